"""``vq-admin-agent lease``: the host-side lease of one lane, held for one run.

A lease is an exclusive, non-blocking ``flock(2)`` on a file in a private
directory of the login host:

* ``<scratch_root>/.vq-admin/locks/`` when the host has a ``scratch_root``;
* else the agent's own state directory,
  ``$XDG_STATE_HOME/vq-admin-agent/locks`` (``~/.local/state/...``).

The directory and every directory above it must pass the secure-path rule
(:mod:`.securepath`); it is created owner-only when missing.  The file is
``runtime.<host>.<program>.lock`` (``helper.<host>.lock`` for the helper
lane); next to it, ``<file>.holder`` records who holds it (driver host, user,
pid, start time, run id, this agent's pid), written atomically.

Once the lock is held, one JSON line ``{"held": true, ...}`` is printed and
the agent then blocks reading its stdin.  When stdin closes (the driver
closed it, the driver died, the ssh connection dropped) the holder record is
removed and the process exits, and the kernel frees the lock with it: the
lease can never outlive its run, whatever ends the run.

Never waits for a held lock: contention prints ``{"held": false, "holder":
{...}}`` and exits 75 (EX_TEMPFAIL) at once.  A lock that cannot be taken for
another reason (a filesystem without working ``flock``: NFS without local
locks, Lustre without the ``flock`` mount option) exits 1 with a message
naming the path and the reason; an unsafe directory exits 4.

Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time

from . import paths, procs, protocol, securepath
from .names import is_name

# Annotations only (never evaluated): the lease is on the per-run path of the session verb, which
# stays near a bare interpreter start, so typing, socket, secrets, json and re are not imported at
# run time (its JSON goes through the protocol's codec, its names through the re-free name rule).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Dict, Optional, TextIO

EXIT_HELD = 75
LANES = ("runtime", "helper")
#: How long a contender waits for the holder record of a lock it just found held.
HOLDER_SETTLE_SECONDS = 1.0
FLOCK_HINT = ("the lease directory must be on a filesystem where flock(2) works: a local filesystem, "
              "NFS with local locks (mount option local_lock=flock or =all), or Lustre mounted with -o flock")


class LeaseError(Exception):
    """The lock could not be taken for a reason other than "held" (exit 1)."""


def default_dir() -> str:
    return paths.agent_lock_dir()


def lease_dir(scratch_root: Optional[str]) -> str:
    if scratch_root:
        return os.path.join(scratch_root, ".vq-admin", "locks")
    return default_dir()


def lock_name(lane: str, host: str, program: Optional[str]) -> str:
    if lane not in LANES:
        raise ValueError(f"lane {lane!r} is not one of {', '.join(LANES)}")
    for value, what in ((host, "host"), (program, "program")):
        if value is not None and not is_name(value):
            raise ValueError(f"{what} {value!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    if lane == "runtime" and not program:
        raise ValueError("the runtime lane's lease needs --program")
    if lane == "helper" and program:
        raise ValueError("the helper lane's lease takes no --program")
    return f"{lane}.{host}" + (f".{program}" if program else "") + ".lock"


def read_holder(path: str) -> Optional[Dict[str, Any]]:
    import json  # contention only: the record of a lease held elsewhere

    try:
        with open(path + ".holder", "rb") as fh:
            value = json.loads(fh.read(65536))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def current_holder(path: str, settle: float = HOLDER_SETTLE_SECONDS) -> Optional[Dict[str, Any]]:
    """The holder record of a held lock, once it names a live agent (bounded wait).

    Between a holder's ``flock`` and its record's rename there is a short
    window; a record naming a dead agent is the previous holder's.
    """
    deadline = time.monotonic() + settle
    while True:
        found = read_holder(path)
        if found is not None and procs.process_alive(found.get("agent_pid")):
            return found
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def describe(holder: Optional[Dict[str, Any]]) -> str:
    if not holder:
        return "holder not recorded"
    return (f"held by {holder.get('user')}@{holder.get('driver_host')} pid {holder.get('pid')} "
            f"since {holder.get('since')} (run {holder.get('run_id')})")


def _write_atomic(path: str, data: bytes) -> None:
    """Replace the holder record *path* with *data*, atomically (a temporary file renamed over it).

    Not ``fsync``-ed: the record means something only while the agent it names runs (a reader
    checks that, :func:`current_holder`), and a crash of the host ends that agent and frees its
    flock, so a record lost or emptied by a crash is only the stale record of a lease nobody
    holds.  Other processes see it as soon as it is renamed; an fsync would cost every run a
    disk flush (several ms on a local disk, more on a shared scratch filesystem).
    """
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".tmp.{os.path.basename(path)}.{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        securepath.discard(tmp)
        raise


def prepare_dir(directory: str) -> None:
    """Create the lease directory owner-only; refuse it unless it passes the secure-path rule."""
    securepath.check(directory, what="lease directory", missing_ok=True)
    securepath.makedirs_private(directory)
    securepath.check(directory, what="lease directory")


def open_lock(path: str) -> int:
    """Open (or create) the lock file without following a symlink."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LeaseError(f"lock file {path} is a symbolic link; refusing to follow it") from None
        raise LeaseError(f"cannot open lock file {path}: {exc.strerror}") from None


def try_lock(fd: int, path: str) -> bool:
    """True when the exclusive lock is now held; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise LeaseError(f"cannot take flock on {path}: {exc.strerror or exc}; {FLOCK_HINT}") from None


def hold(directory: str, name: str, holder: Dict[str, Any], stdin: BinaryIO, out: TextIO) -> int:
    """Take the lease, print one line, hold until *stdin* closes.  Returns the exit status."""
    prepare_dir(directory)
    path = os.path.join(directory, name)
    fd = open_lock(path)
    try:
        if not try_lock(fd, path):
            found = current_holder(path)
            out.write(protocol.encode({"held": False, "lock": path, "holder": found, "message": describe(found)}))
            out.flush()
            return EXIT_HELD
        record = dict(holder, agent_pid=os.getpid(), agent_host=os.uname().nodename)
        _write_atomic(path + ".holder", protocol.encode(record).encode())
        out.write(protocol.encode({"held": True, "lock": path, "holder": record}))
        out.flush()
        try:
            while stdin.read(65536):
                pass
        except OSError:
            pass
        finally:
            try:
                os.unlink(path + ".holder")
            except OSError:
                pass
        return 0
    finally:
        os.close(fd)  # releases the flock


def main_lease(args: Any) -> int:
    try:
        name = lock_name(args.lane, args.host, args.program)
    except ValueError as exc:
        print(f"vq-admin-agent: lease: {exc}", file=sys.stderr)
        return 2
    if args.root is not None and not os.path.isabs(args.root):
        print(f"vq-admin-agent: lease: --root {args.root!r} is not an absolute path", file=sys.stderr)
        return 2
    holder = {
        "driver_host": args.driver_host,
        "user": args.user,
        "pid": args.pid,
        "since": args.since,
        "run_id": args.run_id,
    }
    try:
        return hold(lease_dir(args.root), name, holder, sys.stdin.buffer, sys.stdout)
    except securepath.Untrusted as exc:
        print(f"vq-admin-agent: refused: {exc}", file=sys.stderr)
        return 4
    except LeaseError as exc:
        print(f"vq-admin-agent: lease: {exc}", file=sys.stderr)
        return 1
