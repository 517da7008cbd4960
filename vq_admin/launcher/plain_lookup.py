"""The per-job launcher lookup's plain case, at the cost of a few system calls.

``vq admin launcher PROGRAM HOST [--expected-sha SHA]`` runs for every job the
queue driver submits, so its interpreter start is the figure that matters
(within 1.5 times a bare ``python -c pass``).  This module answers
the plain, successful case with nothing beyond what a bare interpreter has
already imported (``os``, ``posixpath``, ``stat``) plus the secure-path rule
(:mod:`vq_admin.core.securepath`) and the launcher rule
(:mod:`vq_admin.launcher.immutable`): no ``re``, no ``json``, no ``enum``.

It decides only one thing: that the full lookup (:func:`vq_admin.bindings.resolve_launcher`,
through :mod:`vq_admin.launcher.registry` and :mod:`vq_admin.state.tree`) would return this
entry.  It returns ``None`` for everything else (a refusal, a symlink the
operator named, an entry it does not parse, an error of any kind), and the
caller then runs the full lookup, which words the refusal, its code and its
remedy.  So it can make an answer slower, never different.

What it checks, every time (CONTRACT section 10, the same rule as the full
lookup, applied through file descriptors):

* every level from ``/`` down to ``registry/<host>/<program>`` is opened
  relative to the one above without following a symlink and passes
  :func:`~vq_admin.core.securepath.level_problem` on its ``fstat``;
* ``latest.json`` and ``<sha>.json`` are opened ``O_NOFOLLOW | O_NONBLOCK``
  (a FIFO never blocks), must be regular files passing the same rule, and are
  read with the registry's size bound;
* each is the flat JSON object the registry writes (:func:`flat_object`), the
  pointer names a full SHA, the entry passes :func:`entry_problem`;
* ``pruned/<sha>.json``, ``conflicts/<sha>.json`` and ``quarantined/<sha>.json`` are absent;
* where the launcher's path is visible here, it is there with its attested bytes
  (:mod:`vq_admin.launcher.present`: one ``stat`` against the cached one).

Standard library only; the entry point :mod:`vq_admin.entry` imports it before
anything else of vq-admin.
"""

from __future__ import annotations

import os

from ..core import default_paths as paths
from ..core.securepath import open_trusted_dir, read_trusted_file
from ..core.escape import has_control
from ..core.names import is_full_sha, is_name, is_sha256
from .immutable import launcher_problem
from .present import launcher_problem_here

SCHEMA = "vq-admin/launcher/1"
POINTER_SCHEMA = "vq-admin/launcher-latest/1"
#: Largest entry file read back, in bytes (an entry is a few hundred bytes).
MAX_ENTRY_BYTES = 64 * 1024

_JSON_SPACE = " \t\n\r"


def entry_problem(entry: object, host: str, program: str, sha: str | None = None) -> str | None:
    """``None`` when *entry* is a well-formed entry for (host, program[, sha]), else why not."""
    if not isinstance(entry, dict) or entry.get("schema") != SCHEMA:
        return f"not a {SCHEMA} entry"
    if entry.get("host") != host or entry.get("program") != program:
        return f"entry names {entry.get('program')!r} on {entry.get('host')!r}"
    entry_sha = entry.get("sha")
    if not isinstance(entry_sha, str) or not is_full_sha(entry_sha) or (sha is not None and entry_sha != sha):
        return f"entry sha {entry_sha!r} is not {sha or 'a full SHA'}"
    launcher = entry.get("launcher")
    problem = launcher_problem(launcher, entry_sha)
    if problem is not None:
        return problem
    assert isinstance(launcher, str)  # launcher_problem refuses anything else
    if has_control(launcher):
        return "launcher path holds a control character"
    if not is_sha256(entry.get("launcher_sha256")):
        return "launcher_sha256 is not 64 lower-case hex digits"
    for key in ("receipt", "verified_at"):
        value = entry.get(key)
        if not isinstance(value, str) or not value:
            return f"{key} is missing"
    return None


