"""A long-lived process started with ``os.posix_spawn``, before :mod:`subprocess` is loaded.

The early start of an already-current update (:mod:`vq_admin.fastupdate`)
starts its ssh process before the interpreter has loaded anything else, and
``import subprocess`` alone (with its ``locale``, ``re``, ``enum``,
``selectors`` and ``threading``) costs more than everything else the early
start does.  :func:`spawn` starts the process as :func:`vq_admin.process.spawn`
does (stdin and stdout pipes, stderr to the given file, a session of its own,
no other descriptor inherited, SIGPIPE and SIGXFSZ at their defaults as
``subprocess`` restores them) and returns a :class:`Spawned`: the part of
:class:`subprocess.Popen`'s interface the run uses on that process (``pid``,
``args``, ``stdin``, ``stdout``, ``returncode``, ``poll``, ``wait`` with its
``TimeoutExpired``, ``send_signal``, ``kill``), so :mod:`vq_admin.process`'s
bounded :func:`~vq_admin.process.end` and the lease treat both alike.

It returns ``None`` rather than guess where its file actions would not be
plainly right (a pipe or the stderr file landing on descriptor 0, 1 or 2, a
platform without ``setsid`` for ``posix_spawn``, no ``/proc/self/fd``, a C
library older than glibc 2.24, whose ``posix_spawn`` may start a child that
exits 127 instead of reporting a failed ``exec``: the rules of
:mod:`vq_admin.agent.spawn`, shared): the caller then starts the process with
:mod:`subprocess`.  Standard library only; ``os``, ``time`` and
the interpreter's own ``_signal``.
"""

from __future__ import annotations

import os
import time

TYPE_CHECKING = False  # not typing's: imported before the command line is
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import IO

try:  # the interpreter loads _signal at start; the signal module would load enum
    from _signal import SIGKILL, SIGPIPE, SIGXFSZ  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover -- another interpreter
    from signal import SIGKILL, SIGPIPE, SIGXFSZ


class Spawned:
    """A process :func:`spawn` started (the subset of :class:`subprocess.Popen` the run uses)."""

    stderr = None  # as Popen's when stderr went to a file

    def __init__(self, args: list[str], pid: int, stdin: IO[bytes], stdout: IO[bytes]):
        self.args, self.pid, self.stdin, self.stdout = args, pid, stdin, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its status when it has ended (reaped now), else ``None``."""
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end; past *timeout* seconds :class:`subprocess.TimeoutExpired`."""
        if self.returncode is not None:
            return self.returncode
        if timeout is None:
            while self.returncode is None:
                self._reap(0)
            return self.returncode
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                import subprocess

                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(min(delay, remaining, 0.05))
            delay *= 2
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(SIGKILL)

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: its status is lost (Popen says 0 too)
            self.returncode = 0
            return
        except InterruptedError:  # pragma: no cover -- PEP 475 retries; kept for clarity
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def scratch_file() -> IO[bytes]:
    """An unnamed temporary file (``O_TMPFILE`` in ``$TMPDIR`` or ``/tmp``: nothing to clean up, nothing
    another process can open by name); :func:`tempfile.TemporaryFile` where that is not available.
    Without importing :mod:`tempfile` (and its ``shutil``, ``random``) on the fast path."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            fd = os.open(os.environ.get("TMPDIR") or "/tmp", os.O_RDWR | flag | os.O_CLOEXEC, 0o600)
        except OSError:
            pass
        else:
            return os.fdopen(fd, "w+b")
    import tempfile

    return tempfile.TemporaryFile()


def spawn(argv: Sequence[str], *, stderr: IO[bytes]) -> Spawned | None:
    """Start *argv* (looked up on ``PATH``) with stdin and stdout pipes, stderr to *stderr*, in a
    session of its own; ``None`` when that cannot be done plainly here (see the module's text).
    Raises :class:`OSError` when the program cannot start."""
    from .agent.spawn import inherited_fds, spawn_reports_exec_errors  # the agent's own rules, shared

    inherited = inherited_fds() if hasattr(os, "posix_spawnp") and spawn_reports_exec_errors() else None
    if inherited is None:  # no /proc, or a C library whose posix_spawn may hide a failed exec
        return None
    err = stderr.fileno()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    fds = (in_r, in_w, out_r, out_w)
    if min(*fds, err) <= 2:
        for fd in fds:
            os.close(fd)
        return None
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                                      (os.POSIX_SPAWN_DUP2, err, 2)]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited if fd not in (in_r, out_w, err)]
    args = [str(a) for a in argv]
    try:
        pid = os.posix_spawnp(args[0], args, os.environ, file_actions=actions, setsid=True,
                              setsigdef=(SIGPIPE, SIGXFSZ))
    except NotImplementedError:  # no POSIX_SPAWN_SETSID here
        for fd in fds:
            os.close(fd)
        return None
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    os.close(in_r)
    os.close(out_w)
    return Spawned(args, pid, os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"))
