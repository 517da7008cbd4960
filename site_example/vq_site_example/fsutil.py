"""Small file-system primitives that never follow a symlink we did not create.

* :func:`atomic_write` writes through a fresh temporary file in the same
  directory and ``os.replace``s it into place, so readers see the old or the
  new content, never a torn file, and a symlink planted at the target name is
  replaced, not written through;
* :func:`read_small` opens with ``O_NOFOLLOW`` and a size cap;
* :func:`remove_own_tree` removes a directory this process created.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys

#: Largest metadata file (SOURCE-SHA, TAG, ...) read back, in bytes.
SMALL_FILE_LIMIT = 64 * 1024


def fsync_dir(path: str) -> None:
    """Flush a directory entry change (rename, create) to stable storage."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(tmp: str) -> None:
    """Remove the temporary file or link *tmp* this process created, when it is still there."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def atomic_write(directory: str, name: str, data: bytes | str, mode: int = 0o644) -> str:
    """Write *data* (text is UTF-8) to ``directory/name`` atomically: a fresh temporary file in
    the same directory, flushed, given *mode*, then renamed over the target.  Returns the path."""
    final = os.path.join(directory, name)
    import tempfile  # (verify, on every update, writes nothing)

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    except BaseException:
        discard(tmp)
        raise
    fsync_dir(directory)
    return final


def read_small(path: str, limit: int = SMALL_FILE_LIMIT) -> str:
    """Read a small regular file as UTF-8 without following a final symlink.

    Raises ``OSError`` when the file is missing, is a symlink (``ELOOP``), is
    not a regular file, or is larger than *limit*.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            raise OSError(f"{path} is not a regular file of at most {limit} bytes")
        return handle.read(limit + 1).decode("utf-8")


def is_real_dir(path: str) -> bool:
    """True when *path* is a directory and not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def sha256_file(path: str) -> str:
    """Hex SHA-256 of the file at *path*, following symlinks (as ``exec`` does)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def tree_bytes(path: str) -> int:
    """Sum of ``lstat`` sizes of every file below *path* (symlinks not followed)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames + dirnames:
            info = os.lstat(os.path.join(dirpath, name))
            if not stat.S_ISDIR(info.st_mode):
                total += info.st_size
    return total


def remove_own_tree(path: str) -> None:
    """Remove a directory tree this process created (symlinks inside are removed, never
    followed); directories made read-only are made writable first."""

    def _retry(func, failed_path, _exc):  # type: ignore[no-untyped-def]
        parent = os.path.dirname(failed_path)
        if is_real_dir(parent):
            os.chmod(parent, 0o700)
        func(failed_path)

    if os.path.lexists(path):
        if not is_real_dir(path):
            raise OSError(f"{path} is not a directory; refusing to remove it")
        import shutil  # (verify, on every update, removes nothing)

        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=_retry)
        else:
            shutil.rmtree(path, onerror=_retry)
