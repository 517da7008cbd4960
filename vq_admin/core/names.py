"""The plain-string twins of three rules of :mod:`.identifiers`, for the paths that cannot load ``re``.

The regexes of :mod:`.identifiers` are the one definition of every rule.  The
per-job ``vq admin launcher`` (:mod:`vq_admin.launcher.plain_lookup`) answers its plain
case importing nothing a bare interpreter has not (``re`` and its ``enum``
cost that start more than the rest of its work), so the three rules it
checks are spelled here again with ``str`` operations, and nowhere else:

* :func:`is_name` is ``NAME_RE`` (program, host and provider names);
* :func:`is_full_sha` is ``SHA_RE`` (40 or 64 lower-case hex digits);
* :func:`is_sha256` is ``SHA256_RE`` (64 lower-case hex digits).

``tests/test_agent_fastpath.py`` proves with hypothesis that each accepts
exactly what its regex accepts.

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_REST = _FIRST | frozenset("._-")
_HEX = frozenset("0123456789abcdef")


def is_name(value: Any) -> bool:
    """``bool(NAME_RE.match(value))``; a value that is not a ``str`` raises the regex's own ``TypeError``."""
    if not isinstance(value, str):
        from .identifiers import NAME_RE

        return bool(NAME_RE.match(value))
    return 0 < len(value) <= 64 and value[0] in _FIRST and all(c in _REST for c in value[1:])


def is_full_sha(value: object) -> bool:
    """``SHA_RE``: 40 or 64 lower-case hex digits, the whole string (``False`` for what is not a ``str``)."""
    return isinstance(value, str) and len(value) in (40, 64) and _HEX.issuperset(value)


def is_sha256(value: object) -> bool:
    """``SHA256_RE``: 64 lower-case hex digits, the whole string (``False`` for what is not a ``str``)."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)
