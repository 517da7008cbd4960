"""The deploy step inside a Slurm allocation (``update_allocation``).

The provider's update (or install) runs as a batch job submitted from the
login host by the scheduler-side helper::

    vq-admin-agent alloc-run --root SCRATCH --program P --attempt deploy.<UTC>.<hex>
        --timeout TIMEOUT_SECONDS [--sbatch-arg=ARG]... [--env NAME=VALUE]... -- PROVIDER ARGV...

The driver chooses the attempt name, so it knows the log directory even if
the connection drops before the agent says anything.  The plan holds this
argv with slots for what only the run knows (the attempt, the stage, the
archive's digest, the progress option); the run fills exactly that argv,
never builds another.  The agent creates the attempt fresh, submits ``sbatch --parsable --wait``
with the configured ``sbatch_args``, reports the job id the moment sbatch
prints it, bounds the wait by ``timeout_seconds`` (cancelling the job at the bound), settles the
transcripts, applies retention and streams the settled transcripts back.

A dropped connection is never a failure and never a resubmission: the
driver runs ``alloc-reconcile`` for the same attempt, which establishes the
recorded job's end (``scontrol``, else the job completion log) and settles
and streams the files that job wrote.  When the end cannot be established
the step reports an interrupted transport, so the lane resolves the outcome
by read-only verification and, failing that, ends ``unknown`` with the job
id and log directory in ``readback``.

The deployment's exit status is the job's, preserved exactly: the agent's
own exit status and ssh's (255 for both a dropped session and an sbatch
usage error) are never taken for it.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

from msgspec import UNSET

from vq_admin_hookspecs import ProviderCommand, Slot
from vq_admin_hookspecs.slots import find_slot

from ..report import progress
from ..core import checksum, exits, protocol
from ..agent.allocation import JOB_TAMPERED_MARK, new_attempt_name
from ..report.outcome import Locked, Refused, VqAdminError
from ..document import JsonObject
from ..report.sections import CommandOutput, Deploy
from ..plan import SlotValue, Step, settled
from ..ssh.transport import RunResult, Transport, quote_argv
from . import allocation_attempt
from .allocation_stream import (Cancel, OnRecord, Sent, Settle, StreamCall, Summary, TranscriptSink, discard,
                                framed_step)
from .runtime_step import RuntimeStep

#: The attempt the run names (``deploy.<UTC>.<hex>``), chosen when the deploy starts.
ATTEMPT = Slot("attempt")
#: The verified archive in this run's stage (the same slot the provider's words hold).
ARCHIVE = Slot("stage", suffix="/source.tar")
#: Its SHA-256, as the stage proved it (the staging steps fill the same slot).
ARCHIVE_SHA256 = Slot("archive_sha256")
#: The agent's progress option: ``--progress 10`` on a terminal, else no word at all.
PROGRESS = Slot("progress", many=True)
#: How long a reconcile waits for the job's end (seconds): what is left of the bound, plus a grace.
WAIT = Slot("wait_seconds")
#: The planned reconcile of a dropped deploy (``deploy-reconcile``, copied as ``deploy-reconcile-N``).
RECONCILE = "deploy-reconcile"

#: Seconds the driver allows beyond timeout_seconds for settle, retention and streaming.
MARGIN = 180.0
#: Seconds a reconcile waits past the original bound, so the agent's own cancel is seen.
CANCEL_GRACE = 30.0
#: Seconds the reconcile after an interrupted detached build waits for the build's end (it only looks).
RECONCILE_WAIT = 1.0
RECONCILE_TRIES = 3
#: Agent exit statuses that mean "refused before anything was submitted".
REFUSED_BEFORE_SUBMIT = {exits.EXIT_USAGE: "usage, or a missing dependency",
                         exits.EXIT_UNSAFE: "an unsafe path was refused",
                         exits.EXIT_HELD: "the lease's work lock is held by an earlier run's build or job"}


def refused_before_submit(call: StreamCall, what: str) -> VqAdminError | None:
    """The error of a *call* whose agent refused before it started anything (one of its statuses, no job):
    77 for an unsafe path, 75 for a held work lock, else 1; ``None`` when it did not refuse."""
    if call.interrupted is not None or call.exit_code not in REFUSED_BEFORE_SUBMIT or "job" in call.records:
        return None
    error = {exits.EXIT_UNSAFE: Refused, exits.EXIT_HELD: Locked}.get(call.exit_code, VqAdminError)
    return error(f"{what} ({REFUSED_BEFORE_SUBMIT[call.exit_code]}): {call.stderr.strip()[-500:]}")


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3f}"


def _placed(argv: list[str], command: ProviderCommand) -> list[str]:
    """*argv* with the slot markers in the agent's ``--env NAME=VALUE`` words (the provider's env
    values, which held the stage slot or another placed one) made slots again; every other slot
    of *argv* is a word of its own already.  Only the agent's words before ``--`` are looked at."""
    marks = {slot.name: Slot(slot.name, label=slot.label)
             for slot in (ARCHIVE, *(value for _, value in command.env if isinstance(value, Slot)))}
    out = list(argv)
    for i in range(1, out.index(protocol.END) if protocol.END in out else len(out)):
        if out[i - 1] == protocol.ENV and not isinstance(out[i], Slot):
            out[i] = find_slot(out[i], list(marks.values())) or out[i]
    return out



