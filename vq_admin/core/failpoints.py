"""Failpoints: every test-only switch of vq-admin, declared here and nowhere else.

A failpoint is a named place in the code where the test suite can inject a
fault or shorten a wait.  Production code reaches a point with one call::

    from vq_admin.core.failpoints import failpoint

    mode = failpoint("call", where, *argv)      # None unless a test enabled it

Each point is declared once below (:func:`_point`), with the environment
variables that configure it and a docstring that says what it does.  All of
them are inert unless ``VQ_ADMIN_TESTING`` is exactly ``1``: without it this
module reads no other variable, and :func:`failpoint` returns ``None``
without looking at anything.  An operator's environment cannot trigger a
fault by accident.

The environment is read once, when this module is first imported (the
driver and the agent are short-lived processes); a test that drives
vq-admin inside its own process calls :func:`configure` with the
environment it wants.  No other module reads these variables.

The points: ``call``, ``step-before``, ``step-after``, ``mirror-before-push``,
``install-file-before-rename``, ``record-before-statement``, ``helper-rereads``, ``helper-reread-interval``
and ``lease-wait``.

Standard library only; Python 3.8 and later (the agent imports it on the
login host).  It is never imported on the launcher path.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    Handler = Callable[["Settings", tuple[str, ...]], "str | None"]

#: The one switch: every failpoint is inert unless this is exactly "1".
TESTING = "VQ_ADMIN_TESTING"
#: ``VQ_ADMIN_FAULT``'s ``call:N:MODE`` modes, and its ``step:NAME:MODE`` modes (each: when the step is killed).
MODES = ("drop-before", "drop-after", "timeout", "kill")
STEP_MODES = {"sigkill": "before", "sigkill-after": "after"}


class Settings:
    """What the test environment enabled (built once by :func:`configure`)."""

    def __init__(self, values: dict[str, str], calls: dict[int, str], steps: set[tuple[str, str]]) -> None:
        self.values = values
        self.calls = calls
        self.steps = steps
        self.count = 0

    def log(self, entry: dict[str, object]) -> None:
        path = self.values.get("VQ_ADMIN_FAULT_LOG")
        if path:
            import json

            with open(path, "a") as fh:
                fh.write(json.dumps(entry) + "\n")


class Failpoint(NamedTuple):
    """One declared point: its name, the variables that configure it, its handler and what it does."""

    name: str
    variables: tuple[str, ...]
    handler: Handler
    doc: str


#: Every point, by name.
POINTS: dict[str, Failpoint] = {}


def _point(handler: Handler, name: str, *variables: str) -> None:
    """Declare the point *name*, configured by *variables*, answered by *handler* (its docstring says how)."""
    POINTS[name] = Failpoint(name, variables, handler, (handler.__doc__ or "").strip())


def _sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _call(settings: Settings, args: tuple[str, ...]) -> str | None:
    """Every external command vq-admin runs (``args``: where, then the argv), counted from 1 in this process.

    ``VQ_ADMIN_FAULT=call:N:MODE`` returns MODE for the N-th command; the
    caller applies it: ``drop-before`` (not run, reported as ssh's exit 255),
    ``drop-after`` (runs to its end, then reported as exit 255: the session
    dropped after the command finished), ``timeout`` (runs, then reported as
    vq-admin's own timeout), ``kill`` (runs, then reported as killed by
    SIGKILL, return code -9).  ``VQ_ADMIN_FAULT_LOG=PATH`` appends one JSON
    line per command (``index``, ``where``, ``argv``, ``fault``).
    """
    settings.count += 1
    mode = settings.calls.get(settings.count)
    where, argv = (args[0], list(args[1:7])) if args else ("", [])
    settings.log({"index": settings.count, "where": where, "argv": argv, "fault": mode})
    return mode


_point(_call, "call", "VQ_ADMIN_FAULT", "VQ_ADMIN_FAULT_LOG")


def _step_point(when: str, doc: str) -> None:
    """Declare ``step-<when>`` (documented by *doc*): it logs the boundary and SIGKILLs vq-admin where a rule says."""
    def handler(settings: Settings, args: tuple[str, ...]) -> str | None:
        name = args[0] if args else ""
        settings.log({"step": name, "when": when})
        if (name, when) in settings.steps:
            _sigkill()
        return None

    handler.__doc__ = doc
    _point(handler, f"step-{when}", "VQ_ADMIN_FAULT", "VQ_ADMIN_FAULT_LOG")


_step_point("before", """Right before a step starts (``args``: the step's name).

    ``VQ_ADMIN_FAULT=step:NAME:sigkill`` SIGKILLs vq-admin itself there;
    ``VQ_ADMIN_FAULT_LOG`` records the boundary (``step``, ``when``).
    """)
_step_point("after", """Right after a step's result was recorded (``args``: the step's name).

    ``VQ_ADMIN_FAULT=step:NAME:sigkill-after`` SIGKILLs vq-admin itself
    there; ``VQ_ADMIN_FAULT_LOG`` records the boundary.
    """)


def _declare(name: str, variable: str, doc: str, *, crash: str | None = None) -> None:
    """Declare the point *name*, configured by *variable* alone and documented by *doc*: with *crash*, it
    SIGKILLs this process when *variable* is *crash*; else it returns *variable*'s value as given."""
    def handler(settings: Settings, args: tuple[str, ...]) -> str | None:
        value = settings.values.get(variable)
        if crash is None:
            return value
        if value == crash:
            _sigkill()
        return None

    handler.__doc__ = doc
    _point(handler, name, variable)


_declare("mirror-before-push", "VQ_ADMIN_TEST_HOOK_BEFORE_PUSH",
         """Between the mirror feed's read and its push: returns the executable
    named by ``VQ_ADMIN_TEST_HOOK_BEFORE_PUSH``, which the feed runs as
    ``HOOK MIRROR_PATH`` (a test moves the mirror under the feed).""")
_declare("install-file-before-rename", "VQ_ADMIN_AGENT_CRASH", crash="before-rename", doc="""In the agent's
    ``install-file``, between the write of the temporary file and the rename: ``VQ_ADMIN_AGENT_CRASH=before-rename``
    SIGKILLs the agent there (the old file must survive whole).""")
_declare("record-before-statement", "VQ_ADMIN_AGENT_CRASH", crash="record-before-statement", doc="""In the agent's
    record append, between the signature's write and the statement's: ``VQ_ADMIN_AGENT_CRASH=record-before-statement``
    SIGKILLs the agent there (every reader must still accept the record, and the next append must not be refused).""")
_declare("helper-rereads", "VQ_ADMIN_HELPER_REREADS", """The helper read-back's count of re-reads: returns
    ``VQ_ADMIN_HELPER_REREADS`` as given (the caller parses and clamps it to 0-50).""")
_declare("helper-reread-interval", "VQ_ADMIN_HELPER_REREAD_INTERVAL", """The seconds between two helper
    read-backs: returns ``VQ_ADMIN_HELPER_REREAD_INTERVAL`` as given (the caller parses and clamps it to 0-60).""")
_declare("lease-wait", "VQ_ADMIN_LEASE_WAIT", """The seconds the driver waits for the lease's answer line: returns
    ``VQ_ADMIN_LEASE_WAIT`` as given (the caller parses and clamps it to 1-60); the session's verify keeps
    verify_timeout_seconds.""")


def variables() -> tuple[str, ...]:
    """Every environment variable a failpoint reads, the switch first."""
    return tuple(dict.fromkeys([TESTING, *(v for point in POINTS.values() for v in point.variables)]))


def load(environ: Mapping[str, str]) -> Settings | None:
    """The settings *environ* enables, or None when the switch is off (then
    nothing but ``VQ_ADMIN_TESTING`` is read).  A malformed
    ``VQ_ADMIN_FAULT`` rule is a ValueError naming it."""
    if environ.get(TESTING) != "1":
        return None
    values = {name: environ[name] for name in variables()[1:] if name in environ}
    calls: dict[int, str] = {}
    steps: set[tuple[str, str]] = set()
    for rule in filter(None, (r.strip() for r in values.get("VQ_ADMIN_FAULT", "").split(","))):
        kind, _, rest = rule.partition(":")
        target, _, mode = rest.rpartition(":")
        if kind == "call" and target.isdigit() and mode in MODES:
            calls[int(target)] = mode
        elif kind == "step" and target and mode in STEP_MODES:
            steps.add((target, STEP_MODES[mode]))
        else:
            raise ValueError(f"VQ_ADMIN_FAULT: bad rule {rule!r}")
    return Settings(values, calls, steps)


_settings: Settings | None = None


def configure(environ: Mapping[str, str] | None = None) -> None:
    """(Re)read the switches from *environ* (default: this process's
    environment) and restart the call count."""
    global _settings
    _settings = load(os.environ if environ is None else environ)


def enabled() -> bool:
    """Whether any failpoint can fire in this process."""
    return _settings is not None


def failpoint(name: str, *args: str) -> str | None:
    """Reach the declared point *name* (``args``: what it is told of the
    place); its configured value, or None.  Inert (None, nothing read)
    unless ``VQ_ADMIN_TESTING=1``; an undeclared name is a KeyError."""
    point = POINTS[name]
    if _settings is None:
        return None
    return point.handler(_settings, args)


configure()
