"""``vq-admin-agent session``: a run's first call, in one agent start (issue 15 with sections 9 and 10).

Run for real as a child process, as ``transport = "local"`` runs it and as
sshd runs it behind the login shell: the lease is the same flock and holder
record as the ``lease`` verb's, each part runs only when everything before it
passed, and the lease ends when stdin closes.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import AGENT

HOLDER = {"driver_host": "admin-a", "user": "op", "pid": 4242, "since": "2026-11-30T20:00:00Z",
          "run_id": "20261130T200000Z-runtime-cluster-vibeqc-0123abcd"}


def request(**parts: object) -> dict:
    """A session request whose verify (if any) gets a 60 s bound."""
    if isinstance(parts.get("verify"), dict):
        parts["verify"] = {"timeout": 60, **parts["verify"]}  # type: ignore[dict-item]
    return {"protocol": 1, "lease": {"lane": "runtime", "host": "cluster", "program": "vibeqc",
                                     "holder": HOLDER}, **parts}


def start(req: dict, state: Path | None = None, argv: tuple[str, ...] = ()) -> tuple[subprocess.Popen, dict]:
    """The session's answer: its first line, and the second when the lease is held."""
    env = None if state is None else dict(os.environ, XDG_STATE_HOME=str(state))
    proc = subprocess.Popen([AGENT, "session", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(req).encode() + b"\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.poll() is not None else "no answer"
    answer = json.loads(line)
    if answer.get("lease", {}).get("held"):
        answer.update(json.loads(proc.stdout.readline()))
    return proc, answer


def finish(proc: subprocess.Popen) -> int:
    assert proc.stdin is not None
    proc.stdin.close()
    return proc.wait(timeout=30)


@pytest.fixture
def scratch() -> Path:
    """The account's state directory (this test's own ``XDG_STATE_HOME``), where the lease lives."""
    return Path(os.environ["XDG_STATE_HOME"])


def test_one_start_takes_the_lease_checks_and_verifies_then_holds_until_stdin_closes(tmp_path, scratch):
    launcher = tmp_path / "python"
    launcher.write_bytes(b"#!/bin/sh\n")
    receipt = json.dumps({"active_path": str(launcher)})
    proc, answer = start(request(check_paths=[AGENT, "relative-word"],
                                 verify={"argv": ["sh", "-c", 'printf "%s" "$0$VQ_T"', receipt],
                                         "env": {"VQ_T": ""}}))
    lock = scratch / "vq-admin-agent" / "locks" / "runtime.vibeqc.lock"
    assert answer["lease"]["held"] is True and answer["lease"]["lock"] == str(lock)
    assert answer["lease"]["holder"]["run_id"] == HOLDER["run_id"]
    assert answer["lease"]["holder"]["agent_pid"] == proc.pid
    assert answer["check_paths"] == {"checked": [AGENT], "refused": []}
    assert answer["verify"]["verify"]["exit_code"] == 0 and answer["verify"]["readback_exit"] == 0
    assert answer["verify"]["readback"]["path"] == str(launcher)
    assert "shell" not in answer  # no probe asked for (a local child: no login shell parses anything)
    holder = Path(f"{lock}.holder")
    assert json.loads(holder.read_text())["agent_pid"] == proc.pid  # held while stdin is open
    other, refused = start(request(verify={"argv": ["touch", str(tmp_path / "ran")]}))
    assert other.wait(timeout=30) == 0
    assert refused["lease"]["held"] is False and refused["lease"]["exit"] == 75
    message = refused["lease"]["message"]
    assert "op@admin-a pid 4242" in message and f"agent pid {proc.pid}" in message
    assert "verify" not in refused and not (tmp_path / "ran").exists()  # nothing else was done
    assert finish(proc) == 0
    assert not holder.exists()  # released: the record is gone, and the next session takes the lock
    again, answer = start(request())
    assert answer["lease"]["held"] is True
    assert finish(again) == 0


def test_a_refused_command_path_stops_before_the_verify(tmp_path, scratch):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    script = loose / "verify"
    proc, answer = start(request(check_paths=[str(script)],
                                 verify={"argv": ["touch", str(tmp_path / "ran")]}))
    assert answer["lease"]["held"] is True
    assert [r["path"] for r in answer["check_paths"]["refused"]] == [str(script)]
    assert "verify" not in answer and not (tmp_path / "ran").exists()
    assert finish(proc) == 0


def test_an_unsafe_lease_directory_is_4(tmp_path):
    from vq_admin.ssh.transport import SHELL_PROBE, SHELL_PROBE_EXPECTED

    loose = tmp_path / "loose-state"
    loose.mkdir()
    loose.chmod(0o777)
    probe = {"argv": True, "expected": SHELL_PROBE_EXPECTED.decode()}
    proc, answer = start(request(shell_probe=probe, verify={"argv": ["touch", str(tmp_path / "ran")]}), loose,
                         ("--probe", *SHELL_PROBE[2:]))
    assert answer["shell"]["posix"] is True, answer
    assert answer["lease"]["held"] is False and answer["lease"]["exit"] == 4 and "refused" in answer["lease"]["error"]
    assert "verify" not in answer and not (tmp_path / "ran").exists()
    assert proc.wait(timeout=30) == 0 and not (loose / "vq-admin-agent").exists()


def test_an_agent_of_another_protocol_version_does_nothing_but_say_its_own(tmp_path):
    proc, answer = start(dict(request(verify={"argv": ["touch", str(tmp_path / "ran")]}), protocol=0))
    assert answer == {"protocol": 1} and proc.wait(timeout=30) == 0
    assert not (tmp_path / "ran").exists()


def test_a_verify_past_its_bound_has_its_process_group_ended(tmp_path):
    """Issue 26: the pre-verify runs under verify_timeout_seconds; what timed out is not left running."""
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $$ $! > {pids}; wait"
    started = time.monotonic()
    proc, answer = start(request(verify={"argv": ["sh", "-c", script], "timeout": 1}))
    assert time.monotonic() - started < 30
    assert answer["verify"]["verify"]["timed_out"] == 1 and answer["verify"]["verify"]["exit_code"] is None
    for pid in map(int, pids.read_text().split()):  # the verifier and the child it started
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid
    assert finish(proc) == 0


def test_the_probe_words_on_the_session_command_line_are_judged_as_they_arrived(tmp_path, scratch):
    from vq_admin.ssh.transport import SHELL_PROBE, SHELL_PROBE_EXPECTED

    probe = {"argv": True, "expected": SHELL_PROBE_EXPECTED.decode()}
    ran = tmp_path / "ran"
    for words, posix in ((list(SHELL_PROBE[2:]), True), (["a", "b", *SHELL_PROBE[3:]], False), (None, False)):
        argv = [AGENT, "session"] + ([] if words is None else ["--probe", *words])
        proc, answer = start(request(shell_probe=probe, verify={"argv": ["touch", str(ran)]}), argv=tuple(argv[2:]))
        assert answer["shell"]["posix"] is posix, (words, answer)
        if posix:  # a shell that passed the words through exactly: the rest is done
            assert answer["lease"]["held"] is True and answer["verify"]["verify"]["exit_code"] == 0 and ran.exists()
            ran.unlink()
        else:  # a word split, joined or dropped (or none came): nothing else is done
            assert set(answer) == {"protocol", "shell"} and not ran.exists(), answer
        assert finish(proc) == 0
    done = subprocess.run([AGENT, "session", "--probe-x"], input=b"{}\n", capture_output=True, timeout=30)
    assert done.returncode == 2 and b"usage: vq-admin-agent session" in done.stderr


@pytest.mark.parametrize("data", [b"not json\n", b"[1]\n", b'{"lease": {}}'])
def test_a_request_that_is_not_one_json_object_line_is_a_usage_error(data):
    done = subprocess.run([AGENT, "session"], input=data, capture_output=True, timeout=30)
    assert done.returncode == 2 and b"one JSON request object line" in done.stderr and not done.stdout


def test_stdin_closed_before_any_request_is_nothing_asked(tmp_path):
    # a session started early whose run ended before sending its request: nothing done, exit 0
    from vq_admin.ssh.transport import SHELL_PROBE

    done = subprocess.run([AGENT, "session", "--probe", *SHELL_PROBE[2:]], input=b"", capture_output=True,
                          timeout=30, cwd=tmp_path, env=dict(os.environ, HOME=str(tmp_path)))
    assert done.returncode == 0 and not done.stdout and not done.stderr
    assert not list(tmp_path.iterdir())  # no lease directory, no record


def test_the_session_imports_no_verb_table(tmp_path, scratch):
    code = ("import io, json, sys\n_before = set(sys.modules)\nfrom vq_admin.agent.entry import main\n"
            "sys.stdin = io.TextIOWrapper(io.BytesIO(json.dumps(%r).encode() + b'\\n'))\n"
            "code = main(['session'])\nassert code == 0, code\n"
            "sys.stderr.write('\\nMODULES ' + repr(sorted(set(sys.modules) - _before)) + '\\n')\n"
            % (request(verify={"argv": ["true"]}),))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    line = [x for x in done.stderr.splitlines() if x.startswith("MODULES ")]
    assert line, done.stdout + done.stderr
    found = set(ast.literal_eval(line[-1][len("MODULES "):]))
    assert "argparse" not in found and "vq_admin.agent.cli" not in found and "tarfile" not in found, sorted(found)
    own = {m for m in found if m.startswith("vq_admin")} - {"vq_admin"}
    assert own <= {m for m in found if m.startswith(("vq_admin.agent", "vq_admin.core"))}, \
        sorted(found)  # the package itself, the agent and the shared core only: nothing of the driver


def test_the_lease_ends_when_stdin_closes_even_while_the_verify_still_runs(tmp_path, scratch):
    """The driver (or its ssh client) gone mid-verify: the lease is free at once, not when the verify ends."""
    started, release = tmp_path / "started", tmp_path / "release"
    script = f"touch {started}; while [ ! -e {release} ]; do sleep 0.05; done"
    proc = subprocess.Popen([AGENT, "session"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request(verify={"argv": ["sh", "-c", script]})).encode() + b"\n")
    proc.stdin.flush()
    holder = scratch / "vq-admin-agent" / "locks" / "runtime.vibeqc.lock.holder"
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert started.exists() and holder.exists()  # the verify runs, the lease is held
    try:
        proc.stdin.close()  # the run is gone
        deadline = time.monotonic() + 30
        while holder.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not holder.exists() and proc.poll() is None  # released while the verify still runs
        other, answer = start(request())  # and the next run takes the lease
        assert answer["lease"]["held"] is True and not release.exists()
        assert finish(other) == 0
    finally:
        release.touch()
    assert proc.wait(timeout=30) == 0
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["lease"]["held"] is True
    late = json.loads(proc.stdout.readline())
    assert late["released"] == "stdin closed before the answer" and late["verify"]["verify"]["exit_code"] == 0
