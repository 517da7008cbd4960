"""``vq admin history [HOST [PROGRAM]] [--local] [--limit N] [--json]``: runs, newest first.

``history HOST [PROGRAM]`` reads the host's record (CONTRACT section 12; one
agent call, ``record-read``, for PROGRAM or for every program HOST has a
profile for and its helper lane): the runs of every administrator there, those
of other drivers marked with who ran them and, for an entry signed by a key
``allowed_signers`` accepts, the signer's principal; an entry that is not
evidence (unsigned, unknown key, altered) is shown with the reason.

Without HOST, or with ``--local``: this driver's stored receipts, from the
history index (:mod:`vq_admin.state.history`) read from its end, stopping at
``--limit`` runs; never opening the receipts themselves (except once, to build
the index for receipts stored before it existed); nothing runs on any host.
The configuration is read as by every verb (missing or invalid, a HOST it does
not name, or a PROGRAM that host has no profile for, is exit 2).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..config import authority
from ..state import history
from ..config import Config, load_config
from ..record.statement import Summary
from ..report.envelope import emit
from ..report.outcome import Outcome, UsageError
from ..report.output import safe_text
from ..state.records import StateDir

if TYPE_CHECKING:
    from ..record.signing import Verdict
    from ..record.view import Imported

DEFAULT_LIMIT = 20


def _duration(seconds: object) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class HostRun(history.RunRow, frozen=True, kw_only=True):
    """A run as an entry of the host's record says it, and whether it is evidence here."""

    entry: str
    driver: str | None = None
    by: str | None = None
    signer: str | None = None
    evidence: bool = False
    reason: str | None = None
    who: str = "unknown"  #: who ran it, and whose signature it carries


def table(runs: list[history.Run] | list[HostRun]) -> list[str]:
    """The human table of *runs* (at least one): time, lane (and verb), host, program, outcome, SHA short + tag,
    duration (a host record's runs: who ran it)."""
    last = "WHO" if isinstance(runs[0], HostRun) else "DURATION"
    header = ("TIME", "LANE", "HOST", "PROGRAM", "OUTCOME", "SHA", last)
    rows = [header, *(_cells(run) for run in runs)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return [safe_text("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip()) for r in rows]


def _cells(run: history.Run | HostRun) -> tuple[str, ...]:
    """One run's row of the table ("-" for what it does not say): a host record's run says who ran it, a stored
    receipt's how long it took."""
    lane = (run.lane or "-") + (f"/{run.verb}" if run.verb and run.verb != "update" else "")
    sha = (run.expected_sha or "-")[:12] + (f" ({run.tag})" if run.tag else "")
    last = run.who if isinstance(run, HostRun) else _duration(run.seconds)
    return (run.finished_at or "-", lane, run.host or "-", run.program or "-", run.outcome or "-", sha, last)


def run(args: argparse.Namespace) -> int:
    from .arguments import check_name

    config = load_config(args.config)
    host = None
    if args.host is not None:
        host = authority.lookup(config, check_name(args.host, "HOST"))
        if args.program is not None:
            authority.profile_of(host, check_name(args.program, "PROGRAM"))
    limit = DEFAULT_LIMIT if args.limit is None else args.limit
    if limit < 1:
        raise UsageError(f"--limit {limit}: give a positive number of runs")
    state = StateDir(args.state_dir)
    found: list[history.Run] | list[HostRun]
    if host is not None and not args.local:
        programs: list[str | None] = [args.program] if args.program else [*sorted(host.runtimes), None]
        found = host_runs(config, state, host.name, programs)[:limit]
    else:
        found = history.runs(state.root, args.host, args.program, limit)
    if args.json:
        emit(history.SCHEMA, Outcome.OK, {"runs": [run.to_value() for run in found]})
    elif found:
        print("\n".join(table(found)))
    return 0


def host_runs(config: Config, state: StateDir, host: str, programs: list[str | None]) -> list[HostRun]:
    """The runs *host*'s record holds for *programs*, newest first (read in one agent call)."""
    from ..record import view

    view.fetch(config, state, host, programs)
    signing, me = view.signer(config.signing), view.driver_id(state)
    rows = [_row(entry, view.verdict_now(entry, signing), host, program, me, view.confirms(config, host, program))
            for program in programs for entry in view.entries(state, host, program)]
    return sorted(rows, key=lambda row: (row.finished_at or "", row.entry), reverse=True)


def _row(entry: Imported, verdict: Verdict, host: str, program: str | None, me: str, confirm: bool) -> HostRun:
    """One row of the history: *entry* of *host*'s record of *program* under its *verdict* now: a verification
    summary's run (and why it is not evidence here though signed: its confirmation); of any other entry its kind
    and driver."""
    statement = entry.parsed()
    kind, predicate = (statement.predicate_type, statement.predicate) if statement is not None else ("", None)
    row = HostRun(lane="runtime" if program else "helper", host=host, program=program, entry=entry.name,
                  signer=verdict.principal)
    why = None
    if isinstance(predicate, Summary):
        run = predicate.vq_admin
        why = run.unconfirmed(confirm)
        row = row.replace(finished_at=run.finished_at, verb=run.verb, outcome=run.outcome, expected_sha=run.sha,
                          tag=run.tag, driver=run.driver, by=run.by, who=run.by)
    elif predicate is not None:  # roots, forget or quarantine: a driver's entry, its driver id never empty
        row = row.replace(verb=kind.rsplit(":", 2)[-2], driver=predicate.driver, who=predicate.driver)
    who = "this driver" if row.driver == me else row.who
    who += f" (signed by {verdict.principal})" if verdict.accepted else f" (not evidence: {verdict.reason})"
    who += f" ({why})" if why else ""
    return row.replace(who=who, evidence=verdict.accepted and not why, reason=verdict.reason or why)
