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
import sys

from .. import authority
from ..config import load_config
from ..context import RunContext, stderr_narrator
from ..outcome import VqAdminError
from ..plugins import Providers
from ..receipt import Receipt
from ..state import StateDir, utc_now
from ..transport import Session


def run_helper(args: argparse.Namespace, host_name: str, sha: str | None) -> int:
    from ..lanes.helper import HelperUpdate
    from .update import check_name, execute_lane, options_from, refuse_early

    check_name(host_name, "HOST")
    config = load_config(args.config)
    options = options_from(args)
    with Session(config.ssh_config) as session:
        ctx = RunContext(config, StateDir(args.state_dir), session, None, options,  # type: ignore[arg-type]
                         stderr_narrator(options.verbose or sys.stderr.isatty()))
        try:
            host = authority.helper_host(config, host_name)
            ctx.providers = Providers.load([host.helper_provider])
            lane = HelperUpdate(ctx, host_name, sha)
        except VqAdminError as exc:
            return refuse_early(ctx, Receipt("helper", host_name, None, sha, None, utc_now()), exc)
        return execute_lane(ctx, lane.receipt, lane.run, ("helper", host_name, None))
