"""Retention of allocation attempt directories, per program (CONTRACT section 5; the rule in
full in docs/allocation-transcripts.md, "Retention"): newest first, counting the current attempt
first, keep attempts while their sizes fit in 100 MiB, remove the first misfit and every older
one; never the current attempt; the legacy ``deploy.out`` and ``deploy.err`` go too; nothing
but ``deploy.<UTC>.<hex>`` directories (never a symlink) and those two names is ever removed.

An attempt another run is still using holds a shared ``flock`` on its ``.live`` file: it is
skipped (neither counted nor removed).  Callers hold the per-program lock around :func:`prune`;
since ``.live`` is only ever taken under that same lock, an attempt found not live stays so
until the prune is over.

Standard library only: runs inside ``vq-admin-agent``.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from typing import Callable, Iterable

from ..core import safedirs

CAP_BYTES = 100 * 1024 * 1024
ATTEMPT_RE = re.compile(r"\Adeploy\.(\d{8}T\d{6}Z)\.([0-9a-f]{8,64})\Z")
LEGACY_FILES = ("deploy.out", "deploy.err")
LIVE_LOCK = ".live"


def newest_first(names: Iterable[str]) -> list[str]:
    """Attempt names (each matches :data:`ATTEMPT_RE`), newest first (by the UTC stamp, then by name)."""
    return sorted(names, key=lambda name: (name.split(".")[1], name), reverse=True)


def choose_removals(current: str, others: Iterable[str], size: Callable[[str], int],
                    live: Callable[[str], bool] = lambda name: False, cap: int = CAP_BYTES) -> tuple[list[str], int]:
    """The retention rule as a pure function: ``(names to remove, retained bytes)``.

    *others* are the attempts besides *current*; *size* and *live* are asked only until the
    first misfit: every older attempt is condemned, and the caller leaves a live one in place
    as it removes them (:func:`prune`, one open of each).
    """
    total = size(current)
    remove: list[str] = []
    for name in newest_first(n for n in others if n != current):
        if not remove:  # nothing condemned yet: keep it while it fits
            if live(name):
                continue
            bytes_ = size(name)
            if total + bytes_ <= cap:
                total += bytes_
                continue
        remove.append(name)
    return remove, total


def is_live(program_fd: int, name: str) -> bool:
    """True when another process holds the attempt's ``.live`` lock (an attempt without one is not live)."""
    try:
        afd = os.open(name, safedirs.DIR_FLAGS, dir_fd=program_fd)
    except OSError:
        return False
    with safedirs.opened(afd):
        return _held(afd)


def _held(attempt_fd: int) -> bool:
    """True when another process holds the ``.live`` lock in the open attempt directory."""
    try:
        lfd = os.open(LIVE_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=attempt_fd)
    except OSError:
        return False
    try:
        fcntl.flock(lfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(lfd)
    return False


def remove_unless_live(program_fd: int, name: str) -> bool:
    """Remove attempt *name* (True) unless another run holds its ``.live`` lock (False): one open
    and one listing of it."""
    with safedirs.opened(os.open(name, safedirs.DIR_FLAGS, dir_fd=program_fd)) as afd:
        names = os.listdir(afd)
        if LIVE_LOCK in names and _held(afd):
            return False
        safedirs.clear_dir(afd, names)
    os.rmdir(name, dir_fd=program_fd)
    return True


def prune(program_fd: int, current: str, cap: int = CAP_BYTES) -> dict[str, object]:
    """Apply the retention rule below the open program directory *program_fd*; a failure to remove
    one attempt is reported in ``errors`` and does not stop the others."""
    attempts = [entry.name for entry in os.scandir(program_fd)  # current among them: choose_removals skips it
                if ATTEMPT_RE.match(entry.name) and entry.is_dir(follow_symlinks=False)]
    live_skipped: list[str] = []

    def live(name: str) -> bool:
        if is_live(program_fd, name):
            live_skipped.append(name)
            return True
        return False

    def size(name: str) -> int:
        try:
            return safedirs.tree_size_at(program_fd, name)
        except FileNotFoundError:
            return 0

    removed: list[str] = []
    errors: list[str] = []
    condemned, total = choose_removals(current, attempts, size, live, cap)
    for name in condemned:
        try:
            (removed if remove_unless_live(program_fd, name) else live_skipped).append(name)
        except FileNotFoundError:
            removed.append(name)
        except OSError as exc:
            errors.append(f"{name}: {exc.strerror or exc}")
    legacy = []
    for name in LEGACY_FILES:
        try:
            st = os.stat(name, dir_fd=program_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            try:
                os.unlink(name, dir_fd=program_fd)
                legacy.append(name)
            except OSError as exc:
                errors.append(f"{name}: {exc.strerror or exc}")
        else:
            errors.append(f"{name}: not a file; left in place")
    return {
        "removed": removed,
        "legacy_removed": legacy,
        "live_skipped": sorted(live_skipped),
        "retained_bytes": total,
        "cap_bytes": cap,
        "errors": errors,
    }
