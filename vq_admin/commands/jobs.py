"""``vq admin jobs PROGRAM HOST [--sha SHA] [--since UTC] [--json]``: which jobs ran each generation.

Per generation: the uses ``vq admin launcher`` recorded in this state directory (count, first and
last, every job reference: :mod:`vq_admin.launcher.uses`) and the jobs the scheduler holds now that
reference it (the agent's ``census``, one call on the login host, as ``vq admin references``).
Changes nothing.  Exit 0; 1 when the scheduler could not be read completely (the uses are still
printed); 77 for a host without runtime authority.
"""

from __future__ import annotations

import argparse

from ..config import authority, load_config
from ..launcher.recall import SCHEMA, lines, report, since_stamp
from ..launcher.references import CensusError, CensusScan, scan
from ..report.envelope import emit
from ..report.outcome import Outcome
from ..ssh.transport import Session
from ..state.records import StateDir
from .arguments import check_name, full_sha


def run(args: argparse.Namespace) -> int:
    check_name(args.program, "PROGRAM")
    check_name(args.host, "HOST")
    sha, since = full_sha(args.sha, "--sha"), since_stamp(args.since)
    config = load_config(args.config)
    host, _ = authority.runtime_profile(config, args.host, args.program, canonical=True)  # 77 or 2
    census: CensusScan | CensusError
    with Session(config.ssh_config) as session:
        try:
            census = scan(session.for_host(host.transport, host.ssh), host.agent)
        except CensusError as exc:
            census = exc
    doc = report(StateDir(args.state_dir).root, host.name, args.program, sha, since, census)
    outcome = Outcome.FAILED if doc.census_error else Outcome.OK
    if args.json:
        return emit(SCHEMA, outcome, {"requested_host": args.host, **doc.to_value()},
                    [doc.census_error] if doc.census_error else [])
    print("\n".join(lines(doc)))
    return outcome.exit_code
