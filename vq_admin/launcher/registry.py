"""The registry of verified launchers on the driver (standard library only).

Written only from a verified runtime deployment (``conclude()`` of the runtime
lane, after every verify check passed); read for every job the queue driver
submits or dispatches, through :mod:`vq_admin.bindings`.  Layout under the
state directory::

    registry/<host>/<program>/<full sha>.json    one immutable entry per SHA
    registry/<host>/<program>/latest.json        {"sha": ...}: the latest verified SHA
    registry/<host>/<program>/conflicts/<full sha>.json
                                                  a later verification of the same SHA
                                                  that attested a different launcher or bytes
    registry/<host>/<program>/pruned/<full sha>.json
                                                  ``vq admin prune`` removed the generation;
                                                  lookups refuse it (PrunedError) until it is
                                                  deployed and verified again
    registry/<host>/<program>/quarantined/<full sha>.json
                                                  ``vq admin quarantine``: launcher, update and
                                                  rollback refuse the SHA; ``--lift`` renames it
                                                  to ``<full sha>.lifted-<ns>.json`` (kept)

An entry is created with ``link(2)`` from a fully written temp file, so it is
never half-written and never replaced: a second verification of the same SHA
leaves the first entry as it is.  Only ``latest.json`` is ever replaced
(temp file + ``rename(2)``).  A lookup by (host, program, sha) is one
``open()`` plus one ``stat()`` each in the (normally absent) ``pruned`` and
``conflicts`` directories, whatever the number of entries; no directory is ever listed on
the lookup path.

Reading fails closed (CONTRACT section 10): every level from the state
directory down to the entry is opened relative to the one above with
``O_NOFOLLOW`` and checked with ``fstat`` (owned by you or root, not writable
by group or others), the entry is opened ``O_NONBLOCK`` and must be a regular
file of at most :data:`MAX_ENTRY_BYTES` (a FIFO never blocks), and anything
else raises :class:`RegistryError` naming the path, its owner and mode.
Directories are created 0700 and files 0600 whatever the umask.  The entry's
shape (:func:`entry_problem`) and the schemas are defined in
:mod:`vq_admin.launcher.plain_lookup`, the per-job plain case, and re-exported here.

This module must stay tiny and import nothing beyond the standard library
and small stdlib-only modules of this package (:mod:`vq_admin.launcher.immutable`,
:mod:`vq_admin.state.tree`, :mod:`vq_admin.core.bounds`): the queue driver imports
it per job.
"""

from __future__ import annotations

import os

from ..core import atomic
from ..core.identifiers import NAME_RE, NAME_RULE, SHA256_RE, SHA_RE  # noqa: F401  (SHA256_RE: re-exported, the registry's rule)
from ..core.bounds import InputError, loads_json
from ..core.plainrecord import PlainRecord
from .plain_lookup import MAX_ENTRY_BYTES, POINTER_SCHEMA, SCHEMA, absent, entry_problem
from ..state.tree import PrivateTree, UnsafeState, read_private_file
from ..state.tree import dump_json as encode
TYPE_CHECKING = False  # not typing's: the launcher path (vq admin launcher, per job) never imports typing
if TYPE_CHECKING:
    from typing import Callable, TypeVar

    from ..core.bounds import JsonObject
    from ..state.records import Verified

    _Mark = TypeVar("_Mark", "PrunedMark", "QuarantineMark")

class RegistryError(ValueError):
    """An identity that cannot be registered, or an entry that cannot be trusted."""


class PrunedError(RegistryError):
    """The generation was removed by ``vq admin prune``; its launcher no longer exists."""

    def __init__(self, message: str, sha: str) -> None:
        super().__init__(message)
        self.sha = sha


PRUNED_SCHEMA = "vq-admin/pruned/1"


class Entry(PlainRecord):
    """One registry entry (schema ``vq-admin/launcher/1``): the launcher a verified deployment attested,
    checked (:func:`~vq_admin.launcher.plain_lookup.entry_problem`) when built by :meth:`checked`."""

    FIELDS = ("host", "program", "sha", "tag", "launcher", "launcher_sha256", "receipt", "verified_at")
    __slots__ = FIELDS
    host: str
    program: str
    sha: str
    tag: str | None
    launcher: str
    launcher_sha256: str
    receipt: str
    verified_at: str

    @classmethod
    def checked(cls, value: object, host: str, program: str, sha: str | None, shown: str) -> Entry:
        """*value* (a parsed JSON object) as the entry of (host, program[, sha]), or :class:`RegistryError`
        naming *shown* and what is wrong."""
        problem = entry_problem(value, host, program, sha)
        if problem is not None:
            raise RegistryError(f"{shown}: {problem}")
        assert isinstance(value, dict)
        return cls.of(value)

    @classmethod
    def of(cls, value: dict[str, str | None]) -> Entry:
        """*value*, an entry :func:`~vq_admin.launcher.plain_lookup.entry_problem` already passed, as an entry."""
        return cls(**{name: value.get(name) for name in cls.FIELDS})

    def to_value(self) -> JsonObject:
        """The entry as written (with its ``schema``)."""
        return {"schema": SCHEMA, **self.to_dict()}


