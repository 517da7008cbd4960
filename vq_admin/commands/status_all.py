"""``vq admin status --all``: every host's LAST OK side by side, per lane and program.

One block per runtime program (and one for the helper lane): a row per host
with the SHA (first 12 digits), tag and time of its LAST OK, and whether the
hosts agree, so drift across the fleet is visible at a glance.  Reads the
state directory (the configuration was read by ``status``); runs nothing anywhere.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..report.envelope import SCHEMAS, emit
from ..report.outcome import Outcome
from ..report.output import safe_text
from ..state.records import StateDir


def collect(state: StateDir) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for host, lane, program in state.lanes():
        key = "helper" if lane == "helper" else f"runtime {program}"
        last_ok = state.read_record(lane, host, program, "last-ok")
        last = state.read_record(lane, host, program, "last") or {}
        groups.setdefault(key, {})[host] = {
            "sha": (last_ok or {}).get("sha"),
            "tag": (last_ok or {}).get("tag"),
            "at": (last_ok or {}).get("at"),
            "last_outcome": last.get("outcome"),
        }
    return {"state_dir": str(state.root), "last_ok": groups}


def lines(status: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, hosts in sorted(status["last_ok"].items(), key=lambda kv: (kv[0] == "helper", kv[0])):
        shas = {h["sha"] for h in hosts.values() if h["sha"]}
        missing = sum(1 for h in hosts.values() if not h["sha"])
        if len(shas) <= 1 and not missing:
            agree = "all hosts agree"
        else:
            agree = f"DRIFT: {len(shas)} distinct SHA(s)" + (f", {missing} host(s) without LAST OK" if missing else "")
        out.append(f"{key}: LAST OK on {len(hosts)} host(s), {agree}")
        width = max(len(name) for name in hosts)
        for name, h in sorted(hosts.items()):
            sha = (h["sha"] or "-")[:12]
            out.append(f"  {name:<{width}}  {sha:<12}  {h['tag'] or '-':<12}  {h['at'] or '-':<20}  "
                       f"last {h['last_outcome'] or '-'}")
    if not out:
        out.append(f"no recorded runs in {status['state_dir']}")
    return [safe_text(line) for line in out]


def run(args: argparse.Namespace) -> int:
    status = collect(StateDir(args.state_dir))
    if args.json:
        emit(SCHEMAS["status-all"], Outcome.OK, status)
    else:
        print("\n".join(lines(status)))
    return 0
