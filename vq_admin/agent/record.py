"""The host's record (CONTRACT section 12): one entry per run, appended, never edited.

Layout, in the login account's agent state beside the lease directory::

    ${XDG_STATE_HOME:-~/.local/state}/vq-admin-agent/record/
        <program>/                       one directory per program (runtime lane)
        _helper/                         the helper lane's
            .lock                        the record lock (flock) of appends
            0000000001-<16 hex>.json     an in-toto Statement v1, JSON text
            0000000001-<16 hex>.json.sig its detached ssh signature (absent: unsigned)

The number orders the entries (the next is one more than the largest name
present, signature or statement); the hex is the first 16 of the statement's
SHA-256.  Each file is written to a temporary name (``.tmp.*``, which readers
ignore), flushed to disk and linked to its name, which never replaces a file:
the signature first, then the statement, then the directory is flushed.  A
reader takes an entry only once its statement exists, so it never sees a
whole statement whose signature is partial; a crash between the two leaves a
signature without its statement, which readers ignore and the next append
numbers past.  Nothing here edits or removes an entry.

:func:`append` takes the record lock itself, so a writer that does not hold
the run's host-side lease (a quarantine: ``record-quarantine``, which appends
only a quarantine or lift statement of its program) appends safely too; :func:`read_after`
takes no lock.  Standard library only, Python 3.8.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os

from ..core import atomic, default_paths as paths, protocol, securepath
from ..core.failpoints import failpoint
from ..core.names import is_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

    from ..core.protocol import Appended, AppendAnswer, RecordEntry, RecordRead

HELPER = protocol.HELPER_RECORD
LOCK = ".lock"
SUFFIX, SIG = ".json", ".sig"
SEQ_DIGITS, HEX_DIGITS = 10, 16
#: The largest statement or signature kept or read.
MAX_ENTRY = 1 << 16
#: The most entries one answer carries (the driver asks again after the last for the rest).
MAX_ANSWER = 2000


def directory(program: Optional[str]) -> str:
    """The record directory of *program* (``None``: the helper lane)."""
    if program is not None and not is_name(program):
        raise ValueError(f"program {program!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return os.path.join(paths.agent_record_dir(), program or HELPER)


def entry_name(seq: int, statement: bytes) -> str:
    return f"{seq:0{SEQ_DIGITS}d}-{hashlib.sha256(statement).hexdigest()[:HEX_DIGITS]}{SUFFIX}"


def parse_name(name: str) -> Optional[Tuple[int, bool]]:
    """``(seq, is_signature)`` of an entry's file name, ``None`` for any other name (temporary files)."""
    stem, dot, rest = name.partition(".")  # an entry's stem holds no dot
    seq, dash, digest = stem.partition("-")
    if (dot + rest in (SUFFIX, SUFFIX + SIG) and dash and len(seq) == SEQ_DIGITS and seq.isdigit()
            and len(digest) == HEX_DIGITS and all(c in "0123456789abcdef" for c in digest)):
        return int(seq), rest.endswith(SIG)
    return None


#: How the record directory is opened, once it passed the secure-path rule.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def append(program: Optional[str], statement: bytes, sig: Optional[bytes]) -> Appended:
    """Append one entry (*sig* ``None``: unsigned) under the record lock: ``{"seq", "name", "dir"}``.
    Raises ``ValueError`` for an entry too large or empty, :class:`~.securepath.Untrusted`, ``OSError``."""
    if not statement or len(statement) > MAX_ENTRY or (sig is not None and (not sig or len(sig) > MAX_ENTRY)):
        raise ValueError(f"a record entry must be 1 to {MAX_ENTRY} bytes, its signature too")
    path = directory(program)
    securepath.make_private_dir(path, what="record directory")
    dir_fd = os.open(path, DIR_FLAGS)
    try:
        lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # held only for the few writes below, by whoever appends
            seq = 1 + max((parsed[0] for parsed in map(parse_name, os.listdir(dir_fd)) if parsed), default=0)
            name = entry_name(seq, statement)
            if sig is not None:
                atomic.write(name + SIG, sig, dir_fd=dir_fd, exclusive=True)
            failpoint("record-before-statement")
            atomic.write(name, statement, dir_fd=dir_fd, exclusive=True)  # linked: never replaces
            os.fsync(dir_fd)
        finally:
            os.close(lock)
    finally:
        os.close(dir_fd)
    return {"seq": seq, "name": name, "dir": path}


