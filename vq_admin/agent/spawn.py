"""Run one command and capture its output, without :mod:`subprocess`.

:func:`run_captured` is ``subprocess.run(argv, stdin=DEVNULL, stdout=PIPE,
stderr=PIPE, env=env)`` for the agent's per-run path (the verify of
``session`` and ``verify-readback``): importing ``subprocess`` loads
``signal``, ``enum``, ``selectors``, ``threading``, ``locale`` and ``re``,
about 13 ms of a login host's agent start; ``os.posix_spawn`` with two pipes
and ``select.poll`` does the same work.  Same behaviour, point by point:

* the command is an argv, never a shell; a word without ``/`` is looked up
  in the ``PATH`` of the environment the command gets (as subprocess does),
  trying each directory in turn; when none runs it, the error is the first
  that is not "not found" (``ENOENT``, ``ENOTDIR``), else the last, raised
  as the ``OSError`` subprocess raises (``FileNotFoundError``,
  ``PermissionError``, ...);
* stdin is ``/dev/null``, stdout and stderr are read to their end;
* no descriptor but 0, 1 and 2 reaches the command (subprocess's
  ``close_fds``): the agent's own are close-on-exec, and any inherited one
  is closed in the child;
* ``SIGPIPE`` and ``SIGXFSZ``, which Python ignores, are the default again
  in the command (subprocess's ``restore_signals``); one difference, the
  same as in subprocess's own ``posix_spawn`` path: glibc's posix_spawn
  leaves its two internal signals (32 and 33) ignored in the command, which
  only a program's own C library uses (and installs its handlers for);
* with *timeout*, the command leads a session (and process group) of its
  own, and at the bound that whole group gets ``SIGTERM``, then ``SIGKILL``
  (:class:`TimedOut` is raised once it is reaped), so nothing it started is
  left running; if the agent is interrupted while reading, the command gets
  ``SIGKILL`` and is reaped, as ``subprocess.run`` does.

Where that is not possible as stated (no ``os.posix_spawn``, a C library
whose ``posix_spawn`` may not report a failed ``exec``: anything but glibc
2.24 or later, no ``/proc/self/fd`` to find inherited descriptors, a pipe
that would land on 0, 1 or 2), :func:`run_captured` is ``subprocess.run``
itself.

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Mapping, Optional, Tuple

CHUNK = 32768
#: Seconds between SIGTERM and SIGKILL of a command's process group cut off at its bound.
KILL_GRACE = 2.0


class TimedOut(Exception):
    """The command did not end within its bound; its process group was ended (*out*, *err*: what it wrote)."""

    def __init__(self, out: bytes, err: bytes) -> None:
        super().__init__("timed out")
        self.out, self.err = out, err


def _end_group(pid: int, reaped: "Callable[[], bool]") -> None:
    """SIGTERM to the process group *pid* leads, then SIGKILL after :data:`KILL_GRACE` unless *reaped*."""
    import signal
    import time

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except OSError:
            return
        deadline = time.monotonic() + KILL_GRACE
        while time.monotonic() < deadline:
            if reaped():
                return
            time.sleep(0.05)


def _signals() -> "Tuple[int, Tuple[int, ...]]":
    """``(SIGKILL, the signals restored to default)`` from the C module ``signal`` wraps
    (``signal`` itself builds enums)."""
    try:
        sig = __import__("_signal")
    except ImportError:  # pragma: no cover -- CPython always has it
        sig = __import__("signal")
    restored = tuple(getattr(sig, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(sig, name))
    return sig.SIGKILL, restored


def inherited_fds() -> "Optional[List[int]]":
    """Descriptors above 2 that an exec would pass on (not close-on-exec), or ``None`` without ``/proc``."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    found = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:  # the descriptor listdir itself used, closed since
                pass
    return found


def spawn_reports_exec_errors() -> bool:
    """True with glibc 2.24 or later, whose ``posix_spawn`` returns a failed ``exec``'s error (older
    ones, and other C libraries here, may start a child that exits 127 instead)."""
    try:
        name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
        major, minor = (int(part) for part in version.split(".")[:2])
    except (AttributeError, ValueError, OSError):
        return False
    return name == "glibc" and (major, minor) >= (2, 24)


