"""Lane locks: one run per lane (host, and program for the runtime lane).

Kernel locks (filelock's flock) die with their holder, so a crashed run never
leaves a stale lock behind.  Acquisition never waits: a second run exits 75
at once, naming the holder recorded next to the lock.  Only the holder
releases its lock.
"""

from __future__ import annotations

import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from .outcome import Locked


def lock_path(state_root: Path, lane: str, host: str, program: str | None) -> Path:
    name = f"{lane}.{host}" + (f".{program}" if program else "") + ".lock"
    return state_root / "locks" / name


@contextmanager
def lane_lock(state_root: Path, lane: str, host: str, program: str | None) -> Iterator[Path]:
    path = lock_path(state_root, lane, host, program)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = FileLock(str(path), timeout=0, mode=0o600)
    try:
        lock.acquire()
    except Timeout:
        raise Locked(f"another {lane} update of {host}{' ' + program if program else ''} is running ({_holder(path)}); nothing was run") from None
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        tmp = path.with_name(path.name + f".holder.{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(holder))
            os.replace(tmp, path.with_name(path.name + ".holder"))
        except OSError:  # a full state filesystem: no holder record, and never a 0-byte one
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        yield path
    finally:
        lock.release()


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.with_name(path.name + ".holder").read_text())
        return f"held by pid {info['pid']} on {info['host']} since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
