"""The agent judge (vq_admin/core/agentjudge.py) run as every transport runs it: ``launch(words) + verb``,
locally, on an agent script and a venv made here (issue 34, trust round three)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from vq_admin.core.agentjudge import JUDGE_PYTHON, REFUSED, launch


def judge(words: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*launch(words), "identity"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    path = tmp_path / "agent.py"
    path.write_text("import sys\nprint('RAN', *sys.argv[1:])\n")
    return path


def venv(tmp_path: Path, system_site: bool = False) -> tuple[Path, Path]:
    """A venv (its python, its site-packages) made with the judge's own interpreter."""
    subprocess.run([JUDGE_PYTHON, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []),
                    str(tmp_path / "venv")], check=True, timeout=60)
    return tmp_path / "venv" / "bin" / "python3", next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))


def test_a_python_agent_runs_judged(tmp_path, agent):
    python, _ = venv(tmp_path)
    done = judge([str(python), str(agent)])
    assert (done.returncode, done.stdout) == (0, "RAN identity\n"), done.stderr


@pytest.mark.parametrize("wrapper", [["/usr/bin/env", "PYTHONPATH=/x", "python3"], ["nice", "python3"],
                                     ["timeout", "60", "python3"], ["sh"]])
def test_an_agent_behind_a_wrapper_is_refused_not_run_unjudged(tmp_path, agent, wrapper):
    words = [*wrapper, str(agent)]
    if wrapper == ["sh"]:  # a site's shell script that runs the agent
        shell = tmp_path / "agent.sh"
        shell.write_text(f'#!/bin/sh\nexec python3 {agent} "$@"\n')
        shell.chmod(0o755)
        words = [str(shell)]
    done = judge(words)  # before: run as configured, without -I (PYTHONPATH honoured)
    assert done.returncode == REFUSED and "RAN" not in done.stdout, (done.stdout, done.stderr)
    assert "the agent's first word must be a Python interpreter or a Python script" in done.stderr
    assert "nothing was run" in done.stderr


def test_a_symlink_in_site_packages_is_judged_by_what_it_points_to(tmp_path, agent):
    python, site = venv(tmp_path)
    shared = tmp_path / "shared"
    (shared / "pkg").mkdir(parents=True)
    shared.chmod(0o2775)  # group-writable: another user could swap pkg
    (site / "pkg").symlink_to(shared / "pkg")
    done = judge([str(python), str(agent)])
    assert done.returncode == REFUSED and "RAN" not in done.stdout, (done.stdout, done.stderr)
    assert f"the target of symlink {site / 'pkg'}" in done.stderr and f"directory {shared} is group-writable" in \
        done.stderr


def test_a_fifo_named_pth_is_refused_not_waited_on(tmp_path, agent):
    python, site = venv(tmp_path)
    os.mkfifo(site / "evil.pth", 0o644)
    done = judge([str(python), str(agent)])  # before: the judge blocked on the FIFO (TimeoutExpired)
    assert done.returncode == REFUSED and "RAN" not in done.stdout, (done.stdout, done.stderr)
    assert f"{site / 'evil.pth'} is not a regular file" in done.stderr


def test_a_refusal_after_the_interpreter_ran_says_what_ran(tmp_path, agent):
    python, site = venv(tmp_path, system_site=True)  # sys.path read from the interpreter run -I -S
    site.chmod(0o775)
    done = judge([str(python), str(agent)])
    assert done.returncode == REFUSED and "RAN" not in done.stdout, (done.stdout, done.stderr)
    assert "nothing was run" not in done.stderr
    assert f"only the agent interpreter's own start-up ran ({python} -I -S); the agent never started" in done.stderr
