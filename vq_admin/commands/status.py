"""``vq admin status [HOST]``: per host and lane, the last outcome, LAST OK and LAST GOOD.

Helper evidence and runtime evidence are shown apart.  Reads the
configuration (as every verb: missing or invalid, or a HOST it does not name,
is exit 2) and the state directory; runs nothing anywhere.

``vq admin status --all``: every host's LAST OK side by side, one block per
runtime program (and one for the helper lane): a row per host with the SHA
(first 12 digits), tag and time of its LAST OK, and whether the hosts agree,
so drift across the fleet is visible at a glance.
"""

from __future__ import annotations

import argparse
import sys

from ..config import authority
from ..config import load_config
from ..document import Document
from ..report.envelope import SCHEMAS, emit
from ..report.outcome import Outcome, UsageError
from ..report.output import safe_message
from ..report.status_table import HostStatus, LaneStatus, Status, lanes, render, use_color
from ..state.records import StateDir, Verified


def collect(state: StateDir, host: str | None) -> Status:
    hosts: dict[str, HostStatus] = {}
    for name, lane, program in state.lanes():
        if host and name != host:
            continue
        entry = LaneStatus(last=state.last_run(lane, name, program), last_ok=state.verified(lane, name, program),
                           last_good=state.verified(lane, name, program, "last-good"))
        slot = hosts.get(name, HostStatus())
        if lane == "helper":
            hosts[name] = slot.replace(helper=entry)
        else:
            hosts[name] = slot.replace(runtimes={**slot.runtimes, str(program): entry})
    return Status(state_dir=str(state.root), hosts=hosts)


def _identity(record: Verified | None) -> str:
    if not record:
        return "-"
    text = f"{record.sha}"
    if record.tag:
        text += f" ({record.tag})"
    if record.launcher:
        text += f" {record.launcher}"
    if record.verified_by:  # another driver's signed entry of the host's record (CONTRACT section 12)
        text += f" verified by {record.verified_by} (signed by {record.signer or None})"
    return text + f" at {record.at}"


def _lines(status: Status) -> list[str]:
    lines: list[str] = []
    for host, slot in sorted(status.hosts.items()):
        lines.append(f"{host}")
        for _, program, entry in lanes(slot):
            label, last = program or "helper", entry.last
            lines.append(f"  {label}: last {last.outcome} at {last.at} (sha {last.expected_sha})" if last else
                         f"  {label}: last - at - (sha None)")
            lines.append(f"    LAST OK   {_identity(entry.last_ok)}")
            lines.append(f"    LAST GOOD {_identity(entry.last_good)}")
    if not lines:
        lines.append(f"no recorded runs in {status.state_dir}")
    return [safe_message(line) for line in lines]


class LastOkRow(Document, frozen=True, kw_only=True):
    """A host's LAST OK in ``status --all`` (schema ``vq-admin/status-all/1``), and its last run's outcome."""

    sha: str | None
    tag: str | None
    at: str | None
    last_outcome: str | None


class StatusAll(Document, frozen=True, kw_only=True):
    state_dir: str
    last_ok: dict[str, dict[str, LastOkRow]]


def collect_all(state: StateDir) -> StatusAll:
    groups: dict[str, dict[str, LastOkRow]] = {}
    for host, lane, program in state.lanes():
        key = "helper" if lane == "helper" else f"runtime {program}"
        last_ok, last = state.verified(lane, host, program), state.last_run(lane, host, program)
        row = LastOkRow(sha=None, tag=None, at=None, last_outcome=last.outcome if last else None)
        if last_ok:
            row = row.replace(sha=last_ok.sha, tag=last_ok.tag or None, at=last_ok.at)
        groups.setdefault(key, {})[host] = row
    return StatusAll(state_dir=str(state.root), last_ok=groups)


def _agreement(hosts: dict[str, LastOkRow]) -> str:
    """Whether the hosts' LAST OK agree, or how they drift."""
    shas = {h.sha for h in hosts.values() if h.sha}
    missing = sum(1 for h in hosts.values() if not h.sha)
    if len(shas) <= 1 and not missing:
        return "all hosts agree"
    return f"DRIFT: {len(shas)} distinct SHA(s)" + (f", {missing} host(s) without LAST OK" if missing else "")


def _lines_all(status: StatusAll) -> list[str]:
    out: list[str] = []
    for key, hosts in sorted(status.last_ok.items(), key=lambda kv: (kv[0] == "helper", kv[0])):
        out.append(f"{key}: LAST OK on {len(hosts)} host(s), {_agreement(hosts)}")
        width = max(len(name) for name in hosts)
        for name, h in sorted(hosts.items()):
            sha = (h.sha or "-")[:12]
            out.append(f"  {name:<{width}}  {sha:<12}  {h.tag or '-':<12}  {h.at or '-':<20}  "
                       f"last {h.last_outcome or '-'}")
    if not out:
        out.append(f"no recorded runs in {status.state_dir}")
    return [safe_message(line) for line in out]


def _run_all(args: argparse.Namespace, publishing: bool) -> int:
    """``status --all``: every host's LAST OK side by side."""
    if args.host or publishing:
        raise UsageError("status --all shows every host's LAST OK side by side; not with HOST, --prometheus "
                         "or --textfile")
    side_by_side = collect_all(StateDir(args.state_dir))
    if args.json:
        emit(SCHEMAS["status-all"], Outcome.OK, side_by_side.to_value())
    else:
        print("\n".join(_lines_all(side_by_side)))
    return 0


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.host:
        authority.lookup(config, args.host)
    publishing = bool(args.prometheus or args.textfile)
    if args.all:
        return _run_all(args, publishing)
    if args.json and publishing:
        raise UsageError("--json and --prometheus/--textfile are different outputs; give one")
    state = StateDir(args.state_dir)
    if publishing:
        from ..report import metrics

        path = metrics.check_textfile(args.textfile) if args.textfile else None
        registry = metrics.registry_for(collect(state, args.host), state)
        metrics.publish(registry, prometheus=args.prometheus, textfile=path)
        return 0
    status = collect(state, args.host)
    if args.json:
        emit(SCHEMAS["status"], Outcome.OK, status.to_value())
    elif sys.stdout.isatty():
        print("\n".join(render(status, color=use_color(sys.stdout))))
    else:
        print("\n".join(_lines(status)))
    return 0
