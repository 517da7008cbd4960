"""The one liveness rule (``vq_admin.core.procs``): a running process, a zombie, a reused pid
(another start time), a dead pid, a bogus value; and no other module reads a process's state."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vq_admin.agent import detached, lease
from vq_admin.core import procs

ROOT = Path(__file__).resolve().parents[1] / "vq_admin"


def test_a_running_process_is_alive_with_and_without_its_start_time():
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as proc:
        started = procs.proc_start_time(proc.pid)
        assert started is not None and started.isdigit()
        assert procs.process_alive(proc.pid) and procs.process_alive(proc.pid, started)
        assert detached.process_alive(proc.pid, started)
        assert not procs.process_alive(proc.pid, str(int(started) + 1))  # a reused pid: another start time
        proc.stdin.close()  # type: ignore[union-attr]


def test_a_zombie_is_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # not reaped yet: wait (bounded) until the kernel shows it as a zombie
        for _ in range(600):  # at most 30 s
            with open(f"/proc/{proc.pid}/stat", "rb") as fh:
                data = fh.read()
            if data[data.rfind(b")") + 2:].split()[0] == b"Z":
                break
            time.sleep(0.05)
        else:
            pytest.fail("the child never became a zombie")
        assert not procs.process_alive(proc.pid)
    finally:
        proc.wait()
    assert not procs.process_alive(proc.pid)  # reaped: gone


@pytest.mark.parametrize("value", [None, 0, -1, "123", 1.5, True])
def test_no_pid_is_never_alive(value):
    assert not procs.process_alive(value)


def test_the_detached_build_never_takes_pid_1_for_its_build():
    assert not detached.process_alive(1, None)
    assert procs.process_alive(1)  # the rule itself: PID 1 runs


def test_the_lease_reads_a_holder_through_the_rule(tmp_path):
    lock = tmp_path / "runtime.h.p.lock"
    (tmp_path / "runtime.h.p.lock.holder").write_text('{"agent_pid": %d}' % os.getpid())
    assert lease.current_holder(str(lock), settle=0.0) == {"agent_pid": os.getpid()}
    (tmp_path / "runtime.h.p.lock.holder").write_text('{"agent_pid": 0}')
    assert lease.current_holder(str(lock), settle=0.0) is None


def test_no_other_module_reads_a_process_state():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "procs.py" and path.parent.name == "core":
            continue
        text = path.read_text()
        if '/proc/{pid}/stat' in text or "/proc/{pid}/status" in text:
            found.append(str(path.relative_to(ROOT)))
    assert not found, f"process liveness belongs in vq_admin/core/procs.py only: {found}"
