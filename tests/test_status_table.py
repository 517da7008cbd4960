"""``vq admin status`` at a glance on a terminal (a real pseudo-terminal): a table per
host, failed and unknown highlighted; off a terminal and with ``--json`` nothing changes."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time

import pytest

from support import VQ_ADMIN, run_vq_inprocess, write_config
from vq_admin.commands.status import collect
from vq_admin.state.records import LastRun, StateDir, Verified
from vq_admin.report.status_table import Status, age, render

SGR = re.compile(r"\x1b\[[0-9;]*m")
A, B, C = "a" * 40, "b" * 40, "c" * 64


def on_terminal(argv: list[str], env: dict[str, str], timeout: float = 60.0) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; (exit status, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([VQ_ADMIN, *argv], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal has gone
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
            pytest.fail(f"{argv} did not finish within {timeout} s")
        return proc.wait(timeout=timeout), b"".join(chunks).decode("utf-8").replace("\r\n", "\n")
    finally:
        os.close(master)


@pytest.fixture
def state(tmp_path):
    """Two hosts: a helper that failed, a runtime with LAST OK and LAST GOOD whose last run is unknown."""
    s = StateDir(tmp_path / "state")
    s.record_run("helper", "cluster", None, LastRun(outcome="failed", exit_code=1, expected_sha=B,
                                                    at="2026-11-30T11:00:00Z"), None)
    s.record_run("runtime", "cluster", "vibeqc-release", LastRun(outcome="ok", exit_code=0, expected_sha=A,
                                                                 at="2026-11-28T11:00:00Z"),
                 Verified(sha=A, tag="v1.2.3", at="2026-11-28T11:00:00Z"))
    s.record_run("runtime", "cluster", "vibeqc-release", LastRun(outcome="ok", exit_code=0, expected_sha=C,
                                                                 at="2026-11-29T11:00:00Z"),
                 Verified(sha=C, tag="v1.2.4", at="2026-11-29T11:00:00Z"))
    s.record_run("runtime", "cluster", "vibeqc-release", LastRun(outcome="unknown", exit_code=3, expected_sha=B,
                                                                 at="2026-11-30T11:30:00Z"), None)
    s.record_run("runtime", "other", "hello", LastRun(outcome="already-current", exit_code=0, expected_sha=A,
                                                      at="2026-11-30T12:00:00Z"),
                 Verified(sha=A, tag=None, at="2026-11-30T12:00:00Z"))
    return s


def _env(state: StateDir, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(VQ_ADMIN_STATE_DIR=str(state.root), VQ_ADMIN_CONFIG=str(config_for(state)), TERM="xterm", **extra)
    return env


def config_for(state: StateDir):
    """The configuration naming the state's two hosts (status reads it, as every verb)."""
    return write_config(state.root.parent / "admin.toml", "".join(
        f'[hosts.{host}]\nfleet_role = "managed"\n' for host in ("cluster", "other")))


def test_a_terminal_gets_a_table_per_host_with_failures_highlighted(state):
    code, screen = on_terminal(["status"], _env(state))
    assert code == 0, screen
    plain = SGR.sub("", screen)
    lines = plain.splitlines()
    assert lines[0] == "cluster" and "other" in lines
    header = lines[1].split()
    assert header == ["PROGRAM", "LAST", "OK", "LAST", "GOOD", "LAST", "RUN"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("  ") and "PROGRAM" not in line}
    assert rows["(helper)"][-2] == "failed"
    assert rows["vibeqc-release"][:8] == ["vibeqc-release", C[:12], "v1.2.4", rows["vibeqc-release"][3],
                                          A[:12], "v1.2.3", rows["vibeqc-release"][6], "unknown"]
    assert re.fullmatch(r"\d+[smhd]", rows["vibeqc-release"][3]) and re.fullmatch(r"\d+[smhd]", rows["hello"][-1])
    assert rows["hello"][1:3] == [A[:12], "-"] and rows["hello"][-2] == "already-current"
    assert A not in plain and C not in plain, "the table shortens SHAs"
    # Highlighted: exactly the failed and the unknown rows.
    coloured = [SGR.sub("", line).split()[0] for line in screen.splitlines() if "\x1b[1;31m" in line]
    assert sorted(coloured) == ["(helper)", "vibeqc-release"]
    assert not any("\x1b[" in line for line in screen.splitlines() if "hello" in line or "PROGRAM" in line)


def test_no_color_keeps_the_table_without_escapes(state):
    code, screen = on_terminal(["status"], _env(state, NO_COLOR="1"))
    assert code == 0 and "\x1b[" not in screen and "PROGRAM" in screen


def test_host_narrows_the_table(state):
    code, screen = on_terminal(["status", "other"], _env(state))
    assert code == 0
    assert "cluster" not in SGR.sub("", screen) and "hello" in screen


def test_off_a_terminal_the_full_lines_stay(state):
    result = run_vq_inprocess("status", state=state.root, config=config_for(state))
    assert result.exit_code == 0
    assert "\x1b[" not in result.stdout and "PROGRAM" not in result.stdout
    assert f"LAST OK   {C} (v1.2.4)" in result.stdout and f"LAST GOOD {A} (v1.2.3)" in result.stdout


def test_json_is_unchanged_in_content_on_a_terminal(state):
    code, screen = on_terminal(["status", "--json"], _env(state))
    assert code == 0 and "\x1b[" not in screen
    from vq_admin.report.envelope import SCHEMAS, document
    from vq_admin.report.outcome import Outcome

    expected = json.loads(json.dumps(document(SCHEMAS["status"], Outcome.OK, collect(state, None).to_value())))
    again = run_vq_inprocess("status", "--json", state=state.root, config=config_for(state))
    assert json.loads(screen) == expected == again.json()


def test_empty_state_on_a_terminal(tmp_path):
    code, screen = on_terminal(["status"], _env(StateDir(tmp_path / "none")))
    assert code == 0 and "no recorded runs in" in screen


def test_ages():
    now = 1_000_000.0
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    assert age(stamp, now) == "0s" and age(stamp, now + 59) == "59s" and age(stamp, now + 60) == "1m"
    assert age(stamp, now + 7200) == "2h" and age(stamp, now + 3 * 86400 + 5) == "3d"
    assert age(None, now) == "-" and age("yesterday", now) == "?"


def test_text_from_the_state_directory_cannot_reach_the_terminal_raw():
    status = Status.from_value({"state_dir": "/s", "hosts": {"h": {"helper": None, "runtimes": {"p": {
        "last": {"outcome": "ok\x1b]0;pwned\x07", "at": None}, "last_ok": {"sha": A, "tag": "t\x1b[2J"},
        "last_good": None}}}}}, "status")
    text = "\n".join(render(status, color=False))
    assert "\x1b" not in text and "\\x1b" in text
