"""Waiting for a held lane lock or host-side lease instead of exiting 75 at once.

* ``--wait-lock SECONDS`` (update, rollback, prune): a held lane lock or
  lease (another run, or the build or batch job an earlier run left running)
  is asked for again every :data:`POLL_SECONDS` until SECONDS have passed
  since the run started, with a progress line on a terminal; then 75 as
  before, saying how long it waited.
* A fleet rollout's hosts whose accounts share one home (the usual NFS home)
  share one lease: a worker whose lease another worker of the same rollout
  (:data:`FLEET`, the rollout's pid) holds waits for it to end, whatever
  ``--wait-lock`` says, so they run one after another.

A provider's own lock (its exit 75) and the quiescence guard stay 75 at once.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Callable, TypeVar

from .core import procs
from .document import Document
from .report import progress
from .report.outcome import READ_ONLY_RAN, Locked
from .report.sections import Sibling, Waited

#: The environment variable a fleet rollout sets in each of its workers: its own pid.
FLEET = "VQ_ADMIN_FLEET"
#: How often a held lock is asked for again while ``--wait-lock`` lasts.
POLL_SECONDS = 2.0
#: How often a sibling worker holding the lease is checked on (locally, no ssh).
SIBLING_POLL_SECONDS = 0.2
#: A sibling still running is asked for again this often anyway.
SIBLING_RECHECK_SECONDS = 30.0

T = TypeVar("T")


class Holder(Document, frozen=True, kw_only=True):
    """What holds a lease (the agent's holder record, :mod:`vq_admin.agent.lease`): a run's session (its id,
    and the user, machine and pid of its driver, and when it started), or the build or job an earlier run
    left (``kind``, with the ``session`` that started it); ``lock_holders`` when the holder record is missing."""

    run_id: str | None = None
    user: str | None = None
    driver_host: str | None = None
    pid: int | None = None
    since: str | None = None
    kind: str | None = None
    job_id: str | None = None
    session: Holder | None = None
    lock_holders: tuple[Holder, ...] | None = None  #: from ``/proc/locks``: each a pid alone


def sibling(holder: Holder) -> int | None:
    """The pid of the worker of this run's own fleet rollout that holds the lease, or ``None``.

    *holder* is the lease's holder record (a session) or its work lock's (whose ``session`` is
    the run that started the work); a sibling is a live process on this machine whose parent is
    the rollout named by :data:`FLEET`, and this process is one of its workers too."""
    fleet = os.environ.get(FLEET, "")
    if not fleet.isdigit() or os.getppid() != int(fleet):
        return None
    run = holder.session or holder
    pid = run.pid
    if run.driver_host != socket.gethostname() or pid is None or pid == os.getpid():
        return None
    state = procs.process_state(pid)
    return pid if state is not None and state[0] != "Z" and state[1] == int(fleet) else None


class LockWait:
    """How one run waits for its lane lock and lease (module docstring); one deadline for both."""

    def __init__(self, seconds: float | None, *, terminal: bool = False,
                 narrate: Callable[[str], None] = lambda message: None):
        self.seconds = seconds
        self.terminal = terminal
        self.narrate = narrate
        self.started = time.monotonic()
        self.waited = 0.0
        self.siblings: list[Sibling] = []  # the sibling runs waited for: run id and driver pid
        self.holding = ""  # what holds the lock, as the progress line names it
        self._line: progress.LiveLine | None = None

    def record(self) -> Waited | None:
        """What the receipt's ``lease.waited`` says, when this run waited at all."""
        if not self.waited:
            return None
        return Waited(seconds=round(self.waited, 3), wait_lock=self.seconds, siblings=self.siblings)

    def run(self, attempt: Callable[[], T], holder: Callable[[], Holder | None]) -> T:
        """``attempt()`` until it does not raise :class:`Locked`, waiting in between as this run may
        (*holder* gives the holder record of the lock just found held)."""
        try:
            while True:
                try:
                    return attempt()
                except Locked as exc:
                    self.pause(exc, holder())
        finally:
            if self._line is not None:
                self._line.close()
                self._line = None

    def pause(self, error: Locked, holder: Holder | None) -> None:
        """Return when the held lock is worth asking for again; raise *error* when it is not waited for."""
        if holder is not None:  # a lease held by another worker of this rollout is waited for as long as it runs
            pid = sibling(holder)
            if pid is not None:
                self._wait_sibling(pid, holder)
                return
        if self.seconds is None:
            raise error
        left = self.seconds - (time.monotonic() - self.started)
        if left <= 0:
            raise Locked(f"{error.message}\n(waited {self.waited:.0f} s: --wait-lock {self.seconds:g})")
        self.holding = error.message.splitlines()[0].replace(f"; {READ_ONLY_RAN}", "")
        if not self.waited:
            self.narrate(f"waiting up to {self.seconds:g} s (--wait-lock): {self.holding}")
            if self.terminal:
                self._line = progress.LiveLine(self._render).start()
        self._sleep(min(POLL_SECONDS, left))

    def _render(self) -> str:
        return (f"waiting for the lock {progress.elapsed(time.monotonic() - self.started)} of "
                f"{progress.elapsed(self.seconds or 0)}: {self.holding}")

    def _wait_sibling(self, pid: int, holder: Holder) -> None:
        run = holder.session or holder
        if not any(s.pid == pid for s in self.siblings):
            self.narrate(f"the lease is held by this rollout's own run {run.run_id} (pid {pid}): the hosts "
                         "share one home; waiting for it to end")
            self.siblings.append(Sibling(run_id=run.run_id, pid=pid))
        deadline = time.monotonic() + SIBLING_RECHECK_SECONDS
        while time.monotonic() < deadline and sibling(holder) == pid:
            self._sleep(SIBLING_POLL_SECONDS)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)
        self.waited += seconds
