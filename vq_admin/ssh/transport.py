"""A host you can run an argv on: this machine, or a login/build host over ssh.

Two things can go wrong when running a command, and they are kept apart:

* the command ran and exited non-zero: ``exit_code`` holds its status;
* the transport was interrupted (ssh exited 255, the ssh client was killed by
  a signal -- the OOM killer, a logout that kills the user's processes, a
  SIGKILL -- or vq-admin's own timeout fired): ``interrupted`` says which.
  The command may still be running, or may have finished, on the far side:
  that is an *unknown* outcome, resolved only by a read-back, never by
  guessing.  A local command killed by a signal did not choose its exit
  status either, and is classified the same way (:func:`classify_exit`).

Remote commands are argv lists: each word is quoted on its own with
:func:`shlex.quote` for a POSIX shell, and nothing is ever interpreted by a
local shell.  sshd hands the command to the account's login shell, so on
first contact with a destination a probe proves that shell parses the
quoting as POSIX sh does; a C shell, fish or anything else is refused (77)
before any real command is sent.  One :class:`Session` shares one
ssh connection per destination for the length of a run (ControlMaster).

The local process (the ssh client, or the command itself) is run by
:mod:`vq_admin.ssh.process`, which also holds the timeout's SIGTERM -> grace
-> SIGKILL bound and :func:`classify_exit`; the ssh words are :mod:`vq_admin.ssh.argv`'s.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import tempfile
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

from . import effective, process
from ..core.agentjudge import judged  # every agent call: judged, then run isolated
from ..core.failpoints import failpoint
from ..core.identifiers import DESTINATION_RE
from .process import CAPTURE_LIMIT, SSH_TRANSPORT_EXIT, classify_exit, describe_interruption
# the ssh words (vq_admin.ssh.argv, shared with the early start); the probe and the literal-word rule re-exported
from .argv import (CONTROL_PARENT, CONTROL_PREFIX, SHELL_PROBE, SHELL_PROBE_EXPECTED, literal_words, master_argv,
                   ssh_words)

__all__ = ["CAPTURE_LIMIT", "SHELL_PROBE", "SHELL_PROBE_EXPECTED", "SSH_TRANSPORT_EXIT", "classify_exit",
           "describe_interruption", "literal_words"]

@dataclass
class RunResult:
    """What happened to one command; ``argv`` is the command, not the ssh wrapper."""

    argv: list[str]
    where: str
    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    seconds: float = 0.0
    interrupted: str | None = None  # None | "transport" | "timeout" | "job" (ended by a signal or the scheduler)
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
        if self.interrupted == "job":  # a batch job that ended without choosing its status: the reason is the text
            return self.error_text() or f"the job on {self.where} ended by a signal"
        if self.interrupted == "transport":
            tail = self.error_text().splitlines()[-1:] or ["(no message)"]
            return f"{describe_interruption(self.where, self.exit_code)}: {tail[0]}"
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
        watch: Callable[..., None] | None = None,
    ) -> RunResult:
        """Run *argv*; *stdin* is bytes, or the path of a local file to stream in; *watch* (progress
        on a terminal) as for :func:`vq_admin.ssh.process.run`."""
        argv = [str(a) for a in argv]
        full = self.wrap(argv, env or {})
        return run_local_argv(full, argv, self.where, timeout=timeout, stdin=stdin,
                              transport_exit=self.transport_exit, watch=watch)

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
        return _with_env(judged(argv), env)


class SshTransport(Transport):
    """Runs argv on ``destination`` with the system OpenSSH client."""

    transport_exit = SSH_TRANSPORT_EXIT

    def __init__(self, destination: str, ssh_config: str | None, control_dir: str | None):
        if not DESTINATION_RE.match(destination):  # the configuration's rule, again where the argv is built
            raise ValueError(f"bad ssh destination {destination[:200]!r}")
        self.destination = destination
        self.where = destination
        self.ssh_config = ssh_config
        self.control_dir = control_dir
        #: Called once by :meth:`Session.close` before the masters stop (e.g. ending an early session
        #: never given its request, :mod:`vq_admin.ssh.early_session`, which registers it here).
        self.on_session_close: list[Callable[[], None]] = []

    #: Set once the login shell on the far side has been shown to parse like a POSIX shell.
    shell_checked: bool = False

    def run(self, argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
            stdin: bytes | str | None = None, watch: Callable[..., None] | None = None) -> RunResult:
        if not self.shell_checked:
            failed = self.check_login_shell()
            if failed is not None:
                return replace(failed, argv=[str(a) for a in argv])
        return super().run(argv, timeout=timeout, env=env, stdin=stdin, watch=watch)

    def check_login_shell(self) -> RunResult | None:
        """On first contact, prove the remote login shell parses vq-admin's quoting as POSIX sh does.

        sshd hands every remote command to the account's login shell.  The
        probe is ``printf`` of words that a C shell, fish or any other
        non-POSIX shell reads differently (history ``!``, a newline, escapes
        inside single quotes, globs); anything but the exact words back is
        refused (exit 77) before any real command is sent.  A transport
        failure of the probe is returned as the command's result (nothing ran).
        """
        full = [*self.ssh_base(), "--", self.destination, quote_argv(SHELL_PROBE)]
        # its own session, like every other ssh: a ControlMaster it starts must not share our process group
        done = process.run(full, timeout=60)
        if done.ended == process.TIMED_OUT:
            return RunResult(list(SHELL_PROBE), self.where, None, b"",
                             b"vq-admin: the login shell probe did not answer within 60 s\n", done.seconds, "timeout")
        if done.ended == process.NOT_STARTED:
            return RunResult(list(SHELL_PROBE), self.where, 127, b"", done.stderr, 0.0)
        if done.interruption(SSH_TRANSPORT_EXIT) is not None:
            return RunResult(list(SHELL_PROBE), self.where, done.returncode, done.stdout, done.stderr,
                             done.seconds, "transport")
        if done.returncode != 0 or done.stdout != SHELL_PROBE_EXPECTED:
            self.refuse_shell(done.stdout, done.returncode, done.stderr.decode("utf-8", "replace"))
        self.shell_checked = True
        return None

    def refuse_shell(self, stdout: bytes, code: int | None, detail: str) -> None:
        """Refuse (77) a login shell whose answer to the quoting probe was not a POSIX shell's."""
        from ..report.outcome import READ_ONLY_RAN, Refused

        detail = detail.strip().replace("\n", " | ")[-300:]
        raise Refused(
            f"the login shell on {self.destination} does not parse commands as a POSIX shell does (vq-admin's "
            f"quoting probe came back as {stdout[:120]!r}, exit {code}"
            + (f": {detail}" if detail else "") + "); vq-admin quotes every remote argv for a POSIX shell and "
            "never sends one that could mean something else there. Give the account a POSIX login shell on "
            f"that host (chsh -s /bin/bash USER; sh, bash, dash, ksh and zsh all parse alike); {READ_ONLY_RAN}")

    def master_wrap(self, argv: Sequence[str]) -> list[str]:
        """*argv* (words every shell reads literally, see :func:`literal_words`) as the run's
        connection master: ``ControlMaster=yes`` on the run's ControlPath, without ControlPersist,
        so the master is this ssh process and ends with its own session (no ``-O exit``).  Without
        a control directory (connection sharing off) it is a plain connection."""
        held = _holds_anything(self.control_dir)  # a master is already up: ride on it
        return master_argv(self.ssh_config, self.control_dir, not held, self.destination, judged(argv))

    def ssh_base(self) -> list[str]:
        base = ssh_words(self.ssh_config)
        if self.control_dir:
            base += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C", "-o", "ControlPersist=120"]
        return base

    def wrap(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        return [*self.ssh_base(), "--", self.destination, quote_argv(_with_env(judged(argv), env))]

    def unshared(self) -> "SshTransport":
        """This destination over a connection of its own, without the shared master.

        For a run's first call, which may be its only one (an already-current
        update): one ssh process, no master to start, nothing to close.  Once a
        master is up (an earlier call of the run started one), the call uses it."""
        if _holds_anything(self.control_dir):
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
    watch: Callable[..., None] | None = None,
    env: Mapping[str, str] | None = None,
) -> RunResult:
    """Run *full* locally (no shell) with :func:`vq_admin.ssh.process.run`, recorded as *argv* on *where*
    (*env* added to this process's environment).

    On timeout the whole process group is ended and ``interrupted`` is
    ``"timeout"``; when *transport_exit* is the exit status (or a signal ended
    the process), ``interrupted`` is ``"transport"``.
    """
    fault = failpoint("call", where, *argv)
    if fault == "drop-before":
        return RunResult(argv, where, SSH_TRANSPORT_EXIT, b"",
                         b"vq-admin test fault: connection dropped before the command ran\n",
                         0.0, "transport")
    done = process.run(full, timeout=timeout, stdin=stdin, watch=watch, env={**os.environ, **env} if env else None)
    result = RunResult(argv, where, done.exit_code, done.stdout, done.stderr, done.seconds,
                       done.interruption(transport_exit), done.stdout_truncated)
    return _apply_fault(result, fault) if fault and done.ended != process.NOT_STARTED else result


