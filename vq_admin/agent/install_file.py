"""``vq-admin-agent install-file``: replace one private site command atomically.

The new content is read from stdin.  It is written to a fresh temporary file
(``O_EXCL``, never through a symlink) in the destination's directory, given
its mode, flushed to disk, and only then renamed over the destination: a
crash at any point leaves the old file or the new one, never a mix (a killed
run can leave its ``.tmp.<name>.<pid>.*`` temporary file behind; it is never
executed and may be removed by hand).

The answer (one JSON object) carries the old and new SHA-256, the mode, and
the interpreter mapping of both versions as *this host* resolves it: the
shebang line, the program it names, and for ``#!/usr/bin/env CMD`` the path
``CMD`` resolves to on this host's ``PATH`` (realpath included).

Test hook: the ``install-file-before-rename`` failpoint
(:mod:`vq_admin.core.failpoints`; ``VQ_ADMIN_TESTING=1`` with
``VQ_ADMIN_AGENT_CRASH=before-rename``) kills the agent with SIGKILL
between the write and the rename.

Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import socket
import stat
from typing import TYPE_CHECKING, BinaryIO

from ..core.failpoints import failpoint
from ..core.safedirs import UnsafePath
from ..core import atomic
from ..core.stamps import utc_now
from ..core.securepath import ancestors, path_problem

if TYPE_CHECKING:
    from ..core.protocol import Installed

MAX_BYTES = 16 << 20
SHEBANG_LIMIT = 512


def _env_command(words: list[str]) -> str | None:
    """The command ``env`` would run from a shebang's words after ``env``."""
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-S", "--split-string", "-i", "--ignore-environment", "-"):
            i += 1
        elif word in ("-u", "--unset", "-C", "--chdir"):
            i += 2
        elif word.startswith("-") or "=" in word:
            i += 1
        else:
            return word
    return None


def interpreter_mapping(content: bytes | None) -> dict[str, object] | None:
    """How this host would run *content*: its shebang and what it resolves to."""
    if content is None:
        return None
    if not content.startswith(b"#!"):
        kind = "elf" if content.startswith(b"\x7fELF") else "no-shebang"
        return {"kind": kind, "shebang": None}
    line = content[2:SHEBANG_LIMIT].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    words = line.split()
    if not words:
        return {"kind": "shebang", "shebang": "#!", "program": None, "problem": "empty shebang"}
    program = words[0]
    found: dict[str, object] = {
        "kind": "shebang",
        "shebang": "#!" + line,
        "program": program,
        "program_exists": os.path.exists(program),
        "program_resolved": os.path.realpath(program) if os.path.exists(program) else None,
        "args": words[1:],
    }
    if os.path.basename(program) == "env":
        command = _env_command(words[1:])
        where = shutil.which(command) if command else None
        found.update({
            "command": command,
            "command_path": where,
            "command_resolved": os.path.realpath(where) if where else None,
            "search_path": os.environ.get("PATH", ""),
        })
    return found


def _old(pfd: int, name: str, shown: str) -> tuple[str | None, bytes | None, int | None]:
    """``(sha256, first bytes, mode)`` of the file being replaced, or Nones."""
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        return None, None, None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{shown} is a symlink; renaming over it would replace the link, not its target: "
                         "give the real path")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{shown} exists and is not a regular file")
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(SHEBANG_LIMIT)
        digest.update(head)
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest(), head, stat.S_IMODE(st.st_mode)


#: Files that mark a directory as a staged or installed product archive (``vq admin provider
#: install`` refuses a source below one too).
PRODUCT_MARKERS = ("SOURCE-SHA", "SOURCE-TREE-SHA256", "ARCHIVE-SHA256", ".vq-admin-source.json")


def product_tree_problem(directory: str) -> str | None:
    """Why *directory* (or an ancestor) belongs to a product archive, or None.

    Private site commands never live inside a stage, an installed helper
    release or a runtime release: those trees are immutable product content.
    """
    real = os.path.realpath(directory)
    if f"{os.sep}.vq-admin{os.sep}stage{os.sep}" in real + os.sep:
        return f"{directory} lies inside a vq-admin stage"
    for current in (real, *ancestors(real)):  # the directory itself, then each level up to /
        for marker in PRODUCT_MARKERS:
            if os.path.lexists(os.path.join(current, marker)):
                return (f"{directory} lies inside {current}, which holds {marker} "
                        "(a staged or installed product archive)")
    return None


def install(dest: str, mode: int, stream: BinaryIO) -> Installed:
    """Install the bytes of *stream* at *dest* with *mode*; return the evidence."""
    if not os.path.isabs(dest) or os.path.normpath(dest) != dest or dest.endswith("/"):
        raise UnsafePath(f"--dest {dest!r} must be an absolute, normalised file path")
    if mode & ~0o7777 or mode & 0o022:
        raise UnsafePath(f"--mode {mode:04o} is refused: group/other write bits are not allowed")
    if mode & 0o7000:
        raise UnsafePath(f"--mode {mode:04o} is refused: setuid, setgid and sticky bits are not allowed on a site "
                         "command (use a mode such as 0755)")
    parent, name = os.path.split(dest)
    unsafe = path_problem(parent, what="destination directory")
    if unsafe:
        raise UnsafePath(f"{unsafe}; the installed command would run as the administrator")
    problem = product_tree_problem(parent) if os.path.isdir(parent) else None
    if problem:
        raise UnsafePath(problem + "; install private site commands elsewhere")
    new = stream.read(MAX_BYTES + 1)
    if len(new) > MAX_BYTES:
        raise ValueError(f"the new file is larger than {MAX_BYTES} bytes")
    try:
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafePath(f"{parent}: {exc.strerror} (the directory must exist)") from None
    try:
        old_sha, old_head, old_mode = _old(pfd, name, dest)
        new_sha = hashlib.sha256(new).hexdigest()
        changed = old_sha != new_sha or old_mode != mode
        if changed:
            atomic.write(name, lambda fh: (fh.write(new), fh.flush(), failpoint("install-file-before-rename")),
                         dir_fd=pfd, mode=mode)
    finally:
        os.close(pfd)
    return {
        "dest": dest,
        "changed": changed,
        "old_sha256": old_sha,
        "new_sha256": new_sha,
        "old_mode": None if old_mode is None else f"{old_mode:04o}",
        "mode": f"{mode:04o}",
        "bytes": len(new),
        "interpreter": interpreter_mapping(new),
        "old_interpreter": interpreter_mapping(old_head),
        "user": pwd.getpwuid(os.geteuid()).pw_name,
        "uid": os.geteuid(),
        "hostname": socket.gethostname(),
        "at": utc_now(),
    }
