"""Progress on long waits: one live line on a terminal, nothing off it.

The real tests run ``vq-admin update`` on a pseudo-terminal (``pty``) against
the real single-node Slurm through the real loopback sshd: the allocation
build waits behind a job that holds the node (PENDING with its reason), runs
after that job is cancelled (RUNNING with the transcript's last line), and
settles; every wait is on a condition with a bound.  A build on a fixed host
shows elapsed time and its last output line.  Off a terminal, and with
``--json``, nothing extra is printed and the agent is not asked for progress.
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
import threading

import pytest

from plan_match import slot_values
from realhosts.procs import wait_until
from support import AGENT, NOTHING_ACTIVE, VQ_ADMIN, GitRepo, command_host, run_vq, write_config
from test_allocation_real import World
from vq_admin.report import progress
from vq_admin.agent import progress as agent_progress
from vq_admin.agent.settle import FileState

ERASE = "\r\x1b[2K"


class PtyRun:
    """``vq-admin ARGS`` with stdin, stdout and stderr on a pseudo-terminal; output collected."""

    def __init__(self, args, env):
        master, slave = pty.openpty()
        self.proc = subprocess.Popen([VQ_ADMIN, *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.master = master
        self.chunks: list[bytes] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not data:
                return
            with self.lock:
                self.chunks.append(data)

    @property
    def text(self) -> str:
        with self.lock:
            return b"".join(self.chunks).decode("utf-8", "replace")

    def lines(self) -> list[str]:
        """Every state the live line was drawn in (the text between erase sequences)."""
        return [part.strip("\r\n") for part in self.text.split(ERASE) if part.strip("\r\n")]

    def wait_for(self, pattern: str, timeout: float) -> str:
        rx = re.compile(pattern)
        found = wait_until(lambda: next((ln for ln in self.lines() if rx.search(ln)), None), timeout, interval=0.1)
        assert found, f"no live line matching {pattern!r} within {timeout} s; output so far:\n{self.text[-3000:]!r}"
        return found

    def finish(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        os.close(self.master)
        return code


def _env(world: World, **extra: str) -> dict[str, str]:
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(world.config), VQ_ADMIN_STATE_DIR=str(world.state), COLUMNS="200")
    env.update(extra)
    return env


def _slurm(cluster, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), env=dict(os.environ, **cluster.slurm.env), capture_output=True, text=True,
                          timeout=60)


def _deploy_argv(world: World) -> list[str]:
    receipt = json.loads(sorted((world.state / "receipts").glob("*.json"))[-1].read_text())
    return next(s for s in receipt["steps"] if s["name"] == "deploy")["argv"]


@pytest.mark.real
def test_a_pending_allocation_build_shows_job_state_reason_elapsed_and_last_line(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster, "progress-alloc")
    world.command(seconds=14, code=0)
    blocker = _slurm(real_cluster, "sbatch", "--parsable", "--exclusive", "--job-name=progress-blocker",
                     "--output=/dev/null", "--wrap", "sleep 600")
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = blocker.stdout.strip().split(";")[0]
    try:
        assert wait_until(lambda: _slurm(real_cluster, "squeue", "-h", "-j", blocker_id, "-o", "%T").stdout.strip()
                          == "RUNNING", 60), "the blocking job never ran"
        run = PtyRun(["update", world.program, "cluster", "--expected-sha", world.sha], _env(world))
        pending = run.wait_for(r"job \d+ PENDING \((Resources|Priority|None)?", 90)
        assert re.fullmatch(rf"{world.program}: job \d+ PENDING \((Resources|Priority)\) \d+:\d\d", pending), pending
        print(f"\ncaptured while pending: {pending!r}")
    finally:
        _slurm(real_cluster, "scancel", blocker_id)
    running = run.wait_for(r"job \d+ RUNNING \d+:\d\d \| ", 90)
    assert re.search(r"\| (building with|VQ-DEPLOY-METRIC compiled_files=12)", running), running
    print(f"captured while running: {running!r}")
    settle = run.wait_for(r"settling transcript: observation \d+/10", 120)
    print(f"captured while settling: {settle!r}")
    code = run.finish(timeout=300)
    assert code == 1  # the world's verify fails on purpose; the build itself exited 0
    # the line was erased before the summary, and elapsed time advanced while pending
    assert run.text.count("PENDING") >= 1 and ERASE in run.text
    times = [ln for ln in run.lines() if " PENDING " in ln]
    assert len({re.search(r"(\d+:\d\d)$", ln).group(1) for ln in times}) >= 2, times
    argv = _deploy_argv(world)
    assert argv[argv.index("--progress") + 1] == "10"
    # that argv is the dry run's, its progress slot filled with --progress 10 (and nothing else changed)
    dry = run_vq("update", world.program, "cluster", "--expected-sha", world.sha, "--dry-run", "--json",
                 config=world.config, state=world.state, timeout=300)
    planned = next(s for s in dry.json()["steps"] if s["name"] == "deploy")
    values = slot_values([planned], [{"name": "deploy", "status": "ok", "where": planned["where"], "argv": argv}],
                         names={"deploy"})
    assert values["progress"] == ["--progress", "10"] and values["attempt"].startswith("deploy.")


@pytest.mark.real
def test_off_a_terminal_and_with_json_nothing_extra(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster, "progress-quiet")
    world.command(seconds=1, code=0)
    done = run_vq("update", world.program, "cluster", "--expected-sha", world.sha, config=world.config,
                  state=world.state, timeout=300)
    assert done.exit_code == 1
    assert "\r" not in done.stderr and "\x1b" not in done.stderr and "PENDING" not in done.stderr
    assert "--progress" not in _deploy_argv(world)
    # --json on a terminal: exactly the JSON document, no live line
    run = PtyRun(["update", world.program, "cluster", "--expected-sha", world.sha, "--json"], _env(world))
    assert run.finish(timeout=300) == 1
    assert "\x1b" not in run.text and "settling" not in run.text
    assert json.loads(run.text[run.text.index("{"):])["outcome"] == "failed"
    assert "--progress" not in _deploy_argv(world)


def test_a_fixed_host_build_shows_elapsed_time_and_its_last_output_line(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A")
    build = tmp_path / "build"
    build.write_text(f"#!{sys.executable}\nimport sys, time\nprint('compiling step 1', flush=True)\n"
                     "time.sleep(2.5)\nprint('compiling step 2', flush=True)\ntime.sleep(2.5)\n")
    build.chmod(0o755)
    verify = tmp_path / "verify"  # nothing is ever active: every run builds (and fails its final verify)
    verify.write_text("#!/bin/sh\necho '" + json.dumps(NOTHING_ACTIVE) + "'\n")
    verify.chmod(0o755)
    (tmp_path / "scratch").mkdir()
    config = write_config(tmp_path / "admin.toml", command_host(
        "fixed", scratch=tmp_path / "scratch", repo=repo.path, update=str(build), verify=str(verify), host="here",
        transport="local", timeout_seconds=120, verify_timeout_seconds=None))
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(tmp_path / "state"), COLUMNS="200")
    run = PtyRun(["update", "fixed", "here", "--expected-sha", sha], env)
    first = run.wait_for(r"fixed: deploy on local \d+:\d\d \| compiling step 1$", 60)
    second = run.wait_for(r"fixed: deploy on local \d+:\d\d \| compiling step 2$", 60)
    print(f"\ncaptured: {first!r} then {second!r}")
    assert run.finish(timeout=120) == 1  # nothing is active after the build either


def test_wait_lock_shows_what_holds_the_lease_and_for_how_long_then_runs(tmp_path):
    """Issue 31 item 3: while --wait-lock waits for a held host-side lease, one live line names the
    holder and the time waited of the bound; once the holder ends, the run goes on."""
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A")
    verify = tmp_path / "verify"
    verify.write_text("#!/bin/sh\necho '" + json.dumps(NOTHING_ACTIVE) + "'\n")
    verify.chmod(0o755)
    (tmp_path / "scratch").mkdir()
    config = write_config(tmp_path / "admin.toml", command_host(
        "fixed", scratch=tmp_path / "scratch", repo=repo.path, update="/bin/true", verify=str(verify), host="here",
        transport="local", timeout_seconds=120, verify_timeout_seconds=None))
    holder = subprocess.Popen([AGENT, "lease", "--lane", "runtime", "--host", "elsewhere", "--program", "fixed",
                               "--driver-host", "admin2", "--user", "bob", "--pid", "4242", "--since",
                               "2026-11-30T00:00:00Z", "--run-id", "bobs-run"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert json.loads(holder.stdout.readline())["held"] is True
        env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(tmp_path / "state"),
                   COLUMNS="200")
        run = PtyRun(["update", "fixed", "here", "--expected-sha", sha, "--wait-lock", "120"], env)
        line = run.wait_for(r"^waiting for the lock \d+:\d\d of 2:00: the host-side lease of runtime here fixed on "
                            r"local is held by another run \(bob@admin2 pid 4242\)$", 60)
        print(f"\ncaptured: {line!r}")
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert run.finish(timeout=120) == 1  # the run went on: it built, and nothing is active after it either
    assert "deploy" in run.text and "locked" not in run.text


# -- units: the renderer and the agent's records ------------------------------------------


def test_enabled_only_on_a_terminal_without_json():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress.enabled(False, Tty()) is True
    assert progress.enabled(True, Tty()) is False
    assert progress.enabled(False, io.StringIO()) is False


def test_the_allocation_view_renders_each_phase():
    now = [100.0]
    view = progress.AllocationView("mysim", clock=lambda: now[0])
    assert view.render() == "mysim: submitting the batch job 0:00"
    view.on_record("job", {"job_id": "42"})
    now[0] += 65
    assert view.render() == "mysim: job 42 SUBMITTED 1:05"
    view.on_record("progress", {"phase": "wait", "job_id": "42", "state": "PENDING", "reason": "Resources",
                                "last_line": None})
    assert view.render() == "mysim: job 42 PENDING (Resources) 1:05"
    now[0] += 3600
    view.on_record("progress", {"phase": "wait", "job_id": "42", "state": "RUNNING", "reason": None,
                                "last_line": "[ 40%] Building CXX object"})
    assert view.render() == "mysim: job 42 RUNNING 1:01:05 | [ 40%] Building CXX object"
    view.on_record("progress", {"phase": "settle", "observation": 2, "max": 10, "identical": 2, "bytes": 2048})
    assert view.render() == ("mysim: job 42 ended; settling transcript: observation 2/10, 2 identical, 2.0 KiB "
                             "1:01:05")


def test_the_live_line_erases_before_narration_and_at_the_end_and_escapes_host_text():
    out = io.StringIO()
    line = progress.LiveLine(lambda: "job 1 RUNNING | \x1b]0;evil\x07 text", stream=out, interval=3600)
    line.draw()
    said = []
    line.wrap(said.append)("a narration")
    line.close()
    assert out.getvalue() == ERASE + "job 1 RUNNING | \\x1b]0;evil\\x07 text" + ERASE
    assert said == ["a narration"]


def test_the_agent_reports_queue_state_and_the_newest_last_line(tmp_path):
    (tmp_path / "stdout").write_bytes(b"VQ-DEPLOY-METRIC a=1\nstep 3 of 9\n\n")
    (tmp_path / "stderr").write_bytes(b"")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert agent_progress.last_line(fd) == ("step 3 of 9", "stdout")
        sent = []
        with agent_progress.Reporter(sent.append, fd, 1.0, state=lambda job: ("PENDING", "Priority")) as reporter:
            reporter.start("7")
            assert wait_until(lambda: len(sent) >= 2, 10)
    finally:
        os.close(fd)
    assert sent[0] == {"phase": "wait", "job_id": "7", "state": "PENDING", "reason": "Priority",
                       "last_line": "step 3 of 9", "stream": "stdout"}
    history = [(FileState(3, "a"), FileState(0, "b")), (FileState(5, "c"), FileState(0, "b")),
               (FileState(5, "c"), FileState(0, "b"))]
    assert agent_progress.settle_record(3, history, 10) == {"phase": "settle", "observation": 3, "max": 10,
                                                            "identical": 2, "bytes": 5, "readable": True}
