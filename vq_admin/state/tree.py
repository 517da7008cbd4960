"""The driver's state directory as a private tree (CONTRACT section 10).

Every read and write below the state directory goes through
:class:`PrivateTree`, which applies the secure-path rule
(:mod:`vq_admin.core.securepath`) at every level:

* the state directory itself and every directory above it are checked once
  (``path_problem``): owned by you or root, not writable by group or others
  unless sticky.  The operator may name it through a symlink.
* below it, nothing is ever followed: each level is opened with
  ``openat(..., O_NOFOLLOW | O_DIRECTORY)`` relative to the level above, and
  the opened directory's owner and mode are checked with ``fstat``.  A
  symlink, a non-directory, another owner or a loose mode is refused.
* files are opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks),
  must be regular files, owned by you or root and not writable by others,
  and are read with a size bound.
* what is created is owner-only whatever the umask: directories 0700, files
  0600, temporary and lock-holder files with ``O_CREAT | O_EXCL |
  O_NOFOLLOW``.

A violation raises :class:`UnsafeState` (a :class:`~vq_admin.report.outcome.Refused`,
exit 77) whose one-line message names the path, its owner and mode, and the
fix.  Standard library only: the per-job launcher lookup
(:mod:`vq_admin.launcher.registry`) uses it.
"""

from __future__ import annotations

import errno
import os
import stat

from ..core import atomic
from ..core.securepath import describe_owner, level_problem, makedirs_private, path_problem, read_bounded
from ..report.outcome import Refused

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Largest state file read back (receipts, records, registry entries are a few KiB).
MAX_STATE_FILE = 8 << 20
FIX_LOOSE = ("the state directory must be private to the administrator: chmod -R go-w it, or remove the "
             "offending entry after checking who made it")


