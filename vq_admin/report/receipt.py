"""The receipt: one versioned JSON object per run (CONTRACT section 6)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from . import envelope
from .outcome import Outcome
from .sections import (Activation, CommandOutput, Confirm, Deploy, Install, Interruption, LeaseRecord, Metrics,
                       Mirror, PreviousAttempt, Prune, Readback, Record, Registry, Reverted, Rollback, Section, Source,
                       Stage, Verify)
from ..document import Document, JsonObject, JsonValue
from ..plan import Plan

if TYPE_CHECKING:
    from ..ssh.transport import RunResult

SCHEMA = envelope.SCHEMAS["receipt"]
PLAN_SCHEMA = envelope.SCHEMAS["plan"]
#: The most of one stream of a command's output a receipt keeps: its head and tail, half each.
OUTPUT_KEPT = 2 << 20


def _head_and_tail(data: bytes) -> str:
    """*data* as text, or its head and tail (:data:`OUTPUT_KEPT` bytes in all) around a marker."""
    if len(data) <= OUTPUT_KEPT:
        return data.decode("utf-8", "replace")
    half = OUTPUT_KEPT // 2
    return head_and_tail(data[:half], data[-half:], len(data))


def head_and_tail(head: bytes, tail: bytes, total: int) -> str:
    """The *head* and *tail* of *total* bytes of output as text, around a marker naming what was left out."""
    cut = total - len(head) - len(tail)
    return (head.decode("utf-8", "replace") + f"\n[... {cut} bytes left out: see the transcript ...]\n"
            + tail.decode("utf-8", "replace"))


METRIC_RE = re.compile(r"^VQ-DEPLOY-METRIC ([A-Za-z0-9_.-]{1,64})=(.*)$", re.MULTILINE)


def parse_metrics(*texts: str) -> Metrics:
    """``VQ-DEPLOY-METRIC name=value`` lines; finite numbers become numbers, anything else stays text."""
    metrics: Metrics = {}
    for text in texts:
        for name, raw in METRIC_RE.findall(text):
            raw = raw.strip()
            value: int | float | str = raw
            for convert in (int, float):
                try:
                    value = convert(raw)
                    break
                except ValueError:
                    continue
            if isinstance(value, float) and not math.isfinite(value):
                value = raw  # "nan", "inf", "1e999": JSON has no such number; keep the text
            metrics[name] = value
    return metrics


#: The optional sections of a receipt, in order: each is a declared field of
#: :class:`Receipt`, printed only when set (``notes`` when not empty, ``stored``
#: only when false).  Setting any other section is a programming error.
SECTIONS = ("provider", "build_place", "stage", "lease", "previous_attempt", "interruption", "activation",
            "rollback", "prune", "install", "registry", "confirm", "reverted", "record", "notes", "rerun", "stored",
            "not_stored", "traceback")


class UndeclaredSection(AttributeError):
    """A section no receipt declares: a bug in vq-admin, never a silent overwrite of a declared key."""


@dataclass
class Receipt:
    lane: str
    host: str
    program: str | None
    expected_sha: str | None
    tag: str | None
    started_at: str
    plan: Plan = field(default_factory=Plan)
    id: str | None = None
    outcome: Outcome | None = None
    finished_at: str | None = None
    deploy: Deploy = field(default_factory=Deploy)
    command_output: CommandOutput = field(default_factory=CommandOutput)
    metrics: Metrics = field(default_factory=dict)
    metrics_complete: bool = False
    verify: Verify = field(default_factory=Verify)
    mirror: Mirror | None = None
    source: Source | None = None
    errors: list[str] = field(default_factory=list)
    readback: Readback | None = None
    # -- optional sections (SECTIONS) --
    #: the provider that ran the lane's operations, and where the build ran
    provider: str | None = None
    build_place: str | None = None
    #: the staged source directory on the build host
    stage: Stage | None = None
    #: the host-side lease (CONTRACT section 9)
    lease: LeaseRecord | None = None
    #: an earlier allocation attempt this run reconciled
    previous_attempt: PreviousAttempt | None = None
    #: which step a dropped transport cut, and what it left behind
    interruption: Interruption | None = None
    #: the helper activation record (helper lane)
    activation: Activation | None = None
    #: a rollback's generations (CONTRACT section 8)
    rollback: Rollback | None = None
    #: a prune's keep set and what it removed (CONTRACT section 8)
    prune: Prune | None = None
    #: what ``provider install`` installed: source, destination, old and new SHA-256, interpreter
    install: Install | None = None
    #: the registry entry of the verified launcher (runtime lane)
    registry: Registry | None = None
    #: the confirmation job of the new generation, and the revert a failed one caused (CONTRACT section 13)
    confirm: Confirm | None = None
    reverted: Reverted | None = None
    #: the host's record: the entries this run imported, and the entry it appended (CONTRACT section 12)
    record: Record | None = None
    notes: list[str] = field(default_factory=list)
    #: the argv that re-runs this verb (rollback and prune name their own)
    rerun: list[str] | None = None
    #: false when the state directory could not take the receipt
    stored: bool = True
    not_stored: list[str] | None = None
    #: an internal error's traceback
    traceback: str | None = None
    #: the whole of each stream :meth:`record_command` kept only the head and tail of (not a section)
    transcript: dict[str, bytes] = field(default_factory=dict, repr=False)

    def set_section(self, name: str, value: Any) -> None:
        """Set the declared section *name*; any other name raises :class:`UndeclaredSection`."""
        if name not in SECTIONS:
            raise UndeclaredSection(f"receipt section {name!r} is not declared (declared: {', '.join(SECTIONS)})")
        setattr(self, name, value)

    def set_sections(self, sections: dict[str, Section | JsonValue] | None) -> None:
        for name, value in (sections or {}).items():
            self.set_section(name, value)

    def sections(self) -> JsonObject:
        """The optional sections that are set, in declared order."""
        found: JsonObject = {}
        for name in SECTIONS:
            value = getattr(self, name)
            if name == "stored":
                if value is False:
                    found[name] = False
            elif name == "notes":
                if value:
                    found[name] = list(value)
            elif value is not None:
                found[name] = value.to_value() if isinstance(value, Document) else value
        return found

    def record_command(self, result: RunResult, where: str) -> None:
        """A provider command run to its end on a fixed host: exit status, output, metrics.

        Each stream's head and tail (:data:`OUTPUT_KEPT` bytes in all) are kept in the receipt; a
        longer one is kept whole (as captured) in the receipt's transcript directory when the
        receipt is stored (:attr:`transcript`), and the receipt says so."""
        stdout, stderr = result.text(), result.stderr.decode("utf-8", "replace")
        complete = result.interrupted is None and not result.stdout_truncated
        self.deploy = Deploy(exit_code=result.exit_code, where=where, interrupted=result.interrupted)
        self.transcript = {name: data for name, data in (("stdout", result.stdout), ("stderr", result.stderr))
                           if len(data) > OUTPUT_KEPT}
        self.command_output = CommandOutput(
            complete=complete,
            reason=None if complete else "unavailable",
            log_dir=None,
            observations=0,
            stdout=_head_and_tail(result.stdout),
            stderr=_head_and_tail(result.stderr),
        )
        if self.transcript:
            self.command_output = self.command_output.replace(
                truncated=True, kept=(f"the first and last {OUTPUT_KEPT // 2} bytes of "
                                      f"{' and '.join(self.transcript)}; the whole output is in the transcript"))
        self.metrics = parse_metrics(stdout, stderr)
        self.metrics_complete = complete

    def keep_transcript(self, directory: Callable[[], str], write: Callable[[str, bytes], str]) -> None:
        """Store the streams :meth:`record_command` cut in the receipt's transcript *directory*
        (``write(name, data)`` gives each file's path) and name it in ``command_output``."""
        if self.transcript:
            for name, data in self.transcript.items():
                write(name, data)
            self.command_output = self.command_output.replace(transcript=directory())
            self.transcript = {}

    def finish(self, outcome: Outcome, finished_at: str) -> Receipt:
        self.outcome = outcome
        self.finished_at = finished_at
        return self

    def _identity(self) -> JsonObject:
        """What the run maintains: its lane, host and program, and the identity it expects."""
        return {key: getattr(self, key) for key in ("lane", "host", "program", "expected_sha", "tag")}

    def to_dict(self) -> JsonObject:
        """The receipt (CONTRACT section 6) in its envelope (:mod:`vq_admin.report.envelope`)."""
        assert self.outcome is not None
        data = {
            "id": self.id,
            **self._identity(),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "steps": self.plan.to_list(),
            "deploy": self.deploy.to_value(),
            "command_output": self.command_output.to_value(),
            "metrics": self.metrics,
            "metrics_complete": self.metrics_complete,
            "verify": self.verify.to_value(),
            "mirror": None if self.mirror is None else self.mirror.to_value(),
            "source": None if self.source is None else self.source.to_value(),
            "readback": None if self.readback is None else self.readback.to_value(),
        }
        data.update(self.sections())
        return envelope.document(SCHEMA, self.outcome, data, self.errors)

    def plan_dict(self) -> JsonObject:
        """What ``--dry-run`` prints: the plan, nothing executed (outcome ``ok``: nothing was refused)."""
        data = {
            "dry_run": True,
            **self._identity(),
            "steps": [s.record().replace(status="planned").to_value() for s in self.plan.steps],
        }
        if self.plan.when_needed:
            data["when_needed"] = self.plan.when_needed_list()
        data.update(self.sections())
        return envelope.document(PLAN_SCHEMA, Outcome.OK, data, self.errors)
