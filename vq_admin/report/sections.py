"""The receipt's sections (CONTRACT section 6, docs/json.md's field tables): one frozen type each.

A member whose default is ``UNSET`` is absent from the JSON until the run sets it; every other member is
always written (``None`` as ``null``).  A section never takes a member it does not declare
(``forbid_unknown_fields``): a new member is declared here and in docs/json.md
(tests/test_receipt_sections.py checks both)."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from ..document import Document, JsonObject, JsonValue


#: ``VQ-DEPLOY-METRIC name=value`` lines as the receipt keeps them: finite numbers as numbers, else the text.
Metrics = dict[str, int | float | str]


class Section(Document, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every receipt section."""


class Stage(Section, frozen=True, kw_only=True):
    """The staged source directory on the build host."""

    where: str
    dir: str


class Rollback(Section, frozen=True, kw_only=True):
    """A rollback (CONTRACT section 8): the generation it left, the one it made active, and how."""

    from_: str | None = msgspec.field(name="from")
    to: str | None
    via: str | None


class Reverted(Section, frozen=True, kw_only=True):
    """A failed confirmation's re-activation of the previous generation, and whether a verify proved it."""

    from_: str = msgspec.field(name="from")
    to: str
    proven: bool
    activate_exit_code: int | None


class Interruption(Section, frozen=True, kw_only=True):
    """Which step a dropped transport cut, and what it left behind."""

    step: str
    transport: str | None
    installed: str
    stage: str
    reclaimed_now: bool | UnsetType = UNSET


class Verify(Section, frozen=True, kw_only=True):
    """The verifications a run made, each a verification's document: before, after, of a revert, of a read-back."""

    pre: JsonObject | UnsetType = UNSET
    final: JsonObject | UnsetType = UNSET
    revert: JsonObject | UnsetType = UNSET
    readback: JsonObject | UnsetType = UNSET


class Readback(Section, frozen=True, kw_only=True):
    """What a run whose outcome was in doubt read, whether it proved it, and the command to run next."""

    read: str
    proven: bool | UnsetType = UNSET
    reason: str | UnsetType = UNSET
    dest_sha256: str | None | UnsetType = UNSET
    stage: str | None | UnsetType = UNSET
    build: str | UnsetType = UNSET
    preparer: str | UnsetType = UNSET
    job_id: JsonValue | UnsetType = UNSET
    job_state: JsonValue | UnsetType = UNSET
    attempt: JsonValue | UnsetType = UNSET
    attempt_dir: JsonValue | UnsetType = UNSET
    log_dir: JsonValue | UnsetType = UNSET
    pid: JsonValue | UnsetType = UNSET
    next_command: str | None | UnsetType = UNSET
    advice: str | UnsetType = UNSET


class Source(Section, frozen=True, kw_only=True):
    """The source the run built: the commit, its tags, and the staged archive's identity."""

    repo: str
    sha: str
    git_tree: str
    tag: str | None
    tags: list[str]
    archive_sha256: str | None
    tree_sha256: str | None
    archive_bytes: int | None


class Mirror(Section, frozen=True, kw_only=True):
    """The push-fed source mirror: where it is, the refs fed and the push (:mod:`vq_admin.source.mirror_feed`)."""

    mirror: str
    where: str
    url: str
    preparer_reads: str
    source_ref: str
    lane: str
    lane_branch: str
    refs: list[JsonObject]
    push: JsonObject


class Registry(Section, frozen=True, kw_only=True):
    """The registry entry of the verified launcher (runtime lane), or why none was written."""

    entry: str | None
    created: bool | UnsetType = UNSET
    conflict: str | None | UnsetType = UNSET
    error: str | UnsetType = UNSET


class Activation(Section, frozen=True, kw_only=True):
    """The helper lane's activation record, and where it is stored."""

    path: str
    schema: str
    host: str
    expected_sha: str | None
    tree_sha256: str | None
    archive_sha256: str | None
    git_tree: str
    identity: JsonObject
    reads: int
    agent: list[str]
    read_on: str
    receipt: str | None
    at: str


class Record(Section, frozen=True, kw_only=True):
    """The host's record (CONTRACT section 12): what this run imported, and the entries it appended."""

    imported: int | UnsetType = UNSET
    quarantine: list[str] | UnsetType = UNSET
    evidence: list[str] | UnsetType = UNSET
    not_evidence: list[str] | UnsetType = UNSET
    entry: str | None | UnsetType = UNSET
    signed: bool | UnsetType = UNSET
    unchanged: str | UnsetType = UNSET
    roots: str | None | UnsetType = UNSET
    error: str | UnsetType = UNSET


class Sibling(Document, frozen=True, kw_only=True):
    """A run of this run's own fleet rollout whose lease it waited for: one of :class:`Waited`'s."""

    run_id: str | None
    pid: int


class Waited(Section, frozen=True, kw_only=True):
    """How long a run waited for a held lane lock or lease, as ``--wait-lock`` allowed."""

    seconds: float
    wait_lock: float | None
    siblings: list[Sibling]


class AgentChecked(Section, frozen=True, kw_only=True):
    """The helper lane's check of the agent's words before its lease runs them (the last step of it)."""

    argv: list[str] | None
    status: str
    detail: str | None
    steps: list[JsonObject]  #: the check's plan steps (vq_admin.plan)


