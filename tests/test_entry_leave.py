"""vq_admin.entry.leave: the console scripts' exit does what the interpreter's exit does (non-daemon
threads joined, atexit functions run, stdout and stderr flushed, 120 when stdout cannot be), and
then ends without the interpreter's teardown."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import atexit, sys, threading
from vq_admin.entry import leave

done = []
def late():  # a non-daemon thread still running when the run returns
    threading.Event().wait(0.3)
    done.append("thread")

atexit.register(lambda: sys.stderr.write("atexit after " + ",".join(done) + "\n"))
threading.Thread(target=late).start()
sys.stdout.write("buffered, no newline")
leave(int(sys.argv[1]))
"""


#: stdout block-buffered, as under cron (this environment may set PYTHONUNBUFFERED).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def run(code: int, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(code)], timeout=120, env=ENV, **kwargs)


def test_leave_joins_threads_runs_atexit_flushes_and_exits_with_the_code():
    done = run(3, capture_output=True, text=True)
    assert done.returncode == 3
    assert done.stdout == "buffered, no newline"
    assert done.stderr == "atexit after thread\n"


def test_a_stdout_that_cannot_be_flushed_ends_with_120_as_python_does():
    r, w = os.pipe()
    os.close(r)  # the reader went away: the flush at exit fails (EPIPE)
    try:
        ours = run(0, stdout=w, stderr=subprocess.PIPE, text=True)
        python = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.write('x')"], stdout=w,
                                stderr=subprocess.PIPE, timeout=120, env=ENV)
    finally:
        os.close(w)
    assert python.returncode == 120
    assert ours.returncode == 120
    assert "atexit after thread" in ours.stderr
