"""The name rules of :mod:`vq_site_example.names` as plain string checks, without ``re``.

``verify`` runs for every update and reads its few options with these; loading
``re`` (and compiling three patterns) would cost more than the whole check.
Each function accepts exactly what the regular expression of the same name in
:mod:`vq_site_example.names` matches (``tests/test_site_example_verify.py``
proves it with hypothesis); the regular expressions stay the definition the
whole grammar (:mod:`vq_site_example.args`) uses.
"""

from __future__ import annotations

_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_PROGRAM_REST = _ALNUM | frozenset("._-")
_TAG_REST = _ALNUM | frozenset("._/+-")


def is_program(value: str) -> bool:
    """``PROGRAM_RE``: an ASCII letter or digit, then up to 63 of letters, digits, ``.``, ``_``, ``-``."""
    return (0 < len(value) <= 64 and value[0] in _ALNUM
            and all(c in _PROGRAM_REST for c in value))


def is_full_sha(value: str) -> bool:
    """``FULL_SHA_RE``: exactly 40 or 64 hexadecimal digits (either case)."""
    return len(value) in (40, 64) and all(c in _HEX for c in value)


def is_tag(value: str) -> bool:
    """``TAG_RE``: an ASCII letter or digit, then up to 127 of letters, digits, ``.``, ``_``, ``/``,
    ``+``, ``-``; never ``..``."""
    return (0 < len(value) <= 128 and value[0] in _ALNUM and ".." not in value
            and all(c in _TAG_REST for c in value))
