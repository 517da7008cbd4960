"""UTC stamps, one format and one parser for both sides: ``2026-11-30T10:00:00Z`` in records,
``20261130T100000Z`` in names (receipt ids, aside directories).  Standard library only, Python 3.8."""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

RECORD, NAME = "%Y-%m-%dT%H:%M:%SZ", "%Y%m%dT%H%M%SZ"


def utc_now(at: "Optional[float]" = None, fmt: str = RECORD) -> str:
    """*at* (seconds since the epoch; now when ``None``) as a UTC stamp in *fmt*."""
    return time.strftime(fmt, time.gmtime(at))


def parse_utc(stamp: object) -> "Optional[float]":
    """A :func:`utc_now` stamp as seconds since the epoch; ``None`` when unreadable."""
    import calendar

    try:
        return float(calendar.timegm(time.strptime(str(stamp), RECORD)))
    except ValueError:
        return None
