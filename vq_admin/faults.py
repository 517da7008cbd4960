"""Test-only fault injection: inert unless ``VQ_ADMIN_TESTING=1``.

Every external command vq-admin runs passes through one choke point
(:func:`vq_admin.transport.run_local_argv`, and the streamed allocation call),
and every step of a lane through :func:`vq_admin.plan.execute` or
:func:`vq_admin.plan.mark_local`.  With ``VQ_ADMIN_TESTING=1``, the variable
``VQ_ADMIN_FAULT`` (comma-separated rules) injects faults there:

``call:N:MODE``
    the N-th external command of this process (counting from 1):

    * ``drop-before``: not run at all; reported as ssh's exit 255 (a transport
      that never connected);
    * ``drop-after``: runs to its end, then reported as exit 255 (the session
      dropped after the remote command finished: the classic unknown outcome);
    * ``timeout``: runs to its end, then reported as vq-admin's own timeout;
    * ``kill``: runs to its end, then reported as killed by SIGKILL (return
      code -9: the ssh client, or a local command, ended by a signal, which
      is an interrupted transport, never the command's exit status).

``step:NAME:sigkill`` / ``step:NAME:sigkill-after``
    SIGKILL vq-admin itself right before step NAME starts, or right after its
    result was recorded (crash consistency at every step boundary).

``VQ_ADMIN_FAULT_LOG=PATH`` appends one JSON line per external command
(``index``, ``where``, ``argv``) and per step boundary, so a test can list
every call of a run before injecting faults into each.

Outside tests none of this is read: ``VQ_ADMIN_TESTING`` must be exactly
``1``, so an operator's environment cannot trigger it by accident.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from typing import Any

MODES = ("drop-before", "drop-after", "timeout", "kill")
STEP_MODES = ("sigkill", "sigkill-after")


@dataclass(frozen=True)
class Rules:
    calls: dict[int, str]
    steps: dict[tuple[str, str], bool]
    log: str | None


def _load() -> Rules | None:
    if os.environ.get("VQ_ADMIN_TESTING") != "1":
        return None
    calls: dict[int, str] = {}
    steps: dict[tuple[str, str], bool] = {}
    for rule in filter(None, (r.strip() for r in os.environ.get("VQ_ADMIN_FAULT", "").split(","))):
        kind, _, rest = rule.partition(":")
        target, _, mode = rest.rpartition(":")
        if kind == "call" and target.isdigit() and mode in MODES:
            calls[int(target)] = mode
        elif kind == "step" and target and mode in STEP_MODES:
            steps[(target, "before" if mode == "sigkill" else "after")] = True
        else:
            raise ValueError(f"VQ_ADMIN_FAULT: bad rule {rule!r}")
    return Rules(calls, steps, os.environ.get("VQ_ADMIN_FAULT_LOG") or None)


_RULES = _load()
_count = 0


def active() -> bool:
    return _RULES is not None


def _log(entry: dict[str, Any]) -> None:
    if _RULES and _RULES.log:
        with open(_RULES.log, "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def next_call(argv: list[str], where: str) -> str | None:
    """Count one external command; return the fault mode to apply, if any."""
    global _count
    if _RULES is None:
        return None
    _count += 1
    mode = _RULES.calls.get(_count)
    _log({"index": _count, "where": where, "argv": argv[:6], "fault": mode})
    return mode


def step_boundary(name: str, when: str) -> None:
    """``when`` is "before" or "after"; SIGKILL ourselves when a rule says so."""
    if _RULES is None:
        return
    _log({"step": name, "when": when})
    if _RULES.steps.get((name, when)):
        os.kill(os.getpid(), signal.SIGKILL)
