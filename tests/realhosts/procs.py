"""Small process helpers shared by the real-daemon fixtures.

Everything here works by PID and reads ``/proc`` directly.  The machine's
PID 1 reaps orphans only every ~2 s, so a dead process can still answer
``kill -0``: :func:`pid_alive` treats a zombie (``State: Z``) as dead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The port is released before returning, so another process may grab it;
    callers must retry with a new port when their daemon fails to bind.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T | None:
    """Call ``predicate`` until it returns something truthy or ``timeout`` passes.

    Returns the truthy value, or ``None`` on timeout.  The predicate is always
    called at least once, and once more right at the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def _status_state(pid: int) -> str | None:
    """The one-letter ``State:`` of /proc/PID/status, or None if gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in text.splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    return None


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    state = _status_state(pid)
    return state is not None and state != "Z"


def process_table() -> dict[int, tuple[int, str]]:
    """Map every PID to ``(ppid, comm)`` from /proc/*/stat."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # comm is in parentheses and may itself contain spaces or ')'.
        head, _, tail = stat.rpartition(")")
        comm = head.partition("(")[2]
        fields = tail.split()
        if len(fields) >= 2:
            table[int(entry)] = (int(fields[1]), comm)
    return table


def descendants(pid: int) -> list[tuple[int, str]]:
    """All live descendants of ``pid`` as ``(pid, comm)``, parents first."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for child, (ppid, _comm) in table.items():
        children.setdefault(ppid, []).append(child)
    found: list[tuple[int, str]] = []
    queue = list(children.get(pid, []))
    while queue:
        current = queue.pop(0)
        if pid_alive(current):
            found.append((current, table[current][1]))
        queue.extend(children.get(current, []))
    return found


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to each PID; return the PIDs that received it."""
    hit = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except ProcessLookupError:
            pass
    return hit


def wait_pids_gone(pids: list[int], timeout: float = 5.0) -> bool:
    """Wait until every PID is gone or a zombie; True on success."""
    return bool(wait_until(lambda: not any(pid_alive(p) for p in pids), timeout))


def stop_popen(proc: subprocess.Popen | None, term_timeout: float = 5.0) -> None:
    """SIGTERM a child started with Popen, SIGKILL it after ``term_timeout``, reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=term_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=term_timeout)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])
