"""Conformance cases for the generation hooks: activation (rollback) and prune.

Run by :class:`~vq_admin.conformance.kit.Kit` after its update sequence, when
``current`` is A and the releases of A and B exist (C failed validation and
has none).  Only hooks the provider implements are checked: ``activate-B``,
``activate-refuses-unbuilt`` and ``activate-A``; ``prune-keeps-kept`` and
``prune-report-truthful`` (each described in docs/provider-maintenance.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vq_admin_hookspecs import EvidenceError, PruneReport, PruneRequest

from ..report.outcome import UsageError
from ..plugins import ProviderError
from .world import snapshot

if TYPE_CHECKING:
    from .kit import Kit

TIMEOUT = 600.0


def run(kit: "Kit", dirs: dict[str, str]) -> None:
    """*dirs*: the per-SHA release directory of A and B."""
    if kit.offers("vq_admin_runtime_activate", "activate_command"):
        activation(kit, dirs)
    if kit.offers("vq_admin_runtime_prune", "prune_command"):
        prune(kit, dirs)


def _activate(kit: "Kit", label: str) -> tuple[int | None, list[str | None], str]:
    try:
        command = kit.providers.runtime_activate(kit.name, kit.request(label, None))
    except ProviderError as exc:
        return None, [], exc.message
    if command is None:
        return None, [], "the provider answered None"
    return kit.watched(command, TIMEOUT)


def activation(kit: "Kit", dirs: dict[str, str]) -> None:
    before = {label: snapshot(path) for label, path in dirs.items()}
    code, seen, tail = _activate(kit, "B")
    proven = code == 0 and kit.evidence_ok("B")
    untouched = all(snapshot(path) == before[label] for label, path in dirs.items())
    problems = [problem for problem, wrong in (
        (f"activating B exited {code} ({tail}) or B's verify is not proven", not proven),
        (f"current was absent while it switched ({seen!r})", None in seen),
        ("a release changed during activation", not untouched)) if wrong]
    kit.check("activate-B", not problems, "; ".join(problems) or "current switched to B atomically; nothing rebuilt")
    link = kit.world.current()
    code, _, tail = _activate(kit, "C")
    kit.check("activate-refuses-unbuilt", code not in (0, None) and kit.world.current() == link,
              f"activating C, which was never built, exited {code} ({tail}); current {link!r} -> "
              f"{kit.world.current()!r}")
    code, _, tail = _activate(kit, "A")
    ok = code == 0 and kit.evidence_ok("A")
    kit.check("activate-A", ok, "back to A, proven" if ok else f"activating A exited {code}: {tail}")


def _prune(kit: "Kit", keep: list[str]) -> tuple[int | None, PruneReport | None, str]:
    """The provider's prune, asked as ``vq admin prune`` asks it: with the keep set's list slot,
    which must be placed once and is then filled with *keep*."""
    from ..lanes.prune import KEEP, place_keep
    from ..plan import fill_command

    like = kit.request("A", None)  # the kit's program and settings (no import back into the kit)
    request = PruneRequest(like.program, "conformance", KEEP, like.settings)
    try:
        command = fill_command(place_keep(kit.name, kit.providers.runtime_prune(kit.name, request)),
                               keep=sorted(keep))
    except UsageError as exc:  # a provider error, or a keep set not placed once
        return None, None, exc.message
    result = kit.world.run(command, TIMEOUT)
    try:
        report = PruneReport.parse(result.stdout)
    except EvidenceError as exc:
        return result.exit_code, None, str(exc)
    return result.exit_code, report, ""


def _prune_problems(kit: "Kit", keep: list[str]) -> tuple[PruneReport | None, list[str]]:
    code, report, error = _prune(kit, keep)
    return report, [] if code == 0 and report is not None else [f"prune exited {code}: {error or 'no report'}"]


def _report_lies(report: PruneReport | None, sha: dict[str, str], b_gone: bool) -> list[str]:
    """Where a prune asked to keep A says other than what it did to A and B."""
    if report is None:
        return []
    removed = set(report.removed)
    return [problem for problem, wrong in (
        ("the report says A (kept, current) was removed", sha["A"] in removed),
        ("the report says B was removed but its release is still there", sha["B"] in removed and not b_gone),
        ("B's release is gone but the report does not say it was removed", sha["B"] not in removed and b_gone))
        if wrong]


def prune(kit: "Kit", dirs: dict[str, str]) -> None:
    sha = kit.world.sha
    link = kit.world.current()
    before = {label: snapshot(path) for label, path in dirs.items()}
    report, problems = _prune_problems(kit, [sha["A"], sha["B"]])
    problems += [f"kept release {label} ({path}) was {'removed' if not snapshot(path) else 'changed'}"
                 for label, path in dirs.items() if snapshot(path) != before[label]]
    if report is not None and set(report.removed) & {sha["A"], sha["B"]}:
        problems.append(f"the report says kept SHAs were removed: {sorted(report.removed)}")
    kit.check("prune-keeps-kept", not problems, "; ".join(problems) or "asked to keep A and B, both are intact")
    report, problems = _prune_problems(kit, [sha["A"]])
    if snapshot(dirs["A"]) != before["A"] or kit.world.current() != link or not kit.evidence_ok("A"):
        problems.append("current's release A was changed, or current moved, or A is no longer proven")
    problems += _report_lies(report, sha, b_gone=not snapshot(dirs["B"]))
    kit.check("prune-report-truthful", not problems, "; ".join(problems) or
              f"asked to keep A: removed {sorted(report.removed) if report else '?'}; A intact and proven")
