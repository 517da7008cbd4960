"""``vq admin references PROGRAM HOST [--json]``: why each generation must be kept.

Lists every verified generation and launcher of PROGRAM on HOST with its
reasons (``last-ok``, ``last-good``, ``job <id> (<state>)``: the words ``vq admin prune`` keeps them by;
one without is what prune removes), reading queued and running jobs from the
scheduler on the login host (one agent call, the agent's ``census``).  Changes
nothing but that census's cache in the login account's agent state.  Exit 0
with the census, 77 for a host without runtime authority, 1 when the
scheduler could not be read completely (a provider must then prune nothing).
"""

from __future__ import annotations

import argparse

from ..config import authority
from ..config import load_config
from ..report.envelope import emit
from ..report.outcome import Outcome
from ..report.output import safe_text
from ..launcher.references import SCHEMA, Census, census
from ..state.records import StateDir
from ..ssh.transport import Session


#: What a generation nothing references is to ``vq admin prune`` (which also keeps its most recent ones).
PRUNED = "nothing references it: vq admin prune removes it unless it is among the --keep N most recent (default 3)"


def _lines(doc: Census) -> list[str]:
    cost = doc.cost
    lines = [f"{doc.program} on {doc.host}: {len(doc.generations)} generations, "
             f"{doc.jobs_scanned} queued or running jobs read at {doc.taken_at} ({cost.scripts_read} "
             f"scripts read, {cost.scripts_cached} cached, {cost.scheduler_calls} scheduler calls, "
             f"{doc.seconds:.1f} s)"]
    for row in doc.generations:
        lines.append(f"  {row.sha}  {row.launcher or '-'}")
        lines.append(f"      keep: {', '.join(row.reasons)}" if row.reasons else
                     f"      prune: {PRUNED}")
    lines += [f"  warning: {w}" for w in doc.warnings]
    return [safe_text(line) for line in lines]


def run(args: argparse.Namespace) -> int:
    from .arguments import check_name

    check_name(args.program, "PROGRAM")
    check_name(args.host, "HOST")
    config = load_config(args.config)
    host, _ = authority.runtime_profile(config, args.host, args.program, canonical=True)  # 77 or 2
    with Session(config.ssh_config) as session:
        doc = census(StateDir(args.state_dir), session.for_host(host.transport, host.ssh), host.agent, host.name,
                     args.program)
    if args.json:
        emit(SCHEMA, Outcome.OK, {**doc.to_value(), "requested_host": args.host})
    else:
        print("\n".join(_lines(doc)))
    return 0
