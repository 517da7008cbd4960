"""Refuse to run a command file another user could have replaced (as sshd StrictModes does).

vq-admin runs configured commands (provider commands, the agent, a preparer)
with the operator's rights.  On a ``transport = "local"`` host it runs them
itself, so before running an absolute command path it checks, for the path
as given and for the file it resolves to:

* the file: owned by you or root, and not writable by group or others;
* every directory above it: owned by you or root, and not writable by group
  or others unless the sticky bit is set (``/tmp``: others cannot rename or
  remove what they do not own there).

Anything else is refused (exit 77) naming the file or directory, before the
command runs.  Over ssh the remote sshd and the remote host's own permissions
are the boundary; vq-admin cannot see them from here.  A bare name (``git``)
is looked up in ``PATH`` and is not checked.
"""

from __future__ import annotations

import os
import stat



def command_problem(path: str) -> str | None:
    """``None`` when *path* is safe to run, else why not (naming the offending file)."""
    if not path.startswith("/"):
        return None
    try:
        real = os.path.realpath(path)
        problem = _unsafe(real, os.stat(real), is_dir=False)
        if problem:
            return problem if real == path else f"{problem} (it is what {path} resolves to)"
        seen: set[str] = set()
        for directory in _ancestors(path) + _ancestors(real):
            if directory not in seen:
                seen.add(directory)
                problem = _unsafe(directory, os.stat(directory), is_dir=True)
                if problem:
                    return f"{problem}, so another user could replace the command {path}"
        return None
    except FileNotFoundError:
        return None  # running it reports the missing command (exit 127), as before
    except OSError as exc:
        return f"cannot check the command file {path}: {exc.strerror}"


def _ancestors(path: str) -> list[str]:
    parts, found = os.path.dirname(os.path.normpath(path)), []
    while True:
        found.append(parts)
        if parts == "/":
            return found
        parts = os.path.dirname(parts)


def _unsafe(path: str, st: os.stat_result, *, is_dir: bool) -> str | None:
    what = "directory" if is_dir else "command file"
    if st.st_uid not in (0, os.geteuid()):
        return f"{what} {path} is owned by uid {st.st_uid}, not by you or root"
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not (is_dir and st.st_mode & stat.S_ISVTX):
        return f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
