"""Source stages on a build host: create, receive, verify, reclaim.

Layout: ``<root>/.vq-admin/stage/<kind>/<name>/stage.<UTC>.<random>/`` holding
``source.tar`` and the identity files ``SOURCE-SHA``, ``ARCHIVE-SHA256``,
``SOURCE-TREE-SHA256`` and ``GIT-TREE``.  A stage is verified on the host
that will use it, against both its identity files and the values the driver
passes on the command line, before any provider runs.

Reclaim: a successful run's own stage is removed; a failed run's stage is
marked ``FAILED`` and kept; of the failed stages of one name at most
``keep_failed`` are kept, the oldest removed first.  An unmarked stage older
than the reclaiming run's own (left by an interrupted or killed run: the lane
lock and the host-side lease let only one run of a lane go at a time) is
marked ``FAILED`` too and counted under the same cap.  Later unmarked stages
and anything not named ``stage.*`` are never touched.
"""

from __future__ import annotations

import io
import os
import re
import stat
import sys

from ..core import atomic, safedirs, securepath
from ..core.atomic import TEMP_FLAGS
from ..core.protocol import encode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..core.protocol import StageCreated, StageReceived, StageReclaimed, StageVerdict

STAGE_NAME_RE = re.compile(r"\Astage\.\d{8}T\d{6}Z\.[0-9a-f]{8}\Z")
KINDS = ("runtime", "helper")
IDENTITY_FILES = ("SOURCE-SHA", "ARCHIVE-SHA256", "SOURCE-TREE-SHA256", "GIT-TREE")
ARCHIVE = "source.tar"
FAILED_MARK = "FAILED"


def stage_parts(kind: str, name: str) -> list[str]:
    if kind not in KINDS:
        raise safedirs.UnsafePath(f"unknown stage kind {kind!r}")
    return [".vq-admin", "stage", kind, name]


def create(root: str, kind: str, name: str, identity: dict[str, str]) -> StageCreated:
    """Create a fresh stage holding the identity files; return its path."""
    with safedirs.opened(safedirs.open_chain(root, stage_parts(kind, name))) as parent:
        stage_name = safedirs.create_fresh(parent, "stage")
        fd = os.open(stage_name, safedirs.DIR_FLAGS, dir_fd=parent)
        with safedirs.opened(fd):
            for fname in IDENTITY_FILES:
                atomic.write(fname, (identity[fname] + "\n").encode(), dir_fd=fd, exclusive=True)
    path = os.path.join(root, *stage_parts(kind, name), stage_name)
    return {"stage": path}


def _open_stage(stage: str) -> int:
    parent, name = os.path.split(stage.rstrip("/"))
    if not STAGE_NAME_RE.match(name) or f"{os.sep}.vq-admin{os.sep}stage{os.sep}" not in parent + os.sep:
        raise safedirs.UnsafePath(f"{stage} is not a vq-admin stage directory")
    problem = securepath.path_problem(parent, what="the stage directory")
    if problem:  # .vq-admin, the scratch root and every directory above: nobody else may change them
        raise safedirs.UnsafePath(problem)
    pfd = safedirs.open_root(parent)
    try:
        fd = os.open(name, safedirs.DIR_FLAGS, dir_fd=pfd)
    except OSError as exc:
        raise safedirs.UnsafePath(f"{stage}: {exc.strerror}") from None
    finally:
        os.close(pfd)
    return fd


def receive(stage: str, stream: io.RawIOBase | io.BufferedIOBase) -> StageReceived:
    """Write the archive from *stream* into the stage (must not exist yet), through one 1 MiB buffer.

    No fsync: ``stage-verify``, the next step, rehashes the archive before any provider reads it,
    and a run a host crash ends leaves its stage to a later run's reclaim; it is never used again.
    """
    with safedirs.opened(_open_stage(stage)) as fd:
        out = os.open(ARCHIVE, TEMP_FLAGS, 0o600, dir_fd=fd)
        size = 0
        buf = bytearray(1 << 20)
        with safedirs.opened(out), memoryview(buf) as view:
            for n in iter(lambda: stream.readinto(buf), 0):
                written = 0
                while written < n:  # os.write may take less than it was given
                    written += os.write(out, view[written:n])
                size += n
    return {"stage": stage, "bytes": size}


