"""A lane's first call on its login host: one ssh process, one agent start.

Before anything runs on a host, a runtime update needs four things from its
login host: that its login shell parses commands as a POSIX shell does
(section 10), the host-side lease (section 9), the command-file check of the
words that will run there (section 10) and the read-only pre-verify with its
launcher read-back.  They are one ``vq-admin-agent session`` call
(:mod:`vq_admin.agent.session`): the ssh client that runs it is the run's
connection master, its command line is only the agent's words, ``session``
and, on first contact, the login-shell probe's words, and the rest goes on
stdin as one JSON request.  An already-current run ends there (the agent
releases the lease when its stdin closes); otherwise the session keeps the
lease until the run ends.  The receipt keeps its steps: ``check-commands``
and ``pre-verify`` / ``pre-verify-readback`` are recorded from the one
answer.  The helper lane reads its pre-identity the same way
(:func:`vq_admin.lanes.helper.open_helper`).

An allocation profile, or a run that must first reconcile an interrupted
run's attempt, pre-verifies separately, after that reconcile.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, NoReturn

from ..core import exits, protocol
from ..core.failpoints import failpoint
from ..lease import Lease, LeaseUnreachable
from ..report.outcome import READ_ONLY_RAN, VqAdminError
from ..plan import refuse_unsafe_command
from ..report.sections import Readback
from ..ssh.transport import RunResult, SshTransport
from . import allocation_attempt, command_files as remote_paths
from .conclude import rerun_command
from .verify import Verification, judge_verify

if TYPE_CHECKING:
    from ..context import RunContext
    from ..report.receipt import Receipt
    from .lane import RuntimeLane

PURPOSE = " (in the run's first agent call, vq-admin-agent session)"


def open_runtime(update: "RuntimeLane") -> Verification | None:
    """Take the lease, check the login host's command files and, when the profile builds on a
    fixed host, pre-verify, in one agent call.  Returns the pre-verify when it was done here,
    else ``None`` (the caller runs it); raises as the separate steps would."""
    lease: Lease | None = update.ctx.lease
    if lease is None:  # taken the old way by host_lease (or a dry run)
        remote_paths.run(update)
        return None
    login = update.ctx.login(update.host)
    pre_verify, pre_readback = update.pre
    check_index, check_words = _login_check(update)
    request: protocol.SessionRequest = {
        "lease": lease_request(lease), "record": record_request(update.ctx, update.host.name, update.profile.program)}
    if check_words is not None:  # the planned check-commands step's words, run by the session
        check_step = update.receipt.plan.get(remote_paths.step_name(check_index))
        request["check_paths"] = protocol.command_words(check_step.planned_argv, update.host.agent)
    verify_argv = protocol.command_words(pre_verify.planned_argv, update.host.agent)
    # An attempt an interrupted run left is reconciled before any pre-verify (the build may still run).
    with_verify = (update.profile.update_allocation is None and bool(verify_argv)
                   and not update.receipt.plan.has(allocation_attempt.PREVIOUS))
    timeout = update.profile.verify_timeout_seconds
    if with_verify:
        refuse_unsafe_command(pre_verify, login, verify_argv)  # a local verify: checked by the driver first
        request["verify"] = {"argv": verify_argv, "env": dict(pre_verify.env), "timeout": timeout}
        failpoint("step-before", pre_verify.name)
    started = time.monotonic()
    answer = lease.open_session(request, timeout if with_verify else None)
    seconds = time.monotonic() - started
    interrupted = answer.get("interrupted")
    if interrupted is not None:
        if answer.get("unreached") or not with_verify:
            unreached(update.ctx, update.receipt, str(interrupted))
        pre_verify.argv, pre_verify.status, pre_verify.detail = pre_verify.planned_argv, "interrupted", str(interrupted)
        pre_verify.seconds = seconds
        pre_readback.status = "skipped"
        failpoint("step-after", pre_verify.name)
        return Verification(step=pre_verify.name, error=str(interrupted), interrupted=True)
    update.ctx.narrate(f"holding the host-side lease {lease.record.lock} on {lease.where}")
    lease.take_record(update.ctx, update.receipt, update.host.name, update.profile.program)
    if check_words is not None:
        _record_check(update, check_index, check_words, answer.get("check_paths"), login.where, seconds)
    remote_paths.run(update, done=login.where)  # the build host's own check, when it is another host
    if not with_verify:
        return None
    pre_verify.purpose += PURPOSE
    verify = answer.get("verify")
    ran = verify.get("verify") if isinstance(verify, dict) else None
    if isinstance(ran, dict) and ran.get("timed_out") is not None:
        pre_verify.argv, pre_verify.status, pre_verify.seconds = pre_verify.planned_argv, "failed", seconds
        pre_verify.detail = (f"the verifier did not answer within {timeout:g} s (verify_timeout_seconds); its "
                             f"process group on {login.where} was ended")
        pre_readback.status = "skipped"
        raise VqAdminError(f"{pre_verify.name}: {pre_verify.detail}; {READ_ONLY_RAN}")
    result = RunResult(pre_verify.planned_argv, login.where, 0, json.dumps(verify).encode(), b"", seconds)
    pre_verify.argv, pre_verify.status, pre_verify.exit_code, pre_verify.seconds = \
        pre_verify.planned_argv, "ok", 0, seconds
    found = judge_verify(update.request(archive=None), pre_verify, pre_readback, result)
    failpoint("step-after", pre_verify.name)
    return found


def unreached(ctx: RunContext, receipt: Receipt, interrupted: str) -> NoReturn:
    """The run's first agent call ended before anything that changes a host ran (the host not reached:
    its name not resolved, the connection refused, authentication failed): ``failed`` (1), naming
    what it leaves behind (nothing) and the next command (CONTRACT section 15)."""
    message = f"cannot take the host-side lease: {interrupted}; this run changed nothing"
    receipt.readback = Readback(
        read="nothing (the run's first agent call was interrupted before it answered)",
        proven=False, reason=message, stage="no source stage was created",
        build="no build was started", next_command=rerun_command(ctx, receipt),
        advice="nothing was changed by this run; rerun when the login host is reachable")
    raise LeaseUnreachable(message)


def record_request(ctx: RunContext, host: str, program: str | None) -> protocol.RecordRequest:
    """The session's ``record`` member: the host's record after this driver's cursor (CONTRACT section 12)."""
    from ..record import view

    view.signer(ctx.config.signing)  # [signing]'s paths and ssh-keygen judged before anything runs (77)
    return {"program": program, "after": view.cursor(ctx.state, host, program)}