def flat_object(data: bytes) -> dict[str, str | None] | None:
    """The flat JSON object the registry writes, or ``None`` when *data* is anything else.

    Accepted: one object whose values are strings or ``null``, in printable
    ASCII without escapes, any JSON whitespace, no repeated key.  That is
    every entry and pointer :func:`vq_admin.launcher.registry.encode` writes for a
    well-formed identity.  Whatever it returns equals ``json.loads(data)``
    (tests/test_fast_paths.py checks this with hypothesis); ``None`` sends the
    caller to the full parser, which accepts or refuses as before.
    """
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return None
    n = len(text)
    i = _skip_space(text, 0)
    if i >= n or text[i] != "{":
        return None
    found: dict[str, str | None] = {}
    i = _skip_space(text, i + 1)
    if i < n and text[i] == "}":
        return found if _skip_space(text, i + 1) == n else None
    while True:
        key, i = _string(text, i)
        if key is None or key in found:
            return None
        i = _skip_space(text, i)
        if i >= n or text[i] != ":":
            return None
        i = _skip_space(text, i + 1)
        if text.startswith("null", i):
            value: str | None = None
            i += 4
        else:
            value, i = _string(text, i)
            if value is None:
                return None
        found[key] = value
        i = _skip_space(text, i)
        if i >= n:
            return None
        if text[i] == "}":
            return found if _skip_space(text, i + 1) == n else None
        if text[i] != ",":
            return None
        i = _skip_space(text, i + 1)