def lane_dir(state_root: str | os.PathLike[str], host: str, program: str) -> str:
    """``<state>/registry/<host>/<program>``; *host* and *program* must be valid names."""
    if not NAME_RE.match(host) or not NAME_RE.match(program):
        raise RegistryError(f"host {host!r} and program {program!r} must match {NAME_RULE}")
    return os.path.join(os.fspath(state_root), "registry", host, program)


def entry_path(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> str:
    if not SHA_RE.match(sha):
        raise RegistryError(f"{sha!r} is not a full lower-case SHA")
    return os.path.join(lane_dir(state_root, host, program), sha + ".json")


def beside(entry: str, kind: str) -> str:
    """``<lane>/<kind>/<sha>.json`` for the entry at *entry*: ``pruned`` (the mark of a pruned generation)
    or ``conflicts`` (a later, conflicting attestation), each in its own normally absent directory, so
    checking it costs one negative lookup however many entries there are."""
    directory, name = os.path.split(entry)
    return os.path.join(directory, kind, name)


def mark_pruned(state_root: str | os.PathLike[str], host: str, program: str, sha: str, receipt: str, at: str) -> str:
    """Record that *sha* was removed by a prune (receipt *receipt*); its lookups then refuse."""
    path = beside(entry_path(state_root, host, program, sha), "pruned")
    mark = {"schema": PRUNED_SCHEMA, "host": host, "program": program, "sha": sha, "receipt": receipt,
            "pruned_at": at}
    _write(state_root, path, encode(mark), exclusive=True)  # a second prune of the same SHA keeps the first mark
    return path


class PrunedMark(PlainRecord):
    """``pruned/<sha>.json``: the prune that removed a generation (``?`` for what the mark cannot say)."""

    FIELDS = ("receipt", "pruned_at")
    __slots__ = FIELDS
    receipt: str
    pruned_at: str


class QuarantineMark(PlainRecord):
    """``quarantined/<sha>.json``: why, when and by whom (``?`` for what the mark cannot say)."""

    FIELDS = ("reason", "at", "by")
    __slots__ = FIELDS
    reason: str
    at: str
    by: str


def pruned(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> PrunedMark | None:
    """The prune mark of *sha*, or ``None`` (every level checked, as for entries)."""
    return _mark(state_root, host, program, sha, PrunedMark, "pruned")


QUARANTINE_SCHEMA = "vq-admin/quarantined/1"


def quarantined(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> QuarantineMark | None:
    """The quarantine mark of *sha*, or ``None``; an unreadable mark still quarantines (its reason ``?``)."""
    return _mark(state_root, host, program, sha, QuarantineMark, "quarantined")


def _mark(state_root: str | os.PathLike[str], host: str, program: str, sha: str, kind: type[_Mark],
          directory: str) -> _Mark | None:
    path = entry_path(state_root, host, program, sha)
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return None
    try:
        return None if absent(dfd, directory, sha) else _mark_at(dfd, kind, directory, sha, path)
    finally:
        os.close(dfd)


def _mark_at(dfd: int, kind: type[_Mark], directory: str, sha: str, entry: str) -> _Mark:
    """The mark of *sha* in *directory* of the lane *dfd* (checked read); an unreadable mark still counts,
    naming nothing it cannot prove."""
    found: JsonObject = {}
    try:
        sub = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            found = _read_at(sub, sha + ".json", beside(entry, directory)) or {}
        finally:
            os.close(sub)
    except (OSError, RegistryError):
        pass
    return kind(**{name: str(found.get(name, "?")) for name in kind.FIELDS})


def mark_quarantined(state_root: str | os.PathLike[str], host: str, program: str, sha: str, reason: str, at: str,
                     by: str) -> str:
    """Quarantine *sha* here (the mark replaces an earlier one of the same SHA); its path."""
    path = beside(entry_path(state_root, host, program, sha), "quarantined")
    mark = {"schema": QUARANTINE_SCHEMA, "host": host, "program": program, "sha": sha, "reason": reason, "at": at,
            "by": by}
    _write(state_root, path, encode(mark), exclusive=False)
    return path


def lift_quarantine(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> str | None:
    """End the quarantine of *sha* here: its mark is renamed ``<sha>.lifted-<ns>.json`` (kept); that path, or
    ``None`` when it was not quarantined."""
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return None
    try:
        sub = os.open("quarantined", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    finally:
        os.close(dfd)
    try:
        import time

        kept = f"{sha}.lifted-{time.time_ns()}.json"
        os.rename(sha + ".json", kept, src_dir_fd=sub, dst_dir_fd=sub)
        os.fsync(sub)
    except FileNotFoundError:
        return None
    finally:
        os.close(sub)
    return os.path.join(lane_dir(state_root, host, program), "quarantined", kept)


def _clear_pruned_mark(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> None:
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return
    try:
        sub = os.open("pruned", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise RegistryError(f"cannot open {lane_dir(state_root, host, program)}/pruned: {exc.strerror}") from None
    finally:
        os.close(dfd)
    try:
        os.unlink(sha + ".json", dir_fd=sub)
    except FileNotFoundError:
        pass
    finally:
        os.close(sub)


def make_entry(host: str, program: str, verified: Verified) -> Entry:
    """The registry entry for a verified identity (with its ``receipt`` and ``at``, as ``conclude()`` has it)."""
    return Entry.checked({**verified.to_value(), "schema": SCHEMA, "host": host, "program": program,
                          "sha": verified.sha.lower(), "verified_at": verified.at},
                         host, program, None, "not registered")


def _lane_fd(state_root: str | os.PathLike[str], host: str, program: str, *, create: bool) -> int | None:
    """An fd of ``registry/<host>/<program>`` with every level checked; ``None`` when missing."""
    lane_dir(state_root, host, program)  # validates the names
    try:
        return PrivateTree(state_root).open_dir(["registry", host, program], create=create)
    except UnsafeState as exc:
        raise RegistryError(str(exc)) from None


def _split(state_root: str | os.PathLike[str], path: str) -> tuple[list[str], str]:
    """``path`` (below *state_root*) as (directory parts, file name)."""
    rel = os.path.relpath(path, os.path.abspath(os.fspath(state_root)))
    if rel.startswith(".."):
        raise RegistryError(f"{path} is not below the state directory {state_root}")
    parts = rel.split(os.sep)  # never empty
    return parts[:-1], parts[-1]


def _write(state_root: str | os.PathLike[str], path: str, data: bytes, *, exclusive: bool) -> bool:
    """Temp file (0600, ``O_EXCL|O_NOFOLLOW``) + fsync, then ``link`` (exclusive: False if
    *path* exists) or ``rename``; every directory level checked and created 0700."""
    parts, name = _split(state_root, path)
    try:
        dfd = PrivateTree(state_root).open_dir(parts, create=True)
    except UnsafeState as exc:
        raise RegistryError(str(exc)) from None
    assert dfd is not None
    try:
        atomic.write(name, data, dir_fd=dfd, exclusive=exclusive)
    except FileExistsError:
        return False
    finally:
        os.close(dfd)
    return True


def record_verified(state_root: str | os.PathLike[str], host: str, program: str,
                    verified: Verified) -> JsonObject:
    """Register the launcher a verified runtime deployment attested.

    Returns what happened, for the receipt: ``{"entry": path, "created": bool,
    "conflict": None | path}``.  An existing entry for the SHA is never
    rewritten; when the new attestation differs from it (another launcher or
    other bytes), the new one is kept apart in ``conflicts/<sha>.json`` and
    lookups of that SHA refuse until an operator resolves it.  Raises
    :class:`RegistryError` for an identity that is not an immutable launcher.
    """
    result, apply = plan_verified(state_root, host, program, verified)
    apply()
    return result


def plan_verified(state_root: str | os.PathLike[str], host: str, program: str,
                  verified: Verified) -> tuple[JsonObject, Callable[[], None]]:
    """What :func:`record_verified` will do, decided before anything is written.

    Returns ``(result, apply)``: *result* is the receipt's ``registry``
    object; ``apply()`` writes the entry (or the conflict) and ``latest.json``.
    The caller stores the receipt first, so no record ever names a receipt
    that does not exist (the lane lock keeps the decision valid until then).
    """
    entry = make_entry(host, program, verified)
    path = entry_path(state_root, host, program, entry.sha)
    first = _read_in_lane(state_root, host, program, os.path.basename(path))
    created = first is None
    conflict = None
    if first is not None and (first.get("launcher"), first.get("launcher_sha256")) != (entry.launcher,
                                                                                        entry.launcher_sha256):
        conflict = beside(path, "conflicts")
    pointer = {"schema": POINTER_SCHEMA, "sha": entry.sha, "receipt": entry.receipt, "verified_at": entry.verified_at}

    def apply() -> None:
        if created:
            _write(state_root, path, encode(entry.to_value()), exclusive=True)
        elif conflict is not None:
            _write(state_root, conflict, encode(entry.to_value()), exclusive=True)  # the first conflict is kept, too
        if conflict is None:  # deployed and verified again after a prune: valid again
            _clear_pruned_mark(state_root, host, program, entry.sha)
        _write(state_root, os.path.join(os.path.dirname(path), "latest.json"), encode(pointer), exclusive=False)

    return {"entry": path, "created": created, "conflict": conflict}, apply


def _read_at(dfd: int, name: str, shown: str) -> JsonObject | None:
    """The JSON object in *name* below *dfd* (checked read, *shown* in messages); ``None`` when absent."""
    try:
        data = read_private_file(dfd, name, shown, limit=MAX_ENTRY_BYTES)
        value = None if data is None else loads_json(data, shown, limit=MAX_ENTRY_BYTES)
    except UnsafeState as exc:
        raise RegistryError(str(exc)) from None
    except InputError as exc:
        raise RegistryError(f"{exc}; it is not one JSON object") from None
    if data is None:
        return None
    if not isinstance(value, dict):
        raise RegistryError(f"{shown} is not one JSON object")
    return value


def _read_in_lane(state_root: str | os.PathLike[str], host: str, program: str, name: str) -> JsonObject | None:
    """``registry/<host>/<program>/<name>``, every level checked; ``None`` when absent."""
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return None
    try:
        return _read_at(dfd, name, os.path.join(lane_dir(state_root, host, program), name))
    finally:
        os.close(dfd)


def has_lane(state_root: str | os.PathLike[str], host: str, program: str) -> bool:
    """True when any verification of *program* on *host* was ever registered."""
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return False
    try:
        os.stat("latest.json", dir_fd=dfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)


def resolve(state_root: str | os.PathLike[str], host: str, program: str, sha: str | None
            ) -> tuple[str | None, Entry | None]:
    """``(latest SHA, checked entry for *sha* or for the latest when *sha* is None)`` in one
    walk of the directories (the per-job path).  Raises :class:`RegistryError` as
    :func:`lookup` does, and for a ``latest.json`` that names no full SHA."""
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return None, None
    try:
        latest = _latest_at(dfd, state_root, host, program)
        wanted = sha or latest
        return latest, (_lookup_at(dfd, state_root, host, program, wanted) if wanted else None)
    finally:
        os.close(dfd)


def _latest_at(dfd: int, state_root: str | os.PathLike[str], host: str, program: str) -> str | None:
    pointer = _read_at(dfd, "latest.json", os.path.join(lane_dir(state_root, host, program), "latest.json"))
    if pointer is None:
        return None
    sha = pointer.get("sha")
    if pointer.get("schema") != POINTER_SCHEMA or not isinstance(sha, str) or not SHA_RE.match(sha):
        raise RegistryError(f"{lane_dir(state_root, host, program)}/latest.json names no full SHA")
    return sha


def _lookup_at(dfd: int, state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> Entry | None:
    path = entry_path(state_root, host, program, sha)
    found = _read_at(dfd, sha + ".json", path)
    if found is None:
        return None
    entry = Entry.checked(found, host, program, sha, path)
    if not absent(dfd, "pruned", sha):
        mark = _mark_at(dfd, PrunedMark, "pruned", sha, path)
        raise PrunedError(f"{sha} was pruned at {mark.pruned_at} by receipt {mark.receipt}: its "
                          f"release and launcher {entry.launcher} were removed", sha)
    if not absent(dfd, "conflicts", sha):
        raise RegistryError(
            f"{beside(path, 'conflicts')}: a later verification of {sha} attested a different launcher or different "
            f"bytes than {path}; the launcher is not immutable")
    return entry


def lookup(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> Entry | None:
    """The checked entry for (host, program, sha), or ``None`` when none was registered.

    Raises :class:`RegistryError` when the entry or a directory above it cannot
    be trusted, is malformed, or a conflicting later attestation exists for the SHA.
    """
    entry_path(state_root, host, program, sha)  # validates the SHA
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return None
    try:
        return _lookup_at(dfd, state_root, host, program, sha)
    finally:
        os.close(dfd)


def entries(state_root: str | os.PathLike[str], host: str, program: str) -> list[Entry]:
    """Every well-formed entry of (host, program), oldest verification first.

    Lists a directory: for the references census and status, never for the
    per-job lookup.
    """
    directory = lane_dir(state_root, host, program)
    dfd = _lane_fd(state_root, host, program, create=False)
    if dfd is None:
        return []
    found = []
    try:
        for name in os.listdir(dfd):
            sha = name[: -len(".json")]
            if name.endswith(".json") and SHA_RE.match(sha):
                try:
                    entry = _read_at(dfd, name, os.path.join(directory, name))
                    if entry is not None:
                        found.append(Entry.checked(entry, host, program, sha, name))
                except RegistryError:
                    continue
    finally:
        os.close(dfd)
    return sorted(found, key=lambda e: (e.verified_at, e.sha))
