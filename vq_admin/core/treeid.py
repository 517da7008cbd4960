"""Source-tree identity, computed the same way on the driver and on a host.

Two identities are computed from a ``git archive`` tarball, streaming (the
archive is never held in memory):

* the **git tree id**: the object name git gives the commit's root tree,
  recomputed from the archived files (SHA-1 for 40-digit repositories,
  SHA-256 for 64-digit ones).  It must equal ``git rev-parse SHA^{tree}``,
  so a staged archive is proven to hold exactly the commit's tree;
* the **tree SHA-256**: SHA-256 over the sorted lines
  ``<git mode> <sha256 of content> <path>\\n`` of every file and symlink.
  The same digest is computed over an installed directory
  (:func:`directory_tree_sha256`), which is how the helper proves the files
  it runs are the files it was built from.

Standard library only: this module runs inside ``vq-admin-agent``.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from typing import IO, Iterator

from .filehash import CHUNK, file_sha256


@dataclass(frozen=True)
class ArchiveIdentity:
    archive_sha256: str
    git_tree: str
    tree_sha256: str
    commit: str | None  # the pax global header comment git archive writes
    files: int


def _git_mode(is_link: bool, mode: int) -> bytes:
    """git's mode of a symlink, an executable or another regular file (a tar member's mode, or ``st_mode``)."""
    if is_link:
        return b"120000"
    return b"100755" if mode & 0o100 else b"100644"


class _Tree:
    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: dict[bytes, tuple[bytes, object]] = {}

    def subtree(self, name: bytes) -> "_Tree":
        """The tree *name*, made on the way to an entry below it: so no tree is ever empty, as git
        never stores an empty tree inside a tree."""
        mode, value = self.entries.get(name, (b"40000", None))
        if not isinstance(value, _Tree):
            value = _Tree()
            self.entries[name] = (b"40000", value)
        return value

    def object_id(self, algo: str) -> bytes:
        def sort_key(item: tuple[bytes, tuple[bytes, object]]) -> bytes:
            name, (mode, _) = item
            return name + b"/" if mode == b"40000" else name

        body = bytearray()
        for name, (mode, value) in sorted(self.entries.items(), key=sort_key):
            oid = value.object_id(algo) if isinstance(value, _Tree) else value  # never empty: see subtree
            body += mode + b" " + name + b"\0" + oid  # type: ignore[operator]
        h = hashlib.new(algo)
        h.update(b"tree %d\0" % len(body))
        h.update(body)
        return h.digest()


def _stream(fh: IO[bytes], size: int, *hashers: "hashlib._Hash") -> None:
    remaining = size
    while remaining > 0:
        chunk = fh.read(min(CHUNK, remaining))
        if not chunk:
            raise ValueError("archive member is shorter than its header says")
        remaining -= len(chunk)
        for h in hashers:
            h.update(chunk)


def archive_identity(path: str, hash_algo: str = "sha1") -> ArchiveIdentity:
    """Identity of a ``git archive --format=tar`` file at *path*.

    Raises :class:`ValueError` for an archive holding something git cannot
    have put there (absolute or ``..`` names, hard links, devices).
    """
    archive_sha = file_sha256(path)
    root = _Tree()
    lines: list[bytes] = []
    with tarfile.open(path, mode="r:") as tar:
        commit = tar.pax_headers.get("comment")
        for member in tar:
            name = member.name.encode("utf-8", "surrogateescape")
            parts = [p for p in name.split(b"/") if p not in (b"", b".")]
            if name.startswith(b"/") or b".." in parts:
                raise ValueError(f"archive member {member.name!r} escapes the tree")
            if member.isdir():
                continue
            fh: IO[bytes] | None
            if member.issym():  # a symlink's blob is its target
                target = member.linkname.encode("utf-8", "surrogateescape")
                size, fh = len(target), io.BytesIO(target)
            elif member.isfile():
                size, fh = member.size, tar.extractfile(member)
            else:
                raise ValueError(f"archive member {member.name!r} is not a file, directory or symlink")
            assert fh is not None
            mode = _git_mode(member.issym(), member.mode)
            blob = hashlib.new(hash_algo)
            content = hashlib.sha256()
            blob.update(b"blob %d\0" % size)
            _stream(fh, size, blob, content)
            tree = root
            for part in parts[:-1]:
                tree = tree.subtree(part)
            tree.entries[parts[-1]] = (mode, blob.digest())
            lines.append(mode + b" " + content.hexdigest().encode() + b" " + b"/".join(parts) + b"\n")
    return ArchiveIdentity(
        archive_sha256=archive_sha,
        git_tree=root.object_id(hash_algo).hex(),
        tree_sha256=_digest_lines(lines),
        commit=commit,
        files=len(lines),
    )


def _digest_lines(lines: list[bytes]) -> str:
    by_path: list[bytes] = sorted(lines, key=lambda ln: ln.split(b" ", 2)[2])
    return hashlib.sha256(b"".join(by_path)).hexdigest()


def _walk_files(root: str, skip: frozenset[str]) -> Iterator[tuple[str, str]]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        # os.walk lists a symlink to a directory among the directories: it is digested as a link, never entered
        linked_dirs = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and d not in linked_dirs)
        for name in list(filenames) + linked_dirs:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel in skip or name.endswith(".pyc"):
                continue
            yield rel, os.path.join(dirpath, name)


def directory_tree_sha256(root: str, skip: frozenset[str] = frozenset()) -> str:
    """The tree SHA-256 of the files below *root* (``__pycache__`` excluded).

    Paths in *skip* (relative to *root*) are left out: the identity record
    that stores this digest cannot be part of what it digests.
    """
    lines: list[bytes] = []
    for rel, full in _walk_files(root, skip):
        st = os.lstat(full)
        if stat.S_ISLNK(st.st_mode):
            digest = hashlib.sha256(os.readlink(full).encode("utf-8", "surrogateescape")).hexdigest()
        elif stat.S_ISREG(st.st_mode):
            digest = file_sha256(full)
        else:
            continue
        mode = _git_mode(stat.S_ISLNK(st.st_mode), st.st_mode)
        lines.append(mode + b" " + digest.encode() + b" " + rel.encode("utf-8", "surrogateescape") + b"\n")
    return _digest_lines(lines)