class LeaseRecord(Section, frozen=True, kw_only=True):
    """The host-side lease (CONTRACT section 9): where, the agent's words, and what came of taking it."""

    where: str
    argv: list[str]
    held: bool | UnsetType = UNSET
    status: str | UnsetType = UNSET  #: ``planned``: a dry run's
    seconds: float | UnsetType = UNSET
    lock: str | None | UnsetType = UNSET
    holder: JsonObject | None | UnsetType = UNSET  #: the holder's record, as the agent wrote it
    acquired_at: str | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET
    waited: Waited | UnsetType = UNSET
    agent_checked: AgentChecked | UnsetType = UNSET
    note: str | UnsetType = UNSET



class ConfirmOutput(Section, frozen=True, kw_only=True):
    """The confirmation job's output, bounded like a deploy's."""

    stdout: str
    stderr: str
    complete: bool
    log_dir: str
    transcript: str | None


class Accepted(Section, frozen=True, kw_only=True):
    """A regression accepted with ``--accept-regression``: its reason, and what regressed."""

    reason: str | None
    regressed: list[str] | None


class Confirm(Section, frozen=True, kw_only=True):
    """The confirmation job (CONTRACT section 13): the agent's verdict, and its output."""

    attempt_dir: str
    job_id: JsonValue
    state: JsonValue
    output: ConfirmOutput | UnsetType = UNSET
    passed: bool | None | UnsetType = UNSET
    problems: list[str] | None | UnsetType = UNSET
    exit_code: JsonValue | UnsetType = UNSET
    job_exit_code: JsonValue | UnsetType = UNSET
    node: JsonValue | UnsetType = UNSET
    seconds: JsonValue | UnsetType = UNSET
    metrics: JsonValue | UnsetType = UNSET
    regressed: JsonValue | UnsetType = UNSET
    timed_out: JsonValue | UnsetType = UNSET
    cancel: JsonValue | UnsetType = UNSET
    revert: JsonObject | None | UnsetType = UNSET
    accepted: Accepted | UnsetType = UNSET



class PreviousAttempt(Section, frozen=True, kw_only=True):
    """What the reconcile of an earlier run's allocation, detached build or confirmation attempt found."""

    attempt: JsonValue
    attempt_dir: JsonValue
    receipt: JsonValue
    job_id: JsonValue
    job_state: JsonValue
    job_exit_code: JsonValue
    exit_code: JsonValue
    established: JsonValue
    fenced: JsonValue
    notes: JsonValue
    kind: str | UnsetType = UNSET
    where: str | UnsetType = UNSET
    pid: JsonValue | UnsetType = UNSET
    exit_signal: JsonValue | UnsetType = UNSET
    settle: JsonValue | UnsetType = UNSET
    transcript: JsonValue | UnsetType = UNSET
    expected_sha: JsonValue | UnsetType = UNSET
    confirm: JsonValue | UnsetType = UNSET



class CommandOutput(Section, frozen=True, kw_only=True):
    """The provider command's output as the receipt keeps it (CONTRACT section 6); empty before one ran."""

    complete: bool | UnsetType = UNSET
    reason: JsonValue | UnsetType = UNSET  # an allocation's: the agent's settle summary says it
    log_dir: str | None | UnsetType = UNSET
    observations: JsonValue | UnsetType = UNSET
    settle_seconds: JsonValue | UnsetType = UNSET
    stdout: str | UnsetType = UNSET
    stderr: str | UnsetType = UNSET
    stdout_bytes: int | UnsetType = UNSET
    stderr_bytes: int | UnsetType = UNSET
    truncated: bool | UnsetType = UNSET
    kept: str | UnsetType = UNSET
    transcript: str | None | UnsetType = UNSET
    checksum: JsonValue | UnsetType = UNSET
    problems: list[str] | UnsetType = UNSET
    note: str | UnsetType = UNSET

    def __bool__(self) -> bool:
        """False while no command's output was recorded (the receipt's ``{}``)."""
        return bool(self.to_value())


# -- what a run's summary reads of a receipt document (vq_admin.report.output.receipt_summary) --


class DeployView(Document, frozen=True, kw_only=True):
    exit_code: int | None = None
    job_id: JsonValue = None
    where: str | None = None
    log_dir: str | None = None


class OutputView(Document, frozen=True, kw_only=True):
    stdout: str | None = None
    stderr: str | None = None
    log_dir: str | None = None
    transcript: str | None = None


class PruneView(Document, frozen=True, kw_only=True):
    keep: dict[str, list[str]] = msgspec.field(default_factory=dict)
    removed: list[str] = msgspec.field(default_factory=list)


class AcceptedView(Document, frozen=True, kw_only=True):
    reason: str | None = None
    regressed: list[str] | None = None


class ConfirmView(Document, frozen=True, kw_only=True):
    job_id: JsonValue = None
    state: str | None = None
    exit_code: JsonValue = None
    node: str | None = None
    seconds: float | None = None
    metrics: JsonObject | None = None
    accepted: AcceptedView | None = None
    passed: bool | None = None
    output: OutputView = msgspec.field(default_factory=OutputView)
    attempt_dir: str | None = None


class ReceiptView(Document, frozen=True, kw_only=True):
    """The members of a receipt document its summary shows."""

    lane: str
    host: str
    program: str | None
    outcome: str
    exit_code: int
    expected_sha: str | None = None
    tag: str | None = None
    deploy: DeployView = msgspec.field(default_factory=DeployView)
    command_output: OutputView = msgspec.field(default_factory=OutputView)
    verify: Verify = msgspec.field(default_factory=Verify)
    rollback: Rollback | None = None
    prune: PruneView | None = None
    confirm: ConfirmView | None = None
    reverted: Reverted | None = None
    readback: Readback | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)
