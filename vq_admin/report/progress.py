"""Progress on long waits, on a terminal only.

One live line on standard error, redrawn in place (``\\r`` and erase-line),
at most once a second:

* an allocation build: ``job 42 PENDING (Resources) 0:25 | <last line>``,
  then ``job 42 RUNNING 1:02:03 | <last line>``, then ``settle: observation
  3/10, 3 identical, 1.2 KiB``; the job state, its pending reason and the
  transcript's last line come from the agent's ``progress`` records (it polls
  ``squeue`` on the login host every :data:`POLL_SECONDS`), the elapsed time
  is counted here;
* a build on a fixed host (or the login host): ``deploy on cluster-build
  0:42 | <last output line>``, read from the captured output as it grows.

Only when standard error is a terminal and the run is not ``--json``
(:func:`enabled`); otherwise nothing is drawn, no thread is started, and the
agent is not asked for progress records.  Text from a host is escaped
before it reaches the terminal.  A small renderer, standard library only.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, TextIO

from .output import safe_text

if TYPE_CHECKING:
    from ..document import JsonObject

#: How often the agent polls the scheduler for us (the issue's bound: at most every 10 s).
POLL_SECONDS = 10
REDRAW_SECONDS = 1.0
ERASE = "\r\x1b[2K"
TAIL_BYTES = 4096


def enabled(json_output: bool, stream: TextIO | None = None) -> bool:
    """Draw progress: standard error is a terminal and the run is not ``--json``."""
    stream = stream or sys.stderr
    if json_output:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def elapsed(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class LiveLine:
    """One line of stderr redrawn in place by a ticker thread until :meth:`close`."""

    def __init__(self, render: Callable[[], str], stream: TextIO | None = None, interval: float = REDRAW_SECONDS):
        self.render = render
        self.stream = stream or sys.stderr
        self.interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._drawn = False
        self._worker = threading.Thread(target=self._loop, name="vq-live-line", daemon=True)

    def start(self) -> "LiveLine":
        self._worker.start()
        return self

    def _loop(self) -> None:
        while True:
            self.draw()
            if self._stop.wait(self.interval):
                return

    def draw(self) -> None:
        width = max(20, shutil.get_terminal_size((80, 24)).columns - 1)
        text = safe_text(self.render()).replace("\n", " ").replace("\t", " ")
        with self._lock:
            if self._stop.is_set():
                return
            try:
                self.stream.write(ERASE + text[:width])
                self.stream.flush()
                self._drawn = True
            except (OSError, ValueError):
                self._stop.set()

    def _erase(self) -> None:
        """Erase a drawn line (the caller holds the lock); a stream that fails is left alone."""
        if self._drawn:
            try:
                self.stream.write(ERASE)
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._drawn = False

    def wrap(self, narrate: Callable[[str], None]) -> Callable[[str], None]:
        """A narrator that erases the live line before it prints."""
        def say(message: str) -> None:
            with self._lock:
                self._erase()
            narrate(message)
        return say

    def close(self) -> None:
        self._stop.set()
        if self._worker.is_alive():
            self._worker.join(timeout=5)
        with self._lock:
            self._erase()


class AllocationView:
    """The live line of an allocation build, fed by the agent's ``progress`` records."""

    def __init__(self, program: str, clock: Callable[[], float] = time.monotonic):
        self.program = program
        self.clock = clock
        self.started = clock()
        self.job_id: str | None = None
        self.state: str | None = None
        self.reason: str | None = None
        self.line: str | None = None
        self.settle: JsonObject | None = None

    def on_record(self, kind: str, value: JsonObject) -> None:
        if kind == "job" and value.get("job_id"):
            self.job_id = str(value["job_id"])
        elif kind == "progress":
            if value.get("phase") == "wait":
                if value.get("job_id"):
                    self.job_id = str(value["job_id"])
                self.state, self.reason = (str(value[k]) if value.get(k) else None for k in ("state", "reason"))
                if value.get("last_line"):
                    self.line = str(value["last_line"])
            elif value.get("phase") == "settle":
                self.settle = value

    def render(self) -> str:
        since = elapsed(self.clock() - self.started)
        if self.settle is not None:
            s = self.settle
            return (f"{self.program}: job {self.job_id or '?'} ended; settling transcript: observation "
                    f"{s.get('observation')}/{s.get('max')}, {s.get('identical')} identical, "
                    f"{_size(s.get('bytes'))}{'' if s.get('readable', True) else ', not yet readable'} {since}")
        if self.job_id is None:
            return f"{self.program}: submitting the batch job {since}"
        state = self.state or "SUBMITTED"
        if self.reason and state == "PENDING":
            state += f" ({self.reason})"
        tail = f" | {self.line}" if self.line else ""
        return f"{self.program}: job {self.job_id} {state} {since}{tail}"


class CommandView:
    """The live line of a build on a fixed host: elapsed time and the last output line."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic):
        self.what = what
        self.clock = clock
        self.started = clock()
        self.fds: tuple[int, ...] = ()
        self._lock = threading.Lock()

    def watch(self, *fds: int) -> None:
        """The capture files to read (none: they are about to be closed)."""
        with self._lock:
            self.fds = tuple(fds)

    def last_line(self) -> str | None:
        best = None
        with self._lock:  # watch() closes nothing while the files are read
            for fd in self.fds:
                try:
                    st = os.fstat(fd)
                    data = os.pread(fd, TAIL_BYTES, max(0, st.st_size - TAIL_BYTES))
                except OSError:
                    continue
                lines = [ln for ln in data.replace(b"\r", b"\n").split(b"\n") if ln.strip()]
                if lines and (best is None or st.st_mtime >= best[0]):
                    best = (st.st_mtime, lines[-1])
        return best[1].decode("utf-8", "replace").strip() if best else None

    def render(self) -> str:
        line = self.last_line()
        return f"{self.what} {elapsed(self.clock() - self.started)}" + (f" | {line}" if line else "")


@contextmanager
def live(ctx: Any, view: Any) -> Iterator[None]:
    """Draw *view* as a live line while the block runs (nothing when *view* is None).

    ``ctx.narrate`` is wrapped meanwhile, so a narration erases the line
    before it prints instead of running into it.
    """
    if view is None:
        yield
        return
    line = LiveLine(view.render).start()
    narrate = ctx.narrate
    ctx.narrate = line.wrap(narrate)
    try:
        yield
    finally:
        line.close()
        ctx.narrate = narrate


def _size(n: Any) -> str:
    n = int(n or 0)
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"
