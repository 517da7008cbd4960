"""The push-fed source mirror feed and the site preparer, as runtime-lane steps.

(Issue 4 builds this; until then a profile with feed_source_mirror is refused
before anything runs.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..outcome import UsageError

if TYPE_CHECKING:
    from .runtime import RuntimeUpdate


def plan(update: "RuntimeUpdate") -> None:
    """Add the mirror steps to the plan when the profile feeds a mirror."""
    if update.profile.feed_source_mirror is not None:
        raise UsageError("feed_source_mirror is not supported by this version yet")


def run(update: "RuntimeUpdate") -> None:
    """Feed the mirror and run the preparer (before the deploy step)."""
    return None
