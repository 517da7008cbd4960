"""The agent's one process runner: every command the agent runs starts here.

:func:`run_captured` runs a command to its end and captures its output (the
verify of ``session`` and ``verify-readback``, ``squeue``, ``sinfo``, ...);
:func:`start` starts one that outlives the call (the fixed-host build's job
script, sbatch while its job id is read).  Both behave as :mod:`subprocess`:
an argv, never a shell; stdin ``/dev/null``; no descriptor but 0, 1 and 2
passed on; ``SIGPIPE`` and ``SIGXFSZ`` at their defaults in the command.  A
bound that passes ends the command's process group and raises
:class:`TimeoutExpired`.

:func:`run_captured` starts the command with ``os.posix_spawn`` and reads
its two pipes with ``select.poll``: importing ``subprocess`` costs a login
host's agent start about a fifth of a bare interpreter's, and the verify of
every already-current run starts here.  A word without ``/`` is looked up in
the ``PATH`` of the command's environment; when none runs it, the error is
the first that is not "not found", else the last, as subprocess raises it;
if the agent is interrupted while reading, the command gets ``SIGKILL`` and
is reaped.  Where that is not plainly possible (no ``os.posix_spawn``, a C
library whose ``posix_spawn`` may not report a failed ``exec``: anything but
glibc 2.24 or later, no ``/proc/self/fd``, a pipe that would land on 0, 1 or
2) ``subprocess.Popen`` starts it instead.

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

import errno
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

    Target = Union[int, IO[bytes]]

#: subprocess's: the bound of :func:`run_captured` passed (subprocess is imported when first needed).
TimeoutExpired: "type[subprocess.TimeoutExpired]"
#: subprocess's ``PIPE``, for :func:`start`'s stdout.
PIPE = -1


def __getattr__(name: str) -> object:
    if name == "TimeoutExpired":
        import subprocess

        return subprocess.TimeoutExpired
    raise AttributeError(name)


def start(argv: "Sequence[str]", *, stdout: "Target", stderr: "Target", cwd: "Optional[str]" = None,
          new_session: bool = False, pass_fds: "Sequence[int]" = ()) -> "subprocess.Popen[bytes]":
    """Start *argv* (stdout :data:`PIPE` or a descriptor/file); the caller waits for it; *pass_fds* stay
    open in it (the lease's work lock an sbatch --wait holds)."""
    import subprocess

    return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=cwd,
                            close_fds=True, start_new_session=new_session, pass_fds=tuple(pass_fds))


CHUNK = 32768


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


def _spawn(argv: "List[str]", env: "Optional[Dict[str, str]]", group: bool, out_w: int, err_w: int) -> "int":
    """Start *argv* with stdout on *out_w* and stderr on *err_w* (leading a process group of its own when
    *group*) and return its pid, or -1 where ``os.posix_spawn`` cannot plainly run it (see the module)."""
    inherited = inherited_fds() if hasattr(os, "posix_spawn") and spawn_reports_exec_errors() else None
    if inherited is None or min(out_w, err_w) <= 2:  # argv is never empty: every caller names a command
        return -1
    import signal

    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in inherited]
    extra: "Dict[str, Any]" = {"setpgroup": 0} if group else {}
    environ = os.environ if env is None else env
    errors: "List[OSError]" = []
    for path in _candidates(argv[0], environ):  # never none: a bare word has at least one PATH entry
        try:
            return os.posix_spawn(path, argv, environ, file_actions=actions,
                                  setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), **extra)
        except OSError as exc:  # as subprocess: go on past "not found"; the first other error, else the last
            errors.append(exc)
    raise next((exc for exc in errors if exc.errno not in (errno.ENOENT, errno.ENOTDIR)), errors[-1])


def run_captured(argv: "Sequence[str]", env: "Optional[Dict[str, str]]" = None,
                 timeout: "Optional[float]" = None) -> "Tuple[int, bytes, bytes]":
    """``(exit code, stdout, stderr)`` of *argv* (a negative code: killed by that signal), run with
    *env* as its whole environment (``None``: this process's); raises ``OSError`` when it cannot start
    and :class:`TimeoutExpired` past *timeout* seconds (reading its output or waiting for its exit), once its
    process group was ended (:func:`vq_admin.core.procs.end_group`: nothing it started is left running)."""
    import signal

    argv = list(argv)
    deadline = None if timeout is None else time.monotonic() + timeout
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    proc: "Optional[subprocess.Popen[bytes]]" = None
    pid = -1
    try:
        pid = _spawn(argv, env, timeout is not None, out_w, err_w)
        if pid < 0:
            import subprocess

            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w, env=env,
                                    start_new_session=timeout is not None)
            pid = proc.pid
        os.close(out_w)
        os.close(err_w)
        out_w = err_w = -1
        chunks: "Dict[int, List[bytes]]" = {out_r: [], err_r: []}
        live = {out_r, err_r}
        code = _wait(pid, proc, deadline) if _read(chunks, live, deadline) else None
        if code is None:  # the bound passed: its process group is ended here, and it is reaped below
            import subprocess

            from ..core.procs import end_group  # a timeout only: not on the fast verbs' path

            end_group(pid, lambda grace: _read(chunks, live, time.monotonic() + grace) and False)
            raise subprocess.TimeoutExpired(argv, timeout or 0.0, b"".join(chunks[out_r]), b"".join(chunks[err_r]))
        pid = -1
        return code, b"".join(chunks[out_r]), b"".join(chunks[err_r])
    finally:
        for fd in (out_r, out_w, err_r, err_w):
            if fd >= 0:
                os.close(fd)
        if pid >= 0:  # timed out, or interrupted while reading (or reaping): end the command, as subprocess.run does
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            if proc is None:
                os.waitpid(pid, 0)
            else:
                proc.wait()


def _wait(pid: int, proc: "Optional[subprocess.Popen[bytes]]", deadline: "Optional[float]") -> "Optional[int]":
    """The exit code of *pid* (*proc* when it was started by ``subprocess``), or ``None`` when *deadline*
    passes first: a command that closed its output may still run."""
    if proc is not None:
        import subprocess

        try:
            return proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
    if deadline is None:
        return _exit_code(os.waitpid(pid, 0)[1])
    pause = 0.0005  # a command that closed its output is exiting: look again soon, then every 10 ms
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return _exit_code(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def _read(chunks: "Dict[int, List[bytes]]", live: "Set[int]", deadline: "Optional[float]") -> bool:
    """Read the pipes *live* into *chunks* until each has reached its end (True; it leaves *live*), or
    until *deadline* (``time.monotonic``) passes (False)."""
    import select

    poller = select.poll()
    for fd in live:
        poller.register(fd, select.POLLIN)
    while live:
        ready = poller.poll(None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000)
        if not ready:
            return False
        for fd, _ in ready:
            data = os.read(fd, CHUNK)
            if data:
                chunks[fd].append(data)
            else:
                poller.unregister(fd)
                live.discard(fd)
    return True
