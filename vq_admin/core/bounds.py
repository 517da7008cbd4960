"""Bounds checked before parsing any input (CONTRACT section 10, hostile input).

Every document vq-admin parses (the configuration, verify receipts, registry
entries, ``--pin``, state files) has a size bound, a nesting bound checked by
a linear scan *before* the parser runs, and type checks after; a parser
failure of any kind (``RecursionError``, a ``ValueError`` from a 5,000-digit
integer) is turned into :class:`InputError` with one line naming the input.

Standard library only (the per-job launcher lookup uses it).
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # not typing's: the launcher path (vq admin launcher, per job) never imports typing
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Union

    JsonValue = Union[None, bool, int, float, str, List["JsonValue"], Dict[str, "JsonValue"]]  #: any JSON value
    JsonObject = Dict[str, JsonValue]  #: a JSON object (the one JSON alias: vq_admin.document re-exports both)
    from datetime import date, datetime, time

    #: any TOML value: JSON's, less null, plus dates and times
    TomlValue = Union[bool, int, float, str, datetime, date, time, List["TomlValue"], Dict[str, "TomlValue"]]
    TomlTable = Dict[str, TomlValue]  #: a TOML table


#: Deepest nesting of arrays/objects/tables accepted in any document.
MAX_DEPTH = 64
#: Largest integer literal, in digits (Python's own limit for str -> int is 4,300).
MAX_INT_DIGITS = 40
#: Largest configuration file read (a site's file is a few KiB).
MAX_CONFIG_BYTES = 1 << 20


class InputError(ValueError):
    """An input that cannot be parsed safely; ``str()`` is one line."""


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """The deepest ``[``/``{`` nesting of JSON *text*, scanning at most until it exceeds *limit*."""
    if text.count("[") + text.count("{") <= limit:  # cannot be deeper (C-speed fast path)
        return 0
    depth = deepest = 0
    in_string = False
    chars = iter(text)
    for ch in chars:
        if in_string:
            if ch == "\\":
                next(chars, "")  # the escaped character: never the string's end
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def toml_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """The deepest nesting of TOML *text* outside strings and comments: ``[``/``{`` levels plus the
    dots of the key being read (``a.b.c = 1`` nests three tables deep, as ``[a.b.c]`` does)."""
    if text.count("[") + text.count("{") + text.count(".") <= limit:  # cannot be deeper (C-speed fast path)
        return 0
    depth = deepest = dots = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == ".":
            dots += 1
            if depth + dots > limit:
                return depth + dots
        elif ch in "\n=,{":
            dots = 0
        if ch == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if ch in "\"'":
            i = _string_end(text, i)
            continue
        if ch in "[{":
            depth += 1
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
        i += 1
    return deepest


def _string_end(text: str, i: int) -> int:
    """Where the TOML string that opens at *i* (basic or literal, single-line or triple-quoted) ends: the index
    after its closing quote (an unclosed single-line string ends at its line's end)."""
    ch = text[i]
    triple = text.startswith(ch * 3, i)
    quote = ch * 3 if triple else ch
    j, n = i + len(quote), len(text)
    while j < n:
        if ch == '"' and text[j] == "\\":
            j += 2
            continue
        if text.startswith(quote, j) or (not triple and text[j] == "\n"):
            break
        j += 1
    return j + len(quote)


def _parse_int(literal: str) -> int:
    digits = literal.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        raise InputError(f"holds an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})")
    return int(literal)


def _no_constant(name: str) -> object:
    raise InputError(f"holds {name}, which is not JSON")


def _unique_keys(pairs: list[tuple[str, JsonValue]]) -> JsonObject:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise InputError(f"holds the key {twice!r} more than once (which one counts is not defined)")
    return found


def _bounded_text(data: bytes | str, what: str, limit: int, not_utf8: str, depth: Callable[[str, int], int],
                  max_depth: int) -> str:
    """*data* as text when it holds at most *limit* bytes (characters, given as text), is UTF-8 (else
    "<what> <not_utf8> (...)") and nests at most *max_depth* levels deep by *depth*; else :class:`InputError`."""
    if isinstance(data, bytes):
        if len(data) > limit:
            raise InputError(f"{what} is larger than {limit} bytes")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{what} {not_utf8} ({exc.reason} at byte {exc.start})") from None
    elif len(data) > limit:
        raise InputError(f"{what} is larger than {limit} characters")
    if depth(data, max_depth) > max_depth:
        raise InputError(f"{what} is nested more than {max_depth} levels deep")
    return data


def loads_json(data: bytes | str, what: str, *, limit: int, max_depth: int = MAX_DEPTH, nan: bool = False) -> JsonValue:
    """Parse one JSON document of at most *limit* bytes and *max_depth* nesting (the one ``json.loads``
    of both sides; *nan* lets ``NaN``/``Infinity`` through, as the agent's codec writes them).

    Raises :class:`InputError` ("<what> ...: reason") for anything else."""
    data = _bounded_text(data, what, limit, "is not UTF-8", json_depth, max_depth)
    try:
        value: JsonValue = json.loads(data, parse_int=_parse_int, parse_constant=None if nan else _no_constant,
                                      object_pairs_hook=_unique_keys)
        return value
    except InputError as exc:
        raise InputError(f"{what} {exc}") from None
    except RecursionError:
        raise InputError(f"{what} is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int conversion limits
        raise InputError(f"{what} is not valid JSON: {str(exc).splitlines()[0][:200]}") from None


def json_object(data: bytes | str | None, *, limit: int) -> JsonObject | None:
    """The JSON object in *data* (bounded as :func:`loads_json`), or ``None``: absent, unreadable or not an object."""
    try:
        value = None if data is None else loads_json(data, "the record", limit=limit)
    except InputError:
        return None
    return value if isinstance(value, dict) else None


def loads_toml(data: bytes, what: str, *, limit: int, max_depth: int = MAX_DEPTH) -> TomlTable:
    """Parse a TOML document with the same bounds as :func:`loads_json` (the driver's only: ``tomllib`` is
    Python 3.11's, and the agent reads no TOML)."""
    import tomllib

    text = _bounded_text(data, what, limit, "is not valid TOML: not UTF-8", toml_depth, max_depth)
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise InputError(f"{what} is nested too deeply") from None
    except ValueError as exc:  # TOMLDecodeError, and int conversion limits
        raise InputError(f"{what} is not valid TOML: {str(exc).splitlines()[0][:200]}") from None


def read_config(path: str) -> TomlTable:
    """The configuration file *path* (the one reader: ``vq_admin.config`` and the launcher's lookup): a
    trusted regular file of bounded size and nesting, parsed as TOML; every fault is one :class:`InputError`
    naming the file."""
    what = f"configuration file {path}"
    try:
        raw = read_regular_file(path, "configuration file", limit=MAX_CONFIG_BYTES, trusted=True)
    except FileNotFoundError:
        raise InputError(f"{what} does not exist (set VQ_ADMIN_CONFIG or --config)") from None
    except OSError as exc:
        raise InputError(f"{what} cannot be read: {exc.strerror or exc}") from None
    return loads_toml(raw, what, limit=MAX_CONFIG_BYTES)


def read_regular_file(path: str, what: str, *, limit: int, trusted: bool = False) -> bytes:
    """The bytes of the regular file *path* (a symlink the operator named is followed).

    Opened with ``O_NONBLOCK`` so a FIFO never blocks; anything but a regular
    file, or more than *limit* bytes, raises :class:`InputError`.  With
    *trusted*, the file must also pass the secure-path rule, checked on the
    open file (``fstat``, :func:`~vq_admin.core.securepath.opened_problem`):
    what is read is what was checked (else :class:`InputError`, "... refusing it").
    ``FileNotFoundError`` and other ``OSError`` propagate."""
    import os
    import stat

    from .securepath import opened_problem, read_bounded

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except IsADirectoryError:
        raise InputError(f"{what} {path} is a directory, not a regular file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "FIFO" if stat.S_ISFIFO(st.st_mode) else "special file"
            raise InputError(f"{what} {path} is a {kind}, not a regular file")
        if st.st_size > limit:
            raise InputError(f"{what} {path} is larger than {limit} bytes")
        if trusted:
            problem = opened_problem(path, fd, st, what=what)
            if problem:
                raise InputError(f"{problem}; refusing it")
        data = read_bounded(fd, limit)
        if data is None:
            raise InputError(f"{what} {path} is larger than {limit} bytes")
        return data
    finally:
        os.close(fd)
