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


class Deploy(Section, frozen=True, kw_only=True):
    """The provider's deploy command: where it ran and its exit; an allocation's or a detached build's attempt,
    and what the agent reported of its end (:mod:`vq_admin.lanes.allocation_step`).  Empty before one ran."""

    build_place: str | UnsetType = UNSET
    detached: bool | UnsetType = UNSET
    where: str | UnsetType = UNSET
    attempt: str | UnsetType = UNSET
    attempt_dir: str | UnsetType = UNSET
    log_dir: str | UnsetType = UNSET
    job_id: JsonValue | UnsetType = UNSET
    pid: JsonValue | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET
    sbatch_args: list[str] | UnsetType = UNSET
    interrupted: str | None | UnsetType = UNSET
    interruption: str | UnsetType = UNSET
    # as the agent's summary sent them
    sbatch_exit_code: JsonValue | UnsetType = UNSET
    exit_signal: JsonValue | UnsetType = UNSET
    job_state: JsonValue | UnsetType = UNSET
    job_exit_code: JsonValue | UnsetType = UNSET
    end_source: JsonValue | UnsetType = UNSET
    established: JsonValue | UnsetType = UNSET
    timed_out: JsonValue | UnsetType = UNSET
    cancel: JsonValue | UnsetType = UNSET
    reconciled: JsonValue | UnsetType = UNSET
    fenced: JsonValue | UnsetType = UNSET
    notes: JsonValue | UnsetType = UNSET
    retention: JsonValue | UnsetType = UNSET
    tampered: str | UnsetType = UNSET


class KeptLauncher(Section, frozen=True, kw_only=True):
    """A kept launcher read back after a prune (``prune.kept_launchers.SHA``): ``ok`` None when unread."""

    launcher: str
    ok: bool | None
    detail: str | None


class PruneCensus(Section, frozen=True, kw_only=True):
    """What a prune's census found and cost; only ``where`` and ``cost`` when it failed after the agent answered."""

    where: str
    cost: JsonObject
    taken_at: str | UnsetType = UNSET
    jobs_scanned: int | None | UnsetType = UNSET
    warnings: list[str] | UnsetType = UNSET


class Prune(Section, frozen=True, kw_only=True):
    """A prune (CONTRACT section 8): each kept SHA with its reasons, what the provider removed, and why."""

    keep: dict[str, list[str]]
    removed: list[str]
    keep_recent: int
    used_within_days: float
    last_used: dict[str, str] | UnsetType = UNSET
    forgot: JsonObject | UnsetType = UNSET
    census: PruneCensus | UnsetType = UNSET
    would_remove: list[str] | UnsetType = UNSET
    kept: list[str] | UnsetType = UNSET
    kept_launchers: dict[str, KeptLauncher] | UnsetType = UNSET


class Installer(Section, frozen=True, kw_only=True):
    """Who ran ``provider install``, on which driver."""

    user: str
    uid: int
    driver: str


class InstalledBy(Section, frozen=True, kw_only=True):
    """Who the agent on the host ran as."""

    user: JsonValue
    uid: JsonValue
    host: JsonValue


class Install(Section, frozen=True, kw_only=True):
    """What ``provider install`` installed: source, destination, old and new SHA-256, interpreter (the agent's
    ``install-file`` answer)."""

    src: str
    src_sha256: str
    dest: str
    mode: str
    by: Installer
    config: str | None
    config_edited: bool
    where: str
    transport_argv: list[str] | UnsetType = UNSET
    old_sha256: JsonValue | UnsetType = UNSET
    new_sha256: JsonValue | UnsetType = UNSET
    old_mode: JsonValue | UnsetType = UNSET
    changed: JsonValue | UnsetType = UNSET
    interpreter: JsonValue | UnsetType = UNSET
    old_interpreter: JsonValue | UnsetType = UNSET
    user: JsonValue | UnsetType = UNSET
    uid: JsonValue | UnsetType = UNSET
    hostname: JsonValue | UnsetType = UNSET
    at: JsonValue | UnsetType = UNSET
    installed_by: InstalledBy | UnsetType = UNSET


class ReceiptView(Document, frozen=True, kw_only=True):
    """The members of a receipt document its summary shows (:func:`vq_admin.report.output.receipt_summary`)."""

    lane: str
    host: str
    program: str | None
    outcome: str
    exit_code: int
    expected_sha: str | None = None
    tag: str | None = None
    deploy: Deploy = msgspec.field(default_factory=Deploy)
    command_output: CommandOutput = msgspec.field(default_factory=CommandOutput)
    verify: Verify = msgspec.field(default_factory=Verify)
    rollback: Rollback | None = None
    prune: Prune | None = None
    confirm: Confirm | None = None
    reverted: Reverted | None = None
    readback: Readback | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)


class PlannedStep(Document, frozen=True, kw_only=True):
    """A step of a plan document as its summary shows it."""

    name: str
    where: str
    purpose: str
    argv: list[str]
    env: dict[str, str] | None = None


class PlanView(Document, frozen=True, kw_only=True):
    """What the summary of a plan document (``--dry-run``) shows (:func:`vq_admin.report.output.plan_summary`)."""

    lane: str
    host: str
    program: str | None
    steps: list[PlannedStep]
    when_needed: list[PlannedStep] = msgspec.field(default_factory=list)
