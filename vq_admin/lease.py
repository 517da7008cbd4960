"""The host-side lease: one run per lane on the login host, whatever driver runs it.

The driver-side lane lock (:mod:`vq_admin.state.locks`) keeps two runs of one
state directory apart.  The lease keeps every driver apart: a
``vq-admin-agent lease`` process on the login host takes a kernel lock
(``flock``) and holds it until its stdin closes.  The driver starts it over
the run's shared ssh connection (ControlMaster), or as a child process for
``transport = "local"``, in its own session (a terminal's Ctrl-C reaches the
driver, which then ends the run and closes the lease).  The driver is the
only writer of the pipe into that process, so the lease ends when the run
ends, however it ends: normal exit, exception, SIGKILL of the driver, a
dropped connection.

The lease belongs to the login host's account and the program (the agent
keeps it in its own state directory there, :mod:`vq_admin.agent.lease`), and
what a run leaves running there (a detached build, an allocation job) holds
it too until it ends, so a driver's death frees only its own session.

Taking it does not wait unless the run was given ``--wait-lock`` or another
host of its own fleet rollout holds it (:mod:`vq_admin.lockwait`): a held
lease is exit 75 naming, in one short line, what holds it on the login host
(another run, or the build or job an earlier run left running, with its
pid), then the details (the run that started it and whether that run's
session is still there, what a rerun does); an unsafe lease directory or a
filesystem where ``flock`` does not work is exit 77 with the agent's reason;
an agent of another session protocol is exit 77 naming the command that
updates the helper; a host that cannot be reached (its name not resolved, the
connection refused, authentication failed: the agent never answered) is
``failed`` (exit 1), saying that nothing was changed: nothing ran there.
"""

from __future__ import annotations

import getpass
import os
import select
import socket
import tempfile
import time
from contextlib import contextmanager, suppress
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, NoReturn, TypeVar, cast

from .agent import TOO_OLD
from .core import exits, protocol
from .core.agentjudge import SAID_WHAT_RAN
from .core.failpoints import failpoint
from .document import Document, DocumentError, JsonObject, JsonValue
from .lockwait import Holder, LockWait
from .report.outcome import READ_ONLY_RAN, Locked, Outcome, Refused, VqAdminError
from .report.sections import LeaseRecord
from .ssh import process
from .core.stamps import utc_now
from .ssh.early_session import session_command, take
from .ssh.transport import (SHELL_PROBE_EXPECTED, SSH_TRANSPORT_EXIT, SshTransport, Transport,
                            describe_interruption, literal_words)

if TYPE_CHECKING:
    from .ssh.process import LongLived
    from .context import RunContext
    from .report.receipt import Receipt

#: How long to wait for the lease's answer (covers ssh connection setup); the verify of the first call
#: has its own bound, the profile's verify_timeout_seconds, on top of it.
LEASE_WAIT = 30.0
#: How long to wait for the agent to end after its stdin closed.
RELEASE_TIMEOUT = 15.0
#: How long the run's connection master may stay once its session has ended: longer, it only
#: carries channels of ssh clients that are gone (a follow whose driver was interrupted while the
#: remote side still runs), and the run would wait for a build it has left running.
MASTER_LINGER = 2.0
_T = TypeVar("_T")
_D = TypeVar("_D", bound=Document)


class LeaseReply(Document, frozen=True, kw_only=True):
    """The agent's answer to ``lease`` (or a session's ``lease`` member, or what ``verify-readback
    --lease-of`` peeked at): held, or what holds it and why not (``exit``: 75 held, 4 unsafe, 2 a bad
    request, 1 any other reason, with ``error``)."""

    held: bool = False
    lock: str | None = None
    holder: JsonObject | None = None  #: the holder's record, as the agent wrote it (receipts keep it so)
    message: str | None = None
    exit: int | None = None
    error: str | None = None


class ShellReply(Document, frozen=True, kw_only=True):
    """The session's judgement of the login shell (its ``shell`` member): POSIX, or what the probe gave."""

    posix: bool = False
    shell: str | None = None
    stdout: str = ""
    stderr: str | None = None
    exit_code: int | None = None
    error: str | None = None


