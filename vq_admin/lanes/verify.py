"""Runtime verification on the login host: the provider's verify receipt,
every check of CONTRACT section 4, and vq-admin's own read-back of the
launcher's SHA-256.  Used before a build ("already current?"), after it, and
as the read-back that resolves an interrupted transport.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vq_admin_hookspecs import RuntimeRequest, Slot, VerifyReceipt

from ..core import protocol
from ..core.failpoints import failpoint
from ..document import Document, JsonObject
from msgspec import UNSET, UnsetType
from ..config import HostConfig, RuntimeProfile
from ..context import RunContext
from ..lease import LeaseReply, member_as
from ..evidence import Check, all_ok, parse_receipt, readback_check, receipt_checks
from ..report.output import last_line
from ..plan import Plan, Step, execute, fill, refuse_unsafe_command
from ..ssh.transport import RunResult, quote_argv


class OutputExcerpt(Document, frozen=True, kw_only=True):
    """The verifier's output that is not a receipt, bounded and escaped for the receipt."""

    bytes: int
    truncated: bool
    excerpt: str
    parse_error: str | None


class VerifyFound(Document, frozen=True, kw_only=True):
    """A verification as receipts and the verify document carry it (``verify.pre``, ``hosts.H.P.verify``)."""

    step: str
    proven: bool
    receipt: VerifyReceipt | None
    checks: list[Check]
    error: str | None
    interrupted: bool
    output: OutputExcerpt | UnsetType = UNSET  #: the verifier's output, when it is not a receipt


@dataclass
class Verification:
    step: str
    receipt: VerifyReceipt | None = None
    checks: list[Check] = field(default_factory=list)
    error: str | None = None
    interrupted: bool = False
    #: set when the verifier printed something that is not one valid receipt (bounded, escaped)
    not_receipt: OutputExcerpt | None = None
    #: one line, when the verify itself failed: it could not start, exited non-zero, printed nothing or no
    #: receipt (naming the command and its exit status)
    broken: str | None = None
    #: who holds the lane's lease on the login host now (asked by ``vq admin verify``, which takes none)
    lease: LeaseReply | None = None
    #: the host's record after this driver's cursor (asked by ``vq admin verify`` with the lease), unread:
    #: :func:`vq_admin.record.view.take` reads it
    record: object = None

    def _judged(self) -> bool:
        """The verify answered with a receipt, and its checks were judged."""
        return not self.interrupted and self.error is None and self.receipt is not None

    @property
    def proven(self) -> bool:
        return self._judged() and all_ok(self.checks)

    def proven_but_label(self) -> bool:
        """Every check passed but the tag's: the requested SHA is active and verified under another
        label (CONTRACT section 15: the SHA is the identity, a tag a label)."""
        return self._judged() and bool(self.checks) and all(c.ok for c in self.checks if c.name != "tag")

    def failed_checks(self) -> list[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if not c.ok]

    def why(self) -> str:
        """Why it proves nothing: the error, else each failed check."""
        return self.error or "; ".join(self.failed_checks()) or "not proven"

    def document(self) -> VerifyFound:
        return VerifyFound(step=self.step, proven=self.proven, receipt=self.receipt, checks=self.checks,
                           error=self.error, interrupted=self.interrupted, output=self.not_receipt or UNSET)

    def to_dict(self) -> JsonObject:
        return self.document().to_value()


#: The launcher the verify receipt names, read back: known only once the receipt is read.
ACTIVE_PATH = Slot("active_path")


def plan_verify(ctx: RunContext, plan: Plan, name: str, host: HostConfig, profile: RuntimeProfile,
                request: RuntimeRequest, *, peek_lease: bool = False) -> tuple[Step, Step]:
    """Add the verify step and its hash read-back step to *plan*.

    Both run in one agent call on the login host (``vq-admin-agent
    verify-readback -- <verify argv>``): one ssh round trip per verify.  With *peek_lease* (a
    verify that takes no lease) the agent also says who holds the program's lease now.
    """
    command = ctx.providers.runtime_verify(profile.provider, request)
    where = ctx.login(host).where
    lease_of, after = None, None
    if peek_lease:
        from ..record.view import cursor

        lease_of, after = profile.program, cursor(ctx.state, host.name, profile.program)
    verify = plan.add(name, where, protocol.verify_readback(host.agent, command.argv, lease_of, after),
                      "read-only verify receipt on the login host (the agent runs the provider's verify)",
                      dict(command.env))
    readback = plan.add(f"{name}-readback", where, protocol.hash_file(host.agent, ACTIVE_PATH),
                        f"SHA-256 of the receipt's launcher, read back on the login host (in the {name} agent call)")
    return verify, readback


READBACK_VERIFY = "readback-verify"


def plan_readback_verify(plan: Plan, post: tuple[Step, Step]) -> None:
    """Plan, for when it is needed, the fresh read-only verify that resolves an interrupted deploy
    or verify (``readback-verify`` and its hash read-back): copies of the *post* verify's steps,
    so the provider's verify hook is asked once."""
    verify, readback = post
    plan.add_when_needed(READBACK_VERIFY, verify.where, verify.planned_argv,
                         "after an interrupted deploy or verify: a fresh read-only verify decides", dict(verify.env))
    plan.add_when_needed(f"{READBACK_VERIFY}-readback", readback.where, readback.planned_argv,
                         f"SHA-256 of the receipt's launcher, read back on the login host (in the {READBACK_VERIFY} "
                         "agent call)", dict(readback.env))


