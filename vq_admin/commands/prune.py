"""``vq admin prune PROGRAM HOST [--keep N] [--used-within DAYS] [--json] [--dry-run]``: remove generations nobody
needs, through the runtime lane's one entry (see :mod:`vq_admin.lanes.prune`)."""

from __future__ import annotations

import argparse
from functools import partial

from ..lanes.runner import provider_lane, run_lane
from ..report.outcome import UsageError
from ..report.sections import Prune
from ..record.statement import DRIVER_ID_RE
from .arguments import check_name


def run(args: argparse.Namespace) -> int:
    from ..lanes.prune import RuntimePrune

    program, host_name = check_name(args.program, "PROGRAM"), check_name(args.host, "HOST")
    if args.keep < 0:
        raise UsageError(f"--keep {args.keep}: give the number of recent verified generations to keep (0 or more)")
    if not args.used_within >= 0:
        raise UsageError(f"--used-within {args.used_within}: give a number of days (0 or more)")
    forget = args.forget_driver
    if forget is not None and not DRIVER_ID_RE.fullmatch(forget):
        raise UsageError(f"--forget-driver {forget!r}: give a driver id, USER@HOST/<8 hex> (vq admin history HOST "
                         "names each driver)")
    return run_lane(args, ("runtime", host_name, program), None, None,
                    partial(provider_lane, RuntimePrune, host_name=host_name, program=program,
                            keep_recent=args.keep, forget=forget, used_within=args.used_within),
                    early={"prune": Prune(keep={}, removed=[], keep_recent=args.keep,
                                          used_within_days=args.used_within)})
