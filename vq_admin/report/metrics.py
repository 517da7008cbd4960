"""``vq admin status --prometheus`` / ``--textfile PATH``: the state directory as metrics.

For node_exporter's textfile collector: the Prometheus text exposition format,
built with ``prometheus_client`` (a registry of its own, ``generate_latest``,
and ``write_to_textfile`` for an atomic temp-file-and-rename write).  Imported
only for these options: ``vq admin status`` without them, and every other
verb, never load ``prometheus_client``.

One series set per host and lane (``program`` is empty for the helper lane), each gauge
described in :func:`registry_for` (and in docs/operator-guide.md).

``vq admin verify --prometheus`` / ``--textfile PATH`` publish, per host and program, the gauge
``vq_admin_runtime_drift{host,program}`` and the state set ``vq_admin_runtime_state{host,program,state}``
(:func:`drift_registry`), in a file of their own beside this one.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Iterable

from .outcome import Refused, UsageError
from .status_table import LaneStatus, Status, lanes
from ..state.records import LastRun, StateDir
from ..core.stamps import parse_utc

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

LABELS = ("host", "program", "lane")


#: The gauges of each recorded lane, labelled host, program and lane: (what :func:`_lane_values` calls it, name, help).
_LANE_GAUGES = (
    ("exit_code", "vq_admin_last_exit_code", "Exit status of the last vq-admin run of this host and lane"),
    ("last_run", "vq_admin_last_run_timestamp_seconds", "When the last vq-admin run of this host and lane "
     "finished, seconds since the epoch"),
    ("last_ok", "vq_admin_last_ok_timestamp_seconds", "When the identity now LAST OK was verified, seconds "
     "since the epoch"),
    ("duration", "vq_admin_last_run_duration_seconds", "How long the last vq-admin run of this host and "
     "lane took, from its receipt"),
    ("transcript", "vq_admin_transcript_complete", "1 when the last allocation build's transcript settled "
     "complete, 0 when it is incomplete (only for runs that built in a Slurm allocation)"),
)


def registry_for(status: Status, state: StateDir) -> CollectorRegistry:
    """A fresh ``CollectorRegistry`` holding the metrics of the status document *status*."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry(auto_describe=True)
    outcome = Gauge("vq_admin_last_outcome", "Outcome of the last vq-admin run of this host and lane (always 1; "
                    "the outcome label carries it)", LABELS + ("outcome",), registry=registry)
    gauges = {key: Gauge(name, doc, LABELS, registry=registry) for key, name, doc in _LANE_GAUGES}
    uses = Gauge("vq_admin_runtime_uses", "Uses of this generation recorded by vq admin launcher in this state "
                 "directory (every lookup, folded ones included; it only grows)", ("host", "program", "sha"),
                 registry=registry)
    last_use = Gauge("vq_admin_runtime_last_use_timestamp_seconds", "When vq admin launcher last handed out this "
                     "generation, seconds since the epoch", ("host", "program", "sha"), registry=registry)
    for host, slot in sorted(status.hosts.items()):
        for lane, program, entry in lanes(slot):
            labels = {"host": host, "program": program, "lane": lane}
            last = entry.last or LastRun(outcome="")
            if last.outcome:
                outcome.labels(outcome=last.outcome, **labels).set(1)
            for key, value in _lane_values(entry, last, state).items():
                if value is not None:
                    gauges[key].labels(**labels).set(value)
            if lane == "runtime":
                from ..launcher.recall import read_uses

                for sha, usage in read_uses(state.root, host, program).items():
                    uses.labels(host=host, program=program, sha=sha).set(usage.count)
                    at = parse_utc(f"{usage.last[:19]}Z") if usage.last else None
                    if at is not None:
                        last_use.labels(host=host, program=program, sha=sha).set(at)
    return registry


def _lane_values(entry: LaneStatus, last: LastRun, state: StateDir) -> dict[str, float | None]:
    """The value of each of :data:`_LANE_GAUGES` for one lane (``None``: not known, no series)."""
    receipt = state.read_receipt(last.receipt) or {}
    started, finished = parse_utc(receipt.get("started_at")), parse_utc(receipt.get("finished_at"))
    deploy = receipt.get("deploy")
    output = receipt.get("command_output") if isinstance(deploy, dict) and deploy.get("log_dir") else None  # allocation
    return {
        "exit_code": last.exit_code,
        "last_run": parse_utc(last.at),
        "last_ok": parse_utc(entry.last_ok.at if entry.last_ok else None),
        "duration": finished - started if started is not None and finished is not None and finished >= started
        else None,
        "transcript": float(output.get("complete") is True) if isinstance(output, dict) else None,
    }


def drift_registry(found: Iterable[tuple[str, str, str]], states: tuple[str, ...]) -> CollectorRegistry:
    """``vq admin verify``'s gauges from its *found* (host, program, state) triples:
    ``vq_admin_runtime_drift{host,program}``, 0 when the runtime is ``current``, else 1; and the state set
    ``vq_admin_runtime_state{host,program,state}``, one series for each of *states*, 1 for the one found and 0
    for the others.  A change of state changes values, never the series (a label that took the state's value
    would start a new series at each change)."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry(auto_describe=True)
    drift = Gauge("vq_admin_runtime_drift", "0 when vq admin verify found the runtime LAST OK names active and "
                  "verified, else 1 (vq_admin_runtime_state says which state)", ("host", "program"), registry=registry)
    state = Gauge("vq_admin_runtime_state", "1 for the state vq admin verify found the runtime in, 0 for every "
                  f"other ({', '.join(states)})", ("host", "program", "state"), registry=registry)
    for host, program, found_state in sorted(found):
        drift.labels(host=host, program=program).set(found_state != "current")
        for name in states:
            state.labels(host=host, program=program, state=name).set(found_state == name)
    return registry


def publish(registry: CollectorRegistry, *, prometheus: bool, textfile: str | None) -> None:
    """Write *registry* to *textfile* atomically (temp file in the same directory, then rename) and, with
    *prometheus*, print it in the text exposition format (``# HELP``, ``# TYPE``, samples)."""
    from prometheus_client import generate_latest, write_to_textfile

    if textfile:
        write_to_textfile(textfile, registry)
    if prometheus:
        sys.stdout.write(generate_latest(registry).decode("utf-8"))


def check_textfile(path: str) -> str:
    """The absolute *path* for ``--textfile``, or a usage error / refusal naming the rule."""
    from ..core.securepath import path_problem

    if not path.endswith(".prom"):
        raise UsageError(f"--textfile {path!r} must end in .prom (node_exporter's textfile collector reads only "
                         "*.prom files)")
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise UsageError(f"--textfile {path}: the directory {directory} does not exist")
    # The temp file is written next to PATH under a predictable name: a directory others can
    # write to could hold a link planted there, so it must pass the secure-path rule.
    problem = path_problem(directory, what="textfile directory")
    if problem:
        raise Refused(problem)
    if os.path.isdir(path):
        raise UsageError(f"--textfile {path} is a directory; give the .prom file to write")
    return path