def readback_verify_steps(plan: Plan) -> tuple[Step, Step]:
    """The planned ``readback-verify`` steps, added to the run (see :func:`plan_readback_verify`)."""
    return plan.again(READBACK_VERIFY, READBACK_VERIFY), plan.again(f"{READBACK_VERIFY}-readback",
                                                                    f"{READBACK_VERIFY}-readback")


def run_verify(ctx: RunContext, host: HostConfig, profile: RuntimeProfile, request: RuntimeRequest,
               verify_step: Step, readback_step: Step, *, shared: bool = True) -> Verification:
    """Verify and read back in one agent call; *shared* false runs it over its own
    ssh connection instead of the run's shared one (the already-current check:
    a run that changes nothing never starts a connection master)."""
    login = ctx.login(host)
    if not shared:
        login = login.unshared()
    timeout = profile.verify_timeout_seconds
    verify_argv = protocol.command_words(verify_step.planned_argv, host.agent)
    if verify_argv:
        refuse_unsafe_command(verify_step, login, verify_argv)
    result = execute(verify_step, login, timeout=timeout)
    return judge_verify(request, verify_step, readback_step, result)


def judge_verify(request: RuntimeRequest, verify_step: Step, readback_step: Step, result: RunResult) -> Verification:
    """The verify-readback answer in *result* (run by :func:`run_verify`, or inside the run's first
    agent call, :mod:`.first_call`), judged into a :class:`Verification`."""
    found = Verification(step=verify_step.name)
    if result.interrupted:
        found.interrupted, found.error = True, result.describe()
        readback_step.status = "skipped"
        return found
    answer = _parse_answer(result)
    if isinstance(answer, str):
        verify_step.status, verify_step.detail = "failed", answer
        found.error = answer
        readback_step.status = "skipped"
        return found
    found.lease = None if answer.get("lease") is None else member_as(LeaseReply, answer.get("lease"))
    found.record = answer.get("record")
    code = answer["verify"]["exit_code"]
    verify_step.exit_code = code
    receipt = _judge_receipt(found, verify_step, readback_step, request, protocol.verify_output(answer), code,
                             answer["verify"].get("stderr", ""))
    if receipt is None:
        return found
    failpoint("step-before", readback_step.name)
    hashed = answer.get("readback")
    readback_step.argv = fill(readback_step.planned_argv, {"active_path": receipt.active_path})
    readback_step.seconds = answer.get("readback_seconds") or 0.0  # a float: the parser checked it
    if hashed is None or hashed.get("path") != receipt.active_path:
        data, read_error = None, "the agent read back no launcher for this receipt"
        readback_step.exit_code = None
    else:
        data, read_error = hashed, None
        readback_step.exit_code = answer.get("readback_exit")
        if readback_step.exit_code != 0:
            read_error = hashed.get("error") or f"hash-file exited {readback_step.exit_code}"
    readback_step.status = "ok" if read_error is None else "failed"
    readback_step.detail = read_error
    found.checks.append(readback_check(receipt, data, read_error))
    failpoint("step-after", readback_step.name)
    return found


def _judge_receipt(found: Verification, verify_step: Step, readback_step: Step, request: RuntimeRequest,
                   stdout: bytes, code: int | None, stderr: str) -> VerifyReceipt | None:
    """Parse and check the verify receipt into *found*; the receipt when its launcher is to be read back."""
    receipt, error = parse_receipt(stdout)
    if receipt is None and stdout.strip():
        found.not_receipt = output_excerpt(stdout, error)
    # the verify command: the word after the agent's "verify-readback [options] --"
    argv = verify_step.planned_argv
    command = quote_argv([argv[argv.index(protocol.END, argv.index(protocol.VERIFY_READBACK)) + 1]])
    if code != 0:
        found.error = found.broken = f"verify command {command} exited {code}: {last_line(stderr)}"
    elif not stdout.strip():  # a verifier that says nothing is broken, whatever its exit status
        found.error = found.broken = (f"verify command {command} exited 0 and printed nothing (a verify receipt "
                                      f"on stdout is required; stderr: {last_line(stderr)})")
    elif receipt is None:
        found.error, found.broken = error, f"the verifier's output is not a receipt ({error})"
    if found.broken is not None:
        verify_step.status, verify_step.detail = "failed", found.broken
    if receipt is None:
        readback_step.status = "skipped"
        return None
    found.receipt = receipt
    found.checks = receipt_checks(receipt, request.program, request.expected_sha, request.tag)
    if not receipt.active_path.startswith("/"):
        found.checks.append(readback_check(receipt, None, "active_path is not absolute; not read back"))
        readback_step.status = "skipped"
        return None
    return receipt


def _parse_answer(result: RunResult) -> protocol.VerifyReadback | str:
    """The agent's verify-readback answer, or why there is none."""
    if result.exit_code != 0:
        return f"the agent's {protocol.VERIFY_READBACK} exited {result.exit_code}: {result.error_text()[-500:]}"
    try:
        return protocol.parse_verify_readback(result.stdout)
    except protocol.ProtocolError as exc:
        return str(exc)


#: How much of a verifier's unusable output a receipt keeps.
OUTPUT_EXCERPT = 2048


def output_excerpt(stdout: bytes, error: str | None) -> OutputExcerpt:
    """The verifier's output that is not a receipt, bounded and escaped for the receipt."""
    head = stdout[:OUTPUT_EXCERPT]
    return OutputExcerpt(bytes=len(stdout), truncated=len(stdout) > OUTPUT_EXCERPT,
                         excerpt=head.decode("ascii", "backslashreplace").encode("unicode_escape").decode("ascii")
                         .replace("\\\\x", "\\x"),
                         parse_error=error)
