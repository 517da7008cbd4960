"""Lane locks: one run per lane (host, and program for the runtime lane).

Kernel locks (``flock(2)`` on a file under the state directory) die with their holder, so a crashed run never
leaves a stale lock behind.  Acquisition never waits: a second run exits 75
at once, naming the holder recorded next to the lock.  Only the holder
releases its lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .outcome import Locked


def lock_path(state_root: Path, lane: str, host: str, program: str | None) -> Path:
    name = f"{lane}.{host}" + (f".{program}" if program else "") + ".lock"
    return state_root / "locks" / name


@contextmanager
def lane_lock(state_root: Path, lane: str, host: str, program: str | None) -> Iterator[Path]:
    path = lock_path(state_root, lane, host, program)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise
        raise Locked(f"another {lane} update of {host}{' ' + program if program else ''} is running ({_holder(path)}); nothing was run") from None
    try:
        holder = {"pid": os.getpid(), "host": os.uname().nodename, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = path.with_name(path.name + f".holder.{os.getpid()}")
        tmp.write_text(json.dumps(holder))
        os.replace(tmp, path.with_name(path.name + ".holder"))
        yield path
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.with_name(path.name + ".holder").read_text())
        return f"held by pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