def member_as(kind: type[_D], value: object) -> _D:
    """*value* (a member of the agent's answer) as *kind*; one that is not one says nothing (an empty
    *kind*: the exit status and stderr then say why)."""
    try:
        return kind.from_value(value, f"the agent's {kind.__name__}")
    except DocumentError:
        return kind()


class LeaseUnreachable(VqAdminError):
    """The login host could not be reached to take the lease; nothing ran there, so nothing was changed:
    ``failed`` (exit 1), never ``unknown`` (CONTRACT section 15)."""

    outcome = Outcome.FAILED


class OtherProtocol(Refused):
    """The login host's agent speaks another session protocol (exit 77, except in the helper lane)."""


class AgentMissing(Refused):
    """The agent's words cannot be run on the login host (no such file: exit 127); the agent did not run."""


#: How :class:`AgentMissing` ends: the agent's words could not be run, whatever ran before them.
AGENT_NOT_RUN = "the agent was not run"


def _nothing_ran(error: str) -> str:
    """What a refusal after the agent's words were started adds: nothing when the agent judge already
    said what ran (:mod:`vq_admin.core.agentjudge`), else that only read-only checks ran."""
    return "" if any(said in error for said in SAID_WHAT_RAN) else f"; {READ_ONLY_RAN}"


def _transport_lost(code: int | None) -> bool:
    """*code* is the transport's (ssh's 255, a signal, or no status at all), not the agent's."""
    return code is None or code < 0 or code == SSH_TRANSPORT_EXIT


def _last_line(error: str) -> str:
    return error.splitlines()[-1] if error else "no message"


def _agent_cannot_run(code: int | None, error: str, where: str, agent: str) -> None:
    """Raise what an agent that never ran its verb means: an interpreter older than 3.8 (the
    agent's one line, :data:`vq_admin.agent.TOO_OLD`) or no agent at all."""
    too_old = next((line for line in error.splitlines() if line.startswith(TOO_OLD)), None)
    if code == exits.REFUSED and too_old is not None:
        raise Refused(too_old)
    if code == 127:
        raise AgentMissing(f"the agent {agent} cannot be run on {where} (exit 127: {_last_line(error)}); "
                           f"{AGENT_NOT_RUN}")


