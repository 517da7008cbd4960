"""Safe extraction of an identity-checked git archive.

Every member is screened first and the whole archive refused (exit 1,
naming the member) when any member

* has an absolute name, a ``..`` component, or a NUL;
* is a device, FIFO or other special file;
* is a symlink or hard link whose target is absolute or leaves the tree;
* would land in ``.venv`` (the build owns that directory).

Extraction then uses tarfile's ``data`` filter where this Python has it
(3.11.4+), which repeats the link checks and clears setuid/setgid and
group/other write bits.
"""

from __future__ import annotations

import posixpath
import tarfile

from .errors import failed

RESERVED_TOP = ".venv"


def _inside(base: str, name: str) -> bool:
    """True when *name* (relative, POSIX) stays inside the tree once normalised."""
    norm = posixpath.normpath(posixpath.join(base, name))
    return norm != ".." and not norm.startswith("../") and not posixpath.isabs(norm)


def _name_problem(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if not name or "\0" in name or name.startswith("/") or ".." in name.split("/"):
        return "absolute or '..' names are refused"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if parts and parts[0] == RESERVED_TOP:
        return f"the source must not carry its own {RESERVED_TOP}"
    return None


def _kind_problem(member: tarfile.TarInfo) -> str | None:
    if member.isdev() or not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return "special files (devices, FIFOs) are refused"
    return None


def _link_problem(member: tarfile.TarInfo) -> str | None:
    if not (member.issym() or member.islnk()):
        return None
    link = member.linkname
    if not link or "\0" in link or link.startswith("/"):
        return f"link target {link!r} is absolute"
    base = posixpath.dirname(posixpath.normpath(member.name)) if member.issym() else ""
    return None if _inside(base, link) else f"link target {link!r} points outside the source tree"


#: Each check of a member, in order; the first that finds a problem refuses the archive.
_SCREENS = (_name_problem, _kind_problem, _link_problem)


def screen_member(member: tarfile.TarInfo) -> None:
    """Raise SiteError(1) when *member* is unsafe to extract."""
    for screen in _SCREENS:
        problem = screen(member)
        if problem:
            raise failed(f"archive member {member.name!r}: {problem}")


def extract(tar: tarfile.TarFile, dest: str) -> int:
    """Screen every member of *tar*, then extract into the existing *dest*.

    Returns the number of members extracted.
    """
    members = tar.getmembers()
    for member in members:
        screen_member(member)
    try:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python < 3.11.4; the screen above still applies
            tar.extractall(dest, members=members)  # noqa: S202 - every member was screened above
    except (tarfile.TarError, OSError) as exc:
        raise failed(f"unpacking the archive into {dest} failed: {exc}") from None
    return len(members)
