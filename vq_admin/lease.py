"""The host-side lease: one run per lane on the login host, whatever driver runs it.

The driver-side lane lock (:mod:`vq_admin.locks`) keeps two runs of one
state directory apart.  The lease keeps every driver apart: a
``vq-admin-agent lease`` process on the login host takes a kernel lock
(``flock``) and holds it until its stdin closes.  The driver starts it over
the run's shared ssh connection (ControlMaster), or as a child process for
``transport = "local"``, in its own session (a terminal's Ctrl-C reaches the
driver, which then ends the run and closes the lease).  The driver is the
only writer of the pipe into that process, so the lease ends when the run
ends, however it ends: normal exit, exception, SIGKILL of the driver, a
dropped connection.

Taking it never waits: a held lease is exit 75 naming the holder (driver
host, user, pid, since, run id); an unsafe lease directory or a filesystem
where ``flock`` does not work is exit 77 with the agent's reason; a host
that cannot be reached is ``unknown`` (exit 3; nothing ran).
"""

from __future__ import annotations

import getpass
import os
import select
import shlex
import socket
import tempfile
import time
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, Iterator, NoReturn

from . import process
from .agent import TOO_OLD, protocol
from .outcome import Locked, Outcome, Refused, VqAdminError
from .transport import SSH_TRANSPORT_EXIT, SshTransport, Transport, literal_words

if TYPE_CHECKING:
    from .process import LongLived
    from .context import RunContext
    from .receipt import Receipt

#: How long to wait for the agent's one line (covers ssh connection setup).
ACQUIRE_TIMEOUT = 60.0
#: How long to wait for the agent to end after its stdin closed.
RELEASE_TIMEOUT = 15.0
#: How long the run's connection master may stay once its session has ended: longer, it only
#: carries channels of ssh clients that are gone (a follow whose driver was interrupted while the
#: remote side still runs), and the run would wait for a build it has left running.
MASTER_LINGER = 2.0
EXIT_HELD = 75
EXIT_UNSAFE = 4


class LeaseUnreachable(VqAdminError):
    """The login host could not be reached to take the lease; nothing ran (exit 3)."""

    outcome = Outcome.UNKNOWN


class AgentWithoutLease(Refused):
    """The login host's agent predates the lease verb (exit 77, except in the helper lane)."""


class AgentMissing(Refused):
    """The agent's words cannot be run on the login host (no such file: exit 127); nothing ran."""


def _agent_cannot_run(code: int | None, error: str, where: str, agent: str) -> None:
    """Raise what an agent that never ran its verb means: an interpreter older than 3.8 (the
    agent's one line, :data:`vq_admin.agent.TOO_OLD`) or no agent at all."""
    too_old = next((line for line in error.splitlines() if line.startswith(TOO_OLD)), None)
    if code == 77 and too_old is not None:
        raise Refused(too_old)
    if code == 127:
        tail = error.splitlines()[-1] if error else "no message"
        raise AgentMissing(f"the agent {agent} cannot be run on {where} (exit 127: {tail}); nothing was run")


def lease_argv(agent: tuple[str, ...] | list[str], scratch_root: str | None, lane: str, host: str,
               program: str | None, run_id: str, since: str) -> list[str]:
    return protocol.lease(agent, root=scratch_root, lane=lane, host=host, program=program,
                          driver_host=socket.gethostname(), user=_user(), pid=os.getpid(), since=since,
                          run_id=run_id)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.geteuid()}"


