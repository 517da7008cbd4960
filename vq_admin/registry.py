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

An entry is created with ``link(2)`` from a fully written temp file, so it is
never half-written and never replaced: a second verification of the same SHA
leaves the first entry as it is.  Only ``latest.json`` is ever replaced
(temp file + ``rename(2)``).  A lookup by (host, program, sha) is one
``open()`` plus one ``stat()`` in the (normally absent) ``conflicts``
directory, whatever the number of entries; no directory is ever listed on
the lookup path.

This module must stay tiny and import nothing beyond the standard library
and :mod:`vq_admin.launchers`: the queue driver imports it per job.
"""

from __future__ import annotations

import json
import os
import re

from .launchers import launcher_problem

SCHEMA = "vq-admin/launcher/1"
POINTER_SCHEMA = "vq-admin/launcher-latest/1"
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
SHA_RE = re.compile(r"\A(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")
SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
#: Largest entry file read back, in bytes (an entry is a few hundred bytes).
MAX_ENTRY_BYTES = 64 * 1024


class RegistryError(ValueError):
    """An identity that cannot be registered, or an entry that cannot be trusted."""


def lane_dir(state_root: str | os.PathLike[str], host: str, program: str) -> str:
    """``<state>/registry/<host>/<program>``; *host* and *program* must be valid names."""
    if not NAME_RE.match(host) or not NAME_RE.match(program):
        raise RegistryError(f"host {host!r} and program {program!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return os.path.join(os.fspath(state_root), "registry", host, program)


def entry_path(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> str:
    if not SHA_RE.match(sha):
        raise RegistryError(f"{sha!r} is not a full lower-case SHA")
    return os.path.join(lane_dir(state_root, host, program), sha + ".json")


def conflict_path(entry: str) -> str:
    """Where a conflicting re-attestation of the entry at *entry* is kept.

    In its own, normally absent, directory: checking it then costs one
    negative lookup of ``conflicts`` however many entries there are."""
    directory, name = os.path.split(entry)
    return os.path.join(directory, "conflicts", name)


def entry_problem(entry: object, host: str, program: str, sha: str | None = None) -> str | None:
    """``None`` when *entry* is a well-formed entry for (host, program[, sha]), else why not."""
    if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
        return f"not a {SCHEMA} entry"
    if entry.get("host") != host or entry.get("program") != program:
        return f"entry names {entry.get('program')!r} on {entry.get('host')!r}"
    entry_sha = entry.get("sha")
    if not isinstance(entry_sha, str) or not SHA_RE.match(entry_sha) or (sha is not None and entry_sha != sha):
        return f"entry sha {entry_sha!r} is not {sha or 'a full SHA'}"
    launcher = entry.get("launcher")
    problem = launcher_problem(launcher, entry_sha)
    if problem is not None:
        return problem
    if CONTROL_RE.search(launcher):
        return "launcher path holds a control character"
    if not isinstance(entry.get("launcher_sha256"), str) or not SHA256_RE.match(entry["launcher_sha256"]):
        return "launcher_sha256 is not 64 lower-case hex digits"
    for key in ("receipt", "verified_at"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"{key} is missing"
    return None


def make_entry(host: str, program: str, verified: dict) -> dict:
    """The registry entry for a verified identity (``sha``, ``tag``, ``launcher``,
    ``launcher_sha256``, ``receipt``, ``at`` as ``conclude()`` builds it)."""
    sha = str(verified.get("sha") or "").lower()
    entry = {
        "schema": SCHEMA,
        "host": host,
        "program": program,
        "sha": sha,
        "tag": verified.get("tag"),
        "launcher": verified.get("launcher"),
        "launcher_sha256": verified.get("launcher_sha256"),
        "receipt": verified.get("receipt"),
        "verified_at": verified.get("at"),
    }
    problem = entry_problem(entry, host, program, sha)
    if problem is not None:
        raise RegistryError(f"not registered: {problem}")
    return entry


def encode(entry: dict) -> bytes:
    return (json.dumps(entry, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def _write(path: str, data: bytes, *, exclusive: bool) -> bool:
    """Temp file + fsync, then ``link`` (exclusive: False if *path* exists) or ``rename``."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = os.path.join(directory, f".tmp.{os.path.basename(path)}.{os.getpid()}.{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
            tmp = ""
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True


def record_verified(state_root: str | os.PathLike[str], host: str, program: str, verified: dict) -> dict:
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


def plan_verified(state_root: str | os.PathLike[str], host: str, program: str, verified: dict):
    """What :func:`record_verified` will do, decided before anything is written.

    Returns ``(result, apply)``: *result* is the receipt's ``registry``
    object; ``apply()`` writes the entry (or the conflict) and ``latest.json``.
    The caller stores the receipt first, so no record ever names a receipt
    that does not exist (the lane lock keeps the decision valid until then).
    """
    entry = make_entry(host, program, verified)
    path = entry_path(state_root, host, program, entry["sha"])
    first = read_entry(path)
    created = first is None
    conflict = None
    if not created:
        same = all(first.get(k) == entry[k] for k in ("launcher", "launcher_sha256"))
        if not same:
            conflict = conflict_path(path)
    pointer = {"schema": POINTER_SCHEMA, "sha": entry["sha"], "receipt": entry["receipt"], "verified_at": entry["verified_at"]}

    def apply() -> None:
        if created:
            _write(path, encode(entry), exclusive=True)
        elif conflict is not None:
            _write(conflict, encode(entry), exclusive=True)  # the first conflict is kept, too
        _write(os.path.join(os.path.dirname(path), "latest.json"), encode(pointer), exclusive=False)

    return {"entry": path, "created": created, "conflict": conflict}, apply


def read_entry(path: str) -> dict | None:
    """The JSON object at *path*; ``None`` when it does not exist.  Raises
    :class:`RegistryError` when it exists but cannot be read as one object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RegistryError(f"cannot open {path}: {exc.strerror}") from None
    try:
        data = os.read(fd, MAX_ENTRY_BYTES + 1)
    finally:
        os.close(fd)
    try:
        value = json.loads(data.decode("ascii")) if len(data) <= MAX_ENTRY_BYTES else None
    except (UnicodeDecodeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise RegistryError(f"{path} is not one JSON object")
    return value


def has_lane(state_root: str | os.PathLike[str], host: str, program: str) -> bool:
    """True when any verification of *program* on *host* was ever registered."""
    return os.path.exists(os.path.join(lane_dir(state_root, host, program), "latest.json"))


def latest_sha(state_root: str | os.PathLike[str], host: str, program: str) -> str | None:
    """The SHA of the latest verified deployment, or ``None`` when there is none."""
    pointer = read_entry(os.path.join(lane_dir(state_root, host, program), "latest.json"))
    if pointer is None:
        return None
    sha = pointer.get("sha")
    if pointer.get("schema") != POINTER_SCHEMA or not isinstance(sha, str) or not SHA_RE.match(sha):
        raise RegistryError(f"{lane_dir(state_root, host, program)}/latest.json names no full SHA")
    return sha


def lookup(state_root: str | os.PathLike[str], host: str, program: str, sha: str) -> dict | None:
    """The checked entry for (host, program, sha), or ``None`` when none was registered.

    Raises :class:`RegistryError` when the entry is malformed or a conflicting
    later attestation exists for the SHA.
    """
    path = entry_path(state_root, host, program, sha)
    entry = read_entry(path)
    if entry is None:
        return None
    problem = entry_problem(entry, host, program, sha)
    if problem is not None:
        raise RegistryError(f"{path}: {problem}")
    conflict = conflict_path(path)
    if os.path.lexists(conflict):
        raise RegistryError(
            f"{conflict}: a later verification of {sha} attested a different launcher or different bytes "
            f"than {path}; the launcher is not immutable")
    return entry


def entries(state_root: str | os.PathLike[str], host: str, program: str) -> list[dict]:
    """Every well-formed entry of (host, program), oldest verification first.

    Lists a directory: for the references census and status, never for the
    per-job lookup.
    """
    directory = lane_dir(state_root, host, program)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        sha = name[: -len(".json")]
        if name.endswith(".json") and SHA_RE.match(sha):
            try:
                entry = read_entry(os.path.join(directory, name))
            except RegistryError:
                continue
            if entry is not None and entry_problem(entry, host, program, sha) is None:
                found.append(entry)
    return sorted(found, key=lambda e: (e["verified_at"], e["sha"]))