def lease_argv(agent: tuple[str, ...] | list[str], lane: str, host: str, program: str | None, run_id: str,
               since: str, record_after: int | None = None) -> list[str]:
    return protocol.lease(agent, lane=lane, host=host, program=program,
                          driver_host=socket.gethostname(), user=_user(), pid=os.getpid(), since=since,
                          run_id=run_id, record_after=record_after)


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
        #: the receipt's ``lease`` section (:attr:`receipt` shows each change of it)
        self.record = LeaseRecord(where=self.where, argv=argv, held=False)
        self.receipt: Receipt | None = None
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        self._buffer = b""
        self._waited_out = False
        #: the host's record after this driver's cursor, as the agent answered it with the lease (CONTRACT
        #: section 12); ``None`` until then, or from an agent that keeps no record
        self.host_record: JsonValue = None
        #: how a held lease is waited for (:mod:`vq_admin.lockwait`): by default only a sibling's
        self.waiter = LockWait(None)

    def acquire(self) -> None:
        """Take the lease (``vq-admin-agent lease``, its answer waited for :attr:`lease_wait` seconds, as the
        session's); a held one is waited for as :attr:`waiter` allows."""
        self._waited(self._acquire)

    def update(self, **changes: Any) -> None:
        """Change :attr:`record`, and the receipt's ``lease`` section with it."""
        self.record = self.record.replace(**changes)
        if self.receipt is not None:
            self.receipt.lease = self.record

    def _waited(self, attempt: Callable[[], _T]) -> _T:
        try:
            return self.waiter.run(attempt, lambda: member_as(Holder, self.record.holder))  # the last one found
        finally:
            waited = self.waiter.record()
            if waited is not None:
                self.update(waited=waited)

    def _acquire(self) -> None:
        # The first contact with an ssh host proves its login shell parses our quoting (77 otherwise).
        if isinstance(self.transport, SshTransport) and not self.transport.shell_checked:
            failed = self.transport.check_login_shell()
            if failed is not None:
                raise LeaseUnreachable(f"cannot take the host-side lease: {failed.describe()}; "
                                       "this run changed nothing")
        full = self.transport.wrap(self.argv, {})
        started = time.monotonic()
        try:
            self.proc = process.spawn(full, stderr=self._stderr)
        except OSError as exc:
            raise LeaseUnreachable(f"lease: cannot start {full[0]}: {exc.strerror}; nothing was run") from None
        line = self._read_line(self.lease_wait)
        self.update(seconds=round(time.monotonic() - started, 3))
        answer = _parse(protocol.LEASE, line)
        reply = member_as(LeaseReply, answer)
        if reply.held:
            self._held(reply)
            self.host_record = answer.get("record")
            return
        code = self._end(RELEASE_TIMEOUT)
        self.proc = None
        self._refuse(reply, code, self._error_text())

    def _held(self, reply: LeaseReply) -> None:
        self.update(held=True, lock=reply.lock, holder=reply.holder, acquired_at=utc_now())

    def _refuse(self, reply: LeaseReply, code: int | None, error: str) -> NoReturn:
        """Raise what a lease not held (*reply*) means: 75 held, 77 unsafe or not takeable, 3 unreachable."""
        self.update(exit_code=code, holder=reply.holder)
        if code == exits.EXIT_HELD:
            raise Locked(held_message(f"the host-side lease of {self._what()} on {self.where}", reply))
        if code in (exits.EXIT_UNSAFE, exits.EXIT_FAILED):
            raise Refused(f"cannot take the host-side lease on {self.where}: {error or f'agent exit {code}'}"
                          f"{_nothing_ran(error)}")
        if _transport_lost(code):
            raise LeaseUnreachable(f"cannot take the host-side lease: ssh to {self.where} failed "
                                   f"(exit {code}): {_last_line(error)}; this run changed nothing")
        _agent_cannot_run(code, error, self.where, self.argv[0])
        raise Refused(f"cannot take the host-side lease on {self.where}: the agent exited {code}: "
                      f"{error or 'no message'}{_nothing_ran(error)}")

    def open_session(self, request: protocol.SessionRequest, verify_timeout: float | None = None) -> JsonObject:
        """:meth:`_open_session`; a held lease is waited for as :attr:`waiter` allows (a new session each time)."""
        return self._waited(lambda: self._open_session(request, verify_timeout))

    def _open_session(self, request: protocol.SessionRequest, verify_timeout: float | None = None) -> JsonObject:
        """Take the lease and do *request*'s other parts in one agent start (``vq-admin-agent session``).

        Over ssh this process is the run's connection master (``ControlMaster=yes``, no
        ControlPersist): later calls of the run multiplex over it, and it ends when the lease
        is released.  The command line is the agent's words and ``session`` (each a
        :func:`~vq_admin.ssh.transport.literal_words` word, so any login shell runs it as is) and, on
        first contact, ``--probe`` and the login-shell probe's words quoted for a POSIX shell (the
        agent judges what reached it, so the shell sshd runs for this session is the one judged);
        the request goes on stdin.  The lease's answer line is waited for :data:`LEASE_WAIT`
        seconds, the rest (the verify bounded by *verify_timeout* on the host) that much longer.
        Returns the agent's answer with the lease held (``answer["lease"]``); a transport lost
        before or after the agent answered is ``answer["interrupted"]`` (text), with no lease held, and
        ``answer["unreached"]`` when not a word came from the agent (nothing ran on the host).
        Raises as :meth:`acquire` does for a lease not held, :class:`OtherProtocol` for an agent
        of another version, and :class:`Refused` for a login shell that is not POSIX.
        """
        ssh = self.transport if isinstance(self.transport, SshTransport) else None
        request = {**request, "protocol": protocol.SESSION_PROTOCOL}
        full = self._session_argv(ssh, request)
        fault = failpoint("call", self.where, *self.record.argv)
        if fault == "drop-before":
            return dict(self._interrupted(SSH_TRANSPORT_EXIT, "vq-admin test fault: connection dropped before the "
                                                              "command ran"), unreached=True)
        started = time.monotonic()
        self._start_session(ssh, full, request)
        first = _parse(protocol.SESSION, self._read_line(self.lease_wait))
        reply = member_as(LeaseReply, first.get(protocol.LEASE))
        if first.get("protocol") == protocol.SESSION_PROTOCOL and reply.held and fault is None:
            self._held(reply)
            if ssh is not None:
                ssh.shell_checked = True
            wait = self.lease_wait + (verify_timeout or 0.0)
            rest = self._read_line(wait)
            self.update(seconds=round(time.monotonic() - started, 3))
            answer = dict(first, **_parse(protocol.SESSION, rest))
            self.host_record = answer.get("record")
            if rest:
                return answer
            if self._waited_out:  # the lease was taken, the rest of the answer never came
                bound = f" (its verify is bounded at {verify_timeout:g} s)" if verify_timeout else ""
                return dict(answer, interrupted=f"the agent on {self.where} took the lease but its answer did not "
                                                f"arrive within {wait:g} s{bound}")
            assert self.proc is not None
            return dict(answer, **self._interrupted(self.proc.poll(), "the connection ended after the lease was "
                                                    "taken, before the rest of the answer"))
        self.update(seconds=round(time.monotonic() - started, 3))
        return self._not_held(ssh, first, fault)

    def append(self, statement: bytes, sig: bytes | None) -> protocol.AppendAnswer:
        """Append the run's entry to the host's record through the held lease (one line on the agent's
        stdin, CONTRACT section 12): the agent's answer (``appended`` or ``append_error``, checked as
        ``record-quarantine``'s), ``{}`` when none (or none of that shape) came within :data:`LEASE_WAIT` seconds."""
        if self.proc is None or self.proc.stdin is None or not self.record.held:
            return {"append_error": "the host-side lease is not held"}
        line = {"append": {"statement": statement.decode(), "sig": None if sig is None else sig.decode()}}
        try:
            self.proc.stdin.write(protocol.encode_request(line))
            self.proc.stdin.flush()
        except OSError as exc:
            return {"append_error": f"the session ended before the entry was sent: {exc.strerror or exc}"}
        try:
            return protocol.parse_record_quarantine(self._read_line(self.lease_wait))
        except protocol.ProtocolError:
            return {}

    def take_record(self, ctx: RunContext, receipt: Receipt, host: str, program: str | None) -> None:
        """Import the entries of the host's record the agent answered with the lease (each judged once) into
        this driver's view: the receipt's ``record``."""
        from .record import view

        receipt.record = view.take(ctx.config, ctx.state, host, program, self.host_record)

    @property
    def lease_wait(self) -> float:
        """:data:`LEASE_WAIT`, or a test's shorter one (failpoint ``lease-wait``)."""
        return max(1.0, min(60.0, float(failpoint("lease-wait") or LEASE_WAIT)))

    def _session_argv(self, ssh: SshTransport | None, request: protocol.SessionRequest) -> list[str]:
        """The ``session`` command line (with the login-shell probe's words on first contact)."""
        argv = protocol.session(protocol.agent_words(self.argv, protocol.LEASE))
        self.update(argv=argv)
        if ssh is None:
            return self.transport.wrap(argv, {})
        if not ssh.shell_checked:
            request["shell_probe"] = {"argv": True, "expected": SHELL_PROBE_EXPECTED.decode()}
            return session_command(ssh, argv)
        return ssh.master_wrap(argv)

    def _start_session(self, ssh: SshTransport | None, full: list[str], request: protocol.SessionRequest) -> None:
        """Start the session (or adopt the one started early, :mod:`vq_admin.ssh.early_session`) and send *request*."""
        early = take(ssh, full[-1]) if ssh is not None else None
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

    def _interrupted(self, code: int | None, why: str) -> JsonObject:
        return {"interrupted": f"{describe_interruption(self.where, code)}: {why}"}

    def _not_held(self, ssh: SshTransport | None, first: JsonObject, fault: str | None) -> JsonObject:
        """The session ended without holding the lease: say why (an interruption is returned, the rest raised)."""
        waited_out = self._waited_out
        code = self._end(RELEASE_TIMEOUT)
        self.proc = None
        error = self._error_text()
        if fault is not None:
            return self._interrupted(SSH_TRANSPORT_EXIT, f"vq-admin test fault: {fault}")
        if not first:
            return self._no_answer(ssh, code, error, waited_out)
        if first.get("protocol") != protocol.SESSION_PROTOCOL:
            self._other_protocol(first.get("protocol"))
        if ssh is not None:
            judged = first.get("shell")  # absent: the agent had no login shell to judge
            shell = member_as(ShellReply, judged) if judged is not None else None
            if shell is not None and not shell.posix:
                ssh.refuse_shell(shell.stdout.encode("utf-8", "surrogateescape"), shell.exit_code,
                                 f"login shell {shell.shell}: {shell.stderr or shell.error or ''}")
            ssh.shell_checked = True
        reply = member_as(LeaseReply, first.get(protocol.LEASE))
        self._refuse(reply, code if reply.exit is None else reply.exit,
                     (reply.error or error).replace("vq-admin-agent: ", ""))

    def _no_answer(self, ssh: SshTransport | None, code: int | None, error: str, waited_out: bool) -> JsonObject:
        """Not a word from the agent: an interruption when the host was not reached (or the session ended
        before the agent began, so nothing ran there), else raised: why the agent did not run its verb."""
        if waited_out:
            return {"interrupted": f"the agent on {self.where} did not answer within {self.lease_wait:g} s "
                                   "while taking the host-side lease"}
        if protocol.lacks_verb(protocol.SESSION, code, b"", error):
            self._other_protocol(None)
        if not _transport_lost(code):
            if ssh is not None and not ssh.shell_checked:
                # No answer at all (the login shell could not even run the agent's words?): the
                # separate probe tells a login shell that is not POSIX (77) from a broken agent.
                ssh.check_login_shell()
            _agent_cannot_run(code, error, self.where, self.argv[0])
            raise Refused(f"cannot take the host-side lease on {self.where}: the agent's session exited "
                          f"{code}: {error or 'no answer'}{_nothing_ran(error)}")
        return dict(self._interrupted(code, _last_line(error)), unreached=True)

    def _other_protocol(self, theirs: JsonValue) -> NoReturn:
        host = self.option(protocol.HOST)
        raise OtherProtocol(f"the agent on {self.where} ({self.argv[0]}) speaks session protocol "
                            f"{theirs if theirs is not None else 'none (an older helper)'}, this vq-admin "
                            f"{protocol.SESSION_PROTOCOL}; update the helper first (vq admin update {host} "
                            f"--expected-sha SHA); {READ_ONLY_RAN}")

    def release(self) -> None:
        """End the agent (the receipt holding :attr:`record` is stored before and never changes after)."""
        if self.proc is None:
            return
        self._end(RELEASE_TIMEOUT, linger=MASTER_LINGER)
        self.proc = None
        self._stderr.close()

    # -- internals ------------------------------------------------------------------

    def option(self, name: str) -> str | None:
        """The value of the lease argv's option *name* (``protocol.HOST``...), ``None`` without it."""
        return self.argv[self.argv.index(name) + 1] if name in self.argv else None

    def _what(self) -> str:
        program = self.option(protocol.PROGRAM)
        return f"{self.option(protocol.LANE)} {self.option(protocol.HOST)}" + (f" {program}" if program else "")

    def _read_line(self, timeout: float) -> str:
        """The agent's next answer line, waiting at most *timeout* seconds ("" when none came)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            chunk = self._chunk(deadline)
            if chunk is None:
                self._waited_out = True
            if not chunk:
                break
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace")

    def _chunk(self, deadline: float) -> bytes | None:
        """What the agent's stdout has (``b""`` at its end), or ``None`` when nothing came by *deadline*."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        return os.read(fd, 65536)

    def _end(self, timeout: float, linger: float | None = None) -> int | None:
        """Close the agent's stdin and wait for the process (ssh or the agent) to end, at most
        *timeout*.  With *linger*: wait (at most *timeout*) for the agent's own session to end
        (its stdout closes: the lease is released on the host), then at most *linger* for the
        process, which as the run's connection master may still carry channels of interrupted
        ssh clients; it is ended then, as after *timeout*."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None  # process.spawn's pipes
        with suppress(OSError):
            proc.stdin.close()
        with suppress(OSError):
            if linger is not None:
                self._drain(timeout)
            proc.stdout.close()
        return process.end(proc, timeout if linger is None else linger)

    def _drain(self, timeout: float) -> None:
        """Read the agent's stdout until it closes, at most *timeout* seconds (not line by line: a login
        shell's logout files may print an empty line after the agent's last)."""
        deadline = time.monotonic() + timeout
        while self._chunk(deadline):
            pass

    def _error_text(self) -> str:
        try:
            self._stderr.seek(0)
            text = self._stderr.read(8192).decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
        return "\n".join(line.removeprefix("vq-admin-agent: ") for line in text.splitlines())


def held_message(lease: str, answer: LeaseReply) -> str:
    """Why *lease* was not taken: one short line (who holds it; only read-only checks ran), then the agent's
    details, what a rerun does now and how to wait for it."""
    holder = member_as(Holder, answer.holder)
    details = answer.message or "holder not recorded"
    if holder.kind == "job":
        who = f"the allocation job {holder.job_id or '(id not yet recorded)'} an earlier run submitted"
        rerun = "a rerun is 75 until the job ends (or waits for it with --wait-lock SECONDS)"
    elif holder.kind == "build":
        who = f"the build pid {holder.pid} an earlier run left running"
        rerun = "a rerun is 75 until the build ends (or waits for it with --wait-lock SECONDS)"
    elif holder.pid is not None:
        who = f"another run ({holder.user}@{holder.driver_host} pid {holder.pid})"
        rerun = "rerun once it has ended, or wait for it with --wait-lock SECONDS"
    else:
        pids = ", ".join(f"pid {h.pid}" for h in holder.lock_holders or ()) or "a process"
        who, rerun = f"{pids} whose holder record is missing", "rerun in a moment, or wait with --wait-lock SECONDS"
    return f"{lease} is held by {who}; {READ_ONLY_RAN}\n{details}; {rerun}"


def _parse(verb: str, line: str) -> JsonObject:
    """The agent's answer line to *verb* (``lease`` or ``session``); empty when there is none or it is
    not one (the exit status and stderr then say why)."""
    try:  # the parser read it as JSON (bounded) and checked its members' types: a JSON object
        return cast(JsonObject, dict(protocol.PARSERS[verb](line))) if line else {}
    except protocol.ProtocolError:
        return {}


def plan_lease(ctx: RunContext, receipt: Receipt, lane: str, host_name: str, program: str | None) -> None:
    """For ``--dry-run``: the lease command that would run, where (nothing runs)."""
    host = ctx.config.hosts.get(host_name)
    if host is not None:
        argv = lease_argv(host.agent, lane, host_name, program, "<run id>", receipt.started_at)
        receipt.lease = LeaseRecord(where=ctx.login(host).where, argv=argv, status="planned")


@contextmanager
def host_lease(ctx: RunContext, receipt: Receipt, lane: str, host_name: str, program: str | None,
               deferred: bool = False, waiter: LockWait | None = None) -> Iterator[Lease | None]:
    """Hold the lease of (lane, host[, program]) on the host's login host for the body.

    The receipt gets its id now (the holder record names it) and a ``lease``
    record: where, argv, the holder, when it was acquired.

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
    from .record import view

    after = view.cursor(ctx.state, host_name, program)
    argv = lease_argv(host.agent, lane, host_name, program, receipt.id, receipt.started_at, after)
    lease = Lease(ctx.login(host), argv)
    lease.waiter = waiter or lease.waiter
    lease.receipt, receipt.lease = receipt, lease.record
    if lane == "helper":  # the agent is what that lane replaces: judged from stat before it runs at all
        from .lanes.command_files_stat import check_agent_before_lease

        check_agent_before_lease(lease.transport, host_name, host.agent,
                                 lambda checked: lease.update(agent_checked=checked))
    try:
        ctx.held_lease = lease
        if deferred and (not isinstance(lease.transport, SshTransport) or literal_words(host.agent)):
            ctx.lease = lease
        else:
            lease.acquire()
            ctx.narrate(f"holding the host-side lease {lease.record.lock} on {lease.where}")
            lease.take_record(ctx, receipt, host_name, program)
        yield lease
    finally:
        ctx.lease = ctx.held_lease = None
        lease.release()
