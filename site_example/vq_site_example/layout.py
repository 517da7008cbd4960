"""The runtime root: its paths, its deploy lock and the ``current`` switch.

::

    ROOT/
      .deploy.lock                  flock(2) target; exclusive while a deploy runs
      .updater.pid                  pid of the deploy holding the lock (removed at its end)
      current -> releases/<sha>     the stable link; replaced atomically, never rm + ln
      releases/
        <sha>/                      one immutable release per full commit id
          SOURCE-SHA TAG PROGRAM ARCHIVE-SHA256 BUILD-LOG VALIDATED
          bin/<program>-<sha>       the generation's launcher (what jobs are bound to)
          source/                   the unpacked git archive
            .venv/                  its virtual environment
        .partial.<sha>.<random>/    a build in progress (renamed to <sha> when validated)

Nothing in ROOT is followed through a symlink this tool did not create: ROOT
itself, ``releases`` and release directories must be real directories, and
the lock file is opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

from vq_admin_identifiers import FULL_SHA_RE

from . import fsutil
from .errors import EXIT_LOCKED, SiteError, failed, usage

TYPE_CHECKING = False  # not typing's (verify imports this module)
if TYPE_CHECKING:
    from typing import Iterator

LOCK_NAME = ".deploy.lock"
PID_NAME = ".updater.pid"
CURRENT_NAME = "current"
RELEASES_NAME = "releases"
PARTIAL_PREFIX = ".partial."


class Layout:
    """Paths below one runtime root (an absolute, normalised path)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.releases = os.path.join(root, RELEASES_NAME)
        self.current = os.path.join(root, CURRENT_NAME)
        self.lock_path = os.path.join(root, LOCK_NAME)
        self.pid_path = os.path.join(root, PID_NAME)

    def release(self, sha: str) -> str:
        """``ROOT/releases/<sha>``."""
        return os.path.join(self.releases, sha)

    def launcher(self, sha: str, program: str) -> str:
        """The generation's launcher, ``ROOT/releases/<sha>/bin/<program>-<sha>``: its name carries the
        full SHA, and it is never a path through ``current``."""
        return os.path.join(self.release(sha), "bin", f"{program}-{sha}")


def check_layout(layout: Layout, create: bool) -> None:
    """Make sure ROOT and ROOT/releases are real directories.

    With *create* (``install``) missing directories are created (mode 0755);
    without it a missing ROOT is a usage error: run ``install`` first.
    A symlink at ROOT, ``releases`` or ``current``-as-directory is refused.
    """
    for path in (layout.root, layout.releases):
        if os.path.islink(path):
            raise usage(f"{path} is a symlink; give the real path (this tool never follows links it did not create)")
        if not os.path.lexists(path):
            if not create:
                raise usage(f"{path} does not exist; use 'install' for a first-time installation")
            os.makedirs(path, mode=0o755, exist_ok=True)
            fsutil.fsync_dir(os.path.dirname(path))
        if not fsutil.is_real_dir(path):
            raise usage(f"{path} exists but is not a directory")
    if os.path.lexists(layout.current) and not os.path.islink(layout.current):
        raise failed(f"{layout.current} exists and is not a symlink; this provider only manages a "
                     "'current' symlink: move it aside deliberately, then deploy again")


class DeployLock:
    """Exclusive, non-blocking ``flock`` on ``ROOT/.deploy.lock``.

    While held, ``ROOT/.updater.pid`` holds this process's pid (written
    atomically); it is removed on release.  A held lock raises
    :class:`SiteError` with exit 75, naming the holder's pid when known.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.fd = -1  #: the lock file, open from __enter__ to __exit__

    def __enter__(self) -> "DeployLock":
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.layout.lock_path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise failed(f"{self.layout.lock_path} is a symlink; refusing to use it") from None
            raise failed(f"cannot open {self.layout.lock_path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_updater_pid(self.layout)
            who = f"pid {holder}" if holder is not None else "an unknown process"
            raise SiteError(EXIT_LOCKED, f"{self.layout.lock_path} is held by {who}; "
                            "another deploy is running, nothing was done") from None
        self.fd = fd
        fsutil.atomic_write(self.layout.root, PID_NAME, f"{os.getpid()}\n")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.unlink(self.layout.pid_path)
        except FileNotFoundError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def read_updater_pid(layout: Layout) -> int | None:
    """The pid recorded in ``.updater.pid``, or ``None`` when absent or malformed."""
    try:
        text = fsutil.read_small(layout.pid_path, 64).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 2**31 else None


def probe_quiescent(layout: Layout) -> tuple[bool, int | None]:
    """Read-only lock probe for ``verify``: ``(quiescent, updater_pid)``.

    Tries a non-blocking *shared* flock on the lock file without creating it;
    a missing lock file means no deploy ever ran, so quiescent.
    """
    try:
        fd = os.open(layout.lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return True, None
    except OSError:
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False, read_updater_pid(layout)
    finally:
        os.close(fd)  # closing drops a shared lock we may have taken
    return True, None


@contextlib.contextmanager
def new_release(layout: Layout, sha: str) -> Iterator[str]:
    """A fresh ``releases/.partial.<sha>.<random>`` directory (mode 0755) to build in.

    When the block succeeds it is renamed to ``releases/<sha>`` (one atomic rename, which never
    replaces a release: the caller checked under the deploy lock that there is none); when
    anything fails, this partial directory, and only it, is removed.
    """
    import tempfile  # (verify, on every update, builds nothing)

    partial = tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{sha}.", dir=layout.releases)
    try:
        os.chmod(partial, 0o755)
        yield partial
        final = layout.release(sha)
        if os.path.lexists(final):
            raise failed(f"{final} appeared during the build; not replacing it")
        os.rename(partial, final)
    except BaseException:
        fsutil.remove_own_tree(partial)
        raise
    fsutil.fsync_dir(layout.releases)


def release_named(layout: Layout, target: str) -> str | None:
    """The full lower-case SHA when the link target *target* names ``releases/<full sha>`` of this
    root (relative, or absolute below ROOT), else ``None``."""
    for prefix in (RELEASES_NAME + "/", layout.releases + "/"):
        name = target[len(prefix):] if target.startswith(prefix) else ""
        if FULL_SHA_RE.match(name) and name == name.lower():
            return name
    return None


def read_current(layout: Layout) -> str | None:
    """The target of the ``current`` symlink as stored (``readlink``), or None."""
    try:
        return os.readlink(layout.current)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # exists but is not a symlink
            raise failed(f"{layout.current} is not a symlink") from None
        raise


def switch_current(layout: Layout, sha: str) -> str | None:
    """Point ``current`` at ``releases/<sha>``: temp symlink, then ``os.replace``; returns
    the target it had (:func:`read_current`).

    The link is relative (``releases/<sha>``) so the root can be inspected
    from another mount point; it is never removed first, so there is no
    moment without a ``current``.
    """
    previous = read_current(layout)
    release = layout.release(sha)
    if not fsutil.is_real_dir(release):
        raise failed(f"{release} is not a real directory; not activating it")
    tmp = os.path.join(layout.root, f".current.{os.urandom(8).hex()}")
    os.symlink(os.path.join(RELEASES_NAME, sha), tmp)
    try:
        if os.path.lexists(layout.current) and not stat.S_ISLNK(os.lstat(layout.current).st_mode):
            raise failed(f"{layout.current} is not a symlink; not replacing it")
        os.replace(tmp, layout.current)
    except BaseException:
        fsutil.discard(tmp)
        raise
    fsutil.fsync_dir(layout.root)
    return previous
