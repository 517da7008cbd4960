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

import fcntl
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any


#: Free space the state directory must have before a run changes anything (receipts with
#: transcripts are larger; this is the floor that keeps the records of one run writable).
MIN_FREE_BYTES = 1 << 20


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "vq-admin"


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(name: str) -> str:
    """``.tmp.<name>.<pid>.<random>``: the pid lets a later run remove what a killed one left."""
    return f".tmp.{name}.{os.getpid()}.{secrets.token_hex(6)}"


def pid_alive(pid: int) -> bool:
    """True while process *pid* exists and is not a zombie (PID 1 reaps orphans late)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except OSError:
        pass
    return True


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
    """Write *data* to *path* by temp file + rename; *exclusive* never replaces."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.parent / temp_name(path.name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp, path)  # fails if path exists: receipts are immutable
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def dump_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as fh:
            value = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


class StateDir:
    def __init__(self, root: str | os.PathLike[str] | None = None):
        chosen = root or os.environ.get("VQ_ADMIN_STATE_DIR") or default_state_dir()
        self.root = Path(chosen)

    # -- room to record a run -------------------------------------------------------

    def free_bytes(self) -> int:
        """Bytes available to vq-admin in the state directory's filesystem (its nearest existing ancestor)."""
        probe = self.root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        st = os.statvfs(probe)
        return st.f_bavail * st.f_frsize

    def require_free_space(self, minimum: int | None = None) -> None:
        """Refuse (77) before any mutation when the state filesystem cannot hold a run's records.

        A run that changed a host must be able to store its receipt, the
        registry entry, LAST OK and the admin log line; below
        :data:`MIN_FREE_BYTES` nothing is started.
        """
        from .outcome import Refused

        minimum = MIN_FREE_BYTES if minimum is None else minimum
        try:
            free = self.free_bytes()
        except OSError as exc:
            raise Refused(f"the state directory {self.root} cannot be examined ({exc.strerror}); nothing was run") from None
        if free < minimum:
            raise Refused(f"the state directory {self.root} has {free // 1024} KiB free, below the "
                          f"{minimum // 1024} KiB vq-admin needs to record a run (receipt, registry, LAST OK, admin "
                          "log); nothing was run: free space there, then rerun")

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
        if not self.root.is_dir():
            return removed
        now = time.time()
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            for name in filenames:
                if not (name.startswith(".tmp.") or ".holder." in name):
                    continue
                path = os.path.join(dirpath, name)
                owner = _temp_owner(name)
                try:
                    st = os.lstat(path)
                    if owner is not None:
                        stale = owner != os.getpid() and not pid_alive(owner)
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
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        parts = [stamp, lane, host] + ([program] if program else []) + [secrets.token_hex(4)]
        return "-".join(parts)

    def receipt_path(self, receipt_id: str) -> Path:
        return self.root / "receipts" / f"{receipt_id}.json"

    def transcript_dir(self, receipt_id: str) -> Path:
        return self.root / "receipts" / f"{receipt_id}.transcript"

    def store_receipt(self, receipt_id: str, receipt: dict[str, Any]) -> Path:
        path = self.receipt_path(receipt_id)
        write_atomic(path, dump_json(receipt), exclusive=True)
        return path

    # -- per-lane records -----------------------------------------------------------

    def lane_dir(self, lane: str, host: str, program: str | None) -> Path:
        base = self.root / "hosts" / host
        return base / "helper" if lane == "helper" else base / "runtime" / (program or "")

    def read_record(self, lane: str, host: str, program: str | None, which: str) -> dict[str, Any] | None:
        return read_json(self.lane_dir(lane, host, program) / f"{which}.json")

    def record_run(self, lane: str, host: str, program: str | None, summary: dict[str, Any], verified: dict[str, Any] | None) -> None:
        """Record a run's outcome; move LAST OK / LAST GOOD only for *verified*."""
        d = self.lane_dir(lane, host, program)
        if verified is not None:
            previous = read_json(d / "last-ok.json")
            if previous and previous.get("sha") and previous.get("sha") != verified.get("sha"):
                write_atomic(d / "last-good.json", dump_json(previous))
            write_atomic(d / "last-ok.json", dump_json(verified))
        write_atomic(d / "last.json", dump_json(summary))

    def lanes(self) -> list[tuple[str, str, str | None]]:
        """Every (host, lane, program) with recorded state, sorted."""
        found: list[tuple[str, str, str | None]] = []
        hosts = self.root / "hosts"
        if not hosts.is_dir():
            return found
        for host in sorted(p.name for p in hosts.iterdir() if p.is_dir()):
            if (hosts / host / "helper").is_dir():
                found.append((host, "helper", None))
            runtime = hosts / host / "runtime"
            if runtime.is_dir():
                for program in sorted(p.name for p in runtime.iterdir() if p.is_dir()):
                    found.append((host, "runtime", program))
        return found

    # -- admin log ------------------------------------------------------------------

    def append_log(self, entry: dict[str, Any]) -> None:
        """Append one JSON line, under an exclusive lock, in one write."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        line = (json.dumps(entry, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")
        fd = os.open(self.root / "admin.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
