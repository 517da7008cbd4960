"""A plan is the ordered list of steps of one run; a receipt is that plan with
each step's result filled in.

``--dry-run`` prints the plan (``Step.planned_argv``: the exact argv, with
values only known at run time as named :class:`Slot` markers, printed as
``<stage>``) and runs nothing.  :func:`execute` runs exactly the planned argv
with its slots filled (``execute(step, transport, timeout=..., stage=path)``,
:func:`filled`) and records the filled argv, where it ran, its exit status and
its duration into the same step.  Provider hooks are called once, when the plan
is made; the slots they placed are filled here (see ``vq_admin_hookspecs.slots``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, TypeVar, Union

from msgspec import UNSET, UnsetType
from vq_admin_hookspecs import ProviderCommand, Slot
from vq_admin_hookspecs.slots import place, place_env

from .core.failpoints import failpoint
from .core.securepath import command_problem
from .document import Document, JsonObject
from .report.outcome import Refused, VqAdminError
from .ssh.transport import LocalTransport, RunResult, Transport


class StepRecord(Document, frozen=True, kw_only=True):
    """A step as a receipt, a dry run or a verify document lists it; a template (the dry run's
    ``when_needed``) has no status, exit status or duration."""

    name: str
    where: str
    purpose: str
    status: str | UnsetType = UNSET
    argv: list[str]
    exit_code: int | None | UnsetType = UNSET
    seconds: float | None | UnsetType = UNSET
    env: dict[str, str] | UnsetType = UNSET
    detail: str | UnsetType = UNSET


@dataclass
class Step:
    name: str
    where: str
    planned_argv: list[str]
    purpose: str
    env: dict[str, str] = field(default_factory=dict)
    # filled in by execution (the planned argv and env above are never overwritten)
    status: str = "planned"  # planned | ok | failed | interrupted | skipped
    argv: list[str] | None = None
    ran_env: dict[str, str] | None = None
    exit_code: int | None = None
    seconds: float | None = None
    detail: str | None = None

    def record(self) -> StepRecord:
        env = self.ran_env if self.ran_env is not None else self.env
        return StepRecord(name=self.name, where=self.where, purpose=self.purpose, status=self.status,
                          argv=self.argv if self.argv is not None else self.planned_argv, exit_code=self.exit_code,
                          seconds=None if self.seconds is None else round(self.seconds, 3),
                          env=dict(env) if env else UNSET, detail=self.detail or UNSET)


@dataclass
class Plan:
    """The steps of one run, in order, and the steps it adds only when it needs them.

    A step that runs only on a contingency (a second read of a lagging shared
    filesystem, the read-back verify after an interrupted deploy, reconciling a
    dropped batch job) is planned like any other, as a **template** with its
    slots, in :attr:`when_needed`; :meth:`again` adds a copy of a template (or
    of a planned step) to :attr:`steps` under its own name when the run needs
    it, and that copy runs through :func:`execute` like the rest.  The dry run
    lists the templates; the receipt lists the copies that ran."""

    steps: list[Step] = field(default_factory=list)
    when_needed: list[Step] = field(default_factory=list)

    def add(self, name: str, where: str, argv: Sequence[str], purpose: str, env: dict[str, str] | None = None) -> Step:
        step = Step(name, where, [_word(a) for a in argv], purpose, dict(env or {}))
        self.steps.append(step)
        return step

    def add_when_needed(self, name: str, where: str, argv: Sequence[str], purpose: str,
                        env: dict[str, str] | None = None) -> Step:
        """Plan a template that :meth:`again` copies into the run when it is needed."""
        if any(s.name == name for s in self.when_needed):
            raise ValueError(f"a step {name!r} is already planned for when it is needed")
        step = Step(name, where, [_word(a) for a in argv], purpose, dict(env or {}))
        self.when_needed.append(step)
        return step

    def again(self, template: str | Step, name: str, purpose: str | None = None, *, after: Step | None = None) -> Step:
        """A fresh copy of *template* (a step planned for when it is needed, or a planned step), named
        *name*, added to the steps (after *after*, else at the end): its planned argv and environment,
        slots and all, are the template's."""
        if self.has(name):
            raise ValueError(f"the plan already has a step {name!r}")
        if isinstance(template, str):
            template = next((s for s in self.when_needed if s.name == template), None) or self.get(template)
        step = Step(name, template.where, list(template.planned_argv), purpose or template.purpose, dict(template.env))
        self.steps.insert(self.steps.index(after) + 1 if after is not None else len(self.steps), step)
        return step

    def get(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.steps)

    def records(self) -> list[StepRecord]:
        return [s.record() for s in self.steps]

    def to_list(self) -> list[JsonObject]:
        """The steps as the receipt lists them."""
        return [s.record().to_value() for s in self.steps]

    def skip_unrun(self) -> None:
        """A run that ended: every step it never reached is ``skipped``."""
        for step in self.steps:
            if step.status == "planned":
                step.status = "skipped"

    def when_needed_list(self) -> list[JsonObject]:
        """The templates, as the dry run shows them (name, where, purpose, planned argv and env)."""
        return [s.record().replace(status=UNSET, exit_code=UNSET, seconds=UNSET).to_value() for s in self.when_needed]