def _read(dir_fd: int, name: str) -> Optional[bytes]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return None
        raise
    try:
        return securepath.read_bounded(fd, MAX_ENTRY)
    finally:
        os.close(fd)


def read_after(program: Optional[str], cursor: int) -> RecordRead:
    """The entries numbered above *cursor*, oldest first, at most :data:`MAX_ANSWER` (``more`` when there
    are others): each ``{"seq", "name", "statement": text, "sig": text or None}`` (``error`` instead of
    text that is not UTF-8 or too large); ``last`` is the largest number answered (or *cursor*).  A
    record directory that fails the secure-path rule answers ``error`` and no entry."""
    try:
        path = directory(program)
        if not os.path.lexists(path):
            return {"entries": [], "last": cursor}
        securepath.check(path, what="record directory")
        dir_fd = os.open(path, DIR_FLAGS)
    except (ValueError, securepath.Untrusted) as exc:
        return {"entries": [], "last": cursor, "error": str(exc)}
    try:
        names = sorted((parsed[0], name) for name, parsed in ((n, parse_name(n)) for n in os.listdir(dir_fd))
                       if parsed and not parsed[1] and parsed[0] > cursor)
        entries: List[RecordEntry] = []
        for seq, name in names[:MAX_ANSWER]:
            entry: RecordEntry = {"seq": seq, "name": name}
            entry["statement"] = _text(entry, "statement", _read(dir_fd, name))
            entry["sig"] = _text(entry, "sig", _read(dir_fd, name + SIG))
            if entry["statement"] is None and "error" not in entry:
                entry["error"] = "statement unreadable or larger than 64 KiB"
            entries.append(entry)
    finally:
        os.close(dir_fd)
    return {"entries": entries, "last": entries[-1]["seq"] if entries else cursor, "more": len(names) > MAX_ANSWER}


def _text(entry: RecordEntry, key: str, data: Optional[bytes]) -> Optional[str]:
    """*data* as text (``None`` for none); not UTF-8: ``None``, and *entry*'s ``error`` says which."""
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        entry["error"] = f"{key} is not UTF-8 text"
        return None


def request_program(request: object) -> Tuple[Optional[str], int]:
    """``(program, cursor)`` of a ``record`` request member ``{"program": P or null, "after": N}``."""
    if not isinstance(request, dict):
        raise ValueError("bad record request")
    program, after = request.get("program"), request.get("after", 0)
    if (program is not None and not isinstance(program, str)) or not isinstance(after, int) or after < 0:
        raise ValueError("bad record request")
    return program, after


def check_quarantine(program: Optional[str], statement: str) -> None:
    """Refuse (``ValueError``) a *statement* that is not an in-toto quarantine or lift statement of *program*."""
    value = protocol.decode(statement)
    predicate = value.get("predicate") if isinstance(value, dict) else None
    if not (isinstance(predicate, dict) and value.get("_type") == "https://in-toto.io/Statement/v1"
            and value.get("predicateType") == protocol.QUARANTINE_PREDICATE and predicate.get("program") == program
            and predicate.get("action") in ("quarantine", "lift")):
        raise ValueError(f"not a quarantine or lift statement of {program}")


def serve_line(line: bytes, program: Optional[str], quarantine: bool = False) -> AppendAnswer:
    """One line a run sends on a held lease's stdin (or ``record-quarantine``'s, *quarantine*: only a
    quarantine or lift statement of *program*): ``{"append": {"statement": TEXT, "sig": TEXT or null}}``,
    appended to the record of *program*; the answer line's object."""
    try:
        asked = protocol.decode(line.decode("utf-8")).get("append")
        statement, sig = asked.get("statement"), asked.get("sig")
        if not isinstance(statement, str) or not (sig is None or isinstance(sig, str)):
            raise ValueError("bad append request")
        if quarantine:
            check_quarantine(program, statement)
        return {"appended": append(program, statement.encode(), None if sig is None else sig.encode())}
    except (AttributeError, UnicodeDecodeError, ValueError) as exc:
        return {"append_error": f"bad append request: {exc}"}
    except securepath.Untrusted as exc:
        return {"append_error": f"refused: {exc}"}
    except OSError as exc:
        return {"append_error": f"cannot append to the record: {exc.strerror or exc}"}
