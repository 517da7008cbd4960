"""The attempt record of an allocation build, and its reconciliation by the next run.

Before ``alloc-run`` starts, the driver records the attempt it chose in the
lane's state (``hosts/<host>/runtime/<program>/attempt.json``: attempt name,
attempt and log directory, receipt id).  The record is removed once the
deployment's end is known (whatever it was).  When a run ends without that
-- vq-admin killed or sent SIGTERM while the job waits in the queue or runs,
a dropped connection never reconciled -- the record stays, and the batch job
is **not** cancelled: it keeps running to its end.

The next run of the lane reads the record first, before its pre-verify, and
asks the agent (``alloc-reconcile`` with a one-second wait: it never submits) for
that job's end:

* ended: its end state, exit status and transcript settle are recorded in
  the receipt (``previous_attempt``), the record is removed and the run goes
  on (its read-only pre-verify then shows what the job did);
* still pending or running, or not establishable: exit 75, naming the job id,
  the attempt directory and what to do; nothing is run.

A detached fixed-host build (:mod:`.detached_step`) is recorded and
reconciled the same way (``"kind": "detached"``, ``detach-reconcile`` on its
build host).
"""

from __future__ import annotations

from pathlib import Path

from ..core import protocol
from ..document import Document, DocumentError, JsonValue
from ..report.outcome import READ_ONLY_RAN, Locked
from ..report.sections import PreviousAttempt
from ..state.records import dump_json, read_json, write_atomic
from ..plan import Step, execute_stream, settled
from ..ssh.transport import Transport
from .allocation_stream import StreamCall, Summary, stream_call
from .runtime_step import RuntimeStep

RECORD = "attempt.json"
#: Bound of the reconcile call (the agent settles the transcripts for up to about ten seconds).
RECONCILE_CALL_TIMEOUT = 120.0


def _path(inputs: RuntimeStep) -> Path:
    return inputs.ctx.state.lane_dir("runtime", inputs.host.name, inputs.profile.program) / RECORD


class AttemptRecord(Document, frozen=True, kw_only=True, omit_defaults=True):
    """The attempt an interrupted run may have left (``attempt.json``): ``kind`` and ``where`` are written only
    for a detached build or a confirmation (a member at its default is not written)."""

    attempt: str
    attempt_dir: str | None = None
    receipt: str | None = None
    expected_sha: str | None = None
    kind: str = "allocation"
    where: str | None = None


def record(inputs: RuntimeStep, attempt: str, directory: str, kind: str = "allocation",
           where: str | None = None) -> None:
    write_atomic(_path(inputs), dump_json(AttemptRecord(
        attempt=attempt, attempt_dir=directory, receipt=inputs.receipt.id, expected_sha=inputs.sha, kind=kind,
        where=where).to_value()))


def clear(inputs: RuntimeStep) -> None:
    """Remove the record once the attempt's end is known; a state filesystem that refuses leaves it for the
    next run, whose reconcile finds that attempt ended (and the host-side lease free)."""
    try:
        _path(inputs).unlink()
    except OSError:
        pass


PREVIOUS = "previous-attempt"


def _previous(inputs: RuntimeStep) -> AttemptRecord | None:
    """The attempt record an interrupted run left; ``None`` when there is none (or it is not one)."""
    try:
        return AttemptRecord.from_value(read_json(_path(inputs)), str(_path(inputs)))
    except DocumentError:
        return None


def _reconcile_place(inputs: RuntimeStep, previous: AttemptRecord) -> tuple[Transport, list[str], str]:
    """Where and how the end of *previous* is asked for (the agent never starts or submits anything)."""
    detached = previous.kind == "detached"
    login = inputs.build_transport() if detached else inputs.ctx.login(inputs.host)
    if previous.kind == "confirm":
        return login, protocol.confirm_reconcile(inputs.host.agent, root=inputs.host.scratch_root or "",
                                                 program=inputs.profile.program, attempt=previous.attempt,
                                                 timeout="1"), \
            "read the verdict of the confirmation job an interrupted run left (never submits or reverts)"
    argv = protocol.reconcile(inputs.host.agent, detached=detached, root=inputs.host.scratch_root or "",
                              program=inputs.profile.program, attempt=previous.attempt, timeout="1")
    purpose = ("establish the end of the build an interrupted run left on the build host (never starts one)"
               if detached else "establish the end of the batch job an interrupted run left (never submits)")
    return login, argv, purpose


def plan_previous(inputs: RuntimeStep) -> None:
    """Plan the ``previous-attempt`` step when an interrupted run left an attempt record (read locally
    when the plan is made; the dry run shows it)."""
    previous = _previous(inputs)
    if previous is not None:
        login, argv, purpose = _reconcile_place(inputs, previous)
        inputs.receipt.plan.add(PREVIOUS, login.where, argv, purpose)


