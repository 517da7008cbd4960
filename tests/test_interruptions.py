"""Issue 14: interruptions and real faults in the runtime lane (real sshd on 127.0.0.1).

A verifier whose output is not a receipt, a stage-verify whose verdict does
not prove the stage, a killed ssh client.  Slurm and the state filesystem are
in tests/test_chaos.py.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from support import AGENT, SITE_EXAMPLE
from vq_admin.report.outcome import READ_ONLY_RAN
from test_runtime_real import Cluster, steps_by_name

pytestmark = pytest.mark.real


def chatty_verifier(tmp_path, body: str):
    script = tmp_path / "chatty-verify"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_a_pre_verify_that_is_not_a_receipt_refuses_before_any_mutation(tmp_path, real_sshd):
    verify = chatty_verifier(tmp_path, f'echo "Checking..."; {SITE_EXAMPLE} verify --root {tmp_path / "apps"} "$@"; '
                                       'printf "done \\033[0m\\n"')
    marker = tmp_path / "provider-ran"
    c = Cluster(tmp_path, real_sshd.ssh_config, profile=textwrap.dedent(f"""\
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "/usr/bin/touch {marker}"
        verify_command = "{verify}"
        source_repo = "{tmp_path / 'src'}"
        update_host = "cluster-build"
        """))
    result = c.update(c.a)
    receipt = result.json()
    assert result.exit_code == 1 and receipt["outcome"] == "failed", result.stderr
    assert receipt["errors"][-1].startswith("pre-verify: the verifier's output is not a receipt (verify receipt is "
                                            "not JSON") and f"; {READ_ONLY_RAN}" in receipt["errors"][-1]
    output = receipt["verify"]["pre"]["output"]
    assert output["excerpt"].startswith("Checking...\\n{") and "\\x1b[0m" in output["excerpt"]
    steps = steps_by_name(receipt)
    assert all(steps[n]["status"] == "skipped" for n in ("stage-create", "deploy", "verify"))
    assert not marker.exists() and not (tmp_path / "scratch" / ".vq-admin" / "stage").exists()


def test_a_silent_failing_pre_verify_stops_before_any_mutation(tmp_path, real_sshd):
    """A verifier that prints nothing and exits non-zero proves nothing, now or after a build: it stops the run
    (a host with nothing active is told by a receipt, CONTRACT section 4)."""
    apps = tmp_path / "apps"
    verify = chatty_verifier(tmp_path, f'[ -e {apps / "current"} ] || exit 1\n'
                                       f'exec {SITE_EXAMPLE} verify --root {apps} "$@"')
    c = Cluster(tmp_path, real_sshd.ssh_config, profile=textwrap.dedent(f"""\
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "{SITE_EXAMPLE} install --root {apps}"
        verify_command = "{verify}"
        source_repo = "{tmp_path / 'src'}"
        update_host = "cluster-build"
        """))
    result = c.update(c.b)
    receipt = result.json()
    assert result.exit_code == 1 and receipt["outcome"] == "failed", result.stderr + result.stdout
    assert receipt["errors"] == [f"pre-verify: verify command {verify} exited 1: (no message on stderr); "
                                 "only read-only checks ran; nothing was changed"]
    assert "output" not in receipt["verify"]["pre"]
    assert not apps.exists() and not (tmp_path / "scratch" / ".vq-admin" / "stage").exists()


def test_stage_verify_exit_0_without_a_proving_verdict_installs_nothing(tmp_path, real_sshd):
    wrapper = tmp_path / "lying-agent"
    wrapper.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        args = sys.argv[1:]
        if args[:1] == ["stage-verify"]:
            print('{{"verified": false, "mismatches": ["GIT-TREE differs"]}}')
            sys.exit(0)
        os.execv({AGENT!r}, [{AGENT!r}] + args)
        """))
    wrapper.chmod(0o755)
    marker = tmp_path / "provider-ran"
    c = Cluster(tmp_path, real_sshd.ssh_config, agent=str(wrapper), profile=textwrap.dedent(f"""\
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "/usr/bin/touch {marker}"
        verify_command = "{SITE_EXAMPLE} verify --root {tmp_path / 'apps'}"
        source_repo = "{tmp_path / 'src'}"
        update_host = "cluster-build"
        """))
    result = c.update(c.a)
    receipt = result.json()
    assert result.exit_code == 1 and receipt["outcome"] == "failed", result.stderr
    assert "without a verdict proving the stage" in receipt["errors"][-1]
    assert steps_by_name(receipt)["deploy"]["status"] == "skipped" and not marker.exists()


@pytest.mark.parametrize("state, exit_code, unchosen", [
    ("COMPLETED", "0:0", False), ("FAILED", "3:0", False), ("CANCELLED by 0", "0:15", True),
    ("CANCELLED", None, True), ("TIMEOUT", "0:1", True), ("NODE_FAIL", "0:0", True), ("PREEMPTED", "0:0", True),
    ("FAILED", "0:9", True), (None, None, False),
])
def test_a_job_ended_by_the_scheduler_or_a_signal_did_not_choose_its_status(state, exit_code, unchosen):
    from vq_admin.lanes.allocation_step import ended_without_choosing
    from vq_admin.lanes.allocation_stream import Summary

    summary = Summary.from_value({"job_state": state, "job_exit_code": exit_code}, "summary")
    assert bool(ended_without_choosing(summary)) is unchosen
