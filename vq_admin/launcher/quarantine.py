"""Quarantine: stop further use of a generation without deleting the evidence (CONTRACT section 14).

``vq admin quarantine PROGRAM HOST SHA --reason TEXT [--hold-jobs]`` marks SHA quarantined in this
state directory (``registry/<host>/<program>/quarantined/<sha>.json``: ``launcher`` refuses it, 77
``quarantined: TEXT``; ``update --expected-sha`` and ``rollback --to`` refuse it naming ``--lift``),
records the quarantine as an entry of the host's record (:func:`record_on_host`), lists the pending
and running jobs that reference SHA (the census), and with ``--hold-jobs`` holds the pending ones
(``scontrol hold``; running jobs are never touched).  ``--lift`` ends it the same way.  It takes no
lease: a recall is never blocked by a deploy.
"""

from __future__ import annotations

from typing import Sequence

from ..document import Count, Document, FullSha
from ..report.outcome import UsageError
from ..ssh.transport import Transport
from ..state.records import StateDir
from .references import QueuedJob

SCHEMA = "vq-admin/quarantine/1"
MAX_REASON = 500
#: Job states ``--hold-jobs`` holds; every other state (running, suspended, ...) is never touched.
HOLDABLE = ("PENDING",)


class QuarantineReport(Document, frozen=True, kw_only=True):
    host: str
    program: str
    sha: FullSha
    action: str  #: ``quarantine`` or ``lift``
    reason: str | None
    active: bool  #: SHA is LAST OK here: jobs bound without a pin get it; vq admin rollback moves away
    local: str | None  #: the mark in this state directory (the lifted mark's new name for a lift)
    host_record: str | None  #: where the host's record holds the entry, or null
    host_record_problem: str | None  #: why it is not on the host's record
    jobs: tuple[QueuedJob, ...]  #: pending and running jobs referencing SHA now
    held: tuple[str, ...]  #: job ids ``scontrol hold`` held
    hold_failed: dict[str, str]  #: job id -> why it could not be held
    census_error: str | None
    jobs_scanned: Count


def check_reason(reason: str | None, lift: bool) -> str | None:
    """The reason, or a usage error: required (printable, at most 500 characters) unless *lift*."""
    if lift:
        return reason
    if not reason or not reason.strip() or len(reason) > MAX_REASON or not reason.isprintable():
        raise UsageError(f"--reason TEXT is required (1 to {MAX_REASON} printable characters) unless --lift")
    return reason


def statement(state: StateDir, host: str, program: str, sha: str, action: str, reason: str | None, at: str,
              launcher: str | None, launcher_sha256: str | None) -> bytes:
    """The entry for the host's record: the record's own quarantine statement
    (:class:`vq_admin.record.statement.Quarantine`), by this driver, as its bytes."""
    from ..record.statement import QUARANTINE, Quarantine, Statement, Subject
    from ..record.view import driver_id, user_at_host

    subject = (Subject(name=launcher, digest={"sha256": launcher_sha256}),) if launcher and launcher_sha256 else ()
    predicate = Quarantine(driver=driver_id(state), by=user_at_host(), host=host, program=program, at=at, sha=sha,
                           action="lift" if action == "lift" else "quarantine", reason=reason)
    return Statement(subject=subject, predicate_type=QUARANTINE, predicate=predicate).to_text()


def record_on_host(transport: Transport, agent: Sequence[str], program: str, entry: bytes) -> tuple[str | None,
                                                                                                    str | None]:
    """Append *entry* to the host's record of *program* (CONTRACT section 12): ``(where, None)``, or
    ``(None, why not)``.  The one place the quarantine meets the host's record; the agent's record takes
    appends only on a run's lease so far, and a quarantine takes none: until the agent has an append of its
    own (under the record lock), the quarantine holds for this state directory only."""
    return None, ("the host's record is not available in this build: the quarantine holds for this state "
                  "directory only; other drivers must quarantine SHA too")


def hold(transport: Transport, jobs: Sequence[QueuedJob]) -> tuple[list[str], dict[str, str]]:
    """``scontrol hold`` each pending job of *jobs* on the login host: (held ids, {id: why not})."""
    held: list[str] = []
    failed: dict[str, str] = {}
    for job in jobs:
        if job.state in HOLDABLE:
            done = transport.run(["scontrol", "hold", job.id], timeout=60)
            if done.exit_code == 0 and not done.interrupted:
                held.append(job.id)
            else:
                failed[job.id] = done.describe() if done.interrupted else done.error_text()[-300:] or \
                    f"exit status {done.exit_code}"
    return held, failed
