"""The agent's one process runner (vq_admin/agent/spawn.py): its bound covers the whole command, through
``os.posix_spawn`` and through the ``subprocess`` fallback alike."""

from __future__ import annotations

import subprocess

import pytest

from realhosts.procs import pid_alive, wait_until
from vq_admin.agent import spawn


@pytest.fixture(params=["posix_spawn", "subprocess"])
def runner(request, monkeypatch):
    if request.param == "subprocess":
        monkeypatch.setattr(spawn, "_spawn", lambda *args: -1)  # as where posix_spawn cannot plainly run it
    return spawn.run_captured


def test_a_command_runs_to_its_end_and_its_output_is_captured(runner):
    assert runner(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=60) == (3, b"out\n", b"err\n")


def test_a_command_that_closes_its_output_and_lingers_is_ended_at_the_bound(runner, tmp_path):
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; echo receipt; exec >/dev/null 2>&1; exec sleep 300"
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        runner(["sh", "-c", script], timeout=1)
    assert raised.value.output == b"receipt\n"
    pid = int(pid_file.read_text())
    assert wait_until(lambda: not pid_alive(pid), 30), "the lingering command was left running"


def test_what_a_timed_out_command_started_is_ended_with_it(runner, tmp_path):
    child = tmp_path / "child"
    with pytest.raises(subprocess.TimeoutExpired):
        runner(["sh", "-c", f"sleep 300 & echo $! > {child}; wait"], timeout=1)
    pid = int(child.read_text())
    assert wait_until(lambda: not pid_alive(pid), 30), "the command's child was left running"
