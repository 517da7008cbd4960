"""A host you can run an argv on: this machine, or a login/build host over ssh.

Two things can go wrong when running a command, and they are kept apart:

* the command ran and exited non-zero: ``exit_code`` holds its status;
* the transport was interrupted (ssh exited 255, or vq-admin's own timeout
  fired): ``interrupted`` says which.  The command may still be running, or
  may have finished, on the far side: that is an *unknown* outcome, resolved
  only by a read-back, never by guessing.

Remote commands are argv lists: each word is quoted on its own with
:func:`shlex.quote` for the remote POSIX shell that sshd always uses, and
nothing is ever interpreted by a local shell.  One :class:`Session` shares one
ssh connection per destination for the length of a run (ControlMaster).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from . import faults

#: ssh's exit status for its own failures (and, ambiguously, a remote ``exit 255``).
SSH_TRANSPORT_EXIT = 255
#: How much of a command's stdout/stderr is kept in memory (the rest is in files).
CAPTURE_LIMIT = 16 << 20

SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=15",
    "-o", "ServerAliveInterval=15",
    "-o", "ServerAliveCountMax=4",
    "-o", "ClearAllForwardings=yes",
    "-T",
)


@dataclass
class RunResult:
    """What happened to one command; ``argv`` is the command, not the ssh wrapper."""

    argv: list[str]
    where: str
    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    seconds: float = 0.0
    interrupted: str | None = None  # None | "transport" | "timeout"
    stdout_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.interrupted is None and self.exit_code == 0

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    def error_text(self) -> str:
        return self.stderr.decode("utf-8", "replace").strip()

    def describe(self) -> str:
        if self.interrupted == "timeout":
            return f"timed out after {self.seconds:.0f} s on {self.where}"
        if self.interrupted == "transport":
            tail = self.error_text().splitlines()[-1:] or ["(no message)"]
            return f"ssh to {self.where} was interrupted (exit 255): {tail[0]}"
        return f"exit status {self.exit_code} on {self.where}"


class Transport:
    """Runs argv lists on one place.  Subclasses build the local argv."""

    where: str = "local"

    def wrap(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        raise NotImplementedError

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> RunResult:
        """Run *argv*; *stdin* is bytes, or the path of a local file to stream in."""
        argv = [str(a) for a in argv]
        full = self.wrap(argv, env or {})
        return run_local_argv(full, argv, self.where, timeout=timeout, stdin=stdin,
                              transport_exit=self.transport_exit)

    transport_exit: int | None = None

    def describe_argv(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """The exact local argv that :meth:`run` would execute (for ``--dry-run``)."""
        return self.wrap([str(a) for a in argv], env or {})

    def unshared(self) -> "Transport":
        """The same place without the run's shared connection (see :meth:`SshTransport.unshared`)."""
        return self


