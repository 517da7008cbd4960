"""The use record: every launcher lookup, per generation (CONTRACT section 14; standard library only).

``vq admin launcher PROGRAM HOST [--job REF]`` and ``resolve_launcher(..., job=REF)`` append one
line per use; ``vq admin jobs``, ``prune --used-within`` and ``status --prometheus`` read it.
Layout under the state directory (every level 0700, every file 0600, never through a symlink)::

    uses/<host>/<program>/<full sha>/current.log       the segment being appended to
    uses/<host>/<program>/<full sha>/<stamp>-<pid>.log  rotated segments, the newest KEEP_SEGMENTS
    uses/<host>/<program>/<full sha>/folded.json       per UTC day: uses, first and last of folded segments

A line is ``<UTC time, microseconds>\\t<user>\\t<REF or empty>\\t<launcher>\\n`` (program, host and
SHA are its directory), at most :data:`MAX_LINE` bytes (below ``PIPE_BUF``), written with one
``write(2)`` on an ``O_APPEND`` descriptor under a shared ``flock``: concurrent lookups never
interleave or lose a line, and a lookup killed at any point leaves either its whole line or none.
Each record is written with a newline before it as well, so a torn line (a short write, a full disk) ends
where the next record begins instead of gluing onto it.  A reader takes only lines that end in a newline
and start with a time and two more fields (the launcher is the rest of the line; a reference in bytes that
are not UTF-8 reads with U+FFFD), and skips empty ones, so even a torn or foreign line never breaks it.

Rotation: a writer that finds ``current.log`` over :data:`SEGMENT_BYTES` renames it to
``<stamp>-<pid>.log``; beyond :data:`KEEP_SEGMENTS` rotated segments, the oldest is folded into
``folded.json`` (its uses, first and last per UTC day; its references are dropped) and removed.
Rotation and folding take the directory's ``flock`` exclusively without waiting (a reader holds it
shared; when busy, the next lookup rotates); folding takes the segment's lock exclusively, so a
writer that opened it before the rename finishes first, and a writer that gets it afterwards finds
it unlinked and appends to the new ``current.log``.  ``folded.json`` names the segments it holds,
written before a segment is removed, so a crash between the two never counts a use twice.
So at most ``(KEEP_SEGMENTS + 1) * SEGMENT_BYTES`` (36 MiB) per generation, counts exact forever.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time

from ..core.names import is_full_sha, is_name
from ..core.securepath import level_problem, read_bounded, read_trusted_file
from ..core.stamps import utc_now

TYPE_CHECKING = False  # not typing's: the per-job launcher path imports this module
if TYPE_CHECKING:
    from typing import AbstractSet, Any, Iterable

SEGMENT_BYTES = 4 << 20
KEEP_SEGMENTS = 8
MAX_LINE = 4000
MAX_REF = 200
CURRENT, FOLDED = "current.log", "folded.json"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def ref_problem(ref: object) -> str | None:
    """``None`` when *ref* is a job reference the record takes: 1 to 200 printable ASCII characters, no space."""
    if not isinstance(ref, str) or not 0 < len(ref) <= MAX_REF or not ref.isascii() or not ref.isprintable() \
            or " " in ref:
        return f"--job {ref!r}: a job reference is 1 to {MAX_REF} printable ASCII characters without spaces"
    return None


def stamp(at: float) -> str:
    """*at* as ``2026-12-02T15:55:00.123456Z`` (fixed width: text order is time order)."""
    return utc_now(at, "%Y-%m-%dT%H:%M:%S") + ".%06dZ" % int(at % 1 * 1e6)


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (KeyError, ImportError):
        return str(os.geteuid())


def open_dirs(dfd: int, names: Iterable[str], create: bool) -> int | None:
    """An fd of *names* below the directory *dfd* (not closed here), each level opened without following
    a symlink and passing the secure-path rule (created 0700 when *create*); ``None`` when one is missing."""
    fd = dfd
    try:
        for name in names:
            try:
                child = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                child = os.open(name, _DIR, dir_fd=fd)
            if fd != dfd:
                os.close(fd)
            fd = child
            problem = level_problem(name, os.fstat(fd), is_dir=True)
            if problem:
                raise PermissionError(problem)
        result, fd = fd, dfd
        return result if result != dfd else os.dup(dfd)
    finally:
        if fd != dfd:
            os.close(fd)


def append(root_fd: int, host: str, program: str, sha: str, launcher: str, job: str | None,
           at: float | None = None) -> None:
    """Record one use (at *at*, default now) in the state directory *root_fd*; ``OSError`` or ``ValueError``
    when it cannot be."""
    if not (is_name(host) and is_name(program) and is_full_sha(sha)) or (job is not None and ref_problem(job)):
        raise ValueError("not a use to record")
    line = f"\n{stamp(time.time() if at is None else at)}\t{_user()}\t{job or ''}\t{launcher}\n".encode()
    if len(line) > MAX_LINE or "\t" in launcher or "\n" in launcher:
        raise ValueError(f"a use of {launcher} would be longer than {MAX_LINE} bytes")
    dfd = open_dirs(root_fd, ("uses", host, program, sha), True)
    assert dfd is not None
    try:
        for _ in range(8):  # a segment folded between open and lock is unlinked: open current.log again
            fd = os.open(CURRENT, _APPEND, 0o600, dir_fd=dfd)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                st = os.fstat(fd)
                if st.st_nlink == 0:
                    continue
                if not stat.S_ISREG(st.st_mode) or level_problem(CURRENT, st, is_dir=False):
                    raise PermissionError(f"{CURRENT} is not a private regular file")
                if os.write(fd, line) != len(line):
                    raise OSError("short write of a use")
                size = st.st_size + len(line)
            finally:
                os.close(fd)
            if size > SEGMENT_BYTES:
                try:
                    rotate(dfd)
                except (OSError, ValueError):
                    pass  # the use is recorded; the next lookup rotates
            return
        raise OSError("the use segment kept vanishing")
    finally:
        os.close(dfd)


def rotate(dfd: int) -> None:
    """Rename an oversized ``current.log`` and fold the oldest segments beyond :data:`KEEP_SEGMENTS`,
    when the directory's lock is free (else the next lookup does it)."""
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    try:
        try:
            if os.stat(CURRENT, dir_fd=dfd, follow_symlinks=False).st_size > SEGMENT_BYTES:
                os.rename(CURRENT, f"{time.time_ns():020d}-{os.getpid()}.log", src_dir_fd=dfd, dst_dir_fd=dfd)
        except FileNotFoundError:
            pass
        folded = _read_folded(dfd)
        done = set(folded.get("segments", ()))
        for name in done & set(os.listdir(dfd)):  # folded, then a crash before its removal
            os.unlink(name, dir_fd=dfd)
        for name in _segments(dfd, done)[:-KEEP_SEGMENTS]:  # KEEP_SEGMENTS > 0
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # writers that opened it before the rename finish first
                days = folded.setdefault("days", {})
                for at in [at.decode() for at, _ in _lines(read_bounded(fd, 1 << 30) or b"")]:
                    day = days.setdefault(at[:10], [0, at, at])
                    day[0], day[1], day[2] = day[0] + 1, min(day[1], at), max(day[2], at)
                folded["segments"] = [name]
                _write_folded(dfd, folded)
                os.unlink(name, dir_fd=dfd)
            finally:
                os.close(fd)
    finally:
        fcntl.flock(dfd, fcntl.LOCK_UN)


