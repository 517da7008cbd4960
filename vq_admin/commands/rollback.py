"""``vq admin rollback PROGRAM HOST [--to SHA] [--json] [--dry-run]``: re-activate an earlier
verified generation (LAST GOOD by default), through the runtime lane's one entry."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..context import RunContext
from ..plugins import Providers
from .update import check_name, full_sha, run_lane

if TYPE_CHECKING:
    from ..lanes.lane import Lane


def run(args: argparse.Namespace) -> int:
    program, host_name = check_name(args.program, "PROGRAM"), check_name(args.host, "HOST")
    to = full_sha(args.to, "--to")

    def build(ctx: RunContext) -> Lane:
        from .. import authority
        from ..lanes.rollback import RuntimeRollback

        host = authority.runtime_host(ctx.config, host_name)
        profile = host.runtimes.get(program)
        ctx.providers = Providers.load([profile.provider] if profile else [])
        return RuntimeRollback(ctx, host_name, program, to)

    return run_lane(args, ("runtime", host_name, program), to, None, build,
                    early={"rollback": {"from": None, "to": to, "via": None}})