def _apply_fault(result: RunResult, fault: str) -> RunResult:
    """A test fault (failpoint ``call``, :mod:`vq_admin.core.failpoints`) after the command really ran."""
    if fault not in process.FAULT_OUTCOMES:
        return result
    code, interrupted = process.FAULT_OUTCOMES[fault]
    return replace(result, exit_code=code, stderr=result.stderr + f"vq-admin test fault: {fault}\n".encode(),
                   interrupted=interrupted)


#: A run's control directory, ``vqssh-<pid>-*``: the pid of the run that made it.
RUN_DIR_RE = re.compile(rf"\A{re.escape(CONTROL_PREFIX)}(\d+)-")


def sweep_control_dirs(parent: str = CONTROL_PARENT) -> list[str]:
    """Remove ``/tmp/vqssh-<pid>-*`` directories of this user whose run is gone.

    A killed run cannot close its shared ssh connection or remove its
    directory.  Removed here: directories owned by us (never a symlink, never
    another user's) whose pid is no longer alive.
    """
    from ..core.procs import process_alive

    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        owner = RUN_DIR_RE.match(name)
        if owner is None or int(owner[1]) == os.getpid():
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not process_alive(int(owner[1])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@dataclass
class Session:
    """Transports for one run; ssh connections are shared and closed at the end."""

    ssh_config: str | None
    share_connections: bool = True
    _control_dir: str | None = None
    _ssh: dict[str, SshTransport] = field(default_factory=dict)

    def ssh(self, destination: str) -> SshTransport:
        if destination not in self._ssh:
            effective.check(self.ssh_config, destination)  # what ssh would load for it, before any ssh runs
            if self.share_connections and self._control_dir is None:
                # Short path: a unix socket path must stay under ~100 bytes.  The pid in the name lets a
                # later run remove the directory a killed run left (sweep_control_dirs).
                sweep_control_dirs()
                self._control_dir = tempfile.mkdtemp(prefix=f"{CONTROL_PREFIX}{os.getpid()}-", dir=CONTROL_PARENT)
            self._ssh[destination] = SshTransport(destination, self.ssh_config, self._control_dir)
        return self._ssh[destination]

    def for_host(self, transport: str, destination: str) -> Transport:
        return LocalTransport() if transport == "local" else self.ssh(destination)

    def close(self) -> None:
        """Stop the shared masters; a run that started none (its control directory holds no
        socket: an already-current run) runs no ``ssh -O exit`` at all."""
        for t in self._ssh.values():  # an early first call never given its request: stdin closes, nothing asked
            while t.on_session_close:
                t.on_session_close.pop(0)()
        if _holds_anything(self._control_dir):
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


def _with_env(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """*argv*, run through ``env --`` with *env* set when there is any."""
    return ["env", "--", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)


def _holds_anything(directory: str | None) -> bool:
    """True when the control directory *directory* (None: connection sharing off) holds anything (a master's socket)."""
    if not directory:
        return False
    try:
        return bool(os.listdir(directory))
    except OSError:
        return False


def quote_argv(argv: Iterable[str]) -> str:
    """Render argv for humans (plans, messages); never executed."""
    return " ".join(shlex.quote(str(a)) for a in argv)
