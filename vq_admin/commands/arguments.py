"""The command-line arguments every lane verb shares: program and host names, full commit SHAs."""

from __future__ import annotations

from ..agent.identifiers import FULL_SHA_RE, NAME_RE
from ..outcome import UsageError

SHA_RULE = "give the full commit SHA: 40 (or 64) hex digits; abbreviations and ref names are not accepted"


def full_sha(value: str | None, option: str = "--expected-sha") -> str | None:
    if value is None:
        return None
    if not FULL_SHA_RE.match(value):
        raise UsageError(f"{option}: {value!r} is not a full commit SHA; {SHA_RULE}")
    return value.lower()


def check_name(value: str, what: str) -> str:
    if not NAME_RE.match(value):
        raise UsageError(f"{what} {value!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return value
