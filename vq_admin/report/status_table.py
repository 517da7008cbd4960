"""``vq admin status`` at a glance, on a terminal: one table per host.

It takes the document :func:`vq_admin.commands.status.collect` builds (the
same one ``--json`` prints; its types are here, where the table and
:mod:`vq_admin.report.metrics` read them too) and lays it out::

    cluster
      PROGRAM         LAST OK                      LAST GOOD                    LAST RUN
      (helper)        1f0c2a9b7e5d  -         3h   -                            ok       3h
      vibeqc-release  3f2c9d0b8e6a  v1.2.3    2d   9a41c2e17d3b  v1.2.2   30d   failed   5m

A SHA is shortened to 12 hex digits, each time is an age (``45s``, ``5m``,
``3h``, ``2d``), and a last run that ended ``failed`` or ``unknown`` is
highlighted (other outcomes but ``ok``/``already-current`` are too, in a
milder colour).  Colour only on a terminal, and never when ``NO_COLOR`` is
set (https://no-color.org).  Off a terminal ``status`` prints its full,
unabbreviated lines instead, for scripts and mail.
"""

from __future__ import annotations

import os
import time
from typing import Iterator, TextIO

from .output import safe_message, safe_text
from ..core.stamps import parse_utc
from ..document import Document
from ..state.records import LastRun, Verified

SHORT_SHA = 12
RED_BOLD, YELLOW, RESET = "\x1b[1;31m", "\x1b[33m", "\x1b[0m"
#: Outcomes shown in red: the run did something and it is not known good.
ALARM = frozenset({"failed", "unknown"})
#: Outcomes shown as they are.
FINE = frozenset({"ok", "already-current"})


class LaneStatus(Document, frozen=True, kw_only=True):
    """A lane's records: its last run, LAST OK and LAST GOOD (``None``: none recorded)."""

    last: LastRun | None
    last_ok: Verified | None
    last_good: Verified | None


class HostStatus(Document, frozen=True, kw_only=True):
    helper: LaneStatus | None = None
    runtimes: dict[str, LaneStatus] = {}


class Status(Document, frozen=True, kw_only=True):
    """``vq admin status [HOST]`` (schema ``vq-admin/status/1``)."""

    state_dir: str
    hosts: dict[str, HostStatus]


def use_color(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR")


def age(stamp: str | None, now: float) -> str:
    """``2026-11-30T10:00:00Z`` -> ``3h`` (how long before *now*); ``?`` when unreadable."""
    if not isinstance(stamp, str):
        return "-"
    at = parse_utc(stamp)
    if at is None:
        return "?"
    seconds = now - at
    if seconds < 0:
        return "future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _identity(record: Verified | None, now: float) -> tuple[str, str, str]:
    if record is None:
        return "-", "", ""
    return record.sha[:SHORT_SHA], record.tag or "-", age(record.at, now)


def lanes(slot: HostStatus) -> Iterator[tuple[str, str, LaneStatus]]:
    """(lane, program, entry) of each recorded lane of a host: the helper's first (no program), then each runtime."""
    if slot.helper:
        yield "helper", "", slot.helper
    for program, entry in sorted(slot.runtimes.items()):
        yield "runtime", program, entry


HEADER = ("PROGRAM", "LAST OK", "", "", "LAST GOOD", "", "", "LAST RUN", "")


def render(status: Status, *, now: float | None = None, color: bool = False) -> list[str]:
    """The table of every host in the status document *status*, as lines (escape sequences only when *color*)."""
    now = time.time() if now is None else now
    if not status.hosts:
        return [safe_message(f"no recorded runs in {status.state_dir}")]
    lines: list[str] = []
    for host, slot in sorted(status.hosts.items()):
        lines += ([""] if lines else []) + [safe_text(host)] + _host_table(slot, now, color)
    return lines


def _host_table(slot: HostStatus, now: float, color: bool) -> list[str]:
    rows: list[tuple[str, ...]] = []
    for _, program, entry in lanes(slot):
        last = entry.last or LastRun(outcome="")
        raw = (program or "(helper)", *_identity(entry.last_ok, now), *_identity(entry.last_good, now),
               last.outcome or "-", age(last.at, now))
        rows.append(tuple(safe_text(cell) for cell in raw))
    w = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
    for start in (1, 4):  # a header spans its identity's three cells (sha, tag, age)
        w[start] += max(0, len(HEADER[start]) - (w[start] + w[start + 1] + w[start + 2] + 4))
    head = [HEADER[0].ljust(w[0]), HEADER[1].ljust(w[1] + w[2] + w[3] + 4), HEADER[4].ljust(w[4] + w[5] + w[6] + 4),
            HEADER[7]]
    lines = ["  " + "  ".join(head).rstrip()]
    for row in rows:
        identities = (f"{row[i].ljust(w[i])}  {row[i + 1].ljust(w[i + 1])}  {row[i + 2].rjust(w[i + 2])}"
                      for i in (1, 4))
        cells = [row[0].ljust(w[0]), *identities, f"{row[7].ljust(w[7])}  {row[8].rjust(w[8])}"]
        line = "  " + "  ".join(cells).rstrip()
        outcome = row[7]  # escaped: an outcome with control characters is in neither set either way
        paint = RED_BOLD if outcome in ALARM else "" if outcome in FINE else YELLOW
        lines.append(f"{paint}{line}{RESET}" if color and paint else line)
    return lines