#: Slurm end states in which the job did not choose its exit status.
UNCHOSEN_STATES = ("CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")


def ended_without_choosing(summary: Summary) -> str | None:
    """Why the job's exit status is not the deployment's choice, or ``None``.

    A job cancelled, timed out, preempted, killed with its node or by a
    signal (``ExitCode`` ``N:SIG`` with SIG > 0) may have done anything up to
    that moment, including the switch of ``current``.
    """
    state = (summary.job_state or "").split(" ")[0].rstrip("+")
    if state in UNCHOSEN_STATES:
        return f"ended in state {summary.job_state}"
    raw = summary.job_exit_code or ""
    status, _, sig = raw.partition(":")
    if sig.isdigit() and int(sig) > 0:
        return f"was ended by signal {sig} (ExitCode {raw}, state {summary.job_state})"
    return None


class AllocationDeploy(RuntimeStep):
    """The deploy step of a profile with ``update_allocation``, built from the step's inputs."""

    #: The kind of attempt it runs under (:mod:`.allocation_attempt`).
    KIND = "allocation"

    def planned_argv(self, command: ProviderCommand) -> list[str]:
        """The agent argv of the deploy step (``alloc-run``, or ``detach-run`` for a detached build), with
        its slots (:data:`ATTEMPT`, :data:`ARCHIVE`, :data:`ARCHIVE_SHA256`, :data:`PROGRESS`); *command* is
        the planned provider command."""
        allocation = self.profile.update_allocation
        assert self.host.scratch_root
        start = (partial(protocol.alloc_run, sbatch_args=allocation.sbatch_args) if allocation is not None
                 else protocol.detach_run)
        # the job (or build) runs only the archive that was staged and verified (by content, not by path)
        return _placed(start(
            self.host.agent, root=self.host.scratch_root, program=self.profile.program, attempt=ATTEMPT,
            timeout=_seconds(self.profile.timeout_seconds), progress_words=[PROGRESS],
            archive=ARCHIVE, archive_sha256=ARCHIVE_SHA256, env=command.env, command=command.argv), command)

    def run_values(self, attempt: str, live: bool) -> dict[str, SlotValue]:
        """What fills the deploy step's slots: the *attempt*, this run's stage and archive digest, and
        (*live*: stderr is a terminal, not ``--json``) ``--progress 10``, so that the agent reports
        the job's state every 10 s for the live line."""
        values: dict[str, SlotValue] = {
            "attempt": attempt, "progress": protocol.progress_option(str(progress.POLL_SECONDS) if live else None)}
        stage, source = self.stage.dir, self.stage.ident  # None while planning: nothing staged or archived yet
        if stage is not None:
            values["stage"] = stage
        if source is not None and source.archive_sha256:
            values["archive_sha256"] = source.archive_sha256
        return values  # a value missing here is refused by plan.filled before anything runs

    def plan(self, command: ProviderCommand, purpose: str) -> None:
        """Add the ``deploy`` step: the agent on the login host submits the batch job; and, for when
        the connection drops, its reconcile."""
        where = self.ctx.login(self.host).where
        self.receipt.plan.add("deploy", where, self.planned_argv(command),
                              f"{purpose}, as a Slurm batch job (sbatch --wait) submitted from the login host")
        self.plan_reconcile(where, detached=False,
                            purpose="after a dropped deploy: establish the batch job's end by its recorded id "
                                    "(never resubmits)")

    def plan_reconcile(self, where: str, *, detached: bool, purpose: str) -> None:
        """Plan ``deploy-reconcile`` for when it is needed (tried up to :data:`RECONCILE_TRIES` times)."""
        argv = protocol.reconcile(self.host.agent, detached=detached, root=self.host.scratch_root or "",
                                  program=self.profile.program, attempt=ATTEMPT, timeout=WAIT)
        self.receipt.plan.add_when_needed(RECONCILE, where, argv, purpose)

    def deploy(self, command: ProviderCommand) -> RunResult:
        """Run the deploy step; the result's exit_code is the deployment's exit status."""
        login = self.ctx.login(self.host)
        assert self.profile.update_allocation is not None  # deploy() runs only for an allocation profile
        return self.run_attempt(command, login, f"as a batch job from {login.where}", Deploy(
            build_place="allocation", where=login.where, job_id=None, exit_code=None,
            sbatch_args=list(self.profile.update_allocation.sbatch_args)))

    def run_attempt(self, command: ProviderCommand, transport: Transport, how: str, deploy: Deploy) -> RunResult:
        """The deploy step under a fresh attempt (an allocation's, or a detached build's on *transport*).

        Names the receipt (the transcript copy lives next to it) and the attempt, writes the receipt's
        ``deploy`` record (*deploy*, with the attempt and its directory), records the attempt as the
        call starts (a later run reconciles it) and, when the call is cut, asks for the attempt's end
        (never running it again)."""
        ctx, receipt = self.ctx, self.receipt
        self.receipt_id()  # the transcript copy lives next to the receipt
        attempt = new_attempt_name()
        directory = self.log_dir(attempt)
        receipt.deploy = deploy.replace(attempt=attempt, attempt_dir=directory, log_dir=directory)
        step = receipt.plan.get("deploy")
        deadline = time.monotonic() + self.profile.timeout_seconds
        view = progress.AllocationView(self.profile.program) if progress.enabled(ctx.options.json) else None
        values = self.run_values(attempt, live=view is not None)  # checked by execute_stream before anything
        ctx.narrate(f"deploying {self.profile.program} {self.sha} {how}: "
                    f"{quote_argv(command.argv)} (transcripts in {directory})")
        with progress.live(ctx, view):  # the attempt is recorded as the call starts: a later run reconciles it
            call, sinks = self._call(step, values, self.profile.timeout_seconds + MARGIN,
                                     view.on_record if view else None, transport=transport,
                                     starting=lambda: allocation_attempt.record(self, attempt, directory, self.KIND,
                                                                                transport.where))
        receipt.deploy = receipt.deploy.replace(
            interrupted=call.interrupted or ("unreadable answer" if call.frame_error else None))
        if not call.complete:
            call, sinks = self._cut(call, sinks, attempt, deadline, transport)
        result = self._conclude(command, call, sinks)
        summary = call.summary or Summary()  # (a job sbatch did not submit was refused by _conclude)
        if summary.established or summary.timed_out:
            allocation_attempt.clear(self)  # the end is known: nothing for a later run to reconcile
        # the deploy step, and the reconcile that delivered its report, end once the transcripts are in place
        # and the attempt record is current (their ``step-after``)
        settled(step)
        if call.step is not step:  # framed_step gave every call its step
            settled(call.step)
        return result

    def _cut(self, call: StreamCall, sinks: dict[str, TranscriptSink], attempt: str, deadline: float,
             transport: Transport) -> tuple[StreamCall, dict[str, TranscriptSink]]:
        """A call cut before its report: refused before anything started (raised), else the attempt's end,
        asked for by the recorded job id or build (never run again)."""
        ctx, detached = self.ctx, self.KIND == "detached"
        refused = refused_before_submit(call, f"deploy: the helper on {transport.where} refused before "
                                        + ("starting the build" if detached else "submitting"))
        if refused is not None:
            discard(sinks)
            if detached:
                allocation_attempt.clear(self)
            self.stage.reclaim(success=False)
            raise refused
        if detached:
            self.receipt.deploy = self.receipt.deploy.replace(interruption=call.describe())
            ctx.narrate(f"deploy: {call.describe()}; asking {transport.where} for the detached build's end "
                        "(it is never restarted)")
        else:
            ctx.narrate(f"deploy: {call.describe()}; reconciling by the recorded job id (no resubmission)")
        return self._reconcile(attempt, deadline, sinks, transport, wait_for=RECONCILE_WAIT if detached else None)

    def _call(self, step: Step, values: dict[str, SlotValue], timeout: float,
              on_record: OnRecord | None, transport: Transport,
              starting: Callable[[], None] | None = None) -> tuple[StreamCall, dict[str, TranscriptSink]]:
        """Run *step* (its planned argv, slots filled from *values*) as one framed agent call on
        *transport* into fresh transcript sinks; *starting* runs once the step has started and was not
        refused, just before the call (the attempt record)."""

        def observe(kind: str, value: JsonObject) -> None:
            if kind == "job":  # known the moment it arrives, even if vq-admin is interrupted later in the call
                if value.get("job_id"):
                    self.receipt.deploy = self.receipt.deploy.replace(job_id=str(value["job_id"]))
                if isinstance(value.get("pid"), int):  # a detached fixed-host build
                    self.receipt.deploy = self.receipt.deploy.replace(pid=value["pid"])
            if on_record is not None:
                on_record(kind, value)

        return framed_step(step, transport, values, timeout, self.ctx.state, self.receipt_id(), on_record=observe,
                           starting=starting)

    def _reconcile(self, attempt: str, deadline: float, sinks: dict[str, TranscriptSink], transport: Transport,
                   wait_for: float | None) -> tuple[StreamCall, dict[str, TranscriptSink]]:
        """Ask the agent for the recorded job's (or detached build's) end, retrying a dropped connection a few
        times (copies of the planned ``deploy-reconcile``); *wait_for* (seconds) replaces the wait until
        the original bound."""
        for n in range(1, RECONCILE_TRIES + 1):
            discard(sinks)
            wait = max(0.0, deadline - time.monotonic()) + CANCEL_GRACE if wait_for is None else wait_for
            step = self.receipt.plan.again(RECONCILE, RECONCILE if n == 1 else f"{RECONCILE}-{n}")
            call, sinks = self._call(step, {ATTEMPT.name: attempt, WAIT.name: _seconds(round(wait))}, wait + MARGIN,
                                     None, transport)
            if call.complete or not (call.interrupted or call.frame_error):
                break
            self.ctx.narrate(f"deploy-reconcile: {call.describe()}")
        return call, sinks

    def _record_end(self, summary: Summary, call: StreamCall, sinks: dict[str, TranscriptSink],
                    keys: tuple[str, ...], unchosen: object, not_established: str) -> None:
        """Copy the agent's summary (*keys*, as it sent them) into the receipt's deploy record and settle the
        step that delivered it: its exit status, ``ok``/``failed`` when the end was established and chosen
        (*unchosen* false), else ``interrupted`` with the summary's notes or *not_established*."""
        deploy, sent = self.receipt.deploy, call.records["summary"]
        ended = {key: sent.get(key) for key in keys if sent.get(key) is not None or getattr(deploy, key) is UNSET}
        deploy = self.receipt.deploy = deploy.replace(**ended, retention=sent.get("retention"))
        self._fill_output(summary, call, sinks)
        if call.complete:  # the step that delivered the report carries the deployment's exit status
            call.step.exit_code = deploy.exit_code if isinstance(deploy.exit_code, int) else None
            if summary.established and not unchosen:
                call.step.status = "ok" if deploy.exit_code == 0 else "failed"
            else:
                call.step.status = "interrupted"
                call.step.detail = "; ".join(summary.notes) or not_established

    def _conclude(self, command: ProviderCommand, call: StreamCall,
                  sinks: dict[str, TranscriptSink]) -> RunResult:
        receipt, where = self.receipt, call.where
        summary = call.summary
        if summary is None:
            discard(sinks)
            return self._unknown(command, call, "the helper's report never arrived")
        signalled = ended_without_choosing(summary)
        self._record_end(summary, call, sinks, ("job_id", "exit_code", "sbatch_exit_code", "job_state",
                                                "job_exit_code", "end_source", "established", "timed_out",
                                                "cancel", "reconciled", "notes"),
                         signalled, signalled or "the job's end was not established")
        deploy = receipt.deploy
        if summary.submitted is False:
            self.stage.reclaim(success=False)
            raise VqAdminError(f"deploy: sbatch did not submit the job (exit {summary.sbatch_exit_code}): "
                               f"{' '.join(summary.notes)} {summary.sbatch_stderr.strip()[-500:]}")
        if summary.timed_out:
            cancel = summary.cancel or Cancel()
            text = (f"allocation job {deploy.job_id} did not finish within timeout_seconds "
                    f"({_seconds(self.profile.timeout_seconds)} s)")
            # The build may have activated before the cancel: only a read-back decides (never "failed").
            state = deploy.job_state or "not reported by the scheduler"
            how = ("vq-admin cancelled it (scancel exit 0)" if cancel.ok
                   else f"cancelling it failed: {cancel.message}")
            return RunResult(list(command.argv), where, None,
                             stderr=f"{text}; {how}; final scheduler state: {state}; transcripts in {deploy.log_dir}"
                             .encode(), seconds=call.seconds, interrupted="job")
        if not summary.established:
            return self._unknown(command, call, "; ".join(summary.notes) or "the job's end was not established")
        if summary.exit_code == exits.JOB_TAMPERED:
            self.tampered(sinks, f"batch job {deploy.job_id}")
        if signalled:  # the job did not choose its exit status: read back before deciding (unless it never ran)
            if summary.never_started is True:  # the scheduler never gave it a node
                allocation_attempt.clear(self)
                self.stage.reclaim(success=False)
                raise VqAdminError(f"deploy: allocation job {deploy.job_id} {signalled}: the job was cancelled "
                                   "before it started; nothing ran")
            return RunResult(list(command.argv), where, _status(summary),
                             stderr=(f"allocation job {deploy.job_id} {signalled} (exit {summary.exit_code}); "
                                     f"transcripts in {deploy.log_dir}").encode(),
                             seconds=call.seconds, interrupted="job")
        return RunResult(list(command.argv), where, _status(summary), seconds=call.seconds)

    def tampered(self, sinks: dict[str, TranscriptSink], what: str) -> None:
        """The job (or detached build) exited 86: say whether it refused a changed argv or archive."""
        receipt = self.receipt
        refusal = [line for line in sinks["stderr"].text().splitlines() if line.startswith(JOB_TAMPERED_MARK)]
        if refusal:  # the job found its argv or archive changed while it waited and ran nothing
            receipt.deploy = receipt.deploy.replace(tampered=refusal[-1])
            receipt.errors.append(f"deploy: {what} did not run the provider: what it was "
                                  f"given was changed after the run prepared it (tampering): {refusal[-1]}")
        elif not sinks["stderr"].bytes:  # no stderr where it should be: the attempt directory may have been replaced
            receipt.deploy = receipt.deploy.replace(
                tampered="suspected: exit status 86 and no stderr in the attempt directory")
            receipt.errors.append(
                f"deploy: {what} exited {exits.JOB_TAMPERED}, the status the job uses when "
                f"its argv or source archive changed after the run prepared it (tampering suspected), and its "
                f"stderr is not in the attempt directory {receipt.deploy.log_dir}: check who can change that path")

    def _unknown(self, command: ProviderCommand, call: StreamCall, why: str,
                 message: str | None = None) -> RunResult:
        deploy = self.receipt.deploy = self.receipt.deploy.replace(established=False)
        if not self.receipt.command_output:
            self.receipt.command_output = CommandOutput(
                complete=False, reason="unavailable", log_dir=deploy.log_dir, observations=0, stdout="", stderr="",
                note="the transcript was not read; it is retained in log_dir")
            self.receipt.metrics, self.receipt.metrics_complete = {}, False
        message = message or (f"allocation job {deploy.job_id or '(id not recorded)'}: its end could not be "
                              f"established ({why}); log directory {deploy.log_dir}")
        return RunResult(list(command.argv), call.where, None, stderr=message.encode(), seconds=call.seconds,
                         interrupted="transport")

    def _fill_output(self, summary: Summary, call: StreamCall, sinks: dict[str, TranscriptSink]) -> None:
        """command_output, metrics and the driver's transcript copy from what arrived."""
        receipt = self.receipt
        transcript = self._store_transcripts(sinks)
        sent = call.sent if call.ended else {}
        found = {name: problem for name, sink in sinks.items()
                 if (problem := _stream_problem(sent.get(name), sink, summary.settle))}
        problems = [f"{name}: {text}" for name, (text, _) in found.items()]
        if not summary.established and not summary.timed_out:
            problems.append("the job's end was not established: its transcript may still grow")
        cut = any(short for _, short in found.values())
        output = _output(summary.settle, problems, cut, sinks["stdout"], sinks["stderr"], transcript,
                         str(receipt.deploy.log_dir))
        if output.note:
            self.ctx.narrate(f"deploy: {output.note}")
        receipt.command_output = output
        receipt.metrics = {**sinks["stdout"].metrics, **sinks["stderr"].metrics}
        receipt.metrics_complete = output.complete is True

    def _store_transcripts(self, sinks: dict[str, TranscriptSink]) -> str | None:
        """The directory of the driver's copy of the transcripts, or ``None`` (a note says why, when it failed:
        a full or failing state filesystem, and the run goes on to its verify all the same)."""
        paths = [sink.commit() for sink in sinks.values()]
        failed = [f"{sink.name}: {sink.error}" for sink in sinks.values() if sink.error]
        if failed:
            note = (f"the driver's copy of the deploy transcripts could not be stored in "
                    f"{sinks['stdout'].directory} ({'; '.join(failed)}); this receipt keeps their tail and the "
                    f"log directory {self.receipt.deploy.log_dir} on the host the whole of them")
            self.receipt.notes.append(note)
            self.ctx.narrate(note)
        return str(paths[0].parent) if not failed and paths[0] is not None else None


