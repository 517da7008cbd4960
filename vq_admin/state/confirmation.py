"""Which generations a confirmation job proved, and which it did not (CONTRACT section 13).

One small document per host and program, ``hosts/<host>/runtime/<program>/confirmation.json``:
``{"generations": {SHA: entry}}``, each entry ``pending`` (a job is under way), ``passed`` or
``unconfirmed`` with the job's id, end state, exit status, metrics and the reason.  This module is
the one seam the rest of vq-admin asks: :func:`unconfirmed` (why a SHA may not be used),
:func:`confirmed_entry` (a passed entry, what the host's record carries), :func:`baseline` (the
metrics a new generation is compared with) and :func:`record`.  The host's record may carry these
entries later; only this module would change.

:func:`unconfirmed_reason` is the launcher's refusal path: standard library only, no msgspec.
"""

from __future__ import annotations

import os

from ..core.bounds import InputError, loads_json

TYPE_CHECKING = False  # the launcher's refusal path imports this module: no typing at run time
if TYPE_CHECKING:
    from typing import Any

    from .records import StateDir

NAME = "confirmation.json"
PENDING, PASSED, UNCONFIRMED = "pending", "passed", "unconfirmed"
LIMIT = 1 << 20


def _parts(host: str, program: str) -> list[str]:
    return ["hosts", host, "runtime", program]


def _load(data: bytes | None, what: str) -> dict[str, dict[str, Any]]:
    """The generations of the document *data* (``{}`` when there is none); a damaged one is an error."""
    if data is None:
        return {}
    value = loads_json(data, what, limit=LIMIT)
    generations = value.get("generations") if isinstance(value, dict) else None
    if not isinstance(generations, dict) or not all(isinstance(v, dict) for v in generations.values()):
        raise InputError(f"{what}: not a confirmation record ({{\"generations\": {{SHA: entry}}}})")
    return generations


def read(state: StateDir, host: str, program: str) -> dict[str, dict[str, Any]]:
    return _load(state.tree.read(_parts(host, program), NAME, limit=LIMIT), str(state.tree.path(*_parts(host, program),
                                                                                               NAME)))


def record(state: StateDir, host: str, program: str, sha: str, entry: dict[str, Any]) -> None:
    """Write *sha*'s entry (``status`` one of pending, passed, unconfirmed), atomically."""
    from .records import dump_json, utc_now

    generations = read(state, host, program)
    generations[sha] = dict(entry, at=utc_now())
    state.tree.write_atomic(_parts(host, program), NAME, dump_json({"generations": generations}))


def record_verdict(state: StateDir, host: str, program: str, sha: str, verdict: dict[str, Any], receipt: str | None,
                   accepted: str | None) -> None:
    """*sha*'s entry from the agent's confirmation *verdict* (a run's own, or one a later run reconciled)."""
    passed = bool(verdict.get("passed"))
    problems = verdict.get("problems") or []
    record(state, host, program, sha, {
        "status": PASSED if passed else UNCONFIRMED, "job_id": verdict.get("job_id"), "state": verdict.get("state"),
        "exit_code": verdict.get("exit_code"), "node": verdict.get("node"), "metrics": verdict.get("metrics") or {},
        "receipt": receipt, "reason": None if passed else "; ".join(problems),
        "metric_only": not passed and bool(verdict.get("regressed")) and problems == verdict.get("regressed"),
        "accepted_regression": accepted if verdict.get("accepted") else None})


def unconfirmed(state: StateDir, host: str, program: str, sha: str) -> str | None:
    """Why *sha* may not be given to the queue or made current again (``None``: nothing against it)."""
    entry = read(state, host, program).get(sha)
    return _reason(entry)


def confirmed_entry(state: StateDir, host: str, program: str, sha: str) -> dict[str, Any] | None:
    """*sha*'s passed confirmation (job id, state, exit status, node, metrics), or ``None``."""
    entry = read(state, host, program).get(sha)
    return entry if entry is not None and entry.get("status") == PASSED else None


def baseline(state: StateDir, host: str, program: str, sha: str | None) -> dict[str, str]:
    """The metrics of the previous verified generation *sha* (``{}``: none, so every metric passes)."""
    entry = read(state, host, program).get(sha) if sha else None
    metrics = (entry or {}).get("metrics") if (entry or {}).get("status") == PASSED else None
    return {str(k): str(v) for k, v in metrics.items()} if isinstance(metrics, dict) else {}


def skip_as_revert_target(state: StateDir, host: str, program: str, sha: str) -> bool:
    """A generation a revert must not go back to: an unconfirmed one.  (Quarantine, CONTRACT section 14,
    adds its own test here.)"""
    return unconfirmed(state, host, program, sha) is not None


def _reason(entry: object) -> str | None:
    if not isinstance(entry, dict) or entry.get("status") not in (PENDING, UNCONFIRMED):
        return None
    if entry.get("status") == PENDING:
        return f"its confirmation job {entry.get('job_id') or ''} is still under way".replace("  ", " ")
    return f"its confirmation failed: {entry.get('reason') or 'not passed'}"


def unconfirmed_reason(root: str, host: str, program: str, sha: str) -> str | None:
    """:func:`unconfirmed` for the launcher's refusal path: a plain read below the state *root*."""
    path = os.path.join(root, *_parts(host, program), NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(LIMIT + 1)
    try:
        return _reason(_load(data, path).get(sha))
    except InputError as exc:
        return f"its confirmation record cannot be read: {exc}"
