"""vq_admin.spawned: the early start's posix_spawn process behaves as vq_admin.process.spawn's
Popen where the run relies on it (pipes, its own session, no inherited descriptor, SIGPIPE at its
default, the bounded wait with TimeoutExpired, the status of a signalled process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from vq_admin import process
from vq_admin.spawned import Spawned, scratch_file, spawn


def start(code: str) -> Spawned:
    with scratch_file() as err:
        proc = spawn([sys.executable, "-c", code], stderr=err)
    assert proc is not None
    return proc


def test_pipes_and_status():
    proc = start("import sys; sys.stdout.write(sys.stdin.read().upper()); sys.exit(3)")
    proc.stdin.write(b"hello")
    proc.stdin.close()
    assert proc.stdout.read() == b"HELLO"
    assert proc.wait(timeout=60) == 3 and proc.poll() == 3 and proc.returncode == 3


def test_its_own_session_and_no_inherited_descriptor():
    r, w = os.pipe()
    os.set_inheritable(w, True)  # what close_fds=True keeps from a child: so must spawn
    try:
        proc = start("import os, json; print(json.dumps([os.getsid(0) == os.getpid(), "
                     f"os.path.exists('/proc/self/fd/{w}')]))")
        proc.stdin.close()
        out = proc.stdout.read()
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(r)
        os.close(w)
    assert out.strip() == b"[true, false]", out


def test_sigpipe_and_sigxfsz_at_their_defaults_as_subprocess_restores_them():
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # Python's own, which a child would inherit
    with scratch_file() as err:
        proc = spawn(["cat", "/proc/self/status"], stderr=err)
    assert proc is not None
    proc.stdin.close()
    status = proc.stdout.read().decode()
    assert proc.wait(timeout=60) == 0
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), hex(ignored)


def test_the_bounded_wait_then_the_group_killed():
    proc = start("import time; time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    assert process.end(proc, 0.2) is None  # the runner's one bounded wait-then-kill takes it
    assert proc.returncode == -signal.SIGKILL


def test_stderr_goes_to_the_file():
    with scratch_file() as err:
        proc = spawn([sys.executable, "-c", "import sys; sys.stderr.write('oops')"], stderr=err)
        assert proc is not None
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        err.seek(0)
        assert err.read() == b"oops"


def test_a_program_that_cannot_start_raises_and_leaves_no_descriptor():
    before = set(os.listdir("/proc/self/fd"))
    with scratch_file() as err, pytest.raises(OSError):
        spawn(["/nonexistent/ssh"], stderr=err)
    assert set(os.listdir("/proc/self/fd")) == before  # the pipes and the file were closed


def test_a_descriptor_below_3_is_left_to_subprocess():
    saved = os.dup(0)
    try:
        os.close(0)  # the next pipe lands on 0, as under a daemon started with stdin closed
        with scratch_file() as err:
            assert spawn([sys.executable, "-c", "pass"], stderr=err) is None
        assert not os.path.exists("/proc/self/fd/0")  # its pipes were closed again
    finally:
        os.dup2(saved, 0)
        os.close(saved)
