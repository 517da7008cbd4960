"""Session fixtures for the real daemons (logic lives in tests/realhosts)."""

from __future__ import annotations

import os

import pytest

from realhosts import RealCluster, SlurmCluster, SshdServer, remote_path


def _require(*programs: str) -> None:
    """Skip when a daemon is not installed, except in CI (``CI`` set): fail there."""
    missing = [p for p in programs if not os.access(p, os.X_OK)]
    if not missing:
        return
    reason = f"not installed: {', '.join(missing)} (run scripts/test.sh to install)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and a daemon is missing: {reason}", pytrace=False)
    pytest.skip(reason)


def _start_sshd(base_dir, env: dict[str, str]) -> SshdServer:
    server = SshdServer(base_dir, env={"PATH": remote_path(), **env})
    server.start()
    return server


@pytest.fixture(scope="session")
def real_sshd(tmp_path_factory):
    """A private sshd on 127.0.0.1 (no Slurm); use ``real_sshd.ssh_config`` with ``ssh -F``."""
    _require("/usr/sbin/sshd")
    server = _start_sshd(tmp_path_factory.mktemp("sshd"), {})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def real_slurm():
    """A private single-node Slurm 22.05 cluster; merge ``real_slurm.env`` into child envs."""
    _require("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
    cluster = SlurmCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def real_cluster(real_slurm, tmp_path_factory):
    """``RealCluster(sshd, slurm)``: remote commands over ssh see SLURM_CONF."""
    _require("/usr/sbin/sshd")
    server = _start_sshd(tmp_path_factory.mktemp("sshd-cluster"), real_slurm.env)
    yield RealCluster(sshd=server, slurm=real_slurm)
    server.stop()