def receive_verb(stage: str) -> int:
    """``stage-receive``: the archive on standard input written into *stage*, the answer printed."""
    with open(0, "rb", buffering=0, closefd=False) as stdin:
        sys.stdout.write(encode(receive(stage, stdin)))
    sys.stdout.flush()
    return 0


def _read_identity_file(fd: int, name: str) -> str | None:
    try:
        rfd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    with os.fdopen(rfd, "rb") as fh:
        return fh.read(4096).decode("utf-8", "replace").strip()


def verify(stage: str, expected: dict[str, str]) -> StageVerdict:
    """Recompute the archive's identity and compare it with files and *expected*.

    *expected* maps identity file names to the driver's values.
    """
    with safedirs.opened(_open_stage(stage)) as fd:
        recorded = {n: _read_identity_file(fd, n) for n in IDENTITY_FILES}
        st = os.stat(ARCHIVE, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise safedirs.UnsafePath(f"{stage}/{ARCHIVE} is not a regular file")
    from ..core.treeid import archive_identity  # tarfile and hashing: not for stage-receive's early start
    from ..core.identifiers import object_format  # its regular expressions: not for stage-receive either

    mismatches: list[str] = []
    try:
        ident = archive_identity(os.path.join(stage, ARCHIVE), object_format(expected["SOURCE-SHA"]))
        values = (ident.commit or "", ident.archive_sha256, ident.tree_sha256, ident.git_tree)
        computed = dict(zip(IDENTITY_FILES, values))
    except (ValueError, OSError, EOFError) as exc:
        computed = {n: "" for n in IDENTITY_FILES}
        mismatches.append(f"archive unreadable: {exc}")
    for name in IDENTITY_FILES:
        want = expected[name]
        if recorded[name] != want:
            mismatches.append(f"{name} file holds {recorded[name]!r}, expected {want!r}")
        if computed[name] != want:
            mismatches.append(f"{name} of the staged archive is {computed[name]!r}, expected {want!r}")
    return {"stage": stage, "verified": not mismatches, "mismatches": mismatches, "computed": computed}


def reclaim(root: str, kind: str, name: str, stage: str, succeeded: bool, keep_failed: int) -> StageReclaimed:
    """Remove a succeeded stage, or mark a failed one and cap the failed ones."""
    removed: list[str] = []
    abandoned: list[str] = []
    directory, own = os.path.split(stage.rstrip("/"))
    if directory != os.path.join(root, *stage_parts(kind, name)) or not STAGE_NAME_RE.match(own):
        raise safedirs.UnsafePath(f"{stage} is not a stage of {kind} {name} under {root}")
    with safedirs.opened(safedirs.open_chain(root, stage_parts(kind, name), create=False)) as parent:
        if succeeded:
            safedirs.remove_tree_at(parent, own)
            removed.append(own)
        else:
            _mark_failed(parent, own, b"")
        failed = []
        for entry in os.scandir(parent):
            if not STAGE_NAME_RE.match(entry.name) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                os.stat(f"{entry.name}/{FAILED_MARK}", dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                if _stamp(entry.name) >= _stamp(own):
                    continue  # this run's (its own stamp), or a later run's: never touched
                # an unmarked stage older than this run's: its run was interrupted before its reclaim
                _mark_failed(parent, entry.name, b"abandoned by an interrupted run\n")
                abandoned.append(entry.name)
            failed.append(entry.name)
        failed.sort(key=_stamp, reverse=True)  # newest first
        for old in failed[keep_failed:]:
            safedirs.remove_tree_at(parent, old)
            removed.append(old)
    return {"removed": removed, "abandoned": abandoned}


def _mark_failed(parent: int, name: str, text: bytes) -> None:
    with safedirs.opened(os.open(name, safedirs.DIR_FLAGS, dir_fd=parent)) as sfd:
        try:
            atomic.write(FAILED_MARK, text, dir_fd=sfd, exclusive=True)
        except FileExistsError:
            pass


def _stamp(name: str) -> str:
    """The UTC stamp of ``stage.<UTC>.<hex>``."""
    return name.split(".")[1]
