"""SIGINT, SIGTERM and SIGHUP from the console script's first statement to its exit.

:func:`vq_admin.entry.main` calls :func:`install` before it imports anything
else of a verb: from then on each of the three signals raises
:class:`Interruption` where the program is, never ending the process by
itself.  Before a lane started that is exit 130, nothing run, with one error
document under ``--json`` (:func:`finish_early`); a lane makes it ``unknown``
with its receipt (:func:`vq_admin.lanes.runner.execute_lane`).  From the
first signal on, and once a run's answer is decided (:func:`hold`), a signal
changes nothing, so there is never a second document.  Every handler of these
signals in the driver is set here (:class:`handled_by`, :func:`defaults`).

Not caught: a signal while the interpreter itself starts, and during ``vq
admin launcher`` (the per-job lookup imports nothing it need not; the queue
driver fails closed on any non-zero status).
"""

from __future__ import annotations

import signal
import sys

from .report.outcome import READ_ONLY_RAN, Outcome, VqAdminError

TYPE_CHECKING = False  # not typing's: this module is imported first, so its handlers are in force at once
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any, Callable

    from .document import JsonObject

    Handler = Callable[[int, FrameType | None], None]

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Whether the console script's run handles the signals (from :func:`install` to :func:`finish`).
_active = [False]
#: Interruptions Python could only print (:func:`_unraisable`), for :func:`checkpoint` to raise.
_lost: list[str] = []
#: The unraisable hook :func:`install` replaced, for every other unraisable exception.
_previous_hook: list[Callable[[Any], object]] = []


class Interruption(KeyboardInterrupt):
    """One of :data:`SIGNALS` arrived; ``args[0]`` is its name (``SIGTERM``)."""


def _raise(signum: int, frame: FrameType | None) -> None:
    hold()  # the first signal ends the run; a later one changes nothing
    raise Interruption(signal.Signals(signum).name)


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A Python handler, not ``SIG_IGN``: a child started later still gets the default disposition."""


def install() -> None:
    _active[0] = True
    for sig in SIGNALS:
        signal.signal(sig, _raise)
    if sys.unraisablehook is not _unraisable:
        _previous_hook[:] = [sys.unraisablehook]
        sys.unraisablehook = _unraisable


def _unraisable(unraisable: Any) -> None:
    """A signal that lands while Python runs a weakref callback or a finaliser (an import's module lock
    being freed, say) raises :class:`Interruption` where Python can only print it and go on: it is kept
    for the next :func:`checkpoint` and the handlers are armed again, so the run still ends interrupted."""
    if _active[0] and isinstance(unraisable.exc_value, Interruption):
        _lost.append(name_of(unraisable.exc_value))
        for sig in SIGNALS:
            signal.signal(sig, _raise)
    else:
        (_previous_hook or [sys.__unraisablehook__])[0](unraisable)


def checkpoint() -> None:
    """Raise the :class:`Interruption` a signal caused where Python could not raise it (:func:`_unraisable`)."""
    if _lost:
        hold()
        raise Interruption(_lost.pop())


def hold() -> None:
    """The run's answer is decided: a signal changes nothing from now on (only during the console
    script's run, never for a caller of its own)."""
    if _active[0]:
        for sig in SIGNALS:
            signal.signal(sig, _ignore)


def finish() -> None:
    """The console script's run is over: :func:`hold` for the rest of the process."""
    hold()
    _active[0] = False


class handled_by:  # noqa: N801 - used as a context manager (contextlib is not imported this early)
    """*handler* takes the three signals in the block, the previous handlers after it (the fleet's: it
    tells its workers); ``None``: they raise :class:`Interruption` there, as from :func:`install` (a lane
    run by a caller that did not install them)."""

    def __init__(self, handler: Handler | None) -> None:
        self.handler = handler
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if self.handler is not None or not _active[0]:
            self.previous = {sig: signal.signal(sig, self.handler or _raise) for sig in SIGNALS}

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def defaults() -> None:
    """A forked fleet worker: the signals as a new process has them until its run installs them."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def name_of(exc: BaseException) -> str:
    """The signal an interruption stands for (a plain ``KeyboardInterrupt`` is SIGINT's)."""
    return str(exc.args[0]) if isinstance(exc, Interruption) else "SIGINT"


class InterruptedEarly(VqAdminError):
    """A run interrupted before its lane started: nothing was changed (exit 130)."""

    outcome = Outcome.INTERRUPTED


def early_error(exc: BaseException) -> InterruptedEarly:
    return InterruptedEarly(f"vq-admin received {name_of(exc)} before the run started; {READ_ONLY_RAN}; rerun it")


def finish_early(prog: str, error: VqAdminError, document: JsonObject | None) -> int:
    """A run that ended with *error* before any verb printed its own document (interrupted: 130): *document*
    (under ``--json``) and one line on stderr; its exit status."""
    if document is not None:
        from .report.envelope import write

        write(document)
    from .report.output import safe_message

    print(f"{prog}: {error.outcome.value}: {safe_message(error.message)}", file=sys.stderr, flush=True)
    return error.outcome.exit_code
