"""Small file-system primitives that never follow a symlink we did not create.

* :func:`atomic_write` writes through a fresh temporary file in the same
  directory and ``os.replace``s it into place, so readers see the old or the
  new content, never a torn file, and a symlink planted at the target name is
  replaced, not written through;
* :func:`read_small` opens with ``O_NOFOLLOW`` and a size cap;
* :func:`remove_own_tree` removes a directory this process created, and
  :func:`discard` a temporary file or link it created.
"""

from __future__ import annotations

import os
import stat
import sys

TYPE_CHECKING = False  # not typing's: verify (every update) imports this module
if TYPE_CHECKING:
    from typing import Any

#: Largest metadata file (SOURCE-SHA, TAG, ...) read back, in bytes.
SMALL_FILE_LIMIT = 64 * 1024
#: Files up to this size are hashed with the interpreter's built-in SHA-256; larger ones with
#: hashlib's (OpenSSL's), whose speed then pays for loading it (about 10 ms here).
BUILTIN_SHA256_LIMIT = 1024 * 1024


def fsync_dir(path: str) -> None:
    """Flush a directory entry change (rename, create) to stable storage."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(tmp: str) -> None:
    """Remove the temporary file or link *tmp* this process created, when it is still there (the
    clean-up of a write or link switch that failed before its rename)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass


def atomic_write(directory: str, name: str, data: bytes, mode: int = 0o644) -> str:
    """Write *data* to ``directory/name`` atomically (temp file + rename).

    Returns the final path.  The temporary file is created with ``O_EXCL`` in
    the same directory, flushed, given *mode*, then renamed over the target.
    """
    final = os.path.join(directory, name)
    import tempfile  # here, not at the top: verify (every update) writes nothing

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, final)
    except BaseException:
        discard(tmp)
        raise
    fsync_dir(directory)
    return final


def atomic_write_text(directory: str, name: str, text: str, mode: int = 0o644) -> str:
    """:func:`atomic_write` for UTF-8 text."""
    return atomic_write(directory, name, text.encode("utf-8"), mode)


def read_small(path: str, limit: int = SMALL_FILE_LIMIT) -> str:
    """Read a small regular file as UTF-8 without following a final symlink.

    Raises ``OSError`` when the file is missing, is a symlink (``ELOOP``), is
    not a regular file, or is larger than *limit*.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise OSError(f"{path} is larger than {limit} bytes")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    return data.decode("utf-8")


def is_real_dir(path: str) -> bool:
    """True when *path* is a directory and not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _sha256(size: int) -> Any:
    """A fresh SHA-256 object for *size* bytes: the built-in module's for a small file (verify
    hashes the launcher for every update, and ``hashlib`` loads OpenSSL's library), else
    hashlib's.  Both compute the same digest."""
    if size <= BUILTIN_SHA256_LIMIT:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]  # up to Python 3.11
        except ImportError:
            try:
                from _sha2 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]  # 3.12+
            except ImportError:  # a build without them: hashlib has one
                from hashlib import sha256
        return sha256()
    import hashlib

    return hashlib.sha256()


def sha256_file(path: str) -> str:
    """Hex SHA-256 of the file at *path*, following symlinks (as ``exec`` does)."""
    with open(path, "rb") as handle:
        digest = _sha256(os.fstat(handle.fileno()).st_size)
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return str(digest.hexdigest())


def tree_bytes(path: str) -> int:
    """Sum of ``lstat`` sizes of every file below *path* (symlinks not followed)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames + dirnames:
            info = os.lstat(os.path.join(dirpath, name))
            if not stat.S_ISDIR(info.st_mode):
                total += info.st_size
    return total


def remove_own_tree(path: str) -> None:
    """Remove a directory tree this process created (symlinks inside are
    removed, never followed); entries made read-only are made writable first."""

    def _retry(func, failed_path, _exc):  # type: ignore[no-untyped-def]
        parent = os.path.dirname(failed_path)
        if is_real_dir(parent):
            os.chmod(parent, 0o700)
        func(failed_path)

    import shutil  # here, not at the top: verify (every update) never removes anything

    if os.path.lexists(path):
        if not is_real_dir(path):
            raise OSError(f"{path} is not a directory; refusing to remove it")
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=_retry)
        else:
            shutil.rmtree(path, onerror=_retry)
