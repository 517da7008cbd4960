"""``vq admin update HOST``: the helper lane (see :mod:`vq_admin.lanes.helper`).

Authority is checked first (``managed`` or ``helper-only``, else exit 77),
then only the host's ``helper_provider`` is loaded, and the lane runs under
its own lock ("helper", HOST): a second helper update of the same host exits
75 at once, while runtime updates of that host are not blocked by it.  A run
refused before the lane starts (authority, configuration) gets a receipt and
an admin-log line, as in the runtime lane, and leaves the lane's records alone.
"""

from __future__ import annotations

import argparse
from functools import partial

from ..lanes.runner import run_lane
from .arguments import check_name


def run_helper(args: argparse.Namespace, host_name: str, sha: str | None) -> int:
    from ..lanes.helper import build_lane

    check_name(host_name, "HOST")
    return run_lane(args, ("helper", host_name, None), sha, None, partial(build_lane, host_name=host_name, sha=sha))
