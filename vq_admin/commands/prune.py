"""``vq admin prune PROGRAM HOST [--keep N] [--json] [--dry-run]``: remove generations nobody
needs, through the runtime lane's one entry (see :mod:`vq_admin.lanes.prune`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..context import RunContext
from ..outcome import UsageError
from ..plugins import Providers
from .update import check_name, run_lane

if TYPE_CHECKING:
    from ..lanes.lane import Lane


def run(args: argparse.Namespace) -> int:
    program, host_name = check_name(args.program, "PROGRAM"), check_name(args.host, "HOST")
    if args.keep < 0:
        raise UsageError(f"--keep {args.keep}: give the number of recent verified generations to keep (0 or more)")

    def build(ctx: RunContext) -> Lane:
        from .. import authority
        from ..lanes.prune import RuntimePrune

        host = authority.runtime_host(ctx.config, host_name)
        profile = host.runtimes.get(program)
        ctx.providers = Providers.load([profile.provider] if profile else [])
        return RuntimePrune(ctx, host_name, program, args.keep)

    return run_lane(args, ("runtime", host_name, program), None, None, build,
                    early={"prune": {"keep": {}, "removed": [], "keep_recent": args.keep}})
