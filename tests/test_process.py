"""The one process runner (vq_admin.ssh.process): capture and stream modes, one bounded
timeout -> SIGTERM -> grace -> SIGKILL path, one classification, one set of ssh
options, one wait-then-kill, and no other module starting processes on its own."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vq_admin.core import procs
from vq_admin.ssh import process

ROOT = Path(__file__).resolve().parent.parent


def gone(pid: int) -> bool:
    """True when no process *pid* exists (a zombie counts as gone: it no longer runs)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_for(predicate, bound: float = 10.0) -> bool:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- capture ------------------------------------------------------------------------------

def test_capture_keeps_stdout_stderr_and_the_status():
    done = process.run(["sh", "-c", "printf out; printf err >&2; exit 3"], timeout=30)
    assert (done.stdout, done.stderr, done.returncode, done.exit_code) == (b"out", b"err", 3, 3)
    assert done.ended == process.EXITED and not done.ok and done.interruption() is None
    assert done.argv == ["sh", "-c", "printf out; printf err >&2; exit 3"] and done.seconds >= 0


def test_capture_feeds_stdin_bytes_or_a_file_and_takes_env(tmp_path):
    done = process.run(["sh", "-c", 'printf "%s:" "$FOO"; cat'], timeout=30, stdin=b"in",
                       env={"FOO": "bar baz", "PATH": os.environ["PATH"]})
    assert done.ok and done.stdout == b"bar baz:in"
    source = tmp_path / "input"
    source.write_bytes(b"from a file")
    assert process.run(["cat"], timeout=30, stdin=str(source)).stdout == b"from a file"
    assert process.run(["cat"], timeout=30).stdout == b""  # no stdin: /dev/null, never the caller's


def test_capture_is_bounded_and_says_when_it_cut(monkeypatch):
    monkeypatch.setattr(process, "CAPTURE_LIMIT", 10)
    done = process.run(["sh", "-c", "printf 0123456789abc; printf 0123456789xyz >&2"], timeout=30)
    assert done.stdout == b"0123456789" and done.stdout_truncated
    assert done.stderr == b"0123456789"
    tail = process.run(["sh", "-c", "printf 0123456789xyz >&2"], timeout=30, stderr_tail=True)
    assert tail.stderr == b"3456789xyz"


def test_watch_sees_the_growing_captures_while_the_process_runs(tmp_path):
    seen: list[tuple[int, ...]] = []
    done = process.run(["sh", "-c", "printf hello"], timeout=30, watch=lambda *fds: seen.append(fds))
    assert done.ok and len(seen) == 2 and len(seen[0]) == 2 and seen[1] == ()


# -- stream --------------------------------------------------------------------------------

def test_stream_hands_over_output_as_it_arrives(tmp_path):
    # The process prints a line, then waits for the reader to answer through a file: it only
    # finishes if the reader saw the line while the process was still running.
    answer = tmp_path / "answer"
    script = f'echo first; while [ ! -e {answer} ]; do sleep 0.02; done; echo second; echo oops >&2; exit 4'
    lines: list[bytes] = []

    def read(stdout):
        for line in iter(stdout.readline, b""):
            lines.append(line)
            if line == b"first\n":
                answer.touch()
        return False

    done = process.run(["sh", "-c", script], timeout=30, read_stdout=read)
    assert lines == [b"first\n", b"second\n"]
    assert done.stdout == b"" and done.stderr == b"oops\n" and done.returncode == 4 and done.ended == process.EXITED


def test_a_reader_that_gives_up_ends_the_process_group_at_once():
    pids: list[int] = []

    def read(stdout):
        pids.append(int(stdout.readline()))
        return True  # cannot follow this stream

    started = time.monotonic()
    done = process.run(["sh", "-c", "sleep 60 & echo $!; wait"], timeout=60, read_stdout=read)
    assert time.monotonic() - started < 20
    assert done.ended == process.SIGNALLED and done.returncode == -signal.SIGKILL
    assert done.interruption() == "transport"  # the status is not the command's
    assert wait_for(lambda: gone(pids[0]))  # the whole group, not only its leader


def test_an_exception_in_the_reader_kills_the_group_and_propagates():
    pids: list[int] = []

    def read(stdout):
        pids.append(int(stdout.readline()))
        raise KeyboardInterrupt  # as vq-admin's own SIGINT would

    with pytest.raises(KeyboardInterrupt):
        process.run(["sh", "-c", "sleep 60 & echo $!; wait"], timeout=60, read_stdout=read)
    assert wait_for(lambda: gone(pids[0]))