class UnsafeState(Refused):
    """Something in the state directory cannot be proven the administrator's own (exit 77)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def _refuse(path: str, problem: str) -> UnsafeState:
    return UnsafeState(f"state directory: {problem}; another user could change what vq-admin records or "
                       f"trusts there; fix: {FIX_LOOSE}", path)


class PrivateTree:
    """A directory tree only the running user (and root) can change.

    *parts* arguments are sequences of single path components below the
    root; each must be a plain name (no ``/``, not ``.`` or ``..``).
    """

    def __init__(self, root: str | os.PathLike[str], what: str = "state directory"):
        self.root = os.path.normpath(os.path.abspath(os.fspath(root)))
        self.what = what

    # -- levels -----------------------------------------------------------------------

    def _open_root(self, create: bool) -> int | None:
        problem = path_problem(self.root, what=self.what, missing_ok=True)
        if problem:
            raise UnsafeState(problem, self.root)
        if create and not os.path.lexists(self.root):
            try:
                makedirs_private(self.root)
            except OSError as exc:
                raise UnsafeState(f"{self.what} {self.root} cannot be created: {exc.strerror or exc}",
                                  self.root) from None
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if create:
                raise UnsafeState(f"{self.what} {self.root} vanished while it was being created", self.root) from None
            return None
        except NotADirectoryError:
            raise UnsafeState(f"{self.what} {self.root} is not a directory (it is a "
                              f"{_kind(self.root)}); fix: point --state-dir or VQ_ADMIN_STATE_DIR at a private "
                              "directory", self.root) from None
        except OSError as exc:
            raise UnsafeState(f"{self.what} {self.root} cannot be opened: {exc.strerror or exc}", self.root) from None
        problem = level_problem(self.root, os.fstat(fd), is_dir=True)
        if problem:
            os.close(fd)
            raise _refuse(self.root, problem)
        return fd

    def open_dir(self, parts: list[str], *, create: bool) -> int | None:
        """An fd of ``root/parts...`` (caller closes), or ``None`` when a level is missing and not *create*."""
        fd = self._open_root(create)
        if fd is None:
            return None
        path = self.root
        try:
            for name in parts:
                _plain(name)
                path = os.path.join(path, name)
                created = False
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        return None  # the finally closes fd
                    try:
                        os.mkdir(name, 0o700, dir_fd=fd)
                        created = True
                    except FileExistsError:
                        pass
                    try:
                        child = os.open(name, DIR_FLAGS, dir_fd=fd)
                    except OSError as exc:
                        raise self._not_a_dir(fd, name, path, exc) from None
                except OSError as exc:
                    raise self._not_a_dir(fd, name, path, exc) from None
                os.close(fd)
                fd = child
                st = os.fstat(fd)
                if created and st.st_uid == os.geteuid():
                    os.fchmod(fd, 0o700)  # exact, whatever the umask
                    st = os.fstat(fd)
                problem = level_problem(path, st, is_dir=True)
                if problem:
                    raise _refuse(path, problem)
            result, fd = fd, -1
            return result
        finally:
            if fd >= 0:
                os.close(fd)

    @staticmethod
    def _not_a_dir(fd: int, name: str, path: str, exc: OSError) -> UnsafeState:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            return _refuse(path, f"{path} is a {_kind(name, fd)}, not a directory (vq-admin never follows a "
                                 "symlink inside the state directory)")
        return UnsafeState(f"state directory: cannot open {path}: {exc.strerror or exc}", path)

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def ensure_dir(self, parts: list[str]) -> str:
        """Create ``root/parts`` (every level 0700) after checking each level; its path."""
        fd = self.open_dir(parts, create=True)
        assert fd is not None
        os.close(fd)
        return self.path(*parts)

    # -- files ------------------------------------------------------------------------

    def read(self, parts: list[str], name: str, *, limit: int = MAX_STATE_FILE) -> bytes | None:
        """The bytes of ``root/parts/name``; ``None`` when it (or a directory above) does not exist."""
        dfd = self.open_dir(parts, create=False)
        if dfd is None:
            return None
        try:
            return read_private_file(dfd, name, self.path(*parts, name), limit=limit)
        finally:
            os.close(dfd)

    def write_atomic(self, parts: list[str], name: str, data: bytes, *, exclusive: bool = False) -> str:
        """Temp file (0600, ``O_EXCL|O_NOFOLLOW``), fsync, then rename (or link, when
        *exclusive*: ``FileExistsError`` if *name* exists); fsync of the directory."""
        _plain(name)
        dfd = self.open_dir(parts, create=True)
        assert dfd is not None
        try:
            atomic.write(name, data, dir_fd=dfd, exclusive=exclusive)
        finally:
            os.close(dfd)
        return self.path(*parts, name)

    def append(self, parts: list[str], name: str, data: bytes) -> None:
        """Append *data* (whole lines) in one write under an exclusive ``flock`` (the admin log, the host's
        record); a last line a crash cut short is ended first, so it never swallows the first new one."""
        import fcntl

        _plain(name)
        dfd = self.open_dir(parts, create=True)
        assert dfd is not None
        try:
            fd = _open_private(dfd, name, self.path(*parts, name),
                               os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(dfd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            write_synced(fd, (b"\n" if size and os.pread(fd, 1, size - 1) != b"\n" else b"") + data)
        finally:
            os.close(fd)

    def open_lock(self, parts: list[str], name: str) -> int:
        """An fd of the lock file ``root/parts/name`` (created 0600; never through a symlink)."""
        _plain(name)
        dfd = self.open_dir(parts, create=True)
        assert dfd is not None
        try:
            return _open_private(dfd, name, self.path(*parts, name),
                                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(dfd)

    def subdirs(self, parts: list[str]) -> list[str]:
        """Names of the real directories (never symlinks) in ``root/parts``, sorted."""
        dfd = self.open_dir(parts, create=False)
        if dfd is None:
            return []
        try:
            found = []
            for name in os.listdir(dfd):
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    found.append(name)
            return sorted(found)
        finally:
            os.close(dfd)


# -- fd-relative primitives (also used by vq_admin.launcher.registry) --------------------------


def open_private_file(dfd: int, name: str, shown: str) -> int | None:
    """An fd of *name* in the directory *dfd* for reading (the caller closes it); ``None``
    when absent.  Refuses (UnsafeState) a symlink, a non-regular file (FIFO, directory,
    device), another owner or a group/other-writable file; never blocks."""
    return _open_checked(dfd, name, shown, READ_FLAGS, absent_ok=True)


def read_private_file(dfd: int, name: str, shown: str, *, limit: int) -> bytes | None:
    """Read *name* in the directory *dfd* (checked as :func:`open_private_file`); ``None``
    when absent; more than *limit* bytes is refused."""
    fd = open_private_file(dfd, name, shown)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _refuse(shown, f"{shown} holds {size} bytes, more than the {limit} a state file may")
        data = read_bounded(fd, limit)
        if data is None:
            raise _refuse(shown, f"{shown} grew past the {limit} bytes a state file may hold")
        return data
    finally:
        os.close(fd)


def _open_checked(dfd: int, name: str, shown: str, flags: int, *, absent_ok: bool = False) -> int | None:
    """*name* in *dfd* opened with *flags* and checked as :func:`open_private_file` says (``None`` when
    absent and *absent_ok*)."""
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dfd)
    except OSError as exc:
        if absent_ok and isinstance(exc, FileNotFoundError):
            return None
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise _refuse(shown, f"{shown} is a {_kind(name, dfd)} (vq-admin never follows a symlink inside "
                                 "the state directory)") from None
        raise UnsafeState(f"state directory: cannot open {shown}: {exc.strerror or exc}", shown) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(shown, f"{shown} is a {_mode_kind(st.st_mode)}, not a regular file (owner "
                                 f"{describe_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})")
        problem = level_problem(shown, st, is_dir=False)
        if problem:
            raise _refuse(shown, problem)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_private(dfd: int, name: str, shown: str, flags: int) -> int:
    fd = _open_checked(dfd, name, shown, flags)
    assert fd is not None
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    return fd


def write_synced(fd: int, data: bytes) -> None:
    """Write all of *data* to *fd* (a short write continues), then ``fsync`` it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def dump_json(value: object) -> bytes:
    """A state record as written: indented, keys sorted, ASCII, one final newline."""
    import json  # here: the per-job lookup imports this module and never writes

    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _plain(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise UnsafeState(f"state directory: {name!r} is not a plain file name", name)


#: What a mode is, first match wins.
_KINDS = ((stat.S_ISLNK, "symlink"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "directory"), (stat.S_ISSOCK, "socket"),
          (stat.S_ISCHR, "device"), (stat.S_ISBLK, "device"), (stat.S_ISREG, "regular file"))


def _mode_kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), "special file")


def _kind(name: str, dir_fd: int | None = None) -> str:
    """``"symlink owned by nobody (uid 65534), mode 0777"``: what the entry is, its owner and mode."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "unreadable entry"
    return f"{_mode_kind(st.st_mode)} owned by {describe_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}"
