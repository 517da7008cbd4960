"""Driver state: receipts, LAST OK / LAST GOOD, the admin log.

Layout under the state directory (CONTRACT section 5)::

    receipts/<id>.json                      one immutable receipt per run
    receipts/<id>.transcript/{stdout,stderr} an allocation transcript, when any
    admin.log                               append-only JSON lines, one per run
    hosts/<host>/runtime/<program>/last.json      the last run's outcome
    hosts/<host>/runtime/<program>/last-ok.json   LAST OK
    hosts/<host>/runtime/<program>/last-good.json LAST GOOD
    hosts/<host>/helper/...                 the same for the helper lane, apart

LAST OK is the identity proven by the most recent verified success (``ok``
or ``already-current``); nothing else ever writes it.  LAST GOOD is the
previous verified identity with a different SHA: the generation to fall back
to, which retention must keep.  A failed, refused or unknown run moves
neither; both are carried forward unchanged.

Every file is written atomically (temp file, fsync, rename, fsync of the
directory), so a crash leaves either the old or the new file, never half.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import TypeVar

from msgspec import UNSET, UnsetType

from ..core import default_paths as paths
from ..core.procs import process_alive
from ..core.stamps import NAME, utc_now
from ..core.bounds import InputError, json_object
from ..document import Document, FullSha, JsonObject, JsonValue
from ..core import atomic
from .tree import MAX_STATE_FILE, PrivateTree
from .tree import dump_json as dump_json  # the one writer of state records, re-exported


class LastRun(Document, frozen=True, kw_only=True):
    """``last.json``: the lane's last run, whatever its outcome."""

    outcome: str
    exit_code: int | None = None
    expected_sha: str | None = None
    tag: str | None = None
    receipt: str | None = None
    at: str | None = None
    errors: tuple[str, ...] = ()


class LogLine(Document, frozen=True, kw_only=True):
    """One line of ``admin.log``: a run of a lane, a fleet run (its hosts' outcomes) or a provider install (where
    it went, the provider file's digests before and after); a member another kind does not write is absent."""

    at: str | None
    lane: str
    host: str | None
    outcome: str
    exit_code: int
    receipt: str
    errors: tuple[str, ...]
    program: str | None | UnsetType = UNSET
    expected_sha: str | None | UnsetType = UNSET
    hosts: dict[str, str] | UnsetType = UNSET
    dest: str | UnsetType = UNSET
    where: str | UnsetType = UNSET
    old_sha256: JsonValue | UnsetType = UNSET  #: as the agent reported them
    new_sha256: JsonValue | UnsetType = UNSET
    interpreter: JsonValue | UnsetType = UNSET
    by: JsonObject | UnsetType = UNSET


class Verified(Document, frozen=True, kw_only=True):
    """LAST OK and LAST GOOD: the identity a verified success proved active, the receipt that proved it and
    when.  A runtime's has its label and launcher, a helper's its tree; a member a lane does not write is
    absent (not null) in the file."""

    sha: FullSha
    receipt: str | None = None
    at: str | None = None
    tag: str | None | UnsetType = UNSET
    launcher: str | None | UnsetType = UNSET
    launcher_sha256: str | None | UnsetType = UNSET
    #: Another driver's signed entry of the host's record (CONTRACT section 12): who ran it, which driver, the
    #: principal that signed it.
    verified_by: str | None | UnsetType = UNSET
    driver: str | None | UnsetType = UNSET
    signer: str | None | UnsetType = UNSET
    #: The helper lane's: the live helper's identity.
    tree_sha256: str | None | UnsetType = UNSET
    record: str | None | UnsetType = UNSET
    path: str | None | UnsetType = UNSET
    version: str | None | UnsetType = UNSET
    interpreter: str | None | UnsetType = UNSET


_Record = TypeVar("_Record", LastRun, Verified)

#: Free space the state directory must have before a run changes anything (receipts with
#: transcripts are larger; this is the floor that keeps the records of one run writable).
MIN_FREE_BYTES = 1 << 20


#: Temp files without a pid in their name (written by an earlier version) are removed after this long.
LEGACY_TEMP_AGE = 24 * 3600.0


def _temp_owner(name: str) -> int | None:
    """The pid in a temp file name (``.tmp.<name>.<pid>.<hex>``, ``<lock>.holder.<pid>``), if any."""
    parts = name.split(".")
    if ".holder." in name and parts[-1].isdigit():
        return int(parts[-1])
    if len(parts) >= 4 and parts[-2].isdigit():
        return int(parts[-2])
    return None


