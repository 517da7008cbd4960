"""``vq-admin-agent identity``: what the running helper *is*, proven from its files.

The fields, the tree digest and the install record's states (``bound``,
``stale``, ``missing``) are defined in docs/helper-lane.md, "The helper's
identity".  The scopes: ``release`` (an install record beside the package: the
whole tree root is digested, the record left out), ``package`` (no record: only
the ``vq_admin`` package directory), ``zipapp`` (``vq-admin-agent.pyz``, built
by :mod:`.pyz`: the SHA-256 of the archive file, and no record).

Standard library only.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import TYPE_CHECKING, NamedTuple

from ..core.bounds import InputError, loads_json
from ..core.identifiers import SHA256_RE, SHA_RE
from ..core.filehash import file_sha256
from ..core.treeid import directory_tree_sha256

if TYPE_CHECKING:
    from ..core.protocol import Identity

RECORD_NAME = ".vq-admin-source.json"
RECORD_LIMIT = 64 * 1024


def package_dir() -> str:
    """The directory of the ``vq_admin`` package this process imported."""
    import vq_admin

    return os.path.dirname(os.path.abspath(vq_admin.__file__))


def zip_archive(pkg: str) -> str | None:
    """The zipapp file *pkg* lives in (``vq-admin-agent.pyz``), or None for a directory."""
    if os.path.isdir(pkg):
        return None
    head = pkg  # absolute: the loop ends at /
    while head != os.path.dirname(head):
        head = os.path.dirname(head)
        if os.path.isfile(head):
            return os.path.realpath(head)
    return None


class InstallRecord(NamedTuple):
    """What the install record binds: the source commit and the tree digest of the files it was written for."""

    sha: str
    tree_sha256: str


def read_record(root: str) -> tuple[InstallRecord | None, str | None]:
    """``(record, problem)``: the install record below *root*, never followed
    through a symlink; ``(None, None)`` when there is none."""
    path = os.path.join(root, RECORD_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: {exc.strerror}"
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None, f"{path} is not a regular file"
        data = fh.read(RECORD_LIMIT + 1)
    try:
        value = loads_json(data, path, limit=RECORD_LIMIT)
    except InputError as exc:
        return None, str(exc)
    if not isinstance(value, dict):
        return None, f"{path} is not a JSON object"
    sha, tree = value.get("sha"), value.get("tree_sha256")
    if not isinstance(sha, str) or not SHA_RE.match(sha):
        return None, f"{path}: 'sha' is not a full lower-case commit SHA"
    if not isinstance(tree, str) or not SHA256_RE.match(tree):
        return None, f"{path}: 'tree_sha256' is not 64 lower-case hex digits"
    return InstallRecord(sha, tree), None


def identity() -> Identity:
    """The helper identity (hookspecs ``HelperIdentity`` fields plus evidence)."""
    from .. import __version__

    pkg = package_dir()
    root = os.path.realpath(os.path.dirname(pkg))
    archive = zip_archive(pkg)
    problems: list[str] = []
    record, state = None, "missing"
    if archive is not None:  # a single-file zipapp: its bytes are its identity
        scope, path = "zipapp", archive
        digest = file_sha256(archive)
    elif os.path.lexists(os.path.join(root, RECORD_NAME)):
        scope, path = "release", root
        digest = directory_tree_sha256(root, skip=frozenset({RECORD_NAME}))
        record, problem = read_record(root)
        state = "stale"
        if record is not None:
            if record.tree_sha256 == digest:
                state = "bound"
            else:
                problems.append(f"the files changed since the record was written: record tree "
                                f"{record.tree_sha256}, files now {digest}")
        elif problem:  # read_record gives a problem only without a record
            problems.append(problem)
    else:
        scope, path = "package", os.path.realpath(pkg)
        digest = directory_tree_sha256(path)
    return {
        "version": __version__,
        "source_sha": record.sha if record else None,
        "tree_sha256": digest,
        "record": state,
        "record_tree_sha256": record.tree_sha256 if record else None,
        "scope": scope,
        "path": path,
        "package": pkg,
        "interpreter": sys.executable,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "problems": problems,
    }


def human(ident: Identity) -> str:
    """The identity as ``key: value`` lines (without ``--json``)."""
    keys = ("version", "source_sha", "tree_sha256", "record", "scope", "path", "interpreter")
    lines = [f"{k}: {ident.get(k)}" for k in keys]
    lines += [f"problem: {p}" for p in ident["problems"]]
    return "\n".join(lines)