def _status(summary: Summary) -> int:
    """The deployment's exit status from an established summary (the agent says one whenever it establishes the end)."""
    if summary.exit_code is None:
        raise VqAdminError("deploy: the helper established the end but gave no exit status")
    return summary.exit_code


def _stream_problem(got: Sent | None, sink: TranscriptSink, settle: Settle) -> tuple[str, bool] | None:
    """What is wrong with one stream's copy against what the agent says it sent (it names its checksum:
    xxh3_64, or blake2b without xxhash), and whether the copy is short of it (cut, or not the bytes sent:
    the transcript is ``unavailable``, else ``unstable``); ``None`` when nothing is wrong."""
    if got is None:
        return "the stream was cut before the end", True
    algorithm, digest = got.checksum, got.digest
    if algorithm not in checksum.ALGORITHMS:
        return f"the helper used an unknown checksum {str(algorithm)[:40]!r}", False
    if got.bytes != sink.bytes or digest != sink.digest_as(algorithm):
        return f"received {sink.bytes} bytes, the helper sent {got.bytes}", True
    if settle.settled and got.settled_digest != digest:
        return "changed after it had settled", False
    return None


def _output(settle: Settle, problems: list[str], cut: bool, out: TranscriptSink, err: TranscriptSink,
            transcript: str | None, log_dir: str) -> CommandOutput:
    """The receipt's ``command_output`` of an allocation deploy (``kept`` when a stream was cut to its head and
    tail, ``problems`` and ``note`` when the transcript is incomplete: ``unavailable`` when *cut*, a stream's
    copy short of what was sent)."""
    truncated = out.truncated or err.truncated
    output = CommandOutput(
        complete=settle.settled and not problems, reason=None, log_dir=log_dir, observations=settle.observations,
        settle_seconds=settle.seconds, stdout=out.text(), stderr=err.text(), stdout_bytes=out.bytes,
        stderr_bytes=err.bytes, truncated=truncated, transcript=transcript, checksum=settle.checksum or out.algorithm,
        kept=(f"the first and last {out.keep // 2} bytes of each stream; the whole transcript is in "
              f"{transcript or log_dir}") if truncated else UNSET)
    if output.complete:
        return output
    reason = settle.reason or ("unavailable" if cut else "unstable")
    return output.replace(reason=reason, problems=problems, note=(
        f"incomplete transcript ({reason}): the retained log directory {log_dir} holds what the job wrote; metrics "
        "are partial evidence, and an empty metrics object is not proof that no build work occurred"))
