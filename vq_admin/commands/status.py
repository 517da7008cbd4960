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
from typing import Any

from ..config import authority
from ..config import load_config
from ..report.envelope import SCHEMAS, emit
from ..report.outcome import Outcome, UsageError
from ..report.output import safe_message
from ..state.records import StateDir


def collect(state: StateDir, host: str | None) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for name, lane, program in state.lanes():
        if host and name != host:
            continue
        entry = {
            "last": state.read_record(lane, name, program, "last"),
            "last_ok": state.read_record(lane, name, program, "last-ok"),
            "last_good": state.read_record(lane, name, program, "last-good"),
        }
        slot = hosts.setdefault(name, {"helper": None, "runtimes": {}})
        if lane == "helper":
            slot["helper"] = entry
        else:
            slot["runtimes"][program] = entry
    return {"state_dir": str(state.root), "hosts": hosts}


def _identity(record: dict[str, Any] | None) -> str:
    if not record:
        return "-"
    text = f"{record.get('sha')}"
    if record.get("tag"):
        text += f" ({record['tag']})"
    if record.get("launcher"):
        text += f" {record['launcher']}"
    if record.get("verified_by"):  # another driver's signed entry of the host's record (CONTRACT section 12)
        text += f" verified by {record['verified_by']} (signed by {record.get('signer')})"
    return text + f" at {record.get('at')}"


def _lines(status: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for host, slot in sorted(status["hosts"].items()):
        lines.append(f"{host}")
        entries = ([("helper", slot["helper"])] if slot["helper"] else []) + sorted(slot["runtimes"].items())
        for label, entry in entries:
            last = entry["last"] or {}
            lines.append(f"  {label}: last {last.get('outcome', '-')} at {last.get('at', '-')} "
                         f"(sha {last.get('expected_sha')})")
            lines.append(f"    LAST OK   {_identity(entry['last_ok'])}")
            lines.append(f"    LAST GOOD {_identity(entry['last_good'])}")
    if not lines:
        lines.append(f"no recorded runs in {status['state_dir']}")
    return [safe_message(line) for line in lines]


def collect_all(state: StateDir) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for host, lane, program in state.lanes():
        key = "helper" if lane == "helper" else f"runtime {program}"
        last_ok = state.read_record(lane, host, program, "last-ok") or {}
        last = state.read_record(lane, host, program, "last") or {}
        groups.setdefault(key, {})[host] = {
            "sha": last_ok.get("sha"),
            "tag": last_ok.get("tag"),
            "at": last_ok.get("at"),
            "last_outcome": last.get("outcome"),
        }
    return {"state_dir": str(state.root), "last_ok": groups}


def _agreement(hosts: dict[str, dict[str, Any]]) -> str:
    """Whether the hosts' LAST OK agree, or how they drift."""
    shas = {h["sha"] for h in hosts.values() if h["sha"]}
    missing = sum(1 for h in hosts.values() if not h["sha"])
    if len(shas) <= 1 and not missing:
        return "all hosts agree"
    return f"DRIFT: {len(shas)} distinct SHA(s)" + (f", {missing} host(s) without LAST OK" if missing else "")


def _lines_all(status: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, hosts in sorted(status["last_ok"].items(), key=lambda kv: (kv[0] == "helper", kv[0])):
        out.append(f"{key}: LAST OK on {len(hosts)} host(s), {_agreement(hosts)}")
        width = max(len(name) for name in hosts)
        for name, h in sorted(hosts.items()):
            sha = (h["sha"] or "-")[:12]
            out.append(f"  {name:<{width}}  {sha:<12}  {h['tag'] or '-':<12}  {h['at'] or '-':<20}  "
                       f"last {h['last_outcome'] or '-'}")
    if not out:
        out.append(f"no recorded runs in {status['state_dir']}")
    return [safe_message(line) for line in out]


def _run_all(args: argparse.Namespace, publishing: bool) -> int:
    """``status --all``: every host's LAST OK side by side."""
    if args.host or publishing:
        raise UsageError("status --all shows every host's LAST OK side by side; not with HOST, --prometheus "
                         "or --textfile")
    side_by_side = collect_all(StateDir(args.state_dir))
    if args.json:
        emit(SCHEMAS["status-all"], Outcome.OK, side_by_side)
    else:
        print("\n".join(_lines_all(side_by_side)))
    return 0


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.host:
        authority.lookup(config, args.host)
    prometheus, textfile = getattr(args, "prometheus", False), getattr(args, "textfile", None)
    if getattr(args, "all", False):
        return _run_all(args, bool(prometheus or textfile))
    if args.json and (prometheus or textfile):
        raise UsageError("--json and --prometheus/--textfile are different outputs; give one")
    state = StateDir(args.state_dir)
    if prometheus or textfile:
        from ..report import metrics

        path = metrics.check_textfile(textfile) if textfile else None
        registry = metrics.registry_for(collect(state, args.host), state)
        metrics.publish(registry, prometheus=prometheus, textfile=path)
        return 0
    status = collect(state, args.host)
    if args.json:
        emit(SCHEMAS["status"], Outcome.OK, status)
    elif sys.stdout.isatty():
        from ..report.status_table import render, use_color

        print("\n".join(render(status, color=use_color(sys.stdout))))
    else:
        print("\n".join(_lines(status)))
    return 0
