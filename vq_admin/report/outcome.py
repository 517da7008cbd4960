"""The closed set of outcomes and their exit codes (CONTRACT section 2).

Scripts switch on the exit code, never on text, so this table is pinned by a
test; change it only with a new contract version.
"""

from __future__ import annotations

import enum

from ..core import exits


#: What a message says when a run stopped after only read-only checks had run (a lease taken and
#: given back, a pre-verify, a check of paths): said once, here, so that it stays true.
READ_ONLY_RAN = "only read-only checks ran; nothing was changed"


class Outcome(str, enum.Enum):
    OK = "ok"
    ALREADY_CURRENT = "already-current"
    FAILED = "failed"
    USAGE = "usage"
    UNKNOWN = "unknown"
    LOCKED = "locked"
    REFUSED = "refused"
    INTERRUPTED = "interrupted"  # SIGINT, SIGTERM or SIGHUP before the lane started; nothing was changed

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self]

    @property
    def success(self) -> bool:
        return self in (Outcome.OK, Outcome.ALREADY_CURRENT)


EXIT_CODES: dict[Outcome, int] = {
    Outcome.OK: exits.OK,
    Outcome.ALREADY_CURRENT: exits.OK,
    Outcome.FAILED: exits.FAILED,
    Outcome.USAGE: exits.USAGE,
    Outcome.UNKNOWN: exits.UNKNOWN,
    Outcome.LOCKED: exits.LOCKED,
    Outcome.REFUSED: exits.REFUSED,
    Outcome.INTERRUPTED: exits.INTERRUPTED,
}


class VqAdminError(Exception):
    """An error that ends a run with a definite outcome and a message."""

    outcome: Outcome = Outcome.FAILED

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class UsageError(VqAdminError):
    """Bad command line or invalid configuration; nothing was run (exit 2)."""

    outcome = Outcome.USAGE


class Refused(VqAdminError):
    """A guard refused before any mutation (exit 77)."""

    outcome = Outcome.REFUSED


class Locked(VqAdminError):
    """Another run holds the same lane lock (exit 75)."""

    outcome = Outcome.LOCKED


class Interrupted(VqAdminError):
    """vq-admin itself was interrupted (SIGINT, SIGTERM, SIGHUP) mid-run (exit 3)."""

    outcome = Outcome.UNKNOWN