class Lease:
    """One held lease: a running agent whose stdin is ours."""

    def __init__(self, transport: Transport, argv: list[str]):
        self.transport = transport
        self.argv = argv
        self.where = transport.where
        self.proc: LongLived | None = None
        self.record: dict[str, Any] = {"where": self.where, "argv": argv, "held": False}
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        self.lost = False
        self.exit_code: int | None = None
        self.released_at: str | None = None

    def acquire(self, timeout: float = ACQUIRE_TIMEOUT) -> dict[str, Any]:
        # The first contact with an ssh host proves its login shell parses our quoting (77 otherwise).
        probe = getattr(self.transport, "check_login_shell", None)
        if probe is not None and not getattr(self.transport, "shell_checked", True):
            failed = probe()
            if failed is not None:
                raise LeaseUnreachable(f"cannot take the host-side lease: {failed.describe()}; "
                                       "this run changed nothing")
        full = self.transport.wrap(self.argv, {})
        started = time.monotonic()
        try:
            self.proc = process.spawn(full, stderr=self._stderr)
        except OSError as exc:
            raise LeaseUnreachable(f"lease: cannot start {full[0]}: {exc.strerror}; nothing was run") from None
        line = self._read_line(timeout)
        self.record["seconds"] = round(time.monotonic() - started, 3)
        answer = _parse(protocol.LEASE, line)
        if answer.get("held") is True:
            self.record.update(held=True, lock=answer.get("lock"), holder=answer.get("holder"),
                               acquired_at=_now())
            return self.record
        code = self._end(RELEASE_TIMEOUT)
        self.proc = None
        self._refuse(answer, code, self._error_text())

    def _refuse(self, answer: dict[str, Any], code: int | None, error: str) -> NoReturn:
        """Raise what a lease not held means: 75 held, 77 unsafe or not takeable, 3 unreachable."""
        self.record.update(exit_code=code, holder=answer.get("holder"))
        if code == EXIT_HELD:
            message = answer.get("message") or "holder not recorded"
            raise Locked(f"the host-side lease of {self._what()} on {self.where} is {message}; "
                         "another run (from this or another driver) is under way; nothing was run")
        if code == EXIT_UNSAFE or code == 1:
            raise Refused(f"cannot take the host-side lease on {self.where}: {error or f'agent exit {code}'}; "
                          "nothing was run")
        if code == SSH_TRANSPORT_EXIT or code is None or code < 0:
            raise LeaseUnreachable(f"cannot take the host-side lease: ssh to {self.where} failed "
                                   f"(exit {code}): {error.splitlines()[-1] if error else 'no message'}; "
                                   "this run changed nothing")
        _agent_cannot_run(code, error, self.where, self.argv[0])
        if protocol.lacks_verb(protocol.LEASE, code, b"", error):
            raise AgentWithoutLease(f"the agent on {self.where} ({self.argv[0]}) has no lease verb (an older helper); "
                                    "update the helper first (vq admin update HOST); nothing was run")
        raise Refused(f"cannot take the host-side lease on {self.where}: the agent exited {code}: "
                      f"{error or 'no message'}; nothing was run")

    def open_session(self, request: dict[str, Any], timeout: float = ACQUIRE_TIMEOUT,
                     probe_on_line: bool = True) -> dict[str, Any] | None:
        """Take the lease and do *request*'s other parts in one agent start (``vq-admin-agent session``).

        Over ssh this process is the run's connection master (``ControlMaster=yes``, no
        ControlPersist): later calls of the run multiplex over it, and it ends when the lease
        is released.  The command line is the agent's words and ``session`` (each a
        :func:`~vq_admin.transport.literal_words` word, so any login shell runs it as is) and, on
        first contact, ``--probe`` and the login-shell probe's words quoted for a POSIX shell (the
        words the separate probe sends; the agent judges what reached it, so the shell sshd runs
        for this session is the one judged and no second shell starts); the request goes on stdin.  Returns the
        agent's answer with the lease held (``answer["lease"]``), or ``None`` when the agent
        has no ``session`` verb (an older helper: the caller takes the lease the old way).
        A transport lost before or after the agent answered is ``answer["interrupted"]``
        (text), with no lease held.  Raises as :meth:`acquire` does for a lease not held,
        and :class:`Refused` for a login shell that is not POSIX.
        """
        from .agent.failpoints import failpoint
        from .early_session import session_command
        from .early_session import take as take_early
        from .transport import SHELL_PROBE, SHELL_PROBE_EXPECTED, SshTransport, describe_interruption

        argv = protocol.session(protocol.agent_words(self.argv, protocol.LEASE))
        ssh = self.transport if isinstance(self.transport, SshTransport) else None
        on_line = ssh is not None and not ssh.shell_checked and probe_on_line
        if ssh is not None and not ssh.shell_checked:
            # First contact: the probe's words ride on this session's own command line (the login
            # shell sshd runs for it is the one judged, no second shell starts on the host); an
            # agent that predates --probe gets them as a command its login shell runs (-c).
            probe: dict[str, Any] = ({"argv": True} if on_line
                                     else {"command": " ".join(shlex.quote(w) for w in SHELL_PROBE)})
            request = dict(request, shell_probe=dict(probe, expected=SHELL_PROBE_EXPECTED.decode()))
        if ssh is not None and on_line:
            full = session_command(ssh, argv)
        else:
            full = ssh.master_wrap(argv) if ssh is not None else self.transport.wrap(argv, {})
        # started early, as soon as the host was known (vq_admin.early_session): its request goes now
        early = take_early(ssh, full[-1]) if ssh is not None else None
        self.record["argv"] = argv
        fault = failpoint("call", self.where, *argv)
        if fault == "drop-before":
            return {"interrupted": f"{describe_interruption(self.where, SSH_TRANSPORT_EXIT)}: vq-admin test fault: "
                                   "connection dropped before the command ran"}
        started = time.monotonic()
        try:
            if early is not None:
                self._stderr.close()
                self.proc, self._stderr = early.proc, early.stderr
            else:
                self.proc = process.spawn(full, stderr=self._stderr)
            assert self.proc.stdin is not None
            self.proc.stdin.write(protocol.encode_request(request))
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the agent (or ssh) ended at once: its status says why
        except OSError as exc:
            if ssh is None and isinstance(exc, FileNotFoundError):
                _agent_cannot_run(127, exc.strerror or "", self.where, full[0])
            raise LeaseUnreachable(f"lease: cannot start {full[0]}: {exc.strerror}; nothing was run") from None
        line = self._read_line(timeout)
        self.record["seconds"] = round(time.monotonic() - started, 3)
        answer = _parse(protocol.SESSION, line)
        raw = answer.get("lease")
        held: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if answer and held.get("held") is True and fault is None:
            self.record.update(held=True, lock=held.get("lock"), holder=held.get("holder"), acquired_at=_now())
            if ssh is not None:
                ssh.shell_checked = True
            return answer
        code = self._end(RELEASE_TIMEOUT)
        self.proc = None
        error = self._error_text()
        if fault is not None or not answer:
            if not answer and protocol.lacks_verb(protocol.SESSION, code, b"", error):
                self.record["argv"] = self.argv  # the caller takes the lease with the lease verb
                self._stderr.seek(0)
                self._stderr.truncate()
                return None
            if not answer and code == 2 and on_line and "usage: vq-admin-agent session" in error:
                # an agent whose session predates --probe: again, its login shell running the probe
                self._stderr.seek(0)
                self._stderr.truncate()
                return self.open_session(request, timeout, probe_on_line=False)
            if fault is None and code is not None and code not in (SSH_TRANSPORT_EXIT,) and code >= 0:
                if ssh is not None and not ssh.shell_checked:
                    # No answer at all (the login shell could not even run the agent's words?): the
                    # separate probe tells a login shell that is not POSIX (77) from a broken agent.
                    ssh.check_login_shell()
                _agent_cannot_run(code, error, self.where, argv[0])
                raise Refused(f"cannot take the host-side lease on {self.where}: the agent's session exited "
                              f"{code}: {error or 'no answer'}; nothing was run")
            tail = error.splitlines()[-1] if error else "no message"
            return {"interrupted": f"{describe_interruption(self.where, code if fault is None else SSH_TRANSPORT_EXIT)}"
                                   f": {('vq-admin test fault: ' + fault) if fault else tail}"}
        shell = answer.get("shell")
        if ssh is not None and isinstance(shell, dict) and shell.get("posix") is not True:
            stdout, exit_code = shell.get("stdout"), shell.get("exit_code")
            text = stdout if isinstance(stdout, str) else ""
            ssh.refuse_shell(text.encode("utf-8", "surrogateescape"), exit_code if isinstance(exit_code, int) else None,
                             f"login shell {shell.get('shell')}: "
                             + str(shell.get("stderr") or shell.get("error") or ""))
        if ssh is not None:
            ssh.shell_checked = True
        status = held.get("exit")
        self._refuse(held, status if isinstance(status, int) else code,
                     str(held.get("error") or error).replace("vq-admin-agent: ", ""))

    def release(self) -> None:
        # The receipt (holding self.record) is stored before the lease is released and
        # never changes afterwards: what happens at release is kept here only.
        if self.proc is None:
            return
        self.lost = self.proc.poll() is not None  # the agent ended (dropped connection?) before the run did
        self.exit_code = self._end(RELEASE_TIMEOUT, linger=MASTER_LINGER)
        self.released_at = _now()
        self.proc = None
        self._stderr.close()

    # -- internals ------------------------------------------------------------------

    def _what(self) -> str:
        i = self.argv.index(protocol.LANE)
        lane, host = self.argv[i + 1], self.argv[i + 3]
        program = self.argv[self.argv.index(protocol.PROGRAM) + 1] if protocol.PROGRAM in self.argv else None
        return f"{lane} {host}" + (f" {program}" if program else "")

    def _read_line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        data = b""
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
        return data.split(b"\n", 1)[0].decode("utf-8", "replace")

    def _end(self, timeout: float, linger: float | None = None) -> int | None:
        """Close the agent's stdin and wait for the process (ssh or the agent) to end, at most
        *timeout*.  With *linger*: wait (at most *timeout*) for the agent's own session to end
        (its stdout closes: the lease is released on the host), then at most *linger* for the
        process, which as the run's connection master may still carry channels of interrupted
        ssh clients; it is ended then, as after *timeout*."""
        proc = self.proc
        assert proc is not None
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    if stream is proc.stdout and linger is not None:
                        self._drain(timeout)
                    stream.close()
            except OSError:
                pass
        return process.end(proc, timeout if linger is None else linger)

    def _drain(self, timeout: float) -> None:
        """Read the agent's stdout until it closes, at most *timeout* seconds."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([fd], [], [], left)
            if not ready or not os.read(fd, 65536):
                return

    def _error_text(self) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read(8192).decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
        return "\n".join(line.removeprefix("vq-admin-agent: ") for line in text.splitlines())


def _parse(verb: str, line: str) -> dict[str, Any]:
    """The agent's answer line to *verb* (``lease`` or ``session``); empty when there is none or it is
    not one (the exit status and stderr then say why)."""
    try:
        return protocol.PARSERS[verb](line).data if line else {}
    except protocol.ProtocolError:
        return {}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def plan_lease(ctx: RunContext, receipt: Receipt, lane: str, host_name: str, program: str | None) -> None:
    """For ``--dry-run``: the lease command that would run, where (nothing runs)."""
    host = ctx.config.hosts.get(host_name)
    if host is not None:
        argv = lease_argv(host.agent, host.scratch_root, lane, host_name, program, "<run id>", receipt.started_at)
        receipt.lease = {"where": ctx.login(host).where, "argv": argv, "status": "planned"}


@contextmanager
def host_lease(ctx: RunContext, receipt: Receipt, lane: str, host_name: str, program: str | None,
               deferred: bool = False) -> Iterator[Lease | None]:
    """Hold the lease of (lane, host[, program]) on the host's login host for the body.

    The receipt gets its id now (the holder record names it) and a ``lease``
    record: where, argv, the holder, when it was acquired and released.

    *deferred* (a lane that opens its first call itself, see
    :mod:`vq_admin.lanes.first_call`): when the agent's words can be sent before
    the login shell is known, the lease is not taken here but left in
    ``ctx.lease`` for the body to take with :meth:`Lease.open_session` before
    it runs anything on a host; it is released here all the same.
    """
    host = ctx.config.hosts.get(host_name)
    if host is None:  # the lane's own checks name the problem
        yield None
        return
    if receipt.id is None:
        receipt.id = ctx.state.new_receipt_id(receipt.lane, receipt.host, receipt.program)
    argv = lease_argv(host.agent, host.scratch_root, lane, host_name, program, receipt.id, receipt.started_at)
    lease = Lease(ctx.login(host), argv)
    receipt.lease = lease.record
    if lane == "helper":  # the agent is what that lane replaces: judged from stat before it runs at all
        from .lanes.stat_paths import check_agent_before_lease

        check_agent_before_lease(lease.transport, host_name, host.agent, lease.record)
    if deferred and (not isinstance(lease.transport, SshTransport) or literal_words(host.agent)):
        ctx.lease = lease
        try:
            yield lease
        finally:
            ctx.lease = None
            lease.release()
        return
    try:
        lease.acquire()
    except AgentWithoutLease as exc:
        lease.release()
        if lane != "helper":
            raise
        # The helper lane is how an older agent gets the lease verb: it runs without one, and says so.
        lease.record["note"] = exc.message.replace("; nothing was run", "; this helper update runs without a lease")
        receipt.notes.append(lease.record["note"])
        ctx.narrate(lease.record["note"])
        yield None
        return
    except BaseException:
        lease.release()
        raise
    ctx.narrate(f"holding the host-side lease {lease.record.get('lock')} on {lease.where}")
    try:
        yield lease
    finally:
        lease.release()
