"""The SHA-256 of a file's bytes, the one home of the rule: the agent's ``hash-file`` answer, the
archive's and tree's identity (:mod:`.treeid`) and the launcher's attested bytes
(:mod:`vq_admin.launcher.present`).

Standard library; Python 3.8 and later.  :mod:`hashlib` is imported when a file is hashed, not
when this module is: the per-job launcher and the agent's start load it only when they hash.
"""

from __future__ import annotations

import os

CHUNK = 1 << 20


def fd_sha256(fd: int) -> str:
    """The SHA-256 of what is read from *fd* to its end."""
    import hashlib

    h = hashlib.sha256()
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str) -> str:
    """The SHA-256 of *path*'s bytes (a symlink is followed, as ``open`` does)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd_sha256(fd)
    finally:
        os.close(fd)
