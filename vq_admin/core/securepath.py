"""The secure-path rule, one definition for the driver and the agent.

A path is trusted only when nobody but the running user and root can change
it or any directory above it (the model is OpenSSH ``StrictModes`` and sudo's
secure path checks).  For each level, from the path itself up to ``/``:

* the owner is the running user or root;
* it is not writable by group or others, except a directory with the sticky
  bit (``/tmp``): there others cannot rename or remove what they do not own.

A symlink the operator named is followed, and both the path as given and what
it resolves to are checked; a symlink on the way owned by another user is
refused (its owner can repoint it, and in a sticky directory only they can
remove it: :func:`link_problem`).

Standard library only: ``vq-admin-agent`` runs it on login hosts, and the
per-job launcher resolution imports it.  Nothing here writes, but for the
private directories :func:`makedirs_private` creates.
"""

from __future__ import annotations

import os
import stat
# (no typing import at run time: the per-job launcher lookup imports this module; annotations are never evaluated)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable, Optional

    #: ``stat_of(path)``: the path's owner and mode, following symlinks (``os.stat``, or facts read on another host).
    StatOf = Callable[[str], os.stat_result]


class Untrusted(Exception):
    """A path (or a directory above it) can be changed by another user.

    ``str()`` is one line naming the path, its owner and mode, and the fix.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def describe_owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def level_problem(path: str, st: os.stat_result, *, is_dir: bool, me: int | None = None,
                  owner_name: "Callable[[int], str] | None" = None) -> str | None:
    """Why one level fails the rule (owner, mode), or ``None``.

    *me* is the user the rule trusts besides root (default: this process's
    effective uid); *owner_name* names a uid (default: this host's ``pwd``).
    Both are given when the facts were read on another host.
    """
    me = os.geteuid() if me is None else me
    name = owner_name or describe_owner
    mode = stat.S_IMODE(st.st_mode)
    kind = "directory" if is_dir else "file"
    if st.st_uid not in (0, me):
        return (f"{kind} {path} is owned by {name(st.st_uid)}, not by you or root "
                f"(mode {mode:04o})")
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (is_dir and st.st_mode & stat.S_ISVTX):
        who = {stat.S_IWGRP: "group-writable", stat.S_IWOTH: "other-writable"}.get(writable,
                                                                                  "group- and other-writable")
        sticky = " without the sticky bit" if is_dir else ""
        return f"{kind} {path} is {who}{sticky} (owner {name(st.st_uid)}, mode {mode:04o})"
    return None


def ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``['/a/b', '/a', '/']`` (lexically, no filesystem access)."""
    parts = os.path.normpath(path).split("/")
    return ["/".join(parts[:end]) or "/" for end in range(len(parts) - 1, 0, -1)]


def path_problem(path: str, *, what: str, missing_ok: bool = False) -> str | None:
    """``None`` when *path* and every directory above it pass the rule.

    Otherwise one line: what is wrong and the fix.  *what* names the path's
    role for the message ("configuration file", "ssh_config", "state
    directory", ...).  A missing *path* is a problem unless *missing_ok*
    (then only its existing ancestors are checked).
    """
    if not os.path.isabs(path):
        return f"{what} {path} is not an absolute path"
    path = os.path.normpath(path)
    try:
        return link_problem(path, what) or chain_problem(path, os.path.realpath(path), os.stat, what=what,
                                                         missing_ok=missing_ok)
    except OSError as exc:
        return f"cannot check {what} {path}: {exc.strerror or exc}"


def link_problem(path: str, what: str) -> str | None:
    """Why a symlink among the levels of *path* (as given) cannot be trusted, or ``None``.

    A symlink's own owner can repoint it whatever its mode, and in a sticky directory
    (``/scratch`` 1777) nobody else can remove it: one not created by you or root is refused,
    wherever it points (the checks that follow it see only its target)."""
    level = ""
    for name in path.split("/")[1:]:
        level += "/" + name
        try:
            st = os.lstat(level)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, os.geteuid()):
            return (f"{what} {path}: symlink {level} is owned by {describe_owner(st.st_uid)}, not by you or root, "
                    f"who can point it anywhere; vq-admin never follows it; fix: remove it (rm {level}) and "
                    f"use a private directory")
    return None