def write_atomic(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write *data* to *path* by temp file + rename; *exclusive* never replaces.

    Missing directories are created 0700 whatever the umask; the temp file is
    created 0600 with ``O_EXCL|O_NOFOLLOW``.  Inside the state directory,
    prefer :class:`StateDir`, which also checks every level."""
    from ..core.securepath import makedirs_private

    makedirs_private(str(Path(path).parent))
    dfd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        atomic.write(Path(path).name, data, dir_fd=dfd, exclusive=exclusive)
    finally:
        os.close(dfd)


def read_json(path: Path) -> JsonObject | None:
    """A JSON object from any *path* (bounded, never blocking); ``None`` when absent or malformed."""
    from ..core.bounds import read_regular_file

    try:
        data = read_regular_file(str(path), "state file", limit=MAX_STATE_FILE)
    except (OSError, InputError):
        return None
    return json_object(data, limit=MAX_STATE_FILE)


class StateDir:
    """The driver's state directory; every access goes through :class:`~vq_admin.state.tree.PrivateTree`
    (checked at every level, never following a symlink, created owner-only)."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        chosen = root or paths.state_dir()
        self.tree = PrivateTree(chosen)
        self.root = Path(self.tree.root)

    def check(self, *, create: bool = False) -> None:
        """Refuse (exit 77) now when the state directory cannot be trusted."""
        fd = self.tree.open_dir([], create=create)
        if fd is not None:
            os.close(fd)

    def check_run_dirs(self, lane: str, host: str, program: str | None) -> None:
        """Refuse (exit 77) before a run writes anything (its lock, holder, receipt) when a directory it
        would write is not the administrator's own: every existing level checked, nothing created."""
        registry = ["registry", host, program] if program else ["registry"]
        for parts in (["locks"], ["receipts"], registry, self.lane_parts(lane, host, program)):
            fd = self.tree.open_dir(parts, create=False)
            if fd is not None:
                os.close(fd)

    # -- room to record a run -------------------------------------------------------

    def require_free_space(self) -> None:
        """Refuse (77) before any mutation when the state filesystem cannot hold a run's records.

        A run that changed a host must be able to store its receipt, the
        registry entry, LAST OK and the admin log line; below
        :data:`MIN_FREE_BYTES` nothing is started.
        """
        from ..report.outcome import READ_ONLY_RAN, Refused

        probe = self.root  # its filesystem: the nearest existing ancestor's
        try:
            while not probe.exists() and probe != probe.parent:
                probe = probe.parent
            st = os.statvfs(probe)
            free = st.f_bavail * st.f_frsize
        except OSError as exc:
            raise Refused(f"the state directory {self.root} cannot be examined ({exc.strerror}); "
                          f"{READ_ONLY_RAN}") from None
        if free < MIN_FREE_BYTES:
            raise Refused(f"the state directory {self.root} has {free // 1024} KiB free, below the "
                          f"{MIN_FREE_BYTES // 1024} KiB vq-admin needs to record a run (receipt, registry, LAST OK, "
                          f"admin log); {READ_ONLY_RAN}: free space there, then rerun")

    # -- leftovers of killed runs ----------------------------------------------------

    def sweep_leftovers(self) -> list[str]:
        """Remove temp files that killed runs left in the state directory.

        A temp file (``.tmp.*``, including ``receipts/<id>.transcript/.tmp.*``,
        and a lock's ``.holder.<pid>``) is removed when the process named in it
        is gone; one without a pid only when older than a day.  Nothing else
        is touched, symlinks are never followed, and errors are ignored (this
        is housekeeping, never a reason to fail a run).
        """
        removed: list[str] = []
        now = time.time()
        for dirpath, _dirnames, filenames in os.walk(self.root, followlinks=False):  # none when it is no directory
            for name in filenames:
                if not (name.startswith(".tmp.") or ".holder." in name):
                    continue
                path = os.path.join(dirpath, name)
                owner = _temp_owner(name)
                try:
                    st = os.lstat(path)
                    if owner is not None:
                        stale = owner != os.getpid() and not process_alive(owner)
                    else:
                        stale = now - st.st_mtime > LEGACY_TEMP_AGE
                    if stale:
                        os.unlink(path)
                        removed.append(os.path.relpath(path, self.root))
                except OSError:
                    continue
        return removed

    # -- receipts -------------------------------------------------------------------

    def new_receipt_id(self, lane: str, host: str, program: str | None) -> str:
        stamp = utc_now(fmt=NAME)
        parts = [stamp, lane, host] + ([program] if program else []) + [secrets.token_hex(4)]
        return "-".join(parts)

    def receipt_path(self, receipt_id: str) -> Path:
        return self.root / "receipts" / f"{receipt_id}.json"

    def read_receipt(self, receipt_id: object) -> JsonObject | None:
        """A stored receipt (every level checked, never through a symlink); ``None`` when absent or malformed."""
        if not isinstance(receipt_id, str) or not receipt_id or "/" in receipt_id or receipt_id.startswith("."):
            return None
        name = f"{receipt_id}.json"
        return json_object(self.tree.read(["receipts"], name), limit=MAX_STATE_FILE)

    def transcript_dir(self, receipt_id: str) -> Path:
        """The transcript directory of a receipt, created (0700, every level checked)."""
        return Path(self.tree.ensure_dir(["receipts", f"{receipt_id}.transcript"]))

    def store_receipt(self, receipt_id: str, receipt: JsonObject) -> Path:
        self.tree.write_atomic(["receipts"], f"{receipt_id}.json", dump_json(receipt), exclusive=True)
        from . import history

        history.append(self.tree, receipt)  # one line in receipts/index.jsonl, for vq admin history
        return self.receipt_path(receipt_id)

    # -- per-lane records -----------------------------------------------------------

    @staticmethod
    def lane_parts(lane: str, host: str, program: str | None) -> list[str]:
        return ["hosts", host, "helper"] if lane == "helper" else ["hosts", host, "runtime", program or ""]

    def lane_dir(self, lane: str, host: str, program: str | None) -> Path:
        return self.root.joinpath(*self.lane_parts(lane, host, program))

    def _read_typed(self, lane: str, host: str, program: str | None, name: str,
                    kind: type[_Record]) -> _Record | None:
        """The lane's record *name* as *kind*; ``None`` when absent, unreadable or not one."""
        parts = self.lane_parts(lane, host, program)
        data = self.tree.read(parts, name)
        try:
            return None if data is None else kind.from_json(data, self.tree.path(*parts, name), limit=MAX_STATE_FILE)
        except InputError:
            return None

    def last_run(self, lane: str, host: str, program: str | None) -> LastRun | None:
        """``last.json``: the lane's last run."""
        return self._read_typed(lane, host, program, "last.json", LastRun)

    def verified(self, lane: str, host: str, program: str | None, which: str = "last-ok") -> Verified | None:
        """LAST OK (*which* ``last-ok``) or LAST GOOD (``last-good``) of the lane."""
        return self._read_typed(lane, host, program, f"{which}.json", Verified)

    def write_record(self, lane: str, host: str, program: str | None, name: str, record: JsonObject) -> Path:
        return Path(self.tree.write_atomic(self.lane_parts(lane, host, program), name, dump_json(record)))

    def record_run(self, lane: str, host: str, program: str | None, summary: LastRun,
                   verified: Verified | None) -> None:
        """Record a run's outcome; move LAST OK / LAST GOOD only for *verified*."""
        if verified is not None:
            self.move_last_ok(lane, host, program, verified)
        self.tree.write_atomic(self.lane_parts(lane, host, program), "last.json", dump_json(summary.to_value()))

    def move_last_ok(self, lane: str, host: str, program: str | None, verified: Verified) -> None:
        """*verified* becomes LAST OK; the previous LAST OK becomes LAST GOOD when its SHA differs.  Also for
        another driver's signed verification (CONTRACT section 12): this driver's ``last.json`` stays its own."""
        parts = self.lane_parts(lane, host, program)
        previous = self.verified(lane, host, program)
        if previous is not None and previous.sha != verified.sha:
            self.tree.write_atomic(parts, "last-good.json", dump_json(previous.to_value()))
        self.tree.write_atomic(parts, "last-ok.json", dump_json(verified.to_value()))

    def lanes(self) -> list[tuple[str, str, str | None]]:
        """Every (host, lane, program) with recorded state, sorted."""
        found: list[tuple[str, str, str | None]] = []
        for host in self.tree.subdirs(["hosts"]):
            kinds = self.tree.subdirs(["hosts", host])
            if "helper" in kinds:
                found.append((host, "helper", None))
            if "runtime" in kinds:
                for program in self.tree.subdirs(["hosts", host, "runtime"]):
                    found.append((host, "runtime", program))
        return found

    # -- admin log ------------------------------------------------------------------

    def append_log(self, entry: LogLine) -> None:
        """Append one JSON line, under an exclusive lock, in one write."""
        line = (json.dumps(entry.to_value(), sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")
        self.tree.append([], "admin.log", line)
