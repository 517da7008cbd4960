"""Run one health command of ``verify`` with a bound, without the ``subprocess`` module.

``verify`` runs for every update; ``subprocess`` would load ``selectors``,
``threading``, ``locale`` and more before the command even starts.  This is
the little ``verify`` needs, on ``os.posix_spawn``:

* stdin is ``/dev/null``; stdout and stderr go to one pipe, of which the last
  :data:`OUTPUT_LIMIT` bytes are kept;
* the command runs in *cwd* (the parent changes directory around the spawn and
  changes back: ``posix_spawn`` has no working-directory action) and in its
  own process group;
* a command that cannot be executed at all (missing, not executable, a bad
  interpreter line) is told apart from one that ran: ``posix_spawn`` reports
  the ``exec`` failure to the parent;
* past *timeout* seconds the command's whole process group is killed
  (``SIGKILL``) and the command reaped: no zombie is left, on success or not.

The command's end is awaited on a pidfd where the kernel has them (Linux 5.3+),
so a grandchild that keeps the pipe open cannot hold ``verify`` until the
bound; elsewhere the pipe's end and then ``waitpid`` are awaited, still within
the bound.
"""

from __future__ import annotations

import fcntl
import os
import select
import time

#: ``SIGKILL``: 9 on every POSIX system (the ``signal`` module would load ``enum``).
SIGKILL = 9
#: Bytes of a command's output kept (its last ones); the rest is read and dropped.
OUTPUT_LIMIT = 64 * 1024
#: Seconds between two looks at a command whose output ended before it did, where there is no pidfd.
_EXIT_POLL = 0.005

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Sequence


class Outcome:
    """How one command ended: ``code`` its exit status when it exited, else ``None``;
    ``failure`` empty when it exited 0, else what went wrong in a few words
    (``could not start: ...``, ``exited N``, ``was killed by signal N``,
    ``did not finish within N s; its process group was killed``); ``output``
    the tail of its stdout and stderr, decoded as UTF-8 with replacement."""

    __slots__ = ("code", "failure", "output")

    def __init__(self, code: int | None, failure: str, output: str) -> None:
        self.code = code
        self.failure = failure
        self.output = output

    @property
    def started(self) -> bool:
        """False when the command could not be started at all."""
        return not self.failure.startswith("could not start")


def _spawn(argv: Sequence[str], cwd: str, env: Mapping[str, str], out: int) -> int:
    try:
        here: int | None = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # our own directory cannot be opened (removed, say): stay in cwd afterwards
        here = None
    try:
        os.chdir(cwd)
        try:
            return os.posix_spawn(argv[0], list(argv), env, setpgroup=0, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, out, 2),
            ])
        finally:
            if here is not None:
                os.fchdir(here)
    finally:
        if here is not None:
            os.close(here)


def _status(status: int) -> tuple[int | None, str]:
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        return code, "" if code == 0 else f"exited {code}"
    return None, f"was killed by signal {os.WTERMSIG(status)}"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, SIGKILL)
    except OSError:  # the group is gone already
        pass


def run(argv: Sequence[str], cwd: str, env: Mapping[str, str], timeout: float) -> Outcome:
    """Run *argv* (``argv[0]`` a path, not looked up on PATH) in *cwd* with *env*, for at most
    *timeout* seconds; see the module's description.  Never raises for the command's failure."""
    deadline = time.monotonic() + timeout
    read_end, write_end = os.pipe()
    if write_end <= 2:  # stdin/stdout/stderr were closed: keep the pipe clear of the child's 0-2
        moved = fcntl.fcntl(write_end, fcntl.F_DUPFD_CLOEXEC, 3)
        os.close(write_end)
        write_end = moved
    try:
        try:
            pid = _spawn(argv, cwd, env, write_end)
        except OSError as exc:
            return Outcome(None, f"could not start: {exc.strerror or exc}", "")
    finally:
        os.close(write_end)
    tail = bytearray()
    reaped: tuple[int | None, str] | None = None
    pidfd = -1
    try:
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd here: the pipe's end, then waitpid
            pidfd = -1
        poller = select.poll()
        poller.register(read_end, select.POLLIN)
        if pidfd >= 0:
            poller.register(pidfd, select.POLLIN)
        pipe_open = True
        while reaped is None:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not pipe_open and pidfd < 0:  # the output has ended, no pidfd: look at the command now and then
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    reaped = _status(status)
                else:
                    time.sleep(min(_EXIT_POLL, left))
                continue
            for fd, _event in poller.poll(max(1, int(left * 1000) + 1)):
                if fd == pidfd:
                    reaped = _status(os.waitpid(pid, 0)[1])
                elif not _read(read_end, tail):
                    poller.unregister(read_end)
                    pipe_open = False
        if reaped is not None and pipe_open:  # what the command wrote before it ended is in the pipe
            _drain(read_end, tail, deadline)
    finally:
        if reaped is None:
            _kill_group(pid)
            os.waitpid(pid, 0)
        for fd in (read_end, pidfd):
            if fd >= 0:
                os.close(fd)
    output = tail.decode("utf-8", "replace")
    if reaped is None:
        return Outcome(None, f"did not finish within {timeout:g} s; its process group was killed", output)
    return Outcome(reaped[0], reaped[1], output)


def _read(fd: int, tail: bytearray) -> bool:
    """Read what is there into *tail* (keeping its last bytes); False at the pipe's end."""
    data = os.read(fd, 65536)
    if not data:
        return False
    tail += data
    del tail[:-OUTPUT_LIMIT]
    return True


def _drain(fd: int, tail: bytearray, deadline: float) -> None:
    """After the command ended: read what it left in the pipe, without waiting for a writer it
    left behind (and never past *deadline*)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while poller.poll(0) and time.monotonic() < deadline:
        if not _read(fd, tail):
            return
