"""The confirmation step of the runtime lane (CONTRACT section 13): a new generation proven by a real batch job.

After the final verify has proved the new SHA active, and before LAST OK or the registry move, the
agent on the login host runs (``confirm-run``, :mod:`vq_admin.agent.confirm`)::

    <confirm_command words> --program P --expected-sha SHA --launcher LAUNCHER

as one Slurm batch job bound by content hash like an allocation build, under a supervisor that
outlives this driver: it waits (bounded by ``confirm_timeout_seconds``, then ``scancel``), judges the
job's end and its ``VQ-DEPLOY-METRIC`` lines against the previous verified generation's, and, when
the job did not pass, re-activates the previous generation with ``activate_command`` on the login
host.  This step reads its verdict, proves a revert by a read-only verify, and records the SHA's
confirmation (:mod:`vq_admin.state.confirmation`).  A driver killed meanwhile leaves the attempt
record (:mod:`.allocation_attempt`, ``"kind": "confirm"``): the next run reconciles it first (75
while it is under way).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

from vq_admin_hookspecs import RuntimeRequest, Slot

from ..agent.allocation import new_attempt_name
from ..core import exits, protocol
from ..document import Document, DocumentError, JsonObject
from ..plan import SlotValue, Step, settled
from ..report import progress
from ..report.outcome import READ_ONLY_RAN, Refused, VqAdminError
from ..report.sections import Accepted, Confirm, ConfirmOutput
from ..ssh.transport import quote_argv
from ..state import confirmation
from . import allocation_attempt
from .allocation_step import refused_before_submit
from .allocation_stream import OnRecord, StreamCall, TranscriptSink, framed_step
from .runtime_step import RuntimeStep

if TYPE_CHECKING:
    from ..config import HostConfig, RuntimeProfile
    from ..plan import Plan
    from ..context import RunContext

ATTEMPT = Slot("attempt")
LAUNCHER = Slot("launcher")
PROGRESS = Slot("progress", many=True)
BASELINE = Slot("baseline", many=True, prefix=f"{protocol.BASELINE}=")
REVERT = Slot("revert", many=True, prefix=f"{protocol.REVERT}=")
STEP, RECONCILE = "confirm", "confirm-reconcile"
#: Seconds the driver allows beyond the job's bound for the revert, settle and streaming.
MARGIN = 900.0


class HealthJob(Document, frozen=True, kw_only=True):
    """``verify --job``'s ``confirm``: the confirmation job's end as the agent's verdict gives it."""

    job_id: str | None = None
    state: str | None = None  #: Slurm's JobState of the job's end
    exit_code: int | None = None
    node: str | None = None
    seconds: float | None = None
    metrics: dict[str, confirmation.Metric] | None = None
    passed: bool | None = None  #: None: the verdict could not be read
    problems: list[str] | None = None


@dataclass(frozen=True)
class Previous:
    """The generation a failed confirmation goes back to."""

    sha: str
    tag: str | None


def unconfirmed_refusal(step: RuntimeStep) -> None:
    """An unconfirmed SHA is never made current again, nor already-current: 77 naming the way past
    (``--retry-confirmation``; ``--accept-regression`` when its only fault was a metric)."""
    ctx, host, program = step.ctx, step.host.name, step.profile.program
    reason = confirmation.unconfirmed(ctx.state, host, program, step.sha)
    if reason is None or ctx.options.retry_confirmation:
        return
    entry = confirmation.read(ctx.state, host, program).get(step.sha)
    metric_only = entry is not None and entry.metric_only
    if ctx.options.accept_regression and metric_only:
        return
    raise Refused(f"unconfirmed: {program} {step.sha} on {host}: {reason}; {READ_ONLY_RAN}; to prove it again: "
                  f"vq admin update {program} {host} --expected-sha {step.sha} --retry-confirmation"
                  + (" (or --accept-regression REASON: its only fault was a metric)" if metric_only else ""))


def confirm_argv(host: HostConfig, profile: RuntimeProfile, sha: str, launcher: str, attempt: str,
                 baseline: list[tuple[str, str]], *, accept_regression: bool,
                 progress_words: Sequence[str] = ()) -> list[str]:
    """The agent's ``confirm-run`` argv of *profile*'s confirmation job, whose command is
    ``<confirm_command words> --program P --expected-sha SHA --launcher L``."""
    c = profile.confirm
    assert c is not None and host.scratch_root
    command = [*c.command, "--program", profile.program, "--expected-sha", sha, "--launcher", launcher]
    return protocol.confirm_run(
        host.agent, root=host.scratch_root, program=profile.program, attempt=attempt,
        timeout=f"{c.timeout_seconds:g}", sbatch_args=c.sbatch_args, metrics=[m.word() for m in c.metrics],
        baseline=baseline, accept_regression=accept_regression, revert=[], command=command,
        progress_words=progress_words)