def test_a_stream_that_goes_silent_is_ended_at_its_timeout():
    def read(stdout):
        stdout.read()  # blocks until the group dies
        return False

    started = time.monotonic()
    done = process.run(["sh", "-c", "echo x; sleep 60"], timeout=0.5, read_stdout=read)
    assert done.ended == process.TIMED_OUT and done.exit_code is None and done.interruption() == "timeout"
    assert time.monotonic() - started < 0.5 + procs.TERM_GRACE


# -- the bound: SIGTERM, a grace, SIGKILL ----------------------------------------------------

def test_a_timeout_terminates_the_process_within_the_bound():
    started = time.monotonic()
    done = process.run(["sleep", "60"], timeout=0.3)
    elapsed = time.monotonic() - started
    assert done.ended == process.TIMED_OUT and done.exit_code is None and done.interruption(255) == "timeout"
    assert done.returncode == -signal.SIGTERM  # sleep ends on SIGTERM: no need for the SIGKILL
    assert 0.3 <= elapsed < 0.3 + procs.TERM_GRACE


@pytest.mark.parametrize("mode", ["capture", "stream"])
def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(monkeypatch, tmp_path, mode):
    monkeypatch.setattr(procs, "TERM_GRACE", 0.5)
    pid_file = tmp_path / "pid"
    # the ignored disposition is inherited: neither sh nor its sleep ends on SIGTERM
    script = f"trap '' TERM; sleep 60 & echo $! > {pid_file}; wait; wait"

    def read(stdout):
        stdout.read()
        return False

    started = time.monotonic()
    done = process.run(["sh", "-c", script], timeout=0.3, read_stdout=read if mode == "stream" else None)
    elapsed = time.monotonic() - started
    assert done.ended == process.TIMED_OUT and done.returncode == -signal.SIGKILL
    assert 0.3 + 0.5 <= elapsed < 0.3 + 0.5 + 10  # waited the grace, and no longer than a bound
    assert wait_for(lambda: gone(int(pid_file.read_text())))


def test_end_waits_then_kills_a_spawned_process(tmp_path):
    stderr = (tmp_path / "err").open("w+b")
    polite = process.spawn(["cat"], stderr=stderr)
    assert polite.stdin is not None and polite.stdout is not None
    polite.stdin.close()  # cat ends at end-of-file
    assert process.end(polite, 10) == 0
    polite.stdout.close()

    stubborn = process.spawn(["sh", "-c", "trap '' TERM HUP; exec sleep 60"], stderr=stderr)
    started = time.monotonic()
    assert process.end(stubborn, 0.3) is None  # had to be killed
    assert 0.3 <= time.monotonic() - started < 10 and stubborn.returncode == -signal.SIGKILL
    for stream in (stubborn.stdin, stubborn.stdout):
        assert stream is not None
        stream.close()
    stderr.close()


# -- could not start -----------------------------------------------------------------------

def test_a_program_that_cannot_start_is_127_or_126(tmp_path):
    missing = process.run(["vq-no-such-program-anywhere"], timeout=10)
    assert (missing.returncode, missing.ended) == (127, process.NOT_STARTED)
    assert missing.stderr == b"vq-no-such-program-anywhere: command not found\n"
    assert missing.exit_code == 127 and missing.interruption(255) is None  # not a transport failure
    absent = process.run([str(tmp_path / "absent")], timeout=10)
    assert (absent.returncode, absent.ended) == (127, process.NOT_STARTED)
    plain = tmp_path / "not-executable"
    plain.write_text("#!/bin/sh\n")
    refused = process.run([str(plain)], timeout=10)
    assert (refused.returncode, refused.ended) == (126, process.NOT_STARTED)
    assert b"Permission denied" in refused.stderr


# -- classification, with pytest-subprocess standing in for the ssh client -----------------

@pytest.mark.parametrize("returncode, expected", [
    (255, "transport"),           # ssh's own failure
    (-signal.SIGKILL, "transport"),  # the ssh client killed (OOM killer, a logout)
    (-signal.SIGHUP, "transport"),
    (137, None),                  # a remote status of 137 is the command's own
    (0, None),
    (3, None),
])
def test_the_one_classification_of_an_ssh_client_status(fp, returncode, expected):
    fp.register(["/usr/bin/ssh", fp.any()], returncode=returncode, stderr="ssh: message")
    done = process.run(["ssh", "cluster", "true"], timeout=10)
    assert done.returncode == returncode
    assert done.ended == (process.SIGNALLED if returncode < 0 else process.EXITED)
    assert done.interruption(process.SSH_TRANSPORT_EXIT) == expected