def _candidates(program: str, env: "Mapping[str, str]") -> "List[str]":
    if os.path.dirname(program):
        return [program]
    return [os.path.join(directory, program) for directory in os.get_exec_path(env)]


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return -os.WSTOPSIG(status)  # pragma: no cover -- waitpid without WUNTRACED


def _subprocess_run(argv: "List[str]", env: "Optional[Dict[str, str]]",
                    timeout: "Optional[float]") -> "Tuple[int, bytes, bytes]":
    import subprocess

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=timeout is not None)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc.pid, lambda: proc.poll() is not None)
        out, err = proc.communicate()
        raise TimedOut(out, err) from None
    return proc.returncode, out, err


def run_captured(argv: "List[str]", env: "Optional[Dict[str, str]]" = None,
                 timeout: "Optional[float]" = None) -> "Tuple[int, bytes, bytes]":
    """``(exit code, stdout, stderr)`` of *argv* (a negative code: killed by that signal), run with
    *env* as its whole environment (``None``: this process's); raises ``OSError`` when it cannot start
    and :class:`TimedOut` when it ran past *timeout* seconds (its process group was ended)."""
    spawn = getattr(os, "posix_spawn", None)
    inherited = inherited_fds() if spawn is not None and spawn_reports_exec_errors() else None
    if spawn is None or inherited is None or not argv:
        return _subprocess_run(argv, env, timeout)
    environ = os.environ if env is None else env
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if min(out_w, err_w) <= 2:  # the agent's own 0, 1 or 2 was closed: subprocess handles that case
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        return _subprocess_run(argv, env, timeout)
    sigkill, restored = _signals()
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited]
    pid = None
    try:
        first: "Optional[OSError]" = None
        last: "Optional[OSError]" = None
        for path in _candidates(argv[0], environ):
            try:
                pid = spawn(path, argv, environ, file_actions=actions, setsigdef=restored, setsid=timeout is not None)
                break
            except OSError as exc:  # as subprocess: go on past "not found"; the first other error, else the last
                last = exc
                if first is None and exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    first = exc
        os.close(out_w)
        os.close(err_w)
        out_w = err_w = -1
        if pid is None:
            error = first or last
            assert error is not None
            raise error
        out, err, timed_out = _read_both(out_r, err_r, timeout)
        if timed_out:
            group, status = pid, []  # type: int, List[int]
            _end_group(group, lambda: bool(status) or _reap(group, status))
            if not status:
                os.waitpid(group, 0)
            pid = None
            raise TimedOut(out, err)
        _, code = os.waitpid(pid, 0)
        pid = None
        return _exit_code(code), out, err
    finally:
        for fd in (out_r, out_w, err_r, err_w):
            if fd >= 0:
                os.close(fd)
        if pid is not None:  # interrupted while reading (or reaping): end the command, as subprocess.run does
            try:
                os.kill(pid, sigkill)
            except OSError:
                pass
            os.waitpid(pid, 0)


def _reap(pid: int, status: "List[int]") -> bool:
    """Reap *pid* if it has ended (its status appended to *status*)."""
    done, code = os.waitpid(pid, os.WNOHANG)
    if done:
        status.append(code)
    return bool(done)


def _read_both(out_fd: int, err_fd: int, timeout: "Optional[float]" = None) -> "Tuple[bytes, bytes, bool]":
    """Everything written to both pipes, until each reaches its end (or *timeout* passes: then True)."""
    import select
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    chunks: "Dict[int, List[bytes]]" = {out_fd: [], err_fd: []}
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    open_fds = 2
    while open_fds:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), True
        for fd, _ in poller.poll(None if left is None else max(1, int(left * 1000))):
            data = os.read(fd, CHUNK)
            if data:
                chunks[fd].append(data)
            else:
                poller.unregister(fd)
                open_fds -= 1
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), False
