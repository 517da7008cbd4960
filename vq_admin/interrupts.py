"""SIGINT, SIGTERM and SIGHUP from the console script's first statement to its exit.

The console script (:func:`vq_admin.entry.main`) calls :func:`install` before
it imports anything else of a verb: from then on each of the three signals
raises :class:`Interruption` where the program is, so no signal ends the
process by itself.  Before a lane has started that is exit 130 (nothing was
run) with, under ``--json``, one error document (:func:`finish_early`); a
lane catches it and ends ``unknown`` with its receipt
(:func:`vq_admin.lanes.runner.execute_lane`).  Once a run's answer is
decided and being written, :func:`hold` makes a later signal change nothing:
it is noted and ignored, and the process exits with that answer's status
(never a second document).

What cannot be caught: a signal that arrives while the interpreter itself
starts, before the console script's first statement.  ``vq admin launcher``
(the per-job lookup) keeps the default dispositions: it imports nothing it
need not, and the queue driver fails closed on any non-zero status.
"""

from __future__ import annotations

import signal
import sys

from .report.outcome import Outcome, VqAdminError

TYPE_CHECKING = False  # not typing's: this module is imported first, so its handlers are in force at once
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interruption(KeyboardInterrupt):
    """One of :data:`SIGNALS` arrived; ``name`` is the signal's (``SIGTERM``)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _raise(signum: int, frame: FrameType | None) -> None:
    """The first signal ends the run; any later one, while it ends, changes nothing (:func:`hold`)."""
    hold()
    raise Interruption(signal.Signals(signum).name)


#: The signals that arrived after :func:`hold`, by name (they changed nothing).
held: list[str] = []


def _note(signum: int, frame: FrameType | None) -> None:
    held.append(signal.Signals(signum).name)


#: Whether the console script's run handles the signals (from :func:`install` to :func:`finish`).
_active: list[bool] = [False]


def install() -> None:
    """Each of :data:`SIGNALS` raises :class:`Interruption` from now on."""
    _active[0] = True
    for sig in SIGNALS:
        signal.signal(sig, _raise)


def hold() -> None:
    """The run's answer is decided: from now on each of :data:`SIGNALS` is noted and changes nothing (a
    Python handler, not ``SIG_IGN``, so a child started later still gets the default disposition).
    Only during the console script's run (:func:`install`), never for a caller of its own."""
    if _active[0]:
        for sig in SIGNALS:
            signal.signal(sig, _note)


def finish() -> None:
    """The console script's run is over: :func:`hold` for the rest of the process, and no more after."""
    hold()
    _active[0] = False


def name_of(exc: BaseException) -> str:
    """The signal an interruption stands for (a plain ``KeyboardInterrupt`` is SIGINT's)."""
    return exc.name if isinstance(exc, Interruption) else "SIGINT"


class InterruptedEarly(VqAdminError):
    """A run interrupted before its lane started: nothing was run (exit 130)."""

    outcome = Outcome.INTERRUPTED


def early_error(exc: BaseException) -> InterruptedEarly:
    return InterruptedEarly(f"vq-admin received {name_of(exc)} before the run started; nothing was run; rerun it")


def finish_early(prog: str, error: InterruptedEarly, document: dict[str, Any] | None) -> int:
    """End a run interrupted before its lane: *document* (under ``--json``) and one line on stderr; 130."""
    hold()
    if document is not None:
        from .report.envelope import write

        write(document)
    from .report.output import safe_text

    print(f"{prog}: {error.outcome.value}: {safe_text(error.message)}", file=sys.stderr, flush=True)
    return error.outcome.exit_code