def test_local_classification_has_no_transport_exit(fp):
    fp.register(["/usr/bin/git", fp.any()], returncode=255)
    assert process.run(["git", "status"], timeout=10).interruption(None) is None


def test_every_fault_mode_of_the_call_failpoint_has_one_outcome():
    from vq_admin.core.failpoints import MODES

    assert set(process.FAULT_OUTCOMES) == set(MODES)


def test_output_raises_on_failure_and_returns_text_on_success():
    assert process.output(["sh", "-c", "echo ' hi '"], timeout=10) == "hi"
    with pytest.raises(subprocess.CalledProcessError) as raised:
        process.output(["sh", "-c", "echo bad >&2; exit 5"], timeout=10)
    assert raised.value.returncode == 5 and raised.value.stderr == b"bad\n"


# -- one set of ssh options ---------------------------------------------------------------

def contains(argv: list[str], part: tuple[str, ...]) -> bool:
    return any(tuple(argv[i:i + len(part)]) == part for i in range(len(argv)))


def test_every_ssh_argv_carries_the_one_set_of_options():
    from vq_admin.launcher import profile_view as readback
    from vq_admin.ssh.argv import SSH_OPTIONS
    from vq_admin.ssh.early_session import session_command
    from vq_admin.ssh.transport import SshTransport

    assert "ServerAliveInterval=15" in SSH_OPTIONS and "ServerAliveCountMax=4" in SSH_OPTIONS
    t = SshTransport("cluster", None, "/tmp/vqssh-x")
    argvs = [t.describe_argv(["true"]), t.master_wrap(["true"]), session_command(t, ["agent", "session"]),
             SshTransport("cluster", None, None).describe_argv(["true"]),
             readback.hash_argv({"ssh": "cluster", "agent": "/opt/vq/agent"}, {}, "cluster", "/opt/vq/launcher")]
    for argv in argvs:
        assert argv[0] == "ssh" and contains(argv, SSH_OPTIONS), argv
    assert not hasattr(readback, "SSH_OPTIONS")  # no second definition to drift


# -- nobody else starts processes -----------------------------------------------------------

#: Calls in vq_admin (outside vq_admin/agent/, which runs on the login host with its own
#: standard-library calls) that start a process without vq_admin.ssh.process, and why.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("vq_admin/fleet.py", "os.fork"): "each host of `update --all --parallel` runs in a forked copy of the driver "
                                      "(no program is started; that copy's commands go through the runner)",
    ("vq_admin/agent/detached.py", "os.fork"): "the fixed-host build's supervisor detaches itself (double fork; "
                                               "its job starts through the agent's runner, agent/spawn.py)",
    ("vq_admin/core/agentjudge.py", "subprocess.run"): "in judge(), a separate program shipped as text (blob()) "
                                                       "and run by /usr/bin/python3 on the login host (or locally "
                                                       "for a local host), never in the driver: the agent "
                                                       "interpreter run -I -S to print its sys.path",
    ("vq_admin/core/agentjudge.py", "os.execv"): "in judge(), the same separate program: it becomes the agent "
                                                 "it judged (exec, the same process), never in the driver",
}
STARTERS = {("subprocess", name) for name in ("Popen", "run", "call", "check_call", "check_output",
                                               "getoutput", "getstatusoutput")} | \
           {("os", name) for name in ("system", "popen", "execv", "execve", "execvp", "execvpe", "execl",
                                      "execle", "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
                                      "spawnl", "spawnle", "spawnlp", "spawnlpe", "posix_spawn", "posix_spawnp",
                                      "fork", "forkpty")}


def starters_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in STARTERS:
            found.append(f"{node.func.value.id}.{node.func.attr} at line {node.lineno}")
        if isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os"):
            found += [f"from {node.module} import {a.name} at line {node.lineno}" for a in node.names
                      if (node.module, a.name) in STARTERS]
    return found


def test_no_module_but_the_runner_starts_a_process():
    package = ROOT / "vq_admin"
    offenders = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("vq_admin/agent/spawn.py", "vq_admin/ssh/process.py"):  # the one runner of each side
            continue
        found = [f for f in starters_in(path) if (rel, f.split(" at ")[0]) not in EXCEPTIONS]
        if found:
            offenders[rel] = found
    assert not offenders, f"start processes through vq_admin.ssh.process (agent: agent/spawn.py): {offenders}"
    for (rel, call) in EXCEPTIONS:  # each exception is still needed
        assert any(f.startswith(call + " at") for f in starters_in(ROOT / rel)), (rel, call)


