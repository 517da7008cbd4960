"""Fresh private directories in scratch space, never through a symlink.

Every directory level below a given root that vq-admin creates is opened with
``O_NOFOLLOW`` relative to its parent's descriptor, so a symlink planted at
any of those levels is refused rather than followed, and nothing is written
through it.  Existing levels must be real directories owned by us; the last
level (an attempt or stage directory) is always created new, never reused.

Standard library only: this module runs inside ``vq-admin-agent``.
"""

from __future__ import annotations

import os
import stat
import sys
from contextlib import contextmanager

from . import securepath
from .exits import EXIT_FAILED, EXIT_UNSAFE
from .stamps import NAME, utc_now

TYPE_CHECKING = False  # not typing's: stage-receive's early start does without it
if TYPE_CHECKING:
    from typing import Callable, Iterator, Sequence

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(Exception):
    """A path level is a symlink, not a directory, or not ours."""


def verb_status(verb: Callable[[], int]) -> int:
    """An agent verb's exit status: *verb*'s own, 4 (``refused:`` on stderr) when it raised
    :class:`UnsafePath`, 1 when it raised another ``OSError``."""
    try:
        return verb()
    except UnsafePath as exc:
        print(f"vq-admin-agent: refused: {exc}", file=sys.stderr)
        return EXIT_UNSAFE
    except OSError as exc:
        print(f"vq-admin-agent: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _check_dir_fd(fd: int, shown: str) -> None:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{shown} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{shown} is owned by uid {st.st_uid}, not by us ({os.geteuid()})")
    problem = securepath.level_problem(shown, st, is_dir=True)
    if problem:
        raise UnsafePath(f"{problem}; another user could change what vq-admin reads or runs there")


#: The one directory vq-admin owns below a scratch root.
TOP = ".vq-admin"


def check_scratch(root: str) -> None:
    """Refuse ``<root>/.vq-admin`` unless it and every directory above it pass the secure-path rule,
    and a *root* that does not exist (naming the ``mkdir`` that fixes it).

    Checked before anything is created or used below a scratch root (stages,
    allocation attempts, transcripts): a scratch root (or a directory above
    it) that another user can write lets that user rename ``.vq-admin`` away
    and plant their own files, whatever happens below it.
    """
    if not os.path.isabs(root):
        raise UnsafePath(f"scratch root {root} is not absolute")
    problem = securepath.path_problem(os.path.join(root, TOP), what="the scratch directory", missing_ok=True)
    if problem:
        raise UnsafePath(f"{problem} (scratch_root must be a private directory: set it to a directory "
                         f"below {root} that only you and root can change)")
    if not os.path.lexists(root):  # never created here: the operator chooses where scratch space lives
        raise UnsafePath(f"scratch_root {root} does not exist; fix: create it on this host as this user: "
                         f"mkdir -p {root} && chmod 700 {root}")


def scratch_problem(root: str) -> str | None:
    """Why a run could not use *root* as its scratch root, with the fix; ``None`` when it could.

    What ``stage-create``, ``alloc-run`` and ``detach-run`` check before they create anything (the
    secure-path rule of :func:`check_scratch`, a directory that exists, ``.vq-admin`` our own private
    directory), and that this user can create ``.vq-admin`` when it is missing: ``vq admin check
    --connect`` asks it, so a first run is not the first to find the scratch root missing.
    """
    try:
        check_scratch(root)
        os.close(open_chain(root, [TOP], create=False) if os.path.lexists(os.path.join(root, TOP)) else open_root(root))
    except UnsafePath as exc:
        return str(exc)
    if not os.path.lexists(os.path.join(root, TOP)) and not os.access(root, os.W_OK | os.X_OK):
        return (f"scratch_root {root}: this user cannot create {TOP} in it (not writable); fix: "
                f"chmod u+wx {root}, or set scratch_root to a directory of this user")
    return None


def open_root(root: str) -> int:
    """Open an existing root directory (which the operator named, so it may be a link)."""
    if not os.path.isabs(root):
        raise UnsafePath(f"{root} is not absolute")
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UnsafePath(f"{root} does not exist") from None
    except NotADirectoryError:
        raise UnsafePath(f"{root} is not a directory") from None


def open_chain(root: str, parts: Sequence[str], create: bool = True) -> int:
    """Open ``root/parts[0]/parts[1]/...``, creating missing levels with mode 0700.

    Returns a descriptor of the last level; the caller closes it.  A level
    that is a symlink (or anything but our own directory) raises
    :class:`UnsafePath` naming the path.
    """
    if parts and parts[0] == TOP:
        check_scratch(root)
    fd = open_root(root)
    shown = root.rstrip("/")
    try:
        for part in parts:
            if not part or "/" in part or part in (".", ".."):
                raise UnsafePath(f"bad path component {part!r}")
            shown = f"{shown}/{part}"
            if create:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if os.path.islink(shown):
                    owner = securepath.describe_owner(os.lstat(shown).st_uid)
                    raise UnsafePath(f"{shown} is a symlink (owner {owner}); refusing to follow it") from None
                raise UnsafePath(f"{shown}: {exc.strerror}") from None
            os.close(fd)
            fd = nfd
            _check_dir_fd(fd, shown)
        return fd
    except BaseException:
        os.close(fd)
        raise


def fresh_name(prefix: str) -> str:
    """``<prefix>.<UTC>.<random>``: the name of a new stage or attempt directory."""
    return f"{prefix}.{utc_now(fmt=NAME)}.{os.urandom(4).hex()}"


def create_fresh(parent_fd: int, prefix: str) -> str:
    """Create a new directory :func:`fresh_name` (0700) below *parent_fd*."""
    for _ in range(20):
        name = fresh_name(prefix)
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            return name
        except FileExistsError:
            continue
    raise UnsafePath("could not create a fresh directory name")


@contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def closed_on_error(fd: int) -> Iterator[int]:
    """Keep *fd* open for the caller when the block succeeds; close it when the block raises."""
    try:
        yield fd
    except BaseException:
        os.close(fd)
        raise


def tree_size_at(parent_fd: int, name: str) -> int:
    """Bytes of regular files below directory *name* below *parent_fd* (symlinks not followed)."""
    total = 0
    with opened(os.open(name, DIR_FLAGS, dir_fd=parent_fd)) as fd, os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                total += tree_size_at(fd, entry.name)
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def clear_dir(fd: int, names: list[str] | None = None) -> None:
    """Remove everything in the open directory *fd* (*names*: its entries, when the caller has
    listed them already), never following a symlink.

    Each entry is unlinked without a stat first (a symlink goes itself, its target untouched); one
    that ``unlink`` refuses as a directory (EISDIR on Linux, EPERM elsewhere) is opened with
    ``O_NOFOLLOW``, cleared the same way and removed.
    """
    for name in os.listdir(fd) if names is None else names:
        try:
            os.unlink(name, dir_fd=fd)
        except IsADirectoryError:
            remove_tree_at(fd, name)
        except PermissionError:
            if not stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise
            remove_tree_at(fd, name)


def remove_tree_at(parent_fd: int, name: str) -> None:
    """Remove directory *name* below *parent_fd* and everything in it, never following a symlink."""
    with opened(os.open(name, DIR_FLAGS, dir_fd=parent_fd)) as fd:
        clear_dir(fd)
    os.rmdir(name, dir_fd=parent_fd)
