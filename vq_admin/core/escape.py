"""The one rule for echoing a value in a message: control characters escaped, long values shortened.

A *control character* is C0 (U+0000-U+001F), DEL, C1 (U+0080-U+009F), the Unicode line separators and
the bidirectional controls that reorder what a terminal shows.  :func:`escape` writes each as ``\\xNN``
or ``\\uNNNN`` (a newline in ``--state-dir`` cannot start a fake line); :func:`shown` also shortens a
value longer than :data:`LIMIT` characters to its start and end with its length (a 120 KB argument is
not echoed whole).  Standard library only, Python 3.8: the agent and the per-job launcher lookup use it.
"""

from __future__ import annotations

#: The code points :func:`escape` writes out.
CONTROL = frozenset([*range(0x20), *range(0x7F, 0xA0), 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F),
                     *range(0x2066, 0x206A)])
_TABLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in CONTROL}
#: Longest value echoed whole.
LIMIT = 200


def has_control(text: str) -> bool:
    """Whether *text* holds a :data:`CONTROL` character."""
    return any(ord(ch) in CONTROL for ch in text)


def escape(text: str, *, keep: str = "") -> str:
    """*text* with every :data:`CONTROL` character escaped, but those in *keep* (``"\\t\\n"`` for
    multi-line text whose lines are already indented as one value)."""
    return text.translate({c: v for c, v in _TABLE.items() if chr(c) not in keep} if keep else _TABLE)


def shorten(text: str, limit: int = LIMIT) -> str:
    """*text* when at most *limit* characters, else its start and end around ``...`` and its length."""
    if len(text) <= limit:
        return text
    keep = (limit - 40) // 2
    return f"{text[:keep]}...{text[-keep:]} ({len(text)} characters)"


def shown(value: object, limit: int = LIMIT) -> str:
    """*value* as a message echoes it: escaped, then :func:`shorten`-ed."""
    return shorten(escape(str(value)), limit)


def message(text: str, *, keep: str = "\t\n") -> str:
    """A whole message as printed: escaped (but *keep*), and each run of more than :data:`LIMIT`
    non-blank characters (an echoed value) shortened with its length."""
    import re

    return re.sub("[^ \t\n]{%d,}" % (LIMIT + 1), lambda m: shorten(m.group()), escape(text, keep=keep))
