"""A plan is the ordered list of steps of one run; a receipt is that plan with
each step's result filled in.

``--dry-run`` prints the plan (``Step.planned_argv``: the exact argv, with
values only known at run time shown as ``<stage>``-style placeholders) and
runs nothing.  Executing a step records its actual argv, where it ran, its
exit status and its duration into the same object.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import permissions
from .agent.failpoints import failpoint
from .outcome import Refused
from .transport import LocalTransport, RunResult, Transport


@dataclass
class Step:
    name: str
    where: str
    planned_argv: list[str]
    purpose: str
    env: dict[str, str] = field(default_factory=dict)
    # filled in by execution
    status: str = "planned"  # planned | ok | failed | interrupted | skipped
    argv: list[str] | None = None
    exit_code: int | None = None
    seconds: float | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "where": self.where,
            "purpose": self.purpose,
            "status": self.status,
            "argv": self.argv if self.argv is not None else self.planned_argv,
            "exit_code": self.exit_code,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
        }
        if self.env:
            data["env"] = dict(self.env)
        if self.detail:
            data["detail"] = self.detail
        return data


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)

    def add(self, name: str, where: str, argv: Sequence[str], purpose: str, env: dict[str, str] | None = None) -> Step:
        step = Step(name, where, [str(a) for a in argv], purpose, dict(env or {}))
        self.steps.append(step)
        return step

    def get(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.steps)

    def to_list(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.steps]


def execute(step: Step, transport: Transport, argv: Sequence[str], *, timeout: float,
            stdin: bytes | str | None = None, env: dict[str, str] | None = None,
            watch: Callable[..., None] | None = None) -> RunResult:
    """Run *argv* for *step* through *transport* and record the result in it."""
    failpoint("step-before", step.name)
    step.argv = [str(a) for a in argv]
    if env is not None:
        step.env = dict(env)
    refuse_unsafe_command(step, transport, step.argv)
    result = transport.run(step.argv, timeout=timeout, env=step.env or None, stdin=stdin,
                           **({"watch": watch} if watch is not None else {}))
    record(step, result)
    failpoint("step-after", step.name)
    return result


def refuse_unsafe_command(step: Step, transport: Transport, argv: Sequence[str]) -> None:
    """A local command with a word another user could have replaced is never run (exit 77):
    every absolute word counts, interpreter and script alike."""
    if isinstance(transport, LocalTransport) and argv:
        problem = permissions.command_problem(list(argv))
        if problem:
            step.status, step.detail = "failed", problem
            raise Refused(f"{step.name}: {problem}; refusing to run it")


def record(step: Step, result: RunResult) -> None:
    step.exit_code = result.exit_code
    step.seconds = result.seconds
    if result.interrupted:
        step.status = "interrupted"
        step.detail = result.describe()
    elif result.exit_code == 0:
        step.status = "ok"
    else:
        step.status = "failed"
        tail = result.error_text().splitlines()[-3:]
        step.detail = result.describe() + (": " + " | ".join(tail) if tail else "")


def mark_local(step: Step, ok: bool, started: float, detail: str | None = None) -> None:
    """Record a step that ran inside vq-admin itself (no external command)."""
    step.argv = step.planned_argv
    step.status = "ok" if ok else "failed"
    step.exit_code = 0 if ok else 1
    step.seconds = time.monotonic() - started
    step.detail = detail
    failpoint("step-after", step.name)
