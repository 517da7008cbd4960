"""The one atomic write: a temporary file created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (0600, never
through a symlink, never an existing file) in the destination's own directory, written, ``fsync``-ed,
its mode set, then renamed over the name (or linked to it, never replacing, when *exclusive*) and
the directory ``fsync``-ed.  A failure before the rename removes the temporary file.

Every file vq-admin writes by name goes through here (the driver's state tree, the agent's lease
holder, installed files and attempt records, the allocation transcript, the agent archive); the
caller judges the directory (:mod:`vq_admin.core.securepath`) first.  Standard library only,
Python 3.8: the agent and the per-job launcher path import it (no ``secrets``, no ``typing``).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Optional, Tuple

#: How a temporary file is created: a new name only, never through a symlink.
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_name(name: str) -> str:
    """``.tmp.<name>.<pid>.<random>``: the pid lets a later run remove what a killed one left
    (:meth:`vq_admin.state.records.StateDir.sweep_leftovers`)."""
    return f".tmp.{os.path.basename(name)}.{os.getpid()}.{os.urandom(6).hex()}"


def open_temp(name: str, *, dir_fd: "Optional[int]" = None) -> "Tuple[int, str]":
    """A new temporary file next to *name* (relative to *dir_fd* when given): its fd and its name."""
    tmp = os.path.join(os.path.dirname(name), temp_name(name))
    return os.open(tmp, TEMP_FLAGS, 0o600, dir_fd=dir_fd), tmp


def commit(tmp: str, name: str, *, dir_fd: "Optional[int]" = None, exclusive: bool = False) -> None:
    """Put the written temporary file *tmp* in place as *name*: ``rename``, or when *exclusive* a hard
    link that fails if *name* exists (then *tmp* is removed either way)."""
    if exclusive:
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        finally:
            discard(tmp, dir_fd=dir_fd)
    else:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def discard(tmp: str, *, dir_fd: "Optional[int]" = None) -> None:
    """Remove the caller's own temporary file *tmp* if it is still there (a symlink is removed, never followed)."""
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def write(name: str, data: "bytes | Callable[[BinaryIO], object]", *, dir_fd: "Optional[int]" = None,
          mode: int = 0o600, exclusive: bool = False, sync: bool = True) -> None:
    """Write *name* atomically: *data* is the bytes, or a function that writes to the open file.
    Not ``fsync``-ed when not *sync* (a record that means nothing after a crash)."""
    fd, tmp = open_temp(name, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(data, bytes):
                fh.write(data)
            else:
                data(fh)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            if sync:
                os.fsync(fh.fileno())
        commit(tmp, name, dir_fd=dir_fd, exclusive=exclusive)
    except BaseException:
        discard(tmp, dir_fd=dir_fd)
        raise
    if sync:
        directory = os.open(os.path.dirname(name) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