#: What fills a slot: a string for a one-word slot, a list (or tuple) of strings for a list slot.
SlotValue = Union[str, Sequence[str]]


class SlotError(VqAdminError):
    """A step was asked to run with a slot left unfilled, or with a value for a slot it does not
    hold: a defect of vq-admin, refused before anything runs."""


def _word(word: str) -> str:
    return word if isinstance(word, Slot) else str(word)


def slots(step: Step) -> set[str]:
    """The names of the slots in *step*'s planned argv and environment."""
    return {w.name for w in [*step.planned_argv, *step.env.values()] if isinstance(w, Slot)}


def offer(step: Step, **values: SlotValue) -> dict[str, SlotValue]:
    """The *values* whose slots *step* holds: for a step a provider built, which may not have
    placed every slot it was offered (a provider that ignores ``source_archive``)."""
    held = slots(step)
    return {name: value for name, value in values.items() if name in held}


def fill(words: Sequence[str], values: Mapping[str, SlotValue]) -> list[str]:
    """*words* with every slot filled from *values*: a one-word slot with a string, a list slot
    with a list of strings (each its own word); a missing value, a list for a one-word slot or
    anything but a list of strings for a list slot raises :class:`SlotError`."""
    filled: list[str] = []
    for word in words:
        if isinstance(word, Slot):
            if word.name not in values:
                raise SlotError(f"the planned word {str(word)!r} has no value for its slot {word.name!r}; "
                                "the step was not run")
            value = values[word.name]
            if word.many:
                if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                    raise SlotError(f"the planned word {str(word)!r} is a list slot: its value {word.name!r} must be "
                                    f"a list of strings, not {type(value).__name__}; the step was not run")
                filled.extend(word.fill_words(list(value)))
            elif isinstance(value, (list, tuple)):
                raise SlotError(f"the planned word {str(word)!r} stands for one word: its value {word.name!r} must "
                                f"be a string, not a {type(value).__name__}; the step was not run")
            else:
                filled.append(word.fill(str(value)))
        else:
            filled.append(str(word))
    return filled


def fill_env(name: str, value: str, values: Mapping[str, SlotValue]) -> str:
    """One environment value with its slot filled (a list slot is never an environment value)."""
    if isinstance(value, Slot) and value.many:
        raise SlotError(f"env {name}: the list slot {str(value)!r} is never an environment value; the step was not run")
    return fill([value], values)[0]


def filled(step: Step, **values: SlotValue) -> tuple[list[str], dict[str, str]]:
    """*step*'s planned argv and environment with its slots filled; every slot must get a value
    and every value must name a slot of the step (:class:`SlotError` otherwise)."""
    unknown = sorted(set(values) - slots(step))
    if unknown:
        raise SlotError(f"{step.name}: no slot {', '.join(unknown)} in the planned argv; the step was not run")
    argv = fill(step.planned_argv, values)
    env = {name: fill_env(name, value, values) for name, value in step.env.items()}
    return argv, env


def place_command(command: ProviderCommand, *offered: Slot) -> ProviderCommand:
    """A provider's answer with each *offered* slot it holds placed, in its argv and its environment
    (the planned command, which :func:`fill_command` fills)."""
    return ProviderCommand(argv=tuple(place(command.argv, offered)),
                           env=tuple(place_env(dict(command.env), offered).items()))


