"""``vq admin quarantine PROGRAM HOST SHA --reason TEXT [--hold-jobs] [--json]`` and ``... --lift``.

See :mod:`vq_admin.launcher.quarantine`.  Exit 0 once recorded on the host (the jobs it lists printed); 1 when
the host's record was not written (it holds in this state directory only, until rerun), or the scheduler could
not be read (the jobs are not known) or ``--hold-jobs`` could not hold a pending job; 3 when the transport failed
mid-append (whether the host's record holds it is not known); 2 for a usage error; 77 for a host without runtime
authority.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from ..config import authority, load_config
from ..launcher import registry
from ..launcher.quarantine import SCHEMA, QuarantineReport, check_reason, hold, record_on_host, statement
from ..launcher.references import CensusError, QueuedJob, scan
from ..report.envelope import emit
from ..report.outcome import Outcome, Refused
from ..report.output import safe_text
from ..ssh.transport import Session, Transport
from ..core.stamps import utc_now
from ..state.records import StateDir
from .arguments import check_name, full_sha


def run(args: argparse.Namespace) -> int:
    program, name = check_name(args.program, "PROGRAM"), check_name(args.host, "HOST")
    sha = full_sha(args.sha, "SHA")
    assert sha is not None
    reason = check_reason(args.reason, args.lift)
    config = load_config(args.config)
    host, _ = authority.runtime_profile(config, name, program, canonical=True)  # 77: no authority; 2: no profile
    state = StateDir(args.state_dir)
    at = utc_now()
    entry = _registry_entry(state.root, host.name, program, sha)
    launcher, launcher_sha256 = (entry.launcher, entry.launcher_sha256) if entry is not None else (None, None)
    local = _mark_here(state.root, host.name, program, sha, args.lift, reason, at)
    verified = state.verified("runtime", host.name, program)
    last_ok = verified.sha if verified is not None else None
    action = "lift" if args.lift else "quarantine"
    with Session(config.ssh_config) as session:
        transport = session.for_host(host.transport, host.ssh)
        where, problem, unknown = record_on_host(config, state, transport, host, program, statement(
            state, host.name, program, sha, action, reason, at, launcher, launcher_sha256))
        jobs, scanned, census_error = _jobs_naming(transport, host.agent, sha)
        held, failed = hold(transport, jobs) if args.hold_jobs and not args.lift else ([], {})
    doc = QuarantineReport(host=host.name, program=program, sha=sha, action=action, reason=reason,
                           active=last_ok == sha, local=local, host_record=where, host_record_problem=problem,
                           jobs=tuple(jobs), held=tuple(held), hold_failed=failed, census_error=census_error,
                           jobs_scanned=scanned)
    errors = _errors(doc, unknown)
    outcome = Outcome.UNKNOWN if unknown else Outcome.FAILED if errors else Outcome.OK
    if args.json:
        return emit(SCHEMA, outcome, {"requested_host": args.host, **doc.to_value()}, errors)
    print("\n".join(safe_text(line) for line in lines(doc)))
    return outcome.exit_code


def _registry_entry(root: Path, host: str, program: str, sha: str) -> registry.Entry | None:
    """The verified-launcher registry's entry of *sha* (``None`` when there is none, or it was pruned); a
    registry that cannot be trusted refuses the run."""
    try:
        return registry.lookup(root, host, program, sha)
    except registry.PrunedError:
        return None
    except registry.RegistryError as exc:
        raise Refused(f"the verified-launcher registry cannot be trusted: {exc}") from None


def _mark_here(root: Path, host: str, program: str, sha: str, lift: bool, reason: str | None,
               at: str) -> str | None:
    """Quarantine *sha* (or lift its quarantine) in this state directory: the mark's name."""
    if lift:
        return registry.lift_quarantine(root, host, program, sha)
    from ..record.view import user_at_host

    return registry.mark_quarantined(root, host, program, sha, reason or "", at, user_at_host())


def _jobs_naming(transport: Transport, agent: Sequence[str], sha: str) -> tuple[list[QueuedJob], int, str | None]:
    """The queued jobs naming *sha*, how many jobs were read, and why they are not known (or ``None``)."""
    try:
        found = scan(transport, agent)
    except CensusError as exc:
        return [], 0, exc.message
    return found.jobs_naming([sha])[sha], found.jobs_scanned or 0, None


def _errors(doc: QuarantineReport, unknown: bool) -> list[str]:
    """What the run could not do: the host's record not written, the jobs not known, jobs not held."""
    errors = [f"job {job}: not held: {why}" for job, why in doc.hold_failed.items()]
    if doc.census_error:
        errors.append(f"the jobs referencing {doc.sha} are not known: {doc.census_error}")
    if doc.host_record_problem is not None:
        errors.insert(0, f"the {doc.action} holds only in this state directory until rerun: the host's record "
                         f"{'may not hold' if unknown else 'does not hold'} it: {doc.host_record_problem}")
    return errors


def lines(doc: QuarantineReport) -> list[str]:
    if doc.action == "lift":
        head = [f"vq-admin: lifted the quarantine of {doc.program} {doc.sha} on {doc.host}"
                + ("" if doc.local else " (it was not quarantined in this state directory)")]
    else:
        head = [f"vq-admin: quarantined {doc.program} {doc.sha} on {doc.host}: {doc.reason}",
                "  launcher refuses it (77); update --expected-sha and rollback --to refuse it until "
                f"vq admin quarantine {doc.program} {doc.host} {doc.sha} --lift"]
        if doc.active:
            head.append(f"  it is the active generation (LAST OK): move away with vq admin rollback {doc.program} "
                        f"{doc.host} (or update to a good SHA)")
    head.append(f"  host record: {doc.host_record}" if doc.host_record else f"  host record: not recorded "
                f"({doc.host_record_problem}): the {doc.action} holds only in this state directory until rerun")
    if doc.census_error:
        head.append(f"  jobs: not known: {doc.census_error}")
    else:
        head.append(f"  jobs referencing it now: {len(doc.jobs)} of {doc.jobs_scanned} read")
    for job in doc.jobs:
        mark = " (held)" if job.id in doc.held else (f" (not held: {doc.hold_failed[job.id]})"
                                                     if job.id in doc.hold_failed else "")
        head.append(f"    {job.id} {job.state} {job.user}{mark}")
    return head
