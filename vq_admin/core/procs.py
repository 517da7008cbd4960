"""Process liveness: the one rule for "is this recorded process still running?".

Used on both sides: the agent (the lease's holder record, the detached
build's supervisor and build) and the driver (the state directory's lock
owners, a run's temporary ssh directories).

A pid alone is not enough on a real host: PID 1 reaps orphans late, so a
dead process can linger as a zombie (``kill -0`` still succeeds), and a pid
is reused once freed.  So: read ``/proc/PID/stat``; a zombie is dead; with a
recorded start time (``/proc/PID/stat`` field 22, :func:`proc_start_time`)
the pid must still name the process that started then.  Without ``/proc``
(not Linux), ``kill -0`` decides.

Also the one way a process group is ended (:func:`end_group`, one grace: :data:`TERM_GRACE`).

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

import os
import signal

# annotations only: typing is never imported on the session verb's per-run path (the lease imports this)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, List, Optional

    from .protocol import LockHolder

#: Seconds a process group gets after SIGTERM before SIGKILL (and after SIGKILL to be seen gone).
TERM_GRACE = 5.0


def _stat_fields(pid: int) -> Optional[List[bytes]]:
    """The fields of ``/proc/PID/stat`` after the command name (state first), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read(4096)
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def process_state(pid: int) -> "Optional[tuple[str, int]]":
    """The kernel's one-letter state of *pid* (``R``, ``S``, ``T`` stopped, ``Z``...) and its parent's
    pid, or ``None`` when it is gone (or the system has no ``/proc``)."""
    fields = _stat_fields(pid)
    return (fields[0].decode("ascii", "replace"), int(fields[1])) if fields and len(fields) > 1 else None


def proc_start_time(pid: int) -> Optional[str]:
    """The kernel's start time of *pid* (``/proc/PID/stat`` field 22), or ``None``.

    With the pid it names one process for good: a reused pid has another start time.
    """
    fields = _stat_fields(pid)
    return fields[19].decode("ascii", "replace") if fields is not None and len(fields) > 19 else None


def process_alive(pid: Any, start_time: Optional[str] = None) -> bool:
    """True while *pid* (a positive int) runs, is not a zombie, and -- when *start_time*
    is given -- is still the process that started at *start_time*."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if os.path.isdir("/proc/self"):
        fields = _stat_fields(pid)
        if fields is None and start_time is None:
            return _signal_zero(pid)  # gone, or hidden from us (hidepid): kill -0 tells them apart
        if not fields or fields[0] == b"Z":
            return False
        return start_time is None or (len(fields) > 19 and fields[19].decode("ascii", "replace") == start_time)
    return _signal_zero(pid)


def end_group(pid: int, ended: "Callable[[float], bool]", grace: float = TERM_GRACE) -> "List[str]":
    """SIGTERM to process group *pid*, then SIGKILL unless ``ended(grace)`` (which waits at most
    *grace* seconds) says the group is done; ``ended(grace)`` again after SIGKILL.  Stops when the
    group is gone.  Returns the names of the signals sent."""
    sent: "List[str]" = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except OSError:
            break
        sent.append(sig.name)
        if ended(grace):
            break
    return sent


def _signal_zero(pid: int) -> bool:
    """``kill -0``: the pid exists (another user's process counts: ``EPERM``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def flock_holders(path: str) -> "List[LockHolder]":
    """The processes of this host that hold a ``flock(2)`` lock on *path*, from ``/proc/locks``:
    each one's ``pid``, ``command`` (its argv, bounded) and ``started`` (UTC), as far as known;
    ``[]`` when none is found or the system has no ``/proc/locks``."""
    try:
        st = os.stat(path)
        with open("/proc/locks", "rb") as fh:
            table = fh.read(1 << 20).decode("ascii", "replace")
    except OSError:
        return []
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found: List[LockHolder] = []
    for line in table.splitlines():
        words = line.split()
        if len(words) > 5 and words[1] == "FLOCK" and words[5] == inode and words[4].isdigit():
            pid = int(words[4])
            found.append({"pid": pid, "command": _command(pid), "started": _started(pid)})
    return found


def _command(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read(512).split(b"\0")
    except OSError:
        return None
    return " ".join(w.decode("utf-8", "replace").replace("\n", " ") for w in words if w)[:200] or None


def _started(pid: int) -> Optional[str]:
    """When *pid* started (UTC, ``YYYY-MM-DDTHH:MM:SSZ``), from its start time and the boot time."""
    ticks = proc_start_time(pid)
    try:
        with open("/proc/stat", "rb") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith(b"btime "))
        at = boot + int(ticks or "") / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None
    from .stamps import utc_now

    return utc_now(at)