def fill_command(command: ProviderCommand, **values: SlotValue) -> ProviderCommand:
    """A planned provider command with its slots filled (for what is said of it: the narration and
    the result of the allocation and detached deploys, whose step fills its own planned argv)."""
    env = tuple((name, fill_env(name, value, values)) for name, value in command.env)
    return ProviderCommand(argv=tuple(fill(command.argv, values)), env=env)


def execute(step: Step, transport: Transport, argv: Sequence[str] | None = None, *, timeout: float,
            stdin: bytes | str | None = None, env: dict[str, str] | None = None,
            watch: Callable[..., None] | None = None, values: Mapping[str, SlotValue] | None = None,
            **slot_values: SlotValue) -> RunResult:
    """Run *step* through *transport* and record the result in it.

    Without *argv*, what runs is exactly the planned argv (and environment) with its slots
    filled from the keyword arguments (``stage=PATH``, a list slot ``keep=[SHA, ...]``) and
    *values* (:func:`filled`; an unfilled or unknown slot, or a value of the wrong kind, is
    refused before anything runs).  An explicit *argv* or *env* is refused too: what runs is the plan."""
    if argv is not None or env is not None:
        raise SlotError(f"{step.name}: an explicit argv or environment instead of the planned one; "
                        "the step was not run")
    planned_argv, planned_env = filled(step, **{**(values or {}), **slot_values})
    _start(step, transport, planned_argv, planned_env if step.env else None)
    result = transport.run(step.argv or [], timeout=timeout, env=step.ran_env or None, stdin=stdin,
                           **({"watch": watch} if watch is not None else {}))
    record(step, result)
    settled(step)
    return result


Streamed = TypeVar("Streamed")


def execute_stream(step: Step, transport: Transport, call: Callable[[list[str]], Streamed], *,
                   values: Mapping[str, SlotValue] | None = None, **slot_values: SlotValue) -> Streamed:
    """Run *step*'s planned argv, slots filled as :func:`execute` fills them, through *call* (which
    streams the answer as it arrives and records the step's result itself: the allocation and
    detached deploys and their reconciles, :mod:`vq_admin.lanes.allocation_stream`).  The step's
    start (its failpoint, the filled argv in the receipt, the driver's check of a local command) is
    :func:`execute`'s; its end is the caller's, which still has the streamed answer to settle
    (transcripts to rename into place) and calls :func:`settled` once it has.  A streamed step
    carries its environment inside the agent's argv, never in the step's own."""
    argv, env = filled(step, **{**(values or {}), **slot_values})
    if env:
        raise SlotError(f"{step.name}: a streamed step has no environment of its own; the step was not run")
    _start(step, transport, argv, None)
    return call(step.argv or [])


def settled(step: Step) -> None:
    """The end of a step whose result is recorded and settled (its ``step-after`` failpoint)."""
    failpoint("step-after", step.name)


def _start(step: Step, transport: Transport, argv: Sequence[str], env: dict[str, str] | None) -> None:
    """What every run of a step begins with: its failpoint, the filled argv and env recorded (the
    planned ones, slots and all, stay as planned), the driver's own check of a local command."""
    failpoint("step-before", step.name)
    step.argv = [str(a) for a in argv]
    step.ran_env = dict(env) if env is not None else None
    refuse_unsafe_command(step, transport, step.argv)


def refuse_unsafe_command(step: Step, transport: Transport, argv: Sequence[str]) -> None:
    """A local command with a word another user could have replaced is never run (exit 77):
    every absolute word counts, interpreter and script alike."""
    if isinstance(transport, LocalTransport) and argv:
        problem = command_problem(argv)
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


def mark_local(step: Step, ok: bool, started: float, detail: str | None = None,
               argv: list[str] | None = None) -> None:
    """Record a step that ran inside vq-admin itself (no external command); *argv*: its planned argv
    as the run filled it (default: the planned argv, which has no slot)."""
    step.argv = step.planned_argv if argv is None else argv
    step.status = "ok" if ok else "failed"
    step.exit_code = 0 if ok else 1
    step.seconds = time.monotonic() - started
    step.detail = detail
    settled(step)