def reconcile_previous(inputs: RuntimeStep) -> None:
    """Establish the end of the job an interrupted run left, or refuse (75) while it is still going.

    What runs is the planned ``previous-attempt`` step.  A record that appeared, or changed, after
    the plan was made (another run was cut off in between) is refused (75, nothing run: rerun); a
    record cleared in between leaves the step skipped."""
    previous = _previous(inputs)
    plan = inputs.receipt.plan
    step = plan.get(PREVIOUS) if plan.has(PREVIOUS) else None
    if previous is None:
        if step is not None:
            step.status, step.detail = "skipped", "the attempt record was cleared after this run was planned"
        return
    login, argv, _purpose = _reconcile_place(inputs, previous)
    if step is None or step.planned_argv != argv or step.where != login.where:
        raise Locked(f"an interrupted run's attempt record ({_path(inputs)}, attempt {previous.attempt}) appeared "
                     "or changed after this run was planned: another run was cut off meanwhile; "
                     f"{READ_ONLY_RAN}: rerun")
    detached = previous.kind == "detached"
    attempt_of, reconciled = ("build", "build") if detached else ("allocation", "job")
    inputs.ctx.narrate(f"an interrupted run left the {attempt_of} attempt {previous.attempt_dir}; "
                       f"reconciling its {reconciled}")
    call = read_only_call(step, login, RECONCILE_CALL_TIMEOUT)
    summary = call.summary or Summary()
    inputs.receipt.previous_attempt = _found(previous, call, login.where, detached)
    # ended: a build or confirmation job no longer runs; a batch job is established, fenced or never submitted
    ended = call.complete and (summary.job_state != "RUNNING" if previous.kind in ("detached", "confirm")
                               else summary.established or summary.fenced or not summary.job_id)
    if not ended:
        step.status = "interrupted" if call.interrupted else "failed"
        step.detail = call.describe()
        settled(step)
        raise Locked(_still_going(previous, summary, call, login.where))
    if previous.kind == "confirm":
        _record_verdict(inputs, previous, call.answered("confirm"))
    step.status = "ok"
    clear(inputs)  # ended (or never submitted): the pre-verify decides what it did
    settled(step)


def _found(previous: AttemptRecord, call: StreamCall, where: str, detached: bool) -> PreviousAttempt:
    """The receipt's ``previous_attempt``: what the reconcile found of the interrupted run's attempt (the
    agent's summary as it sent it)."""
    sent = call.answered
    found = PreviousAttempt(job_id=sent("job_id"), job_state=sent("job_state"), job_exit_code=sent("job_exit_code"),
                            exit_code=sent("exit_code"), established=sent("established"), fenced=sent("fenced"),
                            notes=sent("notes"), attempt=previous.attempt, attempt_dir=previous.attempt_dir,
                            receipt=previous.receipt)
    if detached:  # the build's exit status and settled transcript are this run's evidence
        found = found.replace(kind="detached", where=where, pid=sent("pid"), exit_signal=sent("exit_signal"),
                              settle=sent("settle"), transcript=call.records.get("end", {}).get("sent"))
    return found


def _record_verdict(inputs: RuntimeStep, previous: AttemptRecord, verdict: JsonValue) -> None:
    """The verdict a confirmation's supervisor wrote with no driver left to read it: into the receipt and,
    when it is one, into the confirmation record."""
    assert inputs.receipt.previous_attempt is not None
    inputs.receipt.previous_attempt = inputs.receipt.previous_attempt.replace(
        kind="confirm", expected_sha=previous.expected_sha, confirm=verdict)
    if isinstance(verdict, dict) and previous.expected_sha is not None:
        from ..state import confirmation

        confirmation.record_verdict(inputs.ctx.state, inputs.host.name, inputs.profile.program,
                                    previous.expected_sha, verdict, previous.receipt, None)


def _still_going(previous: AttemptRecord, summary: Summary, call: StreamCall, where: str) -> str:
    """Why this run is refused (75): the interrupted run's job or build has not ended, or its end is not known."""
    if previous.kind == "confirm":
        return (f"the confirmation job {summary.job_id or '(id not yet recorded)'} of an interrupted "
                f"run (attempt {previous.attempt_dir}, receipt {previous.receipt}) is still under "
                f"way on {where} (state {summary.job_state or 'unknown'}; it reverts by itself if "
                f"it fails); {READ_ONLY_RAN}: wait for it to end, then rerun")
    if previous.kind == "detached":
        pid = summary.pid or f"recorded in {previous.attempt_dir}/build"
        return (f"the build of an interrupted run keeps running on {where} under attempt "
                f"{previous.attempt_dir} (pid {pid}, receipt {previous.receipt}); "
                + ("it has not ended" if call.complete else f"its end could not be read ({call.describe()})")
                + f"; {READ_ONLY_RAN}: wait for it to end, then rerun")
    job = summary.job_id or "(id not read)"
    state = summary.job_state or "unknown"
    return (f"the batch job {job} of an interrupted run (attempt {previous.attempt_dir}, receipt "
            f"{previous.receipt}) has not ended (scheduler state: {state}; {call.describe()}); "
            f"{READ_ONLY_RAN}: wait for it (squeue -j {job}) or cancel it (scancel {job}), then rerun")


def read_only_call(step: Step, transport: Transport, timeout: float) -> StreamCall:
    """Run *step* (exactly its planned argv) as one framed agent call whose transcripts stay on the host (the
    driver keeps only its summary); its exit status and time go in the step, which the caller settles."""
    sinks = {name: _Discard(name) for name in ("stdout", "stderr")}

    def stream(words: list[str]) -> StreamCall:
        return stream_call(transport, words, timeout=timeout, sinks=sinks)  # type: ignore[arg-type]

    call = execute_stream(step, transport, stream)
    step.exit_code, step.seconds = call.exit_code, call.seconds
    return call


class _Discard:
    """A transcript sink that keeps nothing: the reconcile's transcripts stay in the attempt directory."""

    def __init__(self, name: str):
        self.name = name

    def write(self, chunk: bytes) -> None:
        pass

    def use_checksum(self, algorithm: str) -> None:
        pass  # nothing is kept, so nothing is checksummed

