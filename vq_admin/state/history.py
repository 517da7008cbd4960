"""The history index: one JSON line per stored receipt, read from the end.

``<state>/receipts/index.jsonl`` gets one line for every receipt stored
(:meth:`vq_admin.state.records.StateDir.store_receipt` calls :func:`append`), in one
``write(2)`` on a descriptor opened with ``O_APPEND``, under an exclusive
``flock``.  ``vq admin history`` reads the file backwards in blocks and stops
as soon as it has the runs it prints, so its cost depends on ``--limit``, not
on the number of receipts (bench/bench_history.py).

Receipts stored before the index existed: the first time the index is
created (its size is 0 under the lock, either on the next stored receipt or
on the first ``vq admin history``), every receipt already in ``receipts/`` is
read once and written to it, oldest first; from then on each new receipt
appends one line.  Deleting the index is safe: it is rebuilt the same way.
A line a crash left half-written is skipped on reading.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Iterator

from ..core.bounds import InputError, json_object
from ..core.stamps import parse_utc
from ..document import Document, JsonObject
from .tree import MAX_STATE_FILE, PrivateTree, UnsafeState, write_synced, open_private_file

SCHEMA = "vq-admin/history/1"
INDEX_NAME = "index.jsonl"
BLOCK = 64 * 1024


class RunRow(Document, frozen=True, kw_only=True):
    """What every row of ``vq admin history`` says of a run (the index's and the host's record's)."""

    finished_at: str | None = None
    lane: str | None = None
    verb: str | None = None
    host: str | None = None
    program: str | None = None
    outcome: str | None = None
    expected_sha: str | None = None
    tag: str | None = None


class Run(RunRow, frozen=True, kw_only=True):
    """One line of the index: a stored receipt's run."""

    receipt: str | None = None
    exit_code: int | None = None
    started_at: str | None = None
    seconds: float | None = None


def index_path(state_root: str | os.PathLike[str]) -> Path:
    return Path(state_root) / "receipts" / INDEX_NAME


def _seconds(started: object, finished: object) -> float | None:
    a, b = parse_utc(started), parse_utc(finished)
    return None if a is None or b is None else b - a


def entry(receipt: JsonObject) -> Run:
    """The index line of one stored receipt (:class:`~vq_admin.document.DocumentError` if a member's type is not)."""
    verb = ("rollback" if "rollback" in receipt else "prune" if "prune" in receipt
            else "install" if "install" in receipt else "update")
    return Run.from_value({**receipt, "receipt": receipt.get("id"), "verb": verb,
                           "seconds": _seconds(receipt.get("started_at"), receipt.get("finished_at"))}, "the receipt")


def _line(item: Run) -> bytes:
    return (item.to_json() + "\n").encode("ascii")


def _scan(tree: PrivateTree) -> list[Run]:
    """Every stored receipt's index line, oldest first (the one-time rebuild)."""
    found = []
    dfd = tree.open_dir(["receipts"], create=False)
    if dfd is None:
        return []
    try:
        names = os.listdir(dfd)
    finally:
        os.close(dfd)
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            doc = json_object(tree.read(["receipts"], name), limit=MAX_STATE_FILE)
            if isinstance(doc, dict) and doc.get("schema") == "vq-admin/receipt/1":
                found.append(entry(doc))
        except (UnsafeState, InputError):
            continue  # a receipt that cannot be trusted, read or typed is not listed
    return sorted(found, key=lambda e: (str(e.finished_at), str(e.receipt)))


def append(tree: PrivateTree, receipt: JsonObject | None) -> None:
    """Append the line of *receipt* (already stored in the state directory *tree*), under the index's lock
    (created 0600, never through a symlink); a new (empty) index gets every stored receipt, this one included."""
    fd = tree.open_lock(["receipts"], INDEX_NAME)
    try:
        os.set_blocking(fd, True)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.lseek(fd, 0, os.SEEK_END)
        if os.fstat(fd).st_size == 0:
            write_synced(fd, b"".join(_line(e) for e in _scan(tree)))
        elif receipt is not None:
            write_synced(fd, _line(entry(receipt)))
    finally:
        os.close(fd)


def ensure(state_root: str | os.PathLike[str]) -> None:
    """Build the index once when receipts exist but no index does (stored before it existed)."""
    tree = PrivateTree(state_root)
    dfd = tree.open_dir(["receipts"], create=False)
    if dfd is None:
        return
    try:
        st = os.stat(INDEX_NAME, dir_fd=dfd, follow_symlinks=False)
        if st.st_size > 0:
            return
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)
    append(tree, None)


def newest_first(state_root: str | os.PathLike[str]) -> Iterator[Run]:
    """Index lines from the last to the first, reading the file backwards in blocks."""
    dfd = PrivateTree(state_root).open_dir(["receipts"], create=False)
    if dfd is None:
        return
    try:
        fd = open_private_file(dfd, INDEX_NAME, str(index_path(state_root)))
    finally:
        os.close(dfd)
    if fd is None:
        return
    try:
        position = os.fstat(fd).st_size
        tail = b""
        while position > 0:
            size = min(BLOCK, position)
            position -= size
            lines = (os.pread(fd, size, position) + tail).split(b"\n")
            tail = lines.pop(0) if position else b""  # possibly partial: completed by the next (earlier) block
            for raw in reversed(lines):
                item = _parse(raw)
                if item is not None:
                    yield item
    finally:
        os.close(fd)


def _parse(raw: bytes) -> Run | None:
    """One line; ``None`` for a line a crash cut short, or not one of ours."""
    try:
        return Run.from_json(raw, "a history line", limit=64 * 1024) if raw.strip() else None
    except InputError:
        return None


def runs(state_root: str | os.PathLike[str], host: str | None = None, program: str | None = None,
         limit: int | None = 20, *, lane: str | None = None) -> list[Run]:
    """Up to *limit* runs (None: all), newest first, of *host* (and *program*)."""
    ensure(state_root)
    found: list[Run] = []
    seen: set[object] = set()
    for item in newest_first(state_root):
        if item.receipt in seen:  # a receipt stored while the index was being built is listed twice
            continue
        seen.add(item.receipt)
        if host is not None and item.host != host:
            continue
        if program is not None and item.program != program:
            continue
        if lane is not None and item.lane != lane:
            continue
        found.append(item)
        if limit is not None and len(found) >= limit:
            break
    return found