def _segments(dfd: int, done: Iterable[str] = ()) -> list[str]:
    """Rotated segments not yet folded, oldest first."""
    skip = set(done) | {CURRENT}
    return sorted(n for n in os.listdir(dfd) if n.endswith(".log") and n not in skip and not n.startswith("."))


_LINE = rb"(?m)^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)\t[^\t\n]*\t([^\t\n]*)\t[^\n]*\n"


def _lines(data: bytes) -> list[tuple[bytes, bytes]]:
    """``(time, reference)`` of each whole, well-formed line, as bytes; a torn last line or a foreign one is
    skipped (one regular expression over the segment up to its last newline: no Python code per line)."""
    import re

    return re.compile(_LINE).findall(data, 0, data.rfind(b"\n") + 1)


def _read_folded(dfd: int) -> dict[str, Any]:
    data = read_trusted_file(dfd, FOLDED, 16 << 20)
    if data is None:
        try:
            os.stat(FOLDED, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return {}  # nothing folded yet
        raise PermissionError(f"{FOLDED} is not a private regular file")  # never read as empty, then overwritten
    from ..core.bounds import loads_json

    value = loads_json(data, FOLDED, limit=16 << 20)
    if not isinstance(value, dict):
        raise ValueError(f"{FOLDED} is not a JSON object")
    return value


def _write_folded(dfd: int, folded: dict[str, Any]) -> None:
    import json

    from ..core import atomic

    atomic.write(FOLDED, json.dumps(folded, sort_keys=True).encode(), dir_fd=dfd)


class Usage:
    """The recorded uses of one generation: count, first, last, and every reference of the segments kept."""

    __slots__ = ("sha", "count", "first", "last", "refs", "folded")

    def __init__(self, sha: str) -> None:
        self.sha, self.count = sha, 0
        self.first: str | None = None
        self.last: str | None = None
        self.refs: AbstractSet[str] = frozenset()  #: in first-use order
        self.folded = 0  #: uses counted from folded segments (their references are gone)

    def add(self, count: int, first: str, last: str) -> None:
        self.count += count
        self.first = first if self.first is None or first < self.first else self.first
        self.last = last if self.last is None or last > self.last else self.last


def read(root_fd: int, host: str, program: str, shas: Iterable[str] | None = None, since: str | None = None
         ) -> dict[str, Usage]:
    """The uses of every generation of *program* on *host* recorded in the state directory *root_fd*
    (only *shas*, when given; only uses at or after *since*, a :func:`stamp` prefix; folded days whole)."""
    lane = open_dirs(root_fd, ("uses", host, program), False)
    if lane is None:
        return {}
    found: dict[str, Usage] = {}
    try:
        for sha in sorted(shas if shas is not None else os.listdir(lane)):
            dfd = open_dirs(lane, (sha,), False) if is_full_sha(sha) else None
            if dfd is not None:
                try:
                    found[sha] = _read_sha(dfd, sha, since)
                finally:
                    os.close(dfd)
    finally:
        os.close(lane)
    return found


def _read_sha(dfd: int, sha: str, since: str | None) -> Usage:
    from operator import itemgetter  # here, not on the per-job path

    usage = Usage(sha)
    fcntl.flock(dfd, fcntl.LOCK_SH)  # no rotation or fold while the segments are read
    try:
        folded = _read_folded(dfd)
        for count, first, last in folded.get("days", {}).values():
            if since is None or last >= since:
                usage.add(count, first, last)
                usage.folded += count
        refs, bound = [b""], (since or "").encode()  # b"": a use without a reference, first, dropped once decoded
        for name in [*_segments(dfd, folded.get("segments", ())), CURRENT]:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(fd)
                data = read_bounded(fd, st.st_size + MAX_LINE * 64) if stat.S_ISREG(st.st_mode) and \
                    not level_problem(name, st, is_dir=False) else None
            finally:
                os.close(fd)
            lines = _lines(data or b"")
            if since is not None:
                lines = [f for f in lines if f[0] >= bound]
            if lines:
                usage.add(len(lines), min(lines)[0].decode(), max(lines)[0].decode())
                refs += map(itemgetter(1), lines)
        usage.refs = dict.fromkeys(b"\n".join(dict.fromkeys(refs)).decode("utf-8", "replace").split("\n")[1:]).keys()
    finally:
        fcntl.flock(dfd, fcntl.LOCK_UN)
    return usage