class Confirmation(RuntimeStep):
    """The ``confirm`` step, built from the lane's inputs."""

    def planned_argv(self) -> list[str]:
        argv = confirm_argv(self.host, self.profile, self.sha, LAUNCHER, ATTEMPT, [],
                            accept_regression=bool(self.ctx.options.accept_regression), progress_words=[PROGRESS])
        end = argv.index(protocol.END)
        return [*argv[:end], BASELINE, REVERT, *argv[end:]]

    def plan(self) -> None:
        where = self.ctx.login(self.host).where
        self.receipt.plan.add(STEP, where, self.planned_argv(),
                              "prove the new generation by a Slurm batch job through its launcher; a failed job "
                              "reverts to the previous generation on the login host (it outlives this run)")
        self.receipt.plan.add_when_needed(RECONCILE, where, protocol.confirm_reconcile(
            self.host.agent, root=self.host.scratch_root or "", program=self.profile.program, attempt=ATTEMPT,
            timeout=Slot("wait_seconds")), "after a dropped confirmation: read its verdict (never submits)")

    def revert_argv(self, previous: Previous | None, request: RuntimeRequest) -> list[str]:
        if previous is None:
            return []
        command = self.ctx.providers.runtime_activate(
            self.profile.provider, replace(request, expected_sha=previous.sha, tag=previous.tag, where="login-host"))
        return list(command.argv) if command is not None else []

    def run(self, launcher: str, previous: Previous | None, request: RuntimeRequest) -> Confirm:
        """Run the planned step to its verdict: the receipt's ``confirm`` (``passed``, ``problems``, the
        job's id, state, exit status, node, seconds, metrics, output) and ``revert`` (what the host ran)."""
        ctx, receipt, c = self.ctx, self.receipt, self.profile.confirm
        assert c is not None
        self.receipt_id()  # the transcript copy lives next to the receipt
        attempt = new_attempt_name()
        directory = self.log_dir(attempt)
        base = confirmation.baseline(ctx.state, self.host.name, self.profile.program,
                                     previous.sha if previous else None)
        view = progress.AllocationView(f"{self.profile.program} confirmation") if progress.enabled(ctx.options.json) \
            else None
        values: dict[str, SlotValue] = {
            "attempt": attempt, "launcher": launcher, "baseline": [f"{k}={v}" for k, v in sorted(base.items())],
            "revert": self.revert_argv(previous, request),
            "progress": protocol.progress_option(str(progress.POLL_SECONDS) if view else None)}
        step = receipt.plan.get(STEP)
        ctx.narrate(f"confirming {self.profile.program} {self.sha} by a batch job through {launcher}: "
                    f"{quote_argv(list(c.command))} (transcripts in {directory})")
        receipt.confirm = Confirm(attempt_dir=directory, job_id=None, state=None)

        def starting() -> None:
            confirmation.record(ctx.state, self.host.name, self.profile.program, self.sha, confirmation.ConfirmEntry(
                status=confirmation.PENDING, receipt=receipt.id, attempt_dir=directory))
            allocation_attempt.record(self, attempt, directory, "confirm", ctx.login(self.host).where)

        deadline = time.monotonic() + c.timeout_seconds
        with progress.live(ctx, view):
            call, sinks = self._call(step, values, c.timeout_seconds + MARGIN, view.on_record if view else None,
                                     starting)
        refused = refused_before_submit(call, "confirm: the helper refused before submitting")
        if refused is not None:
            allocation_attempt.clear(self)
            confirmation.record(ctx.state, self.host.name, self.profile.program, self.sha, confirmation.ConfirmEntry(
                status=confirmation.UNCONFIRMED, reason="the job was not submitted"))
            raise refused
        if not call.complete:
            ctx.narrate(f"confirm: {call.describe()}; reading its verdict from the login host (never resubmitted)")
            wait = max(0.0, deadline - time.monotonic()) + 60.0
            again = receipt.plan.again(RECONCILE, RECONCILE)
            call, sinks = self._call(again, {"attempt": attempt, "wait_seconds": f"{wait:.0f}"}, wait + MARGIN, None,
                                     None)
        return self.conclude(call, sinks, directory)

    def _call(self, step: Step, values: dict[str, SlotValue], timeout: float, on_record: OnRecord | None,
              starting: Callable[[], None] | None) -> tuple[StreamCall, dict[str, TranscriptSink]]:
        receipt, login = self.receipt, self.ctx.login(self.host)

        def observe(kind: str, value: JsonObject) -> None:
            if kind == "job" and value.get("job_id") and receipt.confirm is not None:
                receipt.confirm = receipt.confirm.replace(job_id=str(value["job_id"]))
            if on_record is not None:
                on_record(kind, value)

        call, sinks = framed_step(step, login, values, timeout, self.ctx.state, self.receipt_id(), prefix="confirm-",
                                  on_record=observe, starting=starting)
        settled(step)
        return call, sinks

    def conclude(self, call: StreamCall, sinks: dict[str, TranscriptSink], directory: str) -> Confirm:
        """The receipt's ``confirm`` (as :meth:`run` started it) from the agent's summary, the attempt record
        cleared once the verdict is in; *sinks* are the call's (:func:`framed_step` always fills them)."""
        verdict = call.answered("confirm")
        stored = sinks["stdout"].commit()
        sinks["stderr"].commit()
        output = ConfirmOutput(stdout=sinks["stdout"].text(), stderr=sinks["stderr"].text(), complete=call.complete,
                               log_dir=directory, transcript=str(stored.parent) if stored is not None else None)
        assert self.receipt.confirm is not None  # run() started it
        confirm = self.receipt.confirm.replace(output=output)
        if not isinstance(verdict, dict):
            confirm = confirm.replace(passed=None, problems=[
                f"the confirmation's verdict could not be read ({call.describe()}); it goes on on the login host: "
                "the next run reconciles it"])
            self.receipt.confirm = confirm
            return confirm
        confirm = confirm.replace(**{k: verdict.get(k) for k in (
            "job_id", "state", "exit_code", "job_exit_code", "node", "seconds", "metrics", "passed", "problems",
            "regressed", "timed_out", "cancel", "revert")})
        regressed = verdict.get("regressed")
        if verdict.get("accepted"):  # the agent's list of metric names, as it sent it
            confirm = confirm.replace(accepted=Accepted(reason=self.ctx.options.accept_regression, regressed=[
                str(name) for name in regressed] if isinstance(regressed, list) else None))
        self.receipt.confirm = confirm
        allocation_attempt.clear(self)
        confirmation.record_verdict(self.ctx.state, self.host.name, self.profile.program, self.sha, verdict,
                                    self.receipt.id, self.ctx.options.accept_regression)
        return confirm


