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
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..outcome import Locked
from ..state import dump_json, read_json, write_atomic
from .allocation_stream import stream_call

if TYPE_CHECKING:
    from .runtime import RuntimeUpdate

RECORD = "attempt.json"
#: Bound of the reconcile call (the agent settles the transcripts for up to about ten seconds).
RECONCILE_CALL_TIMEOUT = 120.0


def _path(update: "RuntimeUpdate") -> Path:
    return update.ctx.state.lane_dir("runtime", update.host.name, update.profile.program) / RECORD


def record(update: "RuntimeUpdate", attempt: str, directory: str) -> None:
    write_atomic(_path(update), dump_json({"attempt": attempt, "attempt_dir": directory,
                                           "receipt": update.receipt.id, "expected_sha": update.sha}))


def clear(update: "RuntimeUpdate") -> None:
    try:
        _path(update).unlink()
    except FileNotFoundError:
        pass


def reconcile_previous(update: "RuntimeUpdate") -> None:
    """Establish the end of the job an interrupted run left, or refuse (75) while it is still going."""
    previous = read_json(_path(update))
    if previous is None or not isinstance(previous.get("attempt"), str):
        return
    ctx, login = update.ctx, update.ctx.login(update.host)
    attempt = previous["attempt"]
    argv = update.agent("alloc-reconcile", "--root", update.host.scratch_root or "", "--program",
                        update.profile.program, "--attempt", attempt, "--timeout", "1")
    step = update.receipt.plan.add("previous-attempt", login.where, argv,
                                   "establish the end of the batch job an interrupted run left (never submits)")
    ctx.narrate(f"an interrupted run left the allocation attempt {previous.get('attempt_dir')}; reconciling its job")
    # The transcripts are settled on the login host; the driver keeps only this call's summary.
    sinks = {name: _Discard(name) for name in ("stdout", "stderr")}
    step.argv = argv
    call = stream_call(login, argv, timeout=RECONCILE_CALL_TIMEOUT, sinks=sinks)  # type: ignore[arg-type]
    step.exit_code, step.seconds = call.exit_code, call.seconds
    summary: dict[str, Any] = call.records.get("summary") or {}
    found = {key: summary.get(key) for key in ("job_id", "job_state", "job_exit_code", "exit_code", "established",
                                                "fenced", "notes")}
    found.update(attempt=attempt, attempt_dir=previous.get("attempt_dir"), receipt=previous.get("receipt"))
    update.receipt.extra["previous_attempt"] = found
    if call.complete and (summary.get("established") or summary.get("fenced") or not summary.get("job_id")):
        step.status = "ok"
        clear(update)  # ended (or never submitted): the pre-verify decides what it did
        return
    step.status = "interrupted" if call.interrupted else "failed"
    step.detail = call.describe()
    job = summary.get("job_id") or "(id not read)"
    state = summary.get("job_state") or "unknown"
    raise Locked(f"the batch job {job} of an interrupted run (attempt {previous.get('attempt_dir')}, receipt "
                 f"{previous.get('receipt')}) has not ended (scheduler state: {state}; {call.describe()}); "
                 f"nothing was run: wait for it (squeue -j {job}) or cancel it (scancel {job}), then rerun")


class _Discard:
    """A transcript sink that keeps nothing: the reconcile's transcripts stay in the attempt directory."""

    def __init__(self, name: str):
        self.name = name

    def write(self, chunk: bytes) -> None:
        pass

    def use_checksum(self, algorithm: str) -> None:
        pass  # nothing is kept, so nothing is checksummed


__all__ = ["record", "clear", "reconcile_previous"]