def lease_request(lease: Lease) -> protocol.LeaseRequest:
    """The session's ``lease`` member: this run, in the words of its lease argv (:func:`vq_admin.lease.lease_argv`
    always gives each but the program)."""
    def word(name: str) -> str:
        return lease.argv[lease.argv.index(name) + 1]

    return {"lane": word(protocol.LANE), "host": word(protocol.HOST), "program": lease.option(protocol.PROGRAM),
            "holder": {"driver_host": word(protocol.DRIVER_HOST), "user": word(protocol.USER),
                       "pid": int(word(protocol.PID)), "since": word(protocol.SINCE), "run_id": word(protocol.RUN_ID)}}


def _login_check(update: "RuntimeLane") -> tuple[int, list[tuple[str, str]] | None]:
    """The index and words of the login host's ``check-commands`` step (ssh only), if it has one."""
    login = update.ctx.login(update.host)
    if not isinstance(login, SshTransport):
        return 0, None
    for index, (transport, words) in enumerate(remote_paths.command_words(update)):
        if transport.where == login.where:
            return index, words
    return 0, None


def _record_check(update: "RuntimeLane", index: int, words: list[tuple[str, str]], answer: Any, where: str,
                  seconds: float) -> None:
    step = update.receipt.plan.get(remote_paths.step_name(index))
    failpoint("step-before", step.name)
    step.argv, step.seconds = step.planned_argv, seconds
    step.purpose += PURPOSE
    refused = answer.get("refused") if isinstance(answer, dict) else None
    if not isinstance(refused, list):  # also when the answer is no object at all
        step.status, step.exit_code = "failed", None
        step.detail = "the agent's session answered no check-paths result"
        raise VqAdminError(f"{step.name}: {step.detail}; no configured command was run")
    if refused:
        step.status, step.exit_code = "failed", exits.EXIT_UNSAFE
        step.detail = "; ".join(str(item.get("problem")) for item in refused if isinstance(item, dict))
        remote_paths.refuse(where, words, refused, step.detail)
    step.status, step.exit_code = "ok", 0
    failpoint("step-after", step.name)