def health_job(ctx: RunContext, host: HostConfig, profile: RuntimeProfile, sha: str, launcher: str,
               plan: Plan) -> tuple[HealthJob, bool]:
    """``verify --job``: the confirmation job against the active generation *sha*, read-only (no revert,
    nothing recorded in the state directory), run as the step ``confirm-job`` of *plan*; metrics are judged
    against that generation's own passed confirmation.  Returns the agent's verdict (``passed`` None when
    there is none) and whether a run's work holds the lease."""
    c = profile.confirm
    assert c is not None
    base = confirmation.baseline(ctx.state, host.name, profile.program, sha)
    argv = confirm_argv(host, profile, sha, launcher, new_attempt_name(), sorted(base.items()), accept_regression=False)
    login = ctx.login(host)
    step = plan.add("confirm-job", login.where, argv, "the confirmation job against the active generation "
                    "(read-only: nothing activated or reverted)")
    call = allocation_attempt.read_only_call(step, login, c.timeout_seconds + MARGIN)
    step.status = "ok" if call.complete else ("interrupted" if call.interrupted else "failed")
    settled(step)
    verdict = call.answered("confirm")
    try:
        return HealthJob.from_value(verdict, "the confirmation job's verdict"), False
    except DocumentError as exc:
        why = str(exc) if isinstance(verdict, dict) else f"{call.describe()}: {call.stderr.strip()[-300:]}"
    return HealthJob(problems=[f"the confirmation job gave no verdict ({why})"]), call.exit_code == exits.EXIT_HELD


def ended_message(confirm: Confirm) -> str:
    return "; ".join(confirm.problems or []) or "not passed"


__all__ = ["Confirmation", "Previous", "VqAdminError", "ended_message", "unconfirmed_refusal"]
