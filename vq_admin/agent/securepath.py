"""The secure-path rule, one definition for the driver and the agent.

A path is trusted only when nobody but the running user and root can change
it or any directory above it (the model is OpenSSH ``StrictModes`` and sudo's
secure path checks).  For each level, from the path itself up to ``/``:

* the owner is the running user or root;
* it is not writable by group or others, except a directory with the sticky
  bit (``/tmp``): there others cannot rename or remove what they do not own.

A symlink the operator named is followed, and both the path as given and what
it resolves to are checked (a link can only be swapped by someone who can
write the directory holding it, which the given chain covers).

Standard library only: ``vq-admin-agent`` runs it on login hosts, and the
per-job launcher resolution imports it.  Nothing here writes.
"""

from __future__ import annotations

import os
import stat
# (no typing import: the per-job launcher lookup imports this module; annotations are never evaluated)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable


class Untrusted(Exception):
    """A path (or a directory above it) can be changed by another user.

    ``str()`` is one line naming the path, its owner and mode, and the fix.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def level_problem(path: str, st: os.stat_result, *, is_dir: bool) -> str | None:
    """Why one level fails the rule (owner, mode), or ``None``."""
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    kind = "directory" if is_dir else "file"
    if st.st_uid not in (0, me):
        return (f"{kind} {path} is owned by {_owner_name(st.st_uid)}, not by you or root "
                f"(mode {mode:04o})")
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (is_dir and st.st_mode & stat.S_ISVTX):
        who = "group- and other-writable" if (st.st_mode & stat.S_IWGRP and st.st_mode & stat.S_IWOTH) else (
            "group-writable" if st.st_mode & stat.S_IWGRP else "other-writable")
        sticky = " without the sticky bit" if is_dir else ""
        return f"{kind} {path} is {who}{sticky} (owner {_owner_name(st.st_uid)}, mode {mode:04o})"
    return None


def ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``['/a/b', '/a', '/']`` (lexically, no filesystem access)."""
    found: list[str] = []
    current = os.path.dirname(os.path.normpath(path))
    while True:
        found.append(current)
        if current == "/":
            return found
        current = os.path.dirname(current)


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
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except FileNotFoundError:
            if not missing_ok:
                return f"{what} {path} does not exist"
            st = None
        if st is not None:
            problem = level_problem(real, st, is_dir=stat.S_ISDIR(st.st_mode))
            if problem:
                return _with_fix(what, path, problem, real)
        seen = set()
        for directory in ancestors(path) + ancestors(real):
            if directory in seen:
                continue
            seen.add(directory)
            try:
                dst = os.stat(directory)
            except FileNotFoundError:
                if missing_ok:
                    continue
                raise
            problem = level_problem(directory, dst, is_dir=True)
            if problem:
                return _with_fix(what, path, problem, directory)
        return None
    except OSError as exc:
        return f"cannot check {what} {path}: {exc.strerror or exc}"


def _with_fix(what: str, path: str, problem: str, offender: str) -> str:
    subject = f"{what} {path}: " if offender != path else f"{what}: "
    if offender == path or offender == os.path.realpath(path):
        fix = f"make it owned by you or root and not writable by others (chmod go-w {offender})"
    else:
        fix = (f"use a private directory (owned by you, mode 0700) instead, or make {offender} "
               f"not writable by others (chmod go-w, or chmod +t for a shared directory)")
    return f"{subject}{problem}; another user could change what vq-admin reads or runs there; fix: {fix}"


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
    missing: list[str] = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
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


def command_problem(words: Iterable[object], *, what: str = "command") -> str | None:
    """``None`` when every absolute path among *words* (interpreter and script
    alike: ``/bin/bash /site/deploy.sh``) passes the rule, else one line naming
    the first offender, its owner and mode, and the fix.

    A missing file is judged by the directories above it (someone who can
    write there could create it); running it then reports the missing file.
    Bare names (``git``, found in ``PATH``) and relative words are not paths
    the configuration names and are not checked here.
    """
    for word in words:
        if not isinstance(word, str) or not word.startswith("/"):
            continue
        problem = path_problem(word, what=what, missing_ok=True)
        if problem:
            return problem
    return None
