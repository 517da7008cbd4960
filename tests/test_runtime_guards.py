"""Guards of the runtime lane: authority, the lane lock, --dry-run, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import (NOTHING_ACTIVE, VQ_ADMIN, GitRepo, command_host, run_vq, site_example_host, tree_digest,
                     write_config)
from vq_admin.report.outcome import EXIT_CODES, Outcome


def test_the_exit_code_table_is_pinned():
    assert {o.value: c for o, c in EXIT_CODES.items()} == {
        "ok": 0, "already-current": 0, "failed": 1, "usage": 2, "unknown": 3, "locked": 75, "refused": 77,
        "interrupted": 130,  # CONTRACT section 2: interrupted before the lane started (version 4's envelope)
    }
    assert set(EXIT_CODES) == set(Outcome)


def recording_path(tmp: Path) -> tuple[Path, Path]:
    """A PATH directory whose ssh and git only record that they were called."""
    bin_dir = tmp / "recording-bin"
    bin_dir.mkdir()
    log = tmp / "calls.log"
    for name in ("ssh", "git", "sbatch"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\nexit 99\n")
        script.chmod(0o755)
    return bin_dir, log


ROLES = """
[hosts.cluster]
fleet_role = "managed"
scratch_root = "/tmp"
[hosts.cluster.scheduler_runtime_deployments.vibeqc]
update_command = "/site/deploy"
verify_command = "/site/verify"
source_repo = "/srv/src"

[hosts.login2]
fleet_role = "alias"
canonical_host = "cluster"
[hosts.login2.scheduler_runtime_deployments.vibeqc]
update_command = "/site/deploy"
verify_command = "/site/verify"
source_repo = "/srv/src"

[hosts.old]
fleet_role = "excluded"
[hosts.old.scheduler_runtime_deployments.vibeqc]
update_command = "/site/deploy"
verify_command = "/site/verify"
source_repo = "/srv/src"

[hosts.helperonly]
fleet_role = "helper-only"
[hosts.helperonly.scheduler_runtime_deployments.vibeqc]
update_command = "/site/deploy"
verify_command = "/site/verify"
source_repo = "/srv/src"
"""


@pytest.mark.parametrize("host,role", [("login2", "alias"), ("old", "excluded"), ("helperonly", "helper-only")])
@pytest.mark.parametrize("force", [False, True])
def test_runtime_lane_refuses_roles_without_authority(tmp_path, host, role, force):
    config = write_config(tmp_path / "admin.toml", ROLES)
    bin_dir, log = recording_path(tmp_path)
    args = ["update", "vibeqc", host, "--expected-sha", "a" * 40, "--json"] + (["--force"] if force else [])
    result = run_vq(*args, config=config, state=tmp_path / "state",
                    env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert result.exit_code == 77, result.stderr
    document = result.json()
    assert document["outcome"] == "refused"
    assert f"fleet_role {role!r}" in document["errors"][0]
    if role == "alias":
        assert "alias of cluster" in document["errors"][0]
    assert not log.exists(), log.read_text()


def test_an_abbreviated_sha_is_a_usage_error_stating_the_rule(tmp_path):
    config = write_config(tmp_path / "admin.toml", ROLES)
    for bad in ("abc123", "main", "A" * 39, "g" * 40):
        result = run_vq("update", "vibeqc", "cluster", "--expected-sha", bad, config=config)
        assert result.exit_code == 2
        assert "40 (or 64) hex digits" in result.stderr


def test_unknown_host_and_program_are_usage_errors(tmp_path):
    config = write_config(tmp_path / "admin.toml", ROLES)
    assert run_vq("update", "vibeqc", "nowhere", "--expected-sha", "a" * 40, config=config).exit_code == 2
    assert run_vq("update", "other", "cluster", "--expected-sha", "a" * 40, config=config).exit_code == 2


@pytest.fixture
def demo_site(tmp_path):
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("one")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    config = write_config(tmp_path / "admin.toml",
                          site_example_host("cluster", root=tmp_path / "apps", repo=repo.path, scratch=scratch))
    return tmp_path, config, sha


def test_dry_run_prints_the_plan_and_changes_nothing(demo_site):
    tmp, config, sha = demo_site
    before = tree_digest(tmp)
    result = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--cluster-install", "--dry-run", "--json",
                    config=config, state=tmp / "state")
    assert result.exit_code == 0, result.stderr
    plan = result.json()
    assert plan["schema"] == "vq-admin/plan/1" and plan["dry_run"] is True
    names = [s["name"] for s in plan["steps"]]
    assert names[:3] == ["pre-verify", "pre-verify-readback", "source"]
    assert names.index("source") < names.index("stage-create") < names.index("stage-verify") < names.index("deploy")
    assert "deploy" in names and names.index("deploy") < names.index("verify")
    deploy = plan["steps"][names.index("deploy")]
    assert deploy["argv"][1] == "install" and sha in deploy["argv"]
    assert all(s["status"] == "planned" for s in plan["steps"])
    assert tree_digest(tmp) == before
    assert not (tmp / "state").exists()


def slow_site(tmp_path):
    """A local site whose deploy blocks until a gate file appears (bounded)."""
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("one")
    gate, started = tmp_path / "gate", tmp_path / "started"
    deploy = tmp_path / "slow-deploy"
    deploy.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, time
        open({str(started)!r}, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists({str(gate)!r}) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise SystemExit(5)
        """))
    deploy.chmod(0o755)
    verify = tmp_path / "verify-nothing"  # nothing is ever active: every run builds
    verify.write_text("#!/bin/sh\necho '" + json.dumps(NOTHING_ACTIVE) + "'\n")
    verify.chmod(0o755)
    config = write_config(tmp_path / "admin.toml", command_host(
        "vibeqc", scratch=tmp_path, repo=repo.path, update=str(deploy), verify=str(verify), transport="local",
        timeout_seconds=None, verify_timeout_seconds=None))
    return sha, config, gate, started