def test_the_scan_finds_a_direct_start(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import subprocess, os\nfrom subprocess import Popen\n"
                      "subprocess.run(['x'])\nos.execvp('x', ['x'])\nx: subprocess.Popen[bytes]\n")
    assert sorted(starters_in(sample)) == ["from subprocess import Popen at line 2", "os.execvp at line 4",
                                           "subprocess.run at line 3"]


def test_the_runner_imports_nothing_but_what_subprocess_does():
    """The launcher's --check-on-host read-back runs through it: no typing, tempfile, shutil, failpoints."""
    def imported(module: str) -> set[str]:
        code = (f"import sys\nbefore = set(sys.modules)\nimport {module}\n"
                "print(' '.join(sorted(set(sys.modules) - before)))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return set(done.stdout.split())

    loaded = imported("vq_admin.ssh.process")
    assert loaded - imported("subprocess") == {"vq_admin", "vq_admin.ssh", "vq_admin.ssh.process"}, loaded
    assert not loaded & {"typing", "shutil", "tempfile", "dataclasses", "vq_admin.core.failpoints"}


# -- the allocation stream runs through the runner ----------------------------------------

def test_the_allocation_stream_reads_records_as_they_arrive_and_reports_the_status(tmp_path):
    from vq_admin.lanes.allocation_stream import TranscriptSink, stream_call
    from vq_admin.ssh.transport import LocalTransport

    script = ('printf \'job {"job_id": "42"}\\nout 5\\nhello\'; printf \'end {}\\n\'; echo ssh-note >&2; exit 3')
    sinks = {name: TranscriptSink(tmp_path, name) for name in ("stdout", "stderr")}
    seen: list[str] = []
    call = stream_call(LocalTransport(), ["sh", "-c", script], timeout=30, sinks=sinks,
                       on_record=lambda kind, value: seen.append(kind))
    assert seen == ["job", "end"] and call.records["job"] == {"job_id": "42"} and call.ended
    assert sinks["stdout"].text() == "hello" and call.exit_code == 3 and call.interrupted is None
    assert call.stderr == "ssh-note\n"
    for sink in sinks.values():
        sink.discard()


def test_an_allocation_stream_past_its_timeout_is_a_timeout():
    from vq_admin.lanes.allocation_stream import stream_call
    from vq_admin.ssh.transport import LocalTransport

    started = time.monotonic()
    call = stream_call(LocalTransport(), ["sh", "-c", "sleep 60"], timeout=0.3, sinks={})
    assert call.interrupted == "timeout" and call.exit_code is None and "timed out" in call.describe()
    assert time.monotonic() - started < 0.3 + procs.TERM_GRACE


def test_an_allocation_stream_that_is_not_frames_is_cut_off_at_once():
    from vq_admin.lanes.allocation_stream import stream_call
    from vq_admin.ssh.transport import LocalTransport

    started = time.monotonic()
    call = stream_call(LocalTransport(), ["sh", "-c", "echo 'garbage here'; sleep 60"], timeout=60, sinks={})
    assert time.monotonic() - started < 20  # killed, not waited for
    assert call.frame_error == "unknown record 'garbage'"
    assert call.exit_code == -signal.SIGKILL and call.interrupted == "transport"


def test_an_allocation_stream_that_cannot_start_is_127():
    from vq_admin.lanes.allocation_stream import stream_call
    from vq_admin.ssh.transport import LocalTransport

    call = stream_call(LocalTransport(), ["/nonexistent/ssh"], timeout=10, sinks={})
    assert call.exit_code == 127 and call.interrupted is None and "/nonexistent/ssh" in call.stderr


def test_end_is_woken_by_the_process_ending_not_by_its_bound():
    """The bounded wait returns when the process ends (a pidfd wakes it), long before the bound."""
    proc = process.spawn([sys.executable, "-c", "import sys; sys.stdin.read()"], stderr=process.scratch_file())
    assert proc.stdin is not None
    started = time.monotonic()
    proc.stdin.close()  # it ends now
    assert process.end(proc, 600) == 0
    assert time.monotonic() - started < 300  # not the bound's 600 s: woken by its end


def test_end_waits_its_bound_once_then_kills():
    """The pidfd's sleep and Popen's wait share the one bound: a process that does not end is
    killed after about *grace* seconds, not twice that."""
    proc = process.spawn([sys.executable, "-c", "import time; time.sleep(600)"], stderr=process.scratch_file())
    started = time.monotonic()
    assert process.end(proc, 3.0) is None  # killed
    waited = time.monotonic() - started
    assert 3.0 <= waited < 5.5, waited  # one bound (and the kill), not two (6 s)
    assert proc.returncode == -signal.SIGKILL
