"""``vq admin history [HOST [PROGRAM]] [--limit N] [--json]``: stored receipts, newest first.

Reads the history index (:mod:`vq_admin.state.history`) from its end and stops at
``--limit`` runs; never opens the receipts themselves (except once, to build
the index for receipts stored before it existed).  Local and read-only: the
configuration is read as by every verb (missing or invalid, a HOST it does
not name, or a PROGRAM that host has no profile for, is exit 2) and nothing
runs on any host.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..config import authority
from ..state import history
from ..config import load_config
from ..report.envelope import emit
from ..report.outcome import Outcome, UsageError
from ..report.output import safe_text
from ..state.records import StateDir

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


def table(runs: list[dict[str, Any]]) -> list[str]:
    """The human table: time, lane (and verb), host, program, outcome, SHA short + tag, duration."""
    header = ("TIME", "LANE", "HOST", "PROGRAM", "OUTCOME", "SHA", "DURATION")
    rows = [header]
    for run in runs:
        sha = (run.get("expected_sha") or "-")[:12]
        if run.get("tag"):
            sha += f" ({run['tag']})"
        lane = run.get("lane") or "-"
        if run.get("verb") and run["verb"] != "update":
            lane += f"/{run['verb']}"
        rows.append((str(run.get("finished_at") or "-"), lane, str(run.get("host") or "-"),
                     str(run.get("program") or "-"), str(run.get("outcome") or "-"), sha,
                     _duration(run.get("seconds"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return [safe_text("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip()) for r in rows]


def run(args: argparse.Namespace) -> int:
    from .arguments import check_name

    config = load_config(args.config)
    if args.host is not None:
        host = authority.lookup(config, check_name(args.host, "HOST"))
        if args.program is not None:
            authority.profile_of(host, check_name(args.program, "PROGRAM"))
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: give a positive number of runs")
    limit = args.limit if args.limit is not None else DEFAULT_LIMIT
    found = history.runs(StateDir(args.state_dir).root, args.host, args.program, limit)
    if args.json:
        emit(history.SCHEMA, Outcome.OK, {"runs": found})
    elif found:
        print("\n".join(table(found)))
    return 0
