"""Lane locks: one run per lane (host, and program for the runtime lane).

Kernel locks (``flock``) die with their holder, so a crashed run never
leaves a stale lock behind.  Acquisition never waits: a second run exits 75
at once, naming the holder recorded next to the lock.  Only the holder
releases its lock.

The lock file and the holder record live in ``<state>/locks/``, opened
through :class:`~vq_admin.state.tree.PrivateTree` (every level checked, never
through a symlink, created 0600 whatever the umask); the holder record is
written to a fresh ``O_CREAT|O_EXCL|O_NOFOLLOW`` temporary file and renamed.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..report.outcome import READ_ONLY_RAN, Locked
from .tree import PrivateTree
from ..core.bounds import json_object
from ..core.stamps import utc_now


def lock_path(state_root: Path, lane: str, host: str, program: str | None) -> Path:
    name = f"{lane}.{host}" + (f".{program}" if program else "") + ".lock"
    return state_root / "locks" / name


@contextmanager
def lane_lock(state_root: Path, lane: str, host: str, program: str | None) -> Iterator[Path]:
    path = lock_path(state_root, lane, host, program)
    tree = PrivateTree(state_root)
    fd = tree.open_lock(["locks"], path.name)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Locked(f"another {lane} update of {host}{' ' + program if program else ''} is running "
                         f"({_holder(tree, path)}); {READ_ONLY_RAN}") from None
        holder = {"pid": os.getpid(), "host": os.uname().nodename, "since": utc_now()}
        try:
            tree.write_atomic(["locks"], path.name + ".holder", json.dumps(holder).encode())
        except OSError:  # a full state filesystem: no holder record (the temp file is removed), never a 0-byte one
            pass
        yield path
    finally:
        os.close(fd)  # releases the flock


def _holder(tree: PrivateTree, path: Path) -> str:
    try:
        info = json_object(tree.read(["locks"], path.name + ".holder", limit=4096), limit=4096) or {}
        return f"held by pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "holder unknown"
