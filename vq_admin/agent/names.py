"""The name rule of :data:`.identifiers.NAME_RE`, without ``re``.

``NAME_RE`` (``\\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\\Z``: program, host and
provider names) is the one definition; :func:`is_name` is the same anchored
check spelled with ``str`` operations, for the agent's per-run path (the
lease of ``session``), which imports neither ``re`` nor ``enum``.
``tests/test_agent_fastpath.py`` proves with hypothesis that both accept exactly
the same values.

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_REST = _FIRST | frozenset("._-")


def is_name(value: Any) -> bool:
    """``bool(NAME_RE.match(value))``; a value that is not a ``str`` raises the regex's own ``TypeError``."""
    if not isinstance(value, str):
        from .identifiers import NAME_RE

        return bool(NAME_RE.match(value))
    return 0 < len(value) <= 64 and value[0] in _FIRST and all(c in _REST for c in value[1:])
