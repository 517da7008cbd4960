"""Transitional: the old fault-injection calls, forwarding to :mod:`vq_admin.agent.failpoints`.

Every test-only switch now lives in :mod:`vq_admin.agent.failpoints`; this
module reads nothing itself.  It is kept only so that code written against
the old names (``faults.step_boundary``, ``faults.next_call``) keeps
working while parallel changes merge; new code calls ``failpoint(...)``, and
this module goes once nothing imports it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .agent.failpoints import enabled, failpoint


def active() -> bool:
    return enabled()


def next_call(argv: Sequence[str], where: str) -> str | None:
    """The ``call`` failpoint."""
    return failpoint("call", where, *argv)


def step_boundary(name: str, when: str) -> None:
    """The ``step-before`` (*when* = "before") or ``step-after`` failpoint."""
    if when == "before":
        failpoint("step-before", name)
    else:
        failpoint("step-after", name)
