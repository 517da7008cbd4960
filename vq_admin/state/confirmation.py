"""Which generations a confirmation job proved, and which it did not (CONTRACT section 13).

One small document per host and program, ``hosts/<host>/runtime/<program>/confirmation.json``
(:class:`ConfirmRecord`): per SHA a :class:`ConfirmEntry`, ``pending`` (a job is under way),
``passed`` or ``unconfirmed``, with the job's id, end state, exit status, node, metrics and the
reason.  This module is the one seam the rest of vq-admin asks: :func:`unconfirmed` (why a SHA may
not be used), :func:`confirmed_entry` (a passed entry: what the host's record carries),
:func:`baseline` (the metrics a new generation is compared with), :func:`skip_as_revert_target`
(what a revert may not go back to) and :func:`record` / :func:`record_verdict`.  The host's record
may carry these entries later; only this module would change.

The launcher's refusal path reads the same file with the standard library only
(:func:`vq_admin.launcher.plain_lookup.unconfirmed_reason`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..document import Document, FullSha, JsonObject
from ..launcher.plain_lookup import why_unconfirmed

if TYPE_CHECKING:
    from .records import StateDir

NAME = "confirmation.json"
Status = Literal["pending", "passed", "unconfirmed"]
PENDING: Status = "pending"
PASSED: Status = "passed"
UNCONFIRMED: Status = "unconfirmed"
LIMIT = 1 << 20
Metric = str | int | float


class JobResult(Document, frozen=True, kw_only=True):
    """What Slurm reported of a confirmation job, as this driver keeps it and as the host's record carries it."""

    job_id: str | None = None
    state: str | None = None  #: Slurm's JobState of the job's end
    exit_code: int | None = None
    node: str | None = None
    metrics: dict[str, Metric] = msgspec.field(default_factory=dict)
    reason: str | None = None  #: why it did not pass (or why it is not known yet)
    accepted_regression: str | None = None  #: the --accept-regression reason it passed with


class ConfirmEntry(JobResult, frozen=True, kw_only=True):
    """One SHA's confirmation."""

    status: Status
    receipt: str | None = None
    attempt_dir: str | None = None
    metric_only: bool = False  #: its only fault was a metric out of tolerance (--accept-regression helps)
    at: str | None = None

    def why_unconfirmed(self) -> str | None:
        """Why this SHA may not be used (``None``: nothing against it)."""
        return why_unconfirmed(self.status, self.job_id, self.reason)


class ConfirmRecord(Document, frozen=True, kw_only=True):
    generations: dict[FullSha, ConfirmEntry] = msgspec.field(default_factory=dict)


def _parts(host: str, program: str) -> list[str]:
    return ["hosts", host, "runtime", program]


def read(state: StateDir, host: str, program: str) -> dict[str, ConfirmEntry]:
    data = state.tree.read(_parts(host, program), NAME, limit=LIMIT)
    if data is None:
        return {}
    return dict(ConfirmRecord.from_json(data, str(state.tree.path(*_parts(host, program), NAME)),
                                        limit=LIMIT).generations)


def record(state: StateDir, host: str, program: str, sha: str, entry: ConfirmEntry) -> None:
    """Write *sha*'s *entry*, atomically."""
    from ..core.stamps import utc_now

    generations = read(state, host, program)
    generations[sha] = entry.replace(at=utc_now())
    state.tree.write_atomic(_parts(host, program), NAME, ConfirmRecord(generations=generations).to_json().encode())


def record_verdict(state: StateDir, host: str, program: str, sha: str, verdict: JsonObject, receipt: str | None,
                   accepted: str | None) -> ConfirmEntry:
    """*sha*'s entry from the agent's confirmation *verdict* (a run's own, or one a later run reconciled)."""
    passed = bool(verdict.get("passed"))
    said = verdict.get("problems")
    problems = [str(p) for p in said] if isinstance(said, list) else []
    found = verdict.get("metrics")
    metrics: dict[Any, Any] = found if isinstance(found, dict) else {}
    entry = ConfirmEntry.from_value({
        "status": PASSED if passed else UNCONFIRMED, "job_id": verdict.get("job_id"), "state": verdict.get("state"),
        "exit_code": verdict.get("exit_code"), "node": verdict.get("node"),
        "metrics": {str(k): v for k, v in metrics.items() if isinstance(v, (str, int, float))},
        "receipt": receipt, "reason": None if passed else "; ".join(problems),
        "metric_only": not passed and bool(verdict.get("regressed")) and problems == verdict.get("regressed"),
        "accepted_regression": accepted if verdict.get("accepted") else None}, "the confirmation verdict")
    record(state, host, program, sha, entry)
    return entry


def unconfirmed(state: StateDir, host: str, program: str, sha: str) -> str | None:
    """Why *sha* may not be given to the queue or made current again (``None``: nothing against it)."""
    entry = read(state, host, program).get(sha)
    return entry.why_unconfirmed() if entry is not None else None


def confirmed_entry(state: StateDir, host: str, program: str, sha: str) -> ConfirmEntry | None:
    """*sha*'s passed confirmation (job id, state, exit status, node, metrics), or ``None``."""
    entry = read(state, host, program).get(sha)
    return entry if entry is not None and entry.status == PASSED else None


def baseline(state: StateDir, host: str, program: str, sha: str | None) -> dict[str, str]:
    """The metrics of the previous verified generation *sha* (``{}``: none, so every metric passes)."""
    entry = confirmed_entry(state, host, program, sha) if sha else None
    return {k: str(v) for k, v in entry.metrics.items()} if entry is not None else {}


def skip_as_revert_target(state: StateDir, host: str, program: str, sha: str) -> bool:
    """A generation a revert must not go back to: an unconfirmed one.  (Quarantine, CONTRACT section 14,
    adds its own test here.)"""
    return unconfirmed(state, host, program, sha) is not None
