"""The deploy step on a fixed host (no ``update_allocation``), detached from the connection.

The provider's update (or install) runs on the build host the way an
allocation build runs, with a supervising process in place of the batch
job (see :mod:`vq_admin.agent.detached`)::

    vq-admin-agent detach-run --root SCRATCH --program P --attempt deploy.<UTC>.<hex>
        --timeout TIMEOUT_SECONDS [--env NAME=VALUE]... --archive STAGE/source.tar --archive-sha256 H
        -- PROVIDER ARGV...

The driver chooses the attempt name and records it in the lane's state
(:mod:`.allocation_attempt`, ``"kind": "detached"``) before the call, then
follows the framed stream exactly as it follows an allocation's: the same
transcript copy next to the receipt, the same settle checksums, the same
retention, the same progress line.

A dropped connection, a killed ssh client or a killed driver leave the build
running to its end.  After an interrupted call the driver asks the build
host once (``detach-reconcile``, a one-second wait, never starts anything):
an ended build's exit status and settled transcript are this run's
evidence; a build still running makes this run ``unknown`` unless the
read-only verify already proves the requested identity, and the receipt
says "the build keeps running on HOST under attempt DIR (pid N); the next
run reconciles it".  The next run of the lane reconciles from the record
before it decides anything (75 while the build still runs).

``transport = "local"`` hosts, and hosts without ``scratch_root``, run the
provider attached as before (:func:`applies`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vq_admin_hookspecs import ProviderCommand

from .. import progress
from ..agent import protocol
from ..agent.failpoints import failpoint
from ..agent.allocation import JOB_TAMPERED_EXIT
from ..outcome import Refused, VqAdminError
from ..transport import RunResult, SshTransport
from . import allocation_attempt, allocation_step
from .allocation_stream import StreamCall, TranscriptSink

if TYPE_CHECKING:
    from .runtime import RuntimeUpdate

#: Seconds the reconcile after an interrupted call waits for the build's end (it only looks).
RECONCILE_WAIT = 1.0


def applies(update: RuntimeUpdate) -> bool:
    """A fixed-host build over ssh with a scratch root runs detached."""
    return (update.profile.update_allocation is None and bool(update.host.scratch_root)
            and isinstance(update.build_transport(), SshTransport))


def run_argv(update: RuntimeUpdate, command: ProviderCommand, attempt: str, live: bool = False) -> list[str]:
    """The agent argv of the deploy step (``attempt`` may be the ``<attempt>`` placeholder)."""
    assert update.host.scratch_root
    source = update.source  # the build runs only the archive that was staged and verified (by content)
    return protocol.detach_run(
        update.host.agent, root=update.host.scratch_root, program=update.profile.program, attempt=attempt,
        timeout=allocation_step._seconds(update.profile.timeout_seconds),
        progress=str(progress.POLL_SECONDS) if live else None, archive=f"{update.stage_dir or '<stage>'}/source.tar",
        archive_sha256=(source.archive_sha256 if source is not None else None) or "<archive_sha256>",
        env=command.env, command=command.argv)


def plan(update: RuntimeUpdate, command: ProviderCommand, purpose: str) -> None:
    """Add the ``deploy`` step: the agent on the build host starts the build detached."""
    update.receipt.plan.add("deploy", update.build_transport().where, run_argv(update, command, "<attempt>"),
                            f"{purpose}, detached on the build host (it survives a dropped connection)")


def deploy(update: RuntimeUpdate, command: ProviderCommand) -> RunResult:
    """Run the deploy step; the result's exit_code is the build's exit status."""
    ctx, receipt = update.ctx, update.receipt
    transport = update.build_transport()
    attempt, directory, step, deadline, view, argv = allocation_step.begin(
        update, command, run_argv, f"on {transport.where}, detached",
        {"build_place": update.profile.build_place, "detached": True, "where": transport.where},
        {"pid": None, "exit_code": None})
    failpoint("step-before", "deploy")
    allocation_attempt.record(update, attempt, directory, "detached", transport.where)
    with progress.live(ctx, view):
        call, sinks = allocation_step._call(update, step, argv,
                                            update.profile.timeout_seconds + allocation_step.MARGIN,
                                            view.on_record if view else None, transport=transport)
    receipt.deploy["interrupted"] = call.interrupted or ("unreadable answer" if call.frame_error else None)
    if not call.complete:
        if (call.interrupted is None and call.exit_code in allocation_step.REFUSED_BEFORE_SUBMIT
                and "job" not in call.records):
            allocation_step._discard(sinks)
            allocation_attempt.clear(update)
            update.reclaim(success=False)
            error = Refused if call.exit_code == 4 else VqAdminError  # an unsafe path: a guard refused (77)
            raise error(f"deploy: the helper on {transport.where} refused before starting the build "
                        f"({allocation_step.REFUSED_BEFORE_SUBMIT[call.exit_code]}): {call.stderr.strip()[-500:]}")
        receipt.deploy["interruption"] = call.describe()
        ctx.narrate(f"deploy: {call.describe()}; asking {transport.where} for the detached build's end "
                    "(it is never restarted)")
        call, sinks = allocation_step._reconcile(
            update, attempt, deadline, call, sinks, detached=True, transport=transport,
            wait_for=RECONCILE_WAIT, purpose="establish the detached build's end from its attempt (never starts one)")
    result = _conclude(update, command, call, sinks)
    summary = call.records.get("summary") or {}
    if summary.get("established") or summary.get("timed_out"):
        allocation_attempt.clear(update)  # the build's end is known: nothing for a later run to reconcile
    failpoint("step-after", "deploy")
    return result


def left_running(deploy: dict[str, Any]) -> str:
    """What an interrupted run leaves behind on the build host (said in its receipt)."""
    if deploy.get("fenced"):
        return (f"no build was started on {deploy.get('where')}: the connection dropped before the agent started, "
                f"and the attempt {deploy.get('attempt_dir')} is now fenced so that none can start under it")
    pid = deploy.get("pid") or f"recorded in {deploy.get('attempt_dir')}/build"
    return (f"the build keeps running on {deploy.get('where')} under attempt {deploy.get('attempt_dir')} "
            f"(pid {pid}); the next run reconciles it")


def _conclude(update: RuntimeUpdate, command: ProviderCommand, call: StreamCall,
              sinks: dict[str, TranscriptSink]) -> RunResult:
    deploy = update.receipt.deploy
    where = deploy["where"]
    summary = call.records.get("summary")
    if summary is None:
        allocation_step._discard(sinks)
        return allocation_step._unknown(update, command, call, "the helper's report never arrived",
                                        message=_still_running(deploy, "the helper's report never arrived"))
    for key in ("pid", "exit_code", "exit_signal", "job_state", "established", "timed_out", "cancel",
                "reconciled", "fenced", "notes"):
        if summary.get(key) is not None or key not in deploy:
            deploy[key] = summary.get(key)
    deploy["retention"] = summary.get("retention")
    allocation_step._fill_output(update, summary, call, sinks)
    signal = summary.get("exit_signal")
    if call.complete:  # the step that delivered the report carries the build's exit status
        call.step.exit_code = deploy["exit_code"]
        if summary.get("established") and not signal:
            call.step.status = "ok" if deploy["exit_code"] == 0 else "failed"
        else:
            call.step.status = "interrupted"
            call.step.detail = "; ".join(summary.get("notes") or []) or "the build's end was not established"
    if summary.get("timed_out"):  # the build may have activated before it was ended: only a read-back decides
        cancel = summary.get("cancel") or {}
        return RunResult(list(command.argv), where, None, seconds=call.seconds, interrupted="job", stderr=(
            f"the build on {where} did not finish within timeout_seconds "
            f"({allocation_step._seconds(update.profile.timeout_seconds)} s); vq-admin ended its process group "
            f"({cancel.get('message')}); transcripts in {deploy['log_dir']}").encode())
    if not summary.get("established"):
        why = "; ".join(summary.get("notes") or []) or "the build's end was not established"
        return allocation_step._unknown(update, command, call, why, message=_still_running(deploy, why))
    if summary["exit_code"] == JOB_TAMPERED_EXIT:
        allocation_step.tampered(update, sinks, f"the build on {where}")
    if signal:  # the build did not choose its exit status: read back before deciding
        return RunResult(list(command.argv), where, 128 + int(signal), seconds=call.seconds, interrupted="job",
                         stderr=(f"the build on {where} was ended by signal {signal}; transcripts in "
                                 f"{deploy['log_dir']}").encode())
    return RunResult(list(command.argv), where, int(summary["exit_code"]), seconds=call.seconds)


def _still_running(deploy: dict[str, Any], why: str) -> str:
    first = f"{deploy['interruption']}; " if deploy.get("interruption") else ""
    return f"{first}the build's end is not known yet ({why}): {left_running(deploy)}"


__all__ = ["applies", "deploy", "left_running", "plan", "run_argv"]