def opened_problem(path: str, fd: int, st: os.stat_result, *, what: str) -> str | None:
    """:func:`path_problem` for the file open as *fd* (``fstat``: *st*), which *path* named when it was
    opened: the owner and mode of what was opened, the symlinks of *path* and the directories above
    both it and the file opened (its real path, as the kernel names the open file)."""
    path = os.path.normpath(os.path.abspath(path))
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the path's own resolution
        real = os.path.realpath(path)
    problem = level_problem(real, st, is_dir=False)
    if problem:
        return _with_fix(what, path, problem, real, real)
    return link_problem(path, what) or chain_problem(path, real, os.stat, what=what)


def chain_problem(path: str, real: str, stat_of: "StatOf", *, what: str, missing_ok: bool = False,
                  me: int | None = None, owner_name: "Callable[[int], str] | None" = None) -> str | None:
    """The walk of :func:`path_problem` over supplied facts.

    *path* is absolute and normalised, *real* is what it resolves to, and
    *stat_of* gives a path's owner and mode following symlinks, raising
    ``FileNotFoundError`` for a missing one (other ``OSError`` propagate).
    *me* and *owner_name* as for :func:`level_problem` (facts read on
    another host carry that host's user and names).
    """
    try:
        st: "Optional[os.stat_result]" = stat_of(real)
    except FileNotFoundError:
        if not missing_ok:
            return f"{what} {path} does not exist"
        st = None
    if st is not None:
        problem = level_problem(real, st, is_dir=stat.S_ISDIR(st.st_mode), me=me, owner_name=owner_name)
        if problem:
            return _with_fix(what, path, problem, real, real)
    for directory in dict.fromkeys(ancestors(path) + ancestors(real)):  # each directory once, in order
        try:
            dst = stat_of(directory)
        except FileNotFoundError:
            if missing_ok:
                continue
            raise
        problem = level_problem(directory, dst, is_dir=True, me=me, owner_name=owner_name)
        if problem:
            return _with_fix(what, path, problem, directory, real)
    return None


def _with_fix(what: str, path: str, problem: str, offender: str, real: str) -> str:
    subject = f"{what} {path}: " if offender != path else f"{what}: "
    if offender == path or offender == real:
        fix = f"make it owned by you or root and not writable by others (chmod go-w {offender})"
    else:
        fix = (f"use a private directory (owned by you, mode 0700) instead, or make {offender} "
               f"not writable by others (chmod go-w, or chmod +t for a shared directory)")
    return f"{subject}{problem}; another user could change what vq-admin reads or runs there; fix: {fix}"


def creatable_problem(path: str, stat_of: "StatOf" = os.stat, *, what: str = "command file",
                      fix: str = "install the command in a directory only you and root can write") -> str | None:
    """For a path that names nothing yet: ``None`` unless the nearest existing directory above it
    lets other users create it first (group- or other-writable, sticky or not: in a sticky ``/tmp``
    anyone can create the name)."""
    for directory in ancestors(path):
        try:
            st = stat_of(directory)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot check {what} {path}: {exc.strerror}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return (f"{what} {path} does not exist and directory {directory} (mode "
                    f"{stat.S_IMODE(st.st_mode):04o}) lets other users create it; fix: {fix}")
        return None
    return None


def check(path: str, *, what: str, missing_ok: bool = False) -> None:
    """Raise :class:`Untrusted` when :func:`path_problem` finds one."""
    problem = path_problem(path, what=what, missing_ok=missing_ok)
    if problem:
        raise Untrusted(problem, path)


def makedirs_private(path: str) -> None:
    """Create *path* and missing parents as 0700 whatever the umask.

    Existing levels are left as they are (the caller checks them with
    :func:`check`); a level that is a symlink is refused with ``OSError``.
    """
    path = os.path.normpath(path)
    missing = [level for level in (path, *ancestors(path)) if not os.path.lexists(level)]
    for level in reversed(missing):
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            pass
        fd = os.open(level, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid():
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)


