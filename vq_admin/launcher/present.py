"""The queue never gets a launcher that is gone (CONTRACT section 12; standard library only).

Where the launcher's path is visible on the driver (a shared file system, or a driver on the login
host), a lookup that finds it missing or changed refuses (77) instead of printing a dead path.  It
stays local and cheap: the launcher's ``stat`` (device, inode, size, mtime and ctime) is compared
with the one cached when its bytes were last found to hash to the attested SHA-256, in the registry
lane's ``seen/<sha>`` (one line); only a first sight or a changed ``stat`` hashes the file again.

Visible means: the launcher exists here, or its anchor does (the ``.../releases`` directory of a
``.../releases/<sha>/...`` launcher, else its parent directory), or it was seen here before.  A
launcher whose path is not visible at all (a driver without the login host's file system) is not
judged here; ``--check-on-host`` re-hashes it on the login host.
"""

from __future__ import annotations

import os
import stat

SEEN = "seen"


def _key(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\n"


def _cached(lane_fd: int, sha: str) -> str | None:
    from ..core.securepath import read_trusted_file

    try:
        sub = os.open(SEEN, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=lane_fd)
    except OSError:
        return None
    try:
        data = read_trusted_file(sub, sha, 256)
        return None if data is None else data.decode("ascii", "replace")
    finally:
        os.close(sub)


def launcher_problem_here(lane_fd: int, sha: str, launcher: str, launcher_sha256: str) -> str | None:
    """``None`` when *launcher* is not visible on this machine, or is there with its attested bytes;
    else why not (``missing``, ``changed``).  *lane_fd*: the registry lane (``registry/<host>/<program>``)."""
    try:  # one open: what is stat'ed is what is hashed, and a FIFO never blocks.  Followed, as the job's exec
        # follows it and the host's read-back attests a symlinked launcher by its target's bytes
        fd = os.open(launcher, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        anchor = launcher.split("/releases/", 1)[0] + "/releases" if "/releases/" in launcher \
            else os.path.dirname(launcher)
        if os.path.isdir(anchor) or _cached(lane_fd, sha) is not None:
            return f"missing: {launcher} no longer exists (its directory {anchor} is visible here)"
        return None
    except OSError:
        return None  # not visible to this account: the login host's read-back decides (--check-on-host)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"changed: {launcher} is not a regular file now"
        key = _key(st)
        if _cached(lane_fd, sha) == key:
            return None
        from ..core.filehash import fd_sha256  # only when the bytes are hashed: not on the cached lookup

        digest = fd_sha256(fd)
    except OSError:
        return None  # there but not readable by this account: not judged here (--check-on-host is)
    finally:
        os.close(fd)
    if digest != launcher_sha256:
        return f"changed: {launcher} now hashes to {digest}, attested {launcher_sha256}"
    from ..core import atomic

    try:
        os.mkdir(SEEN, 0o700, dir_fd=lane_fd)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        sub = os.open(SEEN, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=lane_fd)
        try:
            atomic.write(sha, key.encode(), dir_fd=sub)
        finally:
            os.close(sub)
    except OSError:
        pass  # not cached: the next lookup hashes it again
    return None
