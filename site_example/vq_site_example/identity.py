"""Source identity of a staged archive, checked before anything is unpacked.

The stage vq-admin prepares holds::

    source.tar       git archive --format=tar <sha>
    ARCHIVE-SHA256   hex SHA-256 of source.tar
    SOURCE-SHA       the full commit id

Three independent checks must all hold, or the deploy is refused with exit 3
and a message naming what differs:

1. SHA-256 of the archive bytes == ``ARCHIVE-SHA256``;
2. ``SOURCE-SHA`` == ``--expected-sha``;
3. the pax global header ``comment`` (where ``git archive`` records the
   commit id) == ``--expected-sha``, and no later global header changes it.

The archive is opened once (``O_NOFOLLOW``); the same open file is hashed and
then handed to the unpacker, so the bytes checked are the bytes unpacked.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
from dataclasses import dataclass
from io import BufferedReader

from vq_admin_identifiers import FULL_SHA_RE, SHA256_RE

from . import fsutil
from .errors import identity


@dataclass
class VerifiedArchive:
    """An open, identity-checked archive; a context manager that closes it."""

    path: str
    handle: BufferedReader
    sha256: str
    size: int

    def open_tar(self) -> tarfile.TarFile:
        """A fresh uncompressed-tar reader over the checked bytes."""
        self.handle.seek(0)
        return tarfile.open(fileobj=self.handle, mode="r:")

    def __enter__(self) -> "VerifiedArchive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


def stage_value(stage: str, name: str, pattern: re.Pattern[str]) -> str:
    """The value of the stage file *name*, lower case; exit 3 when missing or not matching *pattern*."""
    path = os.path.join(stage, name)
    try:
        text = fsutil.read_small(path, 4096).strip().lower()
    except FileNotFoundError:
        raise identity(f"cannot establish source identity: {path} is missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise identity(f"cannot establish source identity: cannot read {path}: {exc}") from None
    if not pattern.match(text):
        raise identity(f"cannot establish source identity: {path} does not hold a valid value ({text[:80]!r})")
    return text


def _open_archive(path: str) -> BufferedReader:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise identity(f"cannot establish source identity: source archive {path} is missing") from None
    except OSError as exc:
        raise identity(f"cannot open source archive {path}: {exc.strerror} "
                       "(a symlinked archive is refused)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise identity(f"source archive {path} is not a regular file")
    return os.fdopen(fd, "rb")


def _pax_comment(handle: BufferedReader, path: str) -> tuple[str | None, str | None]:
    """The global ``comment`` after the first member, and after the last."""
    handle.seek(0)
    try:
        with tarfile.open(fileobj=handle, mode="r:") as tar:
            first = tar.pax_headers.get("comment")
            for _member in tar:
                pass
            last = tar.pax_headers.get("comment")
    except tarfile.TarError as exc:
        raise identity(f"source archive {path} is not a readable uncompressed tar: {exc}") from None
    return first, last


def check_archive(archive: str, expected_sha: str) -> VerifiedArchive:
    """Check the staged archive's identity; return it open for unpacking.

    Raises :class:`~.errors.SiteError` with exit 3 on any missing or
    differing piece of identity; nothing is unpacked before this returns.
    """
    expected_sha = expected_sha.lower()
    stage = os.path.dirname(archive)
    recorded_sha256 = stage_value(stage, "ARCHIVE-SHA256", SHA256_RE)
    recorded_source = stage_value(stage, "SOURCE-SHA", FULL_SHA_RE)
    handle = _open_archive(archive)
    try:
        actual = hashlib.file_digest(handle, "sha256").hexdigest()
        size = handle.tell()
        if actual != recorded_sha256:
            raise identity(f"archive checksum differs: sha256({archive}) is {actual}, "
                           f"{stage}/ARCHIVE-SHA256 says {recorded_sha256}")
        if recorded_source != expected_sha:
            raise identity(f"source commit differs: {stage}/SOURCE-SHA is {recorded_source}, "
                           f"--expected-sha is {expected_sha}")
        first, last = _pax_comment(handle, archive)
        if first is None:
            raise identity(f"archive {archive} has no pax global 'comment' (git archive of a commit "
                           "records the commit id there); cannot establish its commit")
        if first.lower() != expected_sha or (last or "").lower() != expected_sha:
            shown = first if first == last else f"{first} then {last}"
            raise identity(f"archive commit differs: pax global comment of {archive} is {shown}, "
                           f"--expected-sha is {expected_sha}")
    except BaseException:
        handle.close()
        raise
    return VerifiedArchive(path=archive, handle=handle, sha256=actual, size=size)
