"""``vq admin update``: the helper lane (one positional) or the runtime lane (two).

A thin typed function: it checks the arguments, names the lane's builder (:mod:`vq_admin.lanes.helper`,
:mod:`vq_admin.lanes.runtime`) and hands both to the lane runner (:mod:`vq_admin.lanes.runner`).
"""

from __future__ import annotations

import argparse
from functools import partial

from ..core.identifiers import SHA_RULE
from ..lanes.runner import run_lane
from ..report.outcome import UsageError
from ..source import check_tag_name
from .arguments import check_name, full_sha


def run(args: argparse.Namespace) -> int:
    targets, fleet = args.targets, args.all
    if not fleet:
        for option in ("canary", "parallel", "max_failed"):
            if getattr(args, option) is not None:
                raise UsageError(f"--{option.replace('_', '-')} belongs to a fleet rollout (update PROGRAM --all)")
        if len(targets) > 2:
            raise UsageError("update takes HOST (helper lane) or PROGRAM HOST (runtime lane)")
    sha = full_sha(args.expected_sha)
    if fleet:  # update PROGRAM --all: see vq_admin.fleet
        from ..fleet import run_fleet

        if sha is None:
            raise UsageError(f"a fleet rollout needs --expected-sha; {SHA_RULE}")
        if args.tag is not None:
            check_tag_name(args.tag)
        return run_fleet(args, check_name(targets[0], "PROGRAM"), sha)
    if args.tag is not None:
        check_tag_name(args.tag)
    if len(targets) == 1:
        if args.tag is not None:
            raise UsageError("--tag belongs to the runtime lane (PROGRAM HOST)")
        from ..lanes.helper import build_lane as build_helper

        host = check_name(targets[0], "HOST")
        return run_lane(args, ("helper", host, None), sha, None, partial(build_helper, host_name=host, sha=sha))
    program, host_name = targets
    if sha is None:
        raise UsageError(f"the runtime lane needs --expected-sha; {SHA_RULE}")
    check_name(program, "PROGRAM")
    check_name(host_name, "HOST")

    from ..lanes.runtime import build_lane

    return run_lane(args, ("runtime", host_name, program), sha, args.tag,
                    partial(build_lane, host_name=host_name, program=program, sha=sha, tag=args.tag))
