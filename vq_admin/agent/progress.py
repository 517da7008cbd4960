"""Progress records of ``alloc-run --progress SECONDS`` (for a terminal; none without it).

While ``sbatch --wait`` runs, a thread of the agent reports, once when the
job id is known and then every *SECONDS*, one ``progress`` record: the job's
queue state and pending reason (``squeue`` on the login host) and the last
line of the attempt's transcript.  During the settle every observation is
reported too.

Record payloads::

    {"phase": "wait", "job_id": "42", "state": "PENDING", "reason": "Resources",
     "last_line": "...", "stream": "stdout" | "stderr" | null}
    {"phase": "settle", "observation": 3, "max": 10, "identical": 3, "bytes": 1234,
     "readable": true}

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Callable, Optional, Sequence, Tuple, TypedDict

from .slurmjob import query

#: The shortest poll interval, in seconds.
MIN_INTERVAL = 1.0
TAIL_BYTES = 4096
LINE_LIMIT = 300
SQUEUE_TIMEOUT = 20.0


def queue_state(job_id: str, timeout: float = SQUEUE_TIMEOUT) -> Tuple[Optional[str], Optional[str]]:
    """``(state, reason)`` from ``squeue -h -j ID -o %T|%r``; ``(None, None)`` when the job left the queue."""
    code, out, err = query(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], timeout)
    if code is None:
        return "UNKNOWN", err[:200]
    if code != 0:
        if "Invalid job id" in err:
            return None, None
        return "UNKNOWN", f"squeue exit {code}: {err.strip()[-200:]}"
    for line in out.splitlines():
        state, _, reason = line.strip().partition("|")
        if state:
            return state, (reason if reason not in ("", "None") else None)
    return None, None


def _tail(dir_fd: int, name: str) -> Tuple[float, bytes]:
    """``(mtime, last bytes)`` of *name* below *dir_fd*, never through a symlink (no bytes: none readable)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return 0.0, b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0.0, b""
        start = max(0, st.st_size - TAIL_BYTES)
        return st.st_mtime, os.pread(fd, TAIL_BYTES, start)
    except OSError:
        return 0.0, b""
    finally:
        os.close(fd)


def last_line(dir_fd: int) -> Tuple[Optional[str], Optional[str]]:
    """The last non-empty line of the transcript written most recently: ``(line, file name)``."""
    best = None
    for name in ("stdout", "stderr"):
        mtime, data = _tail(dir_fd, name)
        lines = [ln for ln in data.replace(b"\r", b"\n").split(b"\n") if ln.strip()]
        if lines and (best is None or mtime >= best[0]):
            best = (mtime, lines[-1], name)
    if best is None:
        return None, None
    return best[1].decode("utf-8", "replace").strip()[:LINE_LIMIT], best[2]


class WaitRecord(TypedDict):
    """A ``progress`` record while the job waits or runs: its queue state and the transcript's last line."""

    phase: str  # "wait"
    job_id: str
    state: str
    reason: Optional[str]
    last_line: Optional[str]
    stream: Optional[str]


class SettleRecord(TypedDict):
    """A ``progress`` record after each settle observation."""

    phase: str  # "settle"
    observation: int
    max: int
    identical: int
    bytes: int
    readable: bool


class Reporter:
    """Sends ``wait`` records every *interval* seconds from :meth:`start` until the ``with`` block ends
    (none at all without an *interval*: ``--progress`` was not given)."""

    def __init__(self, emit: Callable[[WaitRecord], None], attempt_fd: int, interval: Optional[float],
                 state: Callable[[str], Tuple[Optional[str], Optional[str]]] = queue_state):
        self.emit, self.attempt_fd = emit, attempt_fd
        self.interval = max(MIN_INTERVAL, interval) if interval else None
        self.state = state
        self._stop = threading.Event()
        self._worker: Optional[threading.Thread] = None

    def start(self, job_id: str) -> None:
        if self.interval is not None:
            self._worker = threading.Thread(target=self._loop, args=(job_id,), name="vq-progress", daemon=True)
            self._worker.start()

    def _loop(self, job_id: str) -> None:
        while not self._stop.is_set():
            state, reason = self.state(job_id)
            if self._stop.is_set():
                return
            line, stream = last_line(self.attempt_fd)
            self.emit(WaitRecord(phase="wait", job_id=job_id, state=state or "ENDED", reason=reason, last_line=line,
                                 stream=stream))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._worker is not None:
            self._worker.join(timeout=SQUEUE_TIMEOUT + 5)


def settle_record(k: int, history: Sequence[Sequence[object]], max_observations: int) -> SettleRecord:
    """The ``settle`` record after observation *k* (1-based) of *history*."""
    last = history[-1]
    identical = 1
    for previous in reversed(history[:-1]):
        if previous != last:
            break
        identical += 1
    return SettleRecord(phase="settle", observation=k, max=max_observations, identical=identical,
                        bytes=sum(getattr(s, "size", 0) or 0 for s in last),
                        readable=all(getattr(s, "readable", False) for s in last))
