"""The command-line arguments every lane verb shares: program and host names, full commit SHAs."""

from __future__ import annotations

from ..core.identifiers import FULL_SHA_RE, NAME_RE, NAME_RULE, SHA_RULE
from ..report.outcome import UsageError


def full_sha(value: str | None, option: str = "--expected-sha") -> str | None:
    if value is None:
        return None
    if not FULL_SHA_RE.match(value):
        raise UsageError(f"{option}: {value!r} is not a full commit SHA; {SHA_RULE}")
    return value.lower()


def check_name(value: str, what: str) -> str:
    if not NAME_RE.match(value):
        raise UsageError(f"{what} {value!r} must match {NAME_RULE}")
    return value
