"""The in-process CLI runner of the tests (``support.run_vq_inprocess``) gives what a fresh
interpreter gives (``support.run_vq``), and leaves this process as it found it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from support import run_vq, run_vq_inprocess, write_config

CONFIG = """
    [hosts.cluster]
    fleet_role = "managed"
    [hosts.cluster.scheduler_runtime_deployments.vibeqc]
    update_command = "/site/bin/deploy-vibeqc"
    verify_command = "/site/bin/verify-vibeqc"
    source_repo = "/srv/src/vibeqc"
    """


@pytest.mark.parametrize("argv", [["--version"], ["status", "--bogus"], ["update", "--bogus", "--json"],
                                  ["check"], ["check", "--json"], ["status", "--json"], ["history", "--json"]],
                         ids=" ".join)
def test_in_process_gives_what_a_fresh_interpreter_gives(tmp_path: Path, argv: list[str]) -> None:
    config = write_config(tmp_path / "admin.toml", CONFIG)
    state = tmp_path / "state"
    fresh = run_vq(*argv, config=config, state=state)
    inproc = run_vq_inprocess(*argv, config=config, state=state)
    assert (inproc.exit_code, inproc.stdout, inproc.stderr) == (fresh.exit_code, fresh.stdout, fresh.stderr)


def test_help_exits_through_system_exit_with_its_text_captured() -> None:
    result = run_vq_inprocess("--help")
    assert result.exit_code == 0 and result.stdout.startswith("usage: vq-admin") and result.stderr == ""


def test_the_process_is_left_as_it_was(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    environ = dict(os.environ)
    streams = sys.stdout, sys.stderr
    result = run_vq_inprocess("status", "--bogus", config=tmp_path / "admin.toml", state=tmp_path / "state",
                              env={"VQ_INPROCESS_PROBE": "1"})
    assert result.exit_code == 2 and "--bogus" in result.stderr
    assert dict(os.environ) == environ and (sys.stdout, sys.stderr) == streams
    print("after")  # file descriptors 1 and 2 are pytest's again
    out, err = capfd.readouterr()
    assert out == "after\n" and "--bogus" not in err