def start_update(tmp_path, config, sha):
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(tmp_path / "state"))
    return subprocess.Popen([VQ_ADMIN, "update", "vibeqc", "cluster", "--expected-sha",
                             sha, "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path, proc, what):
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_two_concurrent_runs_one_runs_the_other_exits_75(tmp_path):
    sha, config, gate, started = slow_site(tmp_path)
    first = start_update(tmp_path, config, sha)
    try:
        wait_for(started, first, "the first run never reached its deploy step")
        second = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--json", config=config,
                        state=tmp_path / "state")
        assert second.exit_code == 75, second.stderr
        receipt = second.json()
        assert receipt["outcome"] == "locked" and "held by pid" in receipt["errors"][0]
        assert all(s["status"] in ("planned", "skipped") for s in receipt["steps"])
    finally:
        gate.touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 1, err
    assert json.loads(out)["deploy"]["exit_code"] == 5


def test_sigterm_mid_deploy_is_unknown_with_a_receipt_and_frees_the_lock(tmp_path):
    import signal

    sha, config, gate, started = slow_site(tmp_path)
    run = start_update(tmp_path, config, sha)
    try:
        wait_for(started, run, "the run never reached its deploy step")
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
    finally:
        gate.touch()
    assert run.returncode == 3, err
    receipt = json.loads(out)
    assert receipt["outcome"] == "unknown"
    assert "SIGTERM during step deploy" in receipt["errors"][-1]
    assert receipt["readback"]["next_command"] == f"vq admin update vibeqc cluster --expected-sha {sha}"
    stored = list((tmp_path / "state" / "receipts").glob("*.json"))
    assert [json.loads(p.read_text())["outcome"] for p in stored] == ["unknown"]
    again = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--json", config=config,
                   state=tmp_path / "state")
    assert again.exit_code != 75, "the lane lock outlived the interrupted run"


def test_an_internal_error_is_unknown_with_a_receipt_never_a_traceback(demo_site, monkeypatch, capsys):
    import json

    from vq_admin import entry
    from vq_admin.lanes.runtime import RuntimeUpdate

    tmp, config, sha = demo_site

    def broken(self):
        self.make_plan()
        raise RuntimeError("a bug")

    monkeypatch.setattr(RuntimeUpdate, "run", broken)
    monkeypatch.setenv("VQ_ADMIN_CONFIG", str(config))
    monkeypatch.setenv("VQ_ADMIN_STATE_DIR", str(tmp / "state"))
    code = entry.main(["update", "vibeqc", "cluster", "--expected-sha", sha, "--json"])
    out, err = capsys.readouterr()
    receipt = json.loads(out)
    assert code == 3 and receipt["outcome"] == "unknown"
    assert "internal error" in receipt["errors"][0] and "RuntimeError: a bug" in receipt["errors"][0]
    assert "Traceback" not in err
    assert (tmp / "state" / "receipts").is_dir()
