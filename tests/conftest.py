"""Session fixtures for the real daemons (logic lives in tests/realhosts)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from realhosts import RealCluster, SlurmCluster, SshdServer, remote_path


#: Fixtures that start a real daemon: a test using one is marked ``real`` here, so the fast lane
#: (``-m "not real"``) never starts a daemon, whether or not the test declares the mark itself.
DAEMON_FIXTURES = frozenset({"real_sshd", "real_slurm", "real_cluster"})

#: Under pytest-xdist (scripts/test.sh: ``-n N --maxschedchunk 1``), tests are handed out in
#: collection order, each worker holding the test it runs and one more; these (node-id prefixes,
#: the slowest first, measured with ``--durations``) go first, so that no worker is left with a
#: long test while the others have run out of work.  Only the order changes; a stale entry
#: costs wall time, never a test.
SLOW_FIRST = (
    "tests/test_fault_table.py",  # each table in chunks (runtime 3, helper 2, mirror 3), 60-100 s each
    "tests/test_config.py::test_fuzzed_configurations_parse_or_name_a_key",
    "tests/test_allocation_real.py::test_an_unestablished_end_is_unknown_with_job_id_and_log_dir",
    "tests/test_site_example_verify.py::test_the_installed_script_is_ours",  # builds a non-editable install
    "tests/test_site_example_verify.py::test_the_plain_name_checks_equal_the_regular_expressions",
    "tests/test_demo.py",
    "tests/test_ansible.py::test_playbooks_roll_out_stop_check_and_retry_a_lock",
    "tests/test_prune.py::test_prune_keeps_what_a_held_job_needs_and_the_job_then_runs",
    "tests/test_completion.py",  # builds the installed venv that test_install_man and test_launcher_script share
    "tests/test_rollback.py",
    "tests/test_chaos_ssh.py",
    "tests/test_prune.py",
    "tests/test_census_real.py",  # 500 and 300 held jobs, a controller restart: 30-50 s each
    "tests/test_chaos.py",
    "tests/test_mirror_feed.py",
    "tests/test_agent_pythons.py",
    "tests/test_allocation_real.py",
    "tests/test_runtime_real.py",
    "tests/test_mirror_cli.py",
    "tests/test_fleet.py",
    "tests/test_detached.py",
    "tests/test_progress.py",
    "tests/test_bindings_real.py",
    "tests/test_conformance_command.py",
    "tests/test_hostile_input.py",
    "tests/test_evidence.py::test_fuzzed_receipts_parse_or_raise_evidence_errors",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if DAEMON_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("real") is None:
            item.add_marker(pytest.mark.real)
    if getattr(config.option, "numprocesses", None):

        def rank(item: pytest.Item) -> int:
            return next((i for i, prefix in enumerate(SLOW_FIRST) if item.nodeid.startswith(prefix)),
                        len(SLOW_FIRST))

        items.sort(key=rank)  # stable: the order within each rank is the collection order
        # The first hand-out gives each worker two consecutive tests: a quick one, then a slow
        # one, so that no two of the slowest start on the same worker.
        workers = config.option.numprocesses
        if isinstance(workers, int):
            slow = [item for item in items if rank(item) < len(SLOW_FIRST)]
            rest = items[len(slow):]
            pairs = min(workers, len(slow), len(rest))
            head = [item for i in range(pairs) for item in (rest[i], slow[i])]
            items[:] = head + slow[pairs:] + rest[pairs:]


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


@pytest.fixture(scope="session", autouse=True)
def private_xdg_state_per_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same for what module- and session-scoped fixtures run (they start before any test's own
    home is set): each pytest-xdist worker its own XDG state home, never the account's."""
    home = tmp_path_factory.mktemp("xdg-state-worker")
    home.chmod(0o700)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(home))
        yield


@pytest.fixture(autouse=True)
def private_xdg_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own XDG state home.  A ``transport = "local"`` host without ``scratch_root``
    keeps its host-side lease there (``vq-admin-agent/locks``), and under pytest-xdist two tests
    of the same lane (host ``here``, program ``vibeqc``) run at once: one shared home would make
    the second one ``locked`` (75), exactly as two administrators are meant to be."""
    home = tmp_path_factory.mktemp("xdg-state")
    home.chmod(0o700)
    monkeypatch.setenv("XDG_STATE_HOME", str(home))


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
