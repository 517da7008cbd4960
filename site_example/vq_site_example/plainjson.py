"""``json.dumps`` of a flat receipt, without loading ``json``.

``verify`` runs for every update and prints one flat object whose values are
strings, integers, booleans or null.  :func:`dumps` writes exactly the text
``json.dumps`` writes for such an object with its default settings
(``ensure_ascii``, ``", "`` and ``": "`` separators): every character outside
printable ASCII is escaped as ``json`` escapes it (``\\n``, ``\\"``, ``\\uXXXX``, a
surrogate pair above U+FFFF).  ``tests/test_site_example_verify.py`` proves the
equality with hypothesis and parses the output with ``json``.  Any other value
type is refused (``TypeError``) rather than guessed.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Union

    Value = Union[str, int, bool, None]

#: The short escapes ``json`` uses; every other character below U+0020 becomes ``\\u00XX``.
_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _char(c: str) -> str:
    short = _SHORT.get(c)
    if short is not None:
        return short
    n = ord(c)
    if 0x20 <= n < 0x7F:
        return c
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 | (n >> 10):04x}\\u{0xDC00 | (n & 0x3FF):04x}"


def string(value: str) -> str:
    """One JSON string, as ``json.dumps(value)`` writes it."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return '"' + "".join(_char(c) for c in value) + '"'


def _value(value: Value) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is str:
        return string(value)
    raise TypeError(f"plainjson writes str, int, bool or None, not {type(value).__name__}")


def dumps(obj: Mapping[str, Value]) -> str:
    """``json.dumps(obj)`` for a flat mapping of str keys to str, int, bool or None."""
    return "{" + ", ".join(f"{string(key)}: {_value(value)}" for key, value in obj.items()) + "}"
