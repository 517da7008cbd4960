"""``vq admin rollback PROGRAM HOST [--to SHA] [--json] [--dry-run]``: re-activate an earlier
verified generation (LAST GOOD by default), through the runtime lane's one entry."""

from __future__ import annotations

import argparse
from functools import partial

from ..lanes.runner import provider_lane, run_lane
from ..report.sections import Rollback
from .arguments import check_name, full_sha


def run(args: argparse.Namespace) -> int:
    from ..lanes.rollback import RuntimeRollback

    program, host_name = check_name(args.program, "PROGRAM"), check_name(args.host, "HOST")
    to = full_sha(args.to, "--to")
    return run_lane(args, ("runtime", host_name, program), to, None,
                    partial(provider_lane, RuntimeRollback, host_name=host_name, program=program, to=to),
                    early={"rollback": Rollback(from_=None, to=to, via=None)})
