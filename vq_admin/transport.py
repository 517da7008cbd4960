"""A host you can run an argv on: this machine, or a login/build host over ssh.

Two things can go wrong when running a command, and they are kept apart:

* the command ran and exited non-zero: ``exit_code`` holds its status;
* the transport was interrupted (ssh exited 255, or vq-admin's own timeout
  fired): ``interrupted`` says which.  The command may still be running, or
  may have finished, on the far side: that is an *unknown* outcome, resolved
  only by a read-back, never by guessing.

Remote commands are argv lists: each word is quoted on its own with
:func:`shlex.quote` for a POSIX shell, and nothing is ever interpreted by a
local shell.  sshd hands the command to the account's login shell, so on
first contact with a destination a probe proves that shell parses the
quoting as POSIX sh does; a C shell, fish or anything else is refused (77)
before any real command is sent.  One :class:`Session` shares one
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

from plumbum import local

from . import faults
from plumbum.commands.processes import CommandNotFound

#: ssh's exit status for its own failures (and, ambiguously, a remote ``exit 255``).
SSH_TRANSPORT_EXIT = 255
#: How much of a command's stdout/stderr is kept in memory (the rest is in files).
CAPTURE_LIMIT = 16 << 20

#: The login-shell probe (see :meth:`SshTransport.check_login_shell`) and what a POSIX shell prints for it.
SHELL_PROBE = ("printf", "%s|", "a b", "c'd", "e\\\\f", "$HOME", "`x`", "!x", "g\nh", "*", "~", "{a,b}", "^x", "#c")
SHELL_PROBE_EXPECTED = "".join(f"{w}|" for w in SHELL_PROBE[2:]).encode()

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

    #: Set once the login shell on the far side has been shown to parse like a POSIX shell.
    shell_checked: bool = False

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
            stdin: bytes | str | None = None) -> RunResult:
        if not self.shell_checked:
            failed = self.check_login_shell()
            if failed is not None:
                return RunResult([str(a) for a in argv], self.where, failed.exit_code, failed.stdout,
                                 failed.stderr, failed.seconds, failed.interrupted)
        return super().run(argv, timeout=timeout, env=env, stdin=stdin)

    def check_login_shell(self) -> RunResult | None:
        """On first contact, prove the remote login shell parses vq-admin's quoting as POSIX sh does.

        sshd hands every remote command to the account's login shell.  The
        probe is ``printf`` of words that a C shell, fish or any other
        non-POSIX shell reads differently (history ``!``, a newline, escapes
        inside single quotes, globs); anything but the exact words back is
        refused (exit 77) before any real command is sent.  A transport
        failure of the probe is returned as the command's result (nothing ran).
        """
        full = [*self.ssh_base(), "--", self.destination, " ".join(shlex.quote(w) for w in SHELL_PROBE)]
        started = time.monotonic()
        try:
            # its own session, like every other ssh: a ControlMaster it starts must not share our process group
            done = subprocess.run(full, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            return RunResult(list(SHELL_PROBE), self.where, None, b"",
                             b"vq-admin: the login shell probe did not answer within 60 s\n",
                             time.monotonic() - started, "timeout")
        except OSError as exc:
            return RunResult(list(SHELL_PROBE), self.where, 127, b"", f"ssh: {exc.strerror}\n".encode(), 0.0)
        if done.returncode == SSH_TRANSPORT_EXIT:
            return RunResult(list(SHELL_PROBE), self.where, done.returncode, done.stdout, done.stderr,
                             time.monotonic() - started, "transport")
        if done.returncode != 0 or done.stdout != SHELL_PROBE_EXPECTED:
            from .outcome import Refused

            detail = done.stderr.decode("utf-8", "replace").strip().replace("\n", " | ")[-300:]
            raise Refused(
                f"the login shell on {self.destination} does not parse commands as a POSIX shell does (vq-admin's "
                f"quoting probe came back as {done.stdout[:120]!r}, exit {done.returncode}"
                + (f": {detail}" if detail else "") + "); vq-admin quotes every remote argv for a POSIX shell and "
                "never sends one that could mean something else there. Give the account a POSIX login shell on "
                "that host (chsh -s /bin/bash USER; sh, bash, dash, ksh and zsh all parse alike); nothing was run")
        self.shell_checked = True
        return None

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
    try:
        command = local[full[0]][full[1:]]
    except CommandNotFound:
        return RunResult(argv, where, 127, b"", f"{full[0]}: command not found\n".encode(), 0.0)
    stdin_file = open(stdin, "rb") if isinstance(stdin, str) else None
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if stdin_file is not None:
            stdin_arg = stdin_file
        else:
            stdin_arg = subprocess.PIPE if stdin is not None else subprocess.DEVNULL
        try:
            proc = command.popen(
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


def quote_argv(argv: Iterable[str]) -> str:
    """Render argv for humans (plans, messages); never executed."""
    return " ".join(shlex.quote(str(a)) for a in argv)