def make_private_dir(path: str, *, what: str) -> None:
    """Create *path* owner-only (:func:`makedirs_private`) where the secure-path rule allows it, and
    raise :class:`Untrusted` unless it then passes that rule (the agent's state directories)."""
    check(path, what=what, missing_ok=True)
    makedirs_private(path)
    check(path, what=what)


def command_problem(words: "Iterable[object]", *, what: str = "command") -> str | None:
    """``None`` when every absolute path among *words* (interpreter and script
    alike: ``/bin/bash /site/deploy.sh``) passes the rule, else one line naming
    the first offender, its owner and mode, and the fix.

    A missing file is judged by the directories above it (someone who can
    write there could create it); a missing program (the first word) also by the
    directory it would be created in (:func:`creatable_problem`: in a sticky ``/tmp``
    anyone can create it first); running it then reports the missing file.
    Bare names (``git``, found in ``PATH``) and relative words are not paths
    the configuration names and are not checked here.
    """
    for index, word in enumerate(words):
        if not isinstance(word, str) or not word.startswith("/"):
            continue
        problem = path_problem(word, what=what, missing_ok=True) or (
            creatable_problem(word, what=what) if index == 0 and not os.path.lexists(word) else None)
        if problem:
            return problem
    return None


#: Directory levels of :func:`open_trusted_dir`: only looked up through and ``fstat``-ed, so
#: ``O_PATH`` where the platform has it (no read permission needed, as for ``stat``).
_LEVEL_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_trusted_dir(path: str) -> int | None:
    """An fd of the absolute, normalised directory *path* when it and every directory
    above it pass the rule, proven with one ``open`` and one ``fstat`` per level; else ``None``.

    Each level is opened relative to the one above, from ``/``, without following a
    symlink, so what is checked is what is used.  ``None`` covers everything that is
    not that plain case: a missing level, a symlink on the way (which
    :func:`path_problem` follows and checks on both sides), a level that fails the
    rule, any error.  The caller then applies :func:`path_problem`, which words the
    refusal; this function never refuses anything itself.  The caller closes the fd
    (an ``O_PATH`` fd where the platform has it: a ``dir_fd`` for lookups and ``stat``).
    """
    if not path.startswith("/") or "\0" in path or os.path.normpath(path) != path:
        return None
    names = [name for name in path.split("/") if name]
    fd = -1
    try:
        fd = os.open("/", _LEVEL_FLAGS)
        while True:  # O_DIRECTORY: each level opened is a directory; only whether it passes the rule is used
            if level_problem(path, os.fstat(fd), is_dir=True) is not None:
                return None
            if not names:
                result, fd = fd, -1
                return result
            child = os.open(names.pop(0), _LEVEL_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def read_bounded(fd: int, limit: int) -> bytes | None:
    """The rest of what *fd* holds when it is at most *limit* bytes (a file that grew past it while
    being read included), else ``None``.  ``OSError`` propagates."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, limit + 1 - total)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            return None


def read_regular(path: str, limit: int) -> bytes | None:
    """The bytes of *path* when it is a regular file of at most *limit* bytes, else ``None`` (a FIFO or
    other special file is never waited on).  ``OSError`` propagates."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return read_bounded(fd, limit) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def read_trusted_file(dir_fd: int, name: str, limit: int) -> bytes | None:
    """The bytes of *name* in the directory *dir_fd* when it is a regular file that passes
    the rule and holds at most *limit* bytes; else ``None`` (absent, a symlink, a FIFO or
    other special file, another owner, a loose mode, too large, any error).

    Opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks) and checked with one
    ``fstat`` of what was opened.  Like :func:`open_trusted_dir` it never words a
    refusal: on ``None`` the caller's full check does.
    """
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_size > limit
                or level_problem(name, st, is_dir=False) is not None):
            return None
        return read_bounded(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