def _skip_space(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in _JSON_SPACE:
        i += 1
    return i


def _string(text: str, i: int) -> tuple[str | None, int]:
    """The string literal at *i* (no escapes, printable ASCII) and the index after it."""
    if i >= len(text) or text[i] != '"':
        return None, i
    end = text.find('"', i + 1)
    if end < 0:
        return None, i
    value = text[i + 1:end]
    if "\\" in value or not value.isprintable():
        return None, i
    return value, end + 1


def state_root(state_dir: str | os.PathLike[str] | None) -> str:
    """The state directory: *state_dir*, else ``$VQ_ADMIN_STATE_DIR``, else
    ``$XDG_STATE_HOME/vq-admin`` (``~/.local/state/vq-admin``)."""
    return os.fspath(state_dir) if state_dir else paths.state_dir()


def plain_resolve(root: str, host: str, program: str, sha: str | None
                  ) -> tuple[str, dict[str, str | None]] | None:
    """``(latest SHA, entry)`` when the full lookup of *sha* (or of the latest, when
    ``None``) would return this entry for *host* itself; ``None`` for anything else."""
    if not is_name(host) or not is_name(program):
        return None
    if sha is not None:
        sha = sha.lower() if sha.isascii() else ""  # the full lookup takes ASCII hex digits of either case, only
        if not is_full_sha(sha):
            return None
    lane = os.path.join(os.path.normpath(os.path.abspath(root)), "registry", host, program)
    dfd = open_trusted_dir(lane)
    if dfd is None:
        return None
    try:
        latest = _latest(dfd)
        if latest is None:
            return None
        entry = _plain_entry(root, dfd, host, program, sha or latest)
        return None if entry is None else (latest, entry)
    except (OSError, ValueError):
        return None
    finally:
        os.close(dfd)


def _latest(dfd: int) -> str | None:
    """The latest verified SHA the lane's ``latest.json`` names, or ``None``."""
    pointer = _read(dfd, "latest.json")
    latest = pointer.get("sha") if pointer is not None and pointer.get("schema") == POINTER_SCHEMA else None
    return latest if is_full_sha(latest) else None


def _plain_entry(root: str, dfd: int, host: str, program: str, wanted: str) -> dict[str, str | None] | None:
    """The registry entry of *wanted* when the full lookup would return it as it is: sound, not pruned,
    in conflict or quarantined, confirmed when the profile asks, its launcher unchanged here; else ``None``
    (the full lookup words why)."""
    entry = _read(dfd, wanted + ".json")
    if entry is None or entry_problem(entry, host, program, wanted) is not None:
        return None
    if not (absent(dfd, "pruned", wanted) and absent(dfd, "conflicts", wanted)
            and absent(dfd, "quarantined", wanted)):
        return None
    if unconfirmed_reason(root, host, program, wanted) is not None:
        return None  # the full lookup words the refusal (CONTRACT section 13)
    if launcher_problem_here(dfd, wanted, str(entry["launcher"]), str(entry["launcher_sha256"])):
        return None
    return entry


def plain_launcher(program: str, host: str, expected_sha: str | None, state_dir: str | None,
                   job: str | None = None) -> str | None:
    """The launcher ``vq admin launcher PROGRAM HOST [--expected-sha SHA] [--job REF]`` prints, its use
    recorded, when the plain case holds; ``None`` sends the caller to the full command."""
    root = state_root(state_dir)
    found = plain_resolve(root, host, program, expected_sha)
    if found is None:
        return None
    launcher, sha = str(found[1]["launcher"]), str(found[1]["sha"])  # strings: entry_problem passed the entry
    return launcher if record_use(root, host, program, sha, launcher, job) else None


def record_use(root: str, host: str, program: str, sha: str, launcher: str, job: str | None) -> bool:
    """Whether the use was recorded (:mod:`vq_admin.launcher.uses`) below a state directory that passes the
    rule level by level; ``False`` sends the caller to the full lookup, which words why not."""
    from . import uses

    rfd = open_trusted_dir(os.path.normpath(os.path.abspath(root)))
    if rfd is None:
        return False
    try:
        uses.append(rfd, host, program, sha, launcher, job)
        return True
    except (OSError, ValueError):
        return False
    finally:
        os.close(rfd)


def _read(dfd: int, name: str) -> dict[str, str | None] | None:
    data = read_trusted_file(dfd, name, MAX_ENTRY_BYTES)
    return None if data is None else flat_object(data)


def absent(dfd: int, directory: str, sha: str) -> bool:
    """Whether ``<directory>/<sha>.json`` is certainly absent in the lane *dfd* (one ``stat``, never
    followed); a lane whose answer cannot be read counts as having it (fail closed)."""
    try:
        os.stat(os.path.join(directory, sha + ".json"), dir_fd=dfd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def unconfirmed_reason(root: str, host: str, program: str, sha: str) -> str | None:
    """Why *sha* may not be handed out (:mod:`vq_admin.state.confirmation`: pending or unconfirmed, or the
    document cannot be read: fail closed), or ``None`` (passed, not named, or no document at all).  Read with
    the standard library only; the one rule both the plain and the full lookup apply."""
    lane = os.path.join(os.path.normpath(os.path.abspath(root)), "hosts", host, "runtime", program)
    path = os.path.join(lane, "confirmation.json")
    unreadable = f"its confirmation record {path} cannot be read"
    dfd, data = open_trusted_dir(lane), None
    if dfd is not None:
        try:
            data = read_trusted_file(dfd, "confirmation.json", 1 << 20)
        finally:
            os.close(dfd)
    if data is None:
        try:
            os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            pass
        return unreadable
    from ..core.bounds import InputError, loads_json

    try:
        document = loads_json(data, path, limit=1 << 20)
        generations = document.get("generations", {}) if isinstance(document, dict) else None
        entry = generations.get(sha) if isinstance(generations, dict) else None
    except InputError:
        return unreadable
    if generations is None or (entry is not None and not isinstance(entry, dict)):
        return unreadable
    return None if entry is None else why_unconfirmed(entry.get("status"), entry.get("job_id"), entry.get("reason"))


def why_unconfirmed(status: object, job_id: object, reason: object) -> str | None:
    """Why a generation whose confirmation has *status* may not be used (``None``: nothing against it): the one
    wording of this lookup and of :meth:`vq_admin.state.confirmation.ConfirmEntry.why_unconfirmed`."""
    if status == "pending":
        return f"its confirmation job {job_id or '(id not recorded)'} is still under way"
    return f"its confirmation failed: {reason or 'not passed'}" if status == "unconfirmed" else None
