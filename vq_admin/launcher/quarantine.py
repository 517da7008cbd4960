"""Quarantine: stop further use of a generation without deleting the evidence (CONTRACT section 14).

``vq admin quarantine PROGRAM HOST SHA --reason TEXT [--hold-jobs]`` marks SHA quarantined in this
state directory (``registry/<host>/<program>/quarantined/<sha>.json``: ``launcher`` refuses it, 77
``quarantined: TEXT``; ``update --expected-sha`` and ``rollback --to`` refuse it naming ``--lift``),
records the quarantine as an entry of the host's record (:func:`record_on_host`; every driver acts on it at
its next contact with the host, :func:`vq_admin.record.view.apply_record`), lists the pending
and running jobs that reference SHA (the census), and with ``--hold-jobs`` holds the pending ones
(``scontrol hold``; running jobs are never touched).  ``--lift`` ends it the same way.  It takes no
lease: a recall is never blocked by a deploy.
"""

from __future__ import annotations

from typing import Sequence

from ..config import Config, HostConfig
from ..core import protocol
from ..document import Count, Document, FullSha
from ..report.outcome import Refused, UsageError
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


def record_on_host(config: Config, state: StateDir, transport: Transport, host: HostConfig, program: str,
                   entry: bytes) -> tuple[str | None, str | None, bool]:
    """Sign *entry* (under ``[signing]``) and append it to the host's record of *program* with the agent's
    ``record-quarantine`` (CONTRACT sections 12 and 14: under the record's own lock, never a run's lease), in
    one ssh call that also brings this driver the entries it has not read: ``(where, None, False)`` or ``(None,
    why not, unknown)``, *unknown* when the transport failed mid-append (the entry may be on the host or not)."""
    from ..record import view

    signing = view.signer(config.signing)
    try:
        sig = signing.sign(entry) if signing is not None else None
    except Refused as exc:
        return None, exc.message, False
    line = {"append": {"statement": entry.decode(), "sig": None if sig is None else sig.decode()}}
    argv = protocol.record_quarantine(host.agent, program=program, record_after=view.cursor(state, host.name, program))
    done = transport.run(argv, timeout=view.READ_TIMEOUT, stdin=protocol.encode_request(line))
    if protocol.lacks_verb(protocol.RECORD_QUARANTINE, done.exit_code, done.stdout, done.stderr):
        return None, (f"the agent on {transport.where} has no {protocol.RECORD_QUARANTINE} verb: update the helper "
                      "first (vq admin update HOST --expected-sha SHA); the quarantine holds for this state "
                      "directory only until then"), False
    try:
        answer = protocol.parse_record_quarantine(done.stdout)
    except protocol.ProtocolError as exc:
        return None, done.describe() if done.interrupted or not done.stdout else str(exc), True
    if "record" in answer:
        view.take(config, state, host.name, program, answer["record"])
    if "appended" not in answer:
        return None, answer.get("append_error") or "the agent did not append the entry", False
    return f"{answer['appended']['dir']}/{answer['appended']['name']}", None, False


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