class LocalTransport(Transport):
    """Runs argv directly on this machine (``transport = "local"``)."""

    where = "local"

    def wrap(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        if not env:
            return list(argv)
        return ["env", "--", *(f"{k}={v}" for k, v in env.items()), *argv]


class SshTransport(Transport):
    """Runs argv on ``destination`` with the system OpenSSH client."""

    transport_exit = SSH_TRANSPORT_EXIT

    def __init__(self, destination: str, ssh_config: str | None, control_dir: str | None):
        if not destination or destination.startswith("-"):
            raise ValueError(f"bad ssh destination {destination!r}")
        self.destination = destination
        self.where = destination
        self.ssh_config = ssh_config
        self.control_dir = control_dir

    def ssh_base(self) -> list[str]:
        base = ["ssh"]
        if self.ssh_config:
            base += ["-F", self.ssh_config]
        base += list(SSH_OPTIONS)
        if self.control_dir:
            base += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C", "-o", "ControlPersist=120"]
        return base

    def wrap(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        words = list(argv)
        if env:
            words = ["env", "--", *(f"{k}={v}" for k, v in env.items()), *words]
        remote = " ".join(shlex.quote(w) for w in words)
        return [*self.ssh_base(), "--", self.destination, remote]

    def unshared(self) -> "SshTransport":
        """This destination over a connection of its own, without the shared master.

        For a run's first call, which may be its only one (an already-current
        update): one ssh process, no master to start, nothing to close.  Once a
        master is up (an earlier call of the run started one), the call uses it."""
        if self.control_dir and _holds_anything(self.control_dir):
            return self
        return SshTransport(self.destination, self.ssh_config, None)

    def close(self) -> None:
        if not self.control_dir:
            return
        argv = [*self.ssh_base(), "-O", "exit", "--", self.destination]
        run_local_argv(argv, argv, "local", timeout=10)


def run_local_argv(
    full: list[str],
    argv: list[str],
    where: str,
    *,
    timeout: float,
    stdin: bytes | str | None = None,
    transport_exit: int | None = None,
) -> RunResult:
    """Run *full* locally (no shell), capturing output through temp files.

    On timeout the whole process group is killed and ``interrupted`` is
    ``"timeout"``; when *transport_exit* is the exit status, ``interrupted``
    is ``"transport"``.
    """
    started = time.monotonic()
    fault = faults.next_call(argv, where) if faults.active() else None
    if fault == "drop-before":
        return RunResult(argv, where, SSH_TRANSPORT_EXIT, b"", b"vq-admin test fault: connection dropped before the command ran\n",
                         0.0, "transport")
    program = full[0] if "/" in full[0] else shutil.which(full[0])
    if program is None:
        return RunResult(argv, where, 127, b"", f"{full[0]}: command not found\n".encode(), 0.0)
    stdin_file = open(stdin, "rb") if isinstance(stdin, str) else None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if stdin_file is not None:
            stdin_arg = stdin_file
        else:
            stdin_arg = subprocess.PIPE if stdin is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(
                [program, *full[1:]],
                stdin=stdin_arg,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except OSError as exc:
            if stdin_file is not None:
                stdin_file.close()
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            return RunResult(argv, where, code, b"", f"{full[0]}: {exc.strerror}\n".encode(), time.monotonic() - started)
        interrupted = None
        try:
            if isinstance(stdin, bytes):
                proc.communicate(input=stdin, timeout=timeout)
            else:
                proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            interrupted = "timeout"
            _kill_group(proc)
        except BaseException:  # SIGINT/SIGTERM of vq-admin itself: never leave the child running
            _kill_group(proc)
            raise
        finally:
            if stdin_file is not None:
                stdin_file.close()
        seconds = time.monotonic() - started
        code = proc.returncode
        if interrupted is None and transport_exit is not None and code == transport_exit:
            interrupted = "transport"
        stdout, truncated = _read_capped(out)
        stderr, _ = _read_capped(err)
    result = RunResult(argv, where, None if interrupted == "timeout" else code, stdout, stderr,
                       seconds, interrupted, truncated)
    return _apply_fault(result, fault, transport_exit) if fault else result


def _apply_fault(result: RunResult, fault: str, transport_exit: int | None) -> RunResult:
    """A test fault (see :mod:`vq_admin.faults`) after the command really ran."""
    note = f"vq-admin test fault: {fault}\n".encode()
    if fault == "drop-after" or (fault == "kill" and transport_exit is not None):
        return RunResult(result.argv, result.where, SSH_TRANSPORT_EXIT, result.stdout, result.stderr + note,
                         result.seconds, "transport", result.stdout_truncated)
    if fault == "timeout":
        return RunResult(result.argv, result.where, None, result.stdout, result.stderr + note,
                         result.seconds, "timeout", result.stdout_truncated)
    return RunResult(result.argv, result.where, -9, result.stdout, result.stderr + note, result.seconds, None,
                     result.stdout_truncated)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _read_capped(fh) -> tuple[bytes, bool]:
    fh.seek(0)
    data = fh.read(CAPTURE_LIMIT + 1)
    return data[:CAPTURE_LIMIT], len(data) > CAPTURE_LIMIT


@dataclass
class Session:
    """Transports for one run; ssh connections are shared and closed at the end."""

    ssh_config: str | None
    share_connections: bool = True
    _control_dir: str | None = None
    _ssh: dict[str, SshTransport] = field(default_factory=dict)

    def local(self) -> LocalTransport:
        return LocalTransport()

    def ssh(self, destination: str) -> SshTransport:
        if destination not in self._ssh:
            if self.share_connections and self._control_dir is None:
                # Short path: a unix socket path must stay under ~100 bytes.
                self._control_dir = tempfile.mkdtemp(prefix="vqssh-", dir="/tmp")
            self._ssh[destination] = SshTransport(destination, self.ssh_config, self._control_dir)
        return self._ssh[destination]

    def for_host(self, transport: str, destination: str) -> Transport:
        return self.local() if transport == "local" else self.ssh(destination)

    def close(self) -> None:
        """Stop the shared masters; a run that started none (its control directory holds no
        socket: an already-current run) runs no ``ssh -O exit`` at all."""
        if self._control_dir and _holds_anything(self._control_dir):
            for t in self._ssh.values():
                t.close()
        self._ssh.clear()
        if self._control_dir:
            shutil.rmtree(self._control_dir, ignore_errors=True)
            self._control_dir = None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _holds_anything(directory: str) -> bool:
    try:
        return bool(os.listdir(directory))
    except OSError:
        return False


def quote_argv(argv: Iterable[str]) -> str:
    """Render argv for humans (plans, messages); never executed."""
    return " ".join(shlex.quote(str(a)) for a in argv)
