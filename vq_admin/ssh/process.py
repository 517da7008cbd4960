"""The one way vq-admin runs a local process (an ssh client, git, a local command).

:func:`run` starts an argv (never a shell string) in a session of its own, so
that its whole process group can be ended, and returns one record,
:class:`Completed`: the argv, the raw return code, what was captured, how long
it took and how it ended (:data:`EXITED`, :data:`TIMED_OUT`,
:data:`SIGNALLED` or :data:`NOT_STARTED`).  Its output is captured to
temporary files, or its stdout streamed to a reader (the agent's framed
allocation stream); either way, at *timeout* the process group gets SIGTERM,
then at most :data:`vq_admin.core.procs.TERM_GRACE` seconds to end, then SIGKILL
(:func:`terminate`).  vq-admin's own interruption (SIGINT/SIGTERM reaching the
driver as an exception) kills the group at once and re-raises: a child is
never left running.  :func:`end` is the bounded wait-then-kill of a
long-lived process started with :func:`spawn` (a lease's agent, the run's
first session).

:func:`interruption` is the one classification of a result into the faults
the transport reports: ``"timeout"``, ``"transport"`` (ssh's own exit 255, or
the local process ended by a signal: its status is not the command's) or
``None`` (the command's own exit status).

Standard library only, and light: ``vq admin launcher --check-on-host``
(:mod:`vq_admin.launcher.profile_view`) uses it, so it imports neither ``typing``,
``tempfile`` nor ``shutil`` at run time, and ``threading`` only in stream mode.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

TYPE_CHECKING = False  # not typing's: this module is on the launcher's --check-on-host path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import IO

    #: A long-lived process vq-admin talks to (:func:`spawn`'s).
    LongLived = subprocess.Popen[bytes]

#: ssh's exit status for its own failures (and, ambiguously, a remote ``exit 255``).
SSH_TRANSPORT_EXIT = 255
#: How much of a command's stdout/stderr is kept in memory (the rest stays in the temporary files).
CAPTURE_LIMIT = 16 << 20


def scratch_file() -> IO[bytes]:
    """An unnamed temporary file (``O_TMPFILE`` in ``$TMPDIR`` or ``/tmp``), else
    :func:`tempfile.TemporaryFile` (not imported on the launcher's path)."""
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

#: How a process ended (:attr:`Completed.ended`).
EXITED = "exited"
TIMED_OUT = "timed-out"
SIGNALLED = "killed-by-signal"
NOT_STARTED = "could-not-start"


class Completed:
    """What happened to one local process.

    ``returncode`` is the raw status (negative: ended by that signal; after a
    timeout, whatever the kill left; for :data:`NOT_STARTED`, 127 when the
    program does not exist and 126 when it cannot be executed, as a shell
    says).  ``stdout`` is empty in stream mode.
    """

    __slots__ = ("argv", "returncode", "stdout", "stderr", "seconds", "ended", "stdout_truncated")

    def __init__(self, argv: list[str], returncode: int, stdout: bytes, stderr: bytes, seconds: float,
                 ended: str, stdout_truncated: bool = False) -> None:
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.seconds = seconds
        self.ended = ended
        self.stdout_truncated = stdout_truncated

    @property
    def exit_code(self) -> int | None:
        """The status to report: ``None`` after a timeout (nobody chose one), else :attr:`returncode`."""
        return None if self.ended == TIMED_OUT else self.returncode

    @property
    def ok(self) -> bool:
        return self.ended == EXITED and self.returncode == 0

    def interruption(self, transport_exit: int | None = None) -> str | None:
        """``"timeout"``, ``"transport"`` or ``None``: see :func:`classify_exit`."""
        if self.ended == TIMED_OUT:
            return "timeout"
        return classify_exit(self.returncode, transport_exit)  # (not started: 127 or 126, the command's own)

    def __repr__(self) -> str:
        return f"Completed({self.argv[:1]!r}, {self.returncode!r}, ended={self.ended!r}, seconds={self.seconds:.3f})"


def classify_exit(code: int, transport_exit: int | None) -> str | None:
    """``"transport"`` when *code* is not the command's own exit status, else ``None``.

    Over ssh: exit 255 (ssh's own failures) and any end of the ssh client by a
    signal (a negative return code: SIGKILL, the OOM killer, a logout).  For
    a local command, a negative return code (killed by a signal) too: the
    command did not choose that status, so only a read-back can tell what it
    did.  Everything else is the command's own exit status.
    """
    if code < 0 or code == transport_exit:
        return "transport"
    return None


def describe_interruption(where: str, code: int | None) -> str:
    """One line for a ``"transport"`` interruption of a call to *where*."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        what = "the ssh client" if where != "local" else "the command"
        return f"{what} for {where} was killed by {name} (its exit status is not the command's)"
    return f"ssh to {where} was interrupted (exit 255)"


#: A test fault's effect on a call's status (failpoint ``call``, :mod:`vq_admin.core.failpoints`):
#: ``(exit_code, interrupted)``; ``drop-before`` means nothing ran.
FAULT_OUTCOMES: dict[str, tuple[int | None, str]] = {
    "drop-before": (SSH_TRANSPORT_EXIT, "transport"),
    "drop-after": (SSH_TRANSPORT_EXIT, "transport"),
    "kill": (-signal.SIGKILL, "transport"),
    "timeout": (None, "timeout"),
}


def find_program(name: str) -> str | None:
    """*name* itself when it holds a ``/``, else the first executable file of that name on ``PATH``."""
    if "/" in name:
        return name
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    stdin: bytes | str | None = None,
    env: Mapping[str, str] | None = None,
    watch: Callable[..., None] | None = None,
    read_stdout: Callable[[IO[bytes]], bool | None] | None = None,
    stderr_tail: bool = False,
) -> Completed:
    """Run *argv* locally (no shell) in its own session, bounded by *timeout* seconds.

    *stdin* is bytes to write, the path of a local file to stream in, or
    ``None`` (``/dev/null``).  *env* replaces the environment when given.

    Capture mode (no *read_stdout*): *watch*, when given, is called with the
    descriptors of the growing stdout and stderr captures once the process
    started, and with none just before they are closed.

    Stream mode (*read_stdout*): it is called, in this thread, with the stdout
    pipe and reads it until it closes or it has had enough; a true return
    asks for the process group to be killed at once (the reader found
    something it cannot follow).  An exception from it kills the group and
    propagates.  The timeout is enforced by a timer meanwhile, so a reader
    blocked on a silent process is released when the group dies.

    Kept of stderr: its first :data:`CAPTURE_LIMIT` bytes, or its last ones
    with *stderr_tail*.
    """
    argv = [str(a) for a in argv]
    started = time.monotonic()
    program = find_program(argv[0])
    if program is None:
        return Completed(argv, 127, b"", f"{argv[0]}: command not found\n".encode(), 0.0, NOT_STARTED)
    stdin_file = open(stdin, "rb") if isinstance(stdin, str) else None  # closed below
    try:
        with scratch_file() as out, scratch_file() as err:
            stdin_arg: IO[bytes] | int = (stdin_file if stdin_file is not None
                                          else subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
            try:
                proc = subprocess.Popen([program, *argv[1:]], stdin=stdin_arg,
                                        stdout=subprocess.PIPE if read_stdout is not None else out,
                                        stderr=err, env=env, start_new_session=True)
            except OSError as exc:
                code = 127 if isinstance(exc, FileNotFoundError) else 126
                return Completed(argv, code, b"", f"{argv[0]}: {exc.strerror}\n".encode(),
                                 time.monotonic() - started, NOT_STARTED)
            if read_stdout is not None:
                timed_out = _stream(proc, read_stdout, timeout)
            else:
                timed_out = _capture(proc, stdin if isinstance(stdin, bytes) else None, timeout, watch, out, err)
            seconds = time.monotonic() - started
            code = proc.returncode  # reaped by _stream or _capture: never None
            stdout, truncated = _read_capped(out)  # in stream mode nothing was written there: empty
            stderr, _ = _read_capped(err, tail=stderr_tail)
    finally:
        if stdin_file is not None:
            stdin_file.close()
    ended = TIMED_OUT if timed_out else SIGNALLED if code < 0 else EXITED
    return Completed(argv, code, stdout, stderr, seconds, ended, truncated)


def _capture(proc: subprocess.Popen[bytes], data: bytes | None, timeout: float,
             watch: Callable[..., None] | None, out: IO[bytes], err: IO[bytes]) -> bool:
    """Wait for *proc* (writing *data* to its stdin), at most *timeout*; True when it timed out."""
    if watch is not None:
        watch(out.fileno(), err.fileno())
    try:
        if data is not None:
            proc.communicate(input=data, timeout=timeout)
        else:
            proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        terminate(proc)
        return True
    except BaseException:  # SIGINT/SIGTERM of vq-admin itself: never leave the child running
        kill_group(proc)
        raise
    finally:
        if watch is not None:
            watch()


def _stream(proc: subprocess.Popen[bytes], read_stdout: Callable[[IO[bytes]], bool | None],
            timeout: float) -> bool:
    """Give *proc*'s stdout to *read_stdout* under a timer of *timeout*; True when the timer fired."""
    import threading

    fired = threading.Event()

    def on_timeout() -> None:
        fired.set()
        terminate(proc)

    timer = threading.Timer(timeout, on_timeout)
    timer.daemon = True
    timer.start()
    assert proc.stdout is not None
    try:
        if read_stdout(proc.stdout):
            kill_group(proc, wait=False)
    except BaseException:  # the reader failed, or SIGTERM/SIGINT of vq-admin: end the group at once
        kill_group(proc, wait=False)
        raise
    finally:
        proc.stdout.close()
        proc.wait()
        timer.cancel()
    return fired.is_set()


def output(argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> str:
    """The stdout (text, stripped) of *argv*, which must exit 0 within *timeout* (setup commands:
    the demo's and the conformance kit's git); else :class:`subprocess.CalledProcessError`."""
    done = run(argv, timeout=timeout, env=env)
    if not done.ok:
        raise subprocess.CalledProcessError(done.returncode, done.argv, done.stdout, done.stderr)
    return done.stdout.decode("utf-8", "replace").strip()


def spawn(argv: Sequence[str], *, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start a long-lived *argv* that vq-admin talks to: stdin and stdout are pipes, stderr goes
    to *stderr*, in a session of its own.  End it with :func:`end`.  Raises :class:`OSError` when
    it cannot start."""
    return subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, start_new_session=True, close_fds=True)


def end(proc: LongLived, grace: float) -> int | None:
    """Wait at most *grace* seconds for *proc* to end, then kill its process group.

    Returns its status, or ``None`` when it had to be killed.  The caller
    closes the pipes it wants closed first (an agent reading stdin ends at
    end-of-file)."""
    if _ended(proc, grace):
        return proc.returncode
    kill_group(proc)
    return None


def _ended(proc: LongLived, grace: float) -> bool:
    """Wait at most *grace* seconds for *proc* to end; True when it did."""
    deadline = time.monotonic() + grace
    _sleep_until_ended(proc, grace)
    try:  # the rest of the one bound (nothing when the pidfd's wait used it all)
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _sleep_until_ended(proc: LongLived, timeout: float) -> None:
    """Sleep until *proc* ends (or *timeout*), woken by its end through a pidfd (Linux 5.3 and later):
    ``Popen.wait`` with a timeout polls with growing sleeps, which can add half the time waited."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None or proc.returncode is not None:
        return
    try:
        fd = pidfd_open(proc.pid)  # not reaped yet (no returncode): the pid is still this child's
    except OSError:
        return
    try:
        select.select([fd], [], [], timeout)
    except OSError:
        pass
    finally:
        os.close(fd)


def terminate(proc: LongLived, grace: float | None = None) -> None:
    """End *proc*'s process group (:func:`vq_admin.core.procs.end_group`, at most *grace* seconds after
    SIGTERM): SIGKILL goes to the group's stragglers too when the leader ended in time; *proc* is reaped."""
    from ..core import procs  # not on the launcher's path: only a timeout gets here

    procs.end_group(proc.pid, lambda seconds: _ended(proc, seconds) and False,
                    procs.TERM_GRACE if grace is None else grace)
    proc.wait()


def kill_group(proc: LongLived, *, wait: bool = True) -> None:
    """SIGKILL to *proc*'s process group (its session: see :func:`run`), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if wait:
        proc.wait()


def _read_capped(fh: IO[bytes], *, tail: bool = False) -> tuple[bytes, bool]:
    if tail:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - CAPTURE_LIMIT))
        return fh.read(), size > CAPTURE_LIMIT
    fh.seek(0)
    data = fh.read(CAPTURE_LIMIT + 1)
    return data[:CAPTURE_LIMIT], len(data) > CAPTURE_LIMIT
