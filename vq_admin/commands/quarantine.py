"""``vq admin quarantine PROGRAM HOST SHA --reason TEXT [--hold-jobs] [--json]`` and ``... --lift``.

See :mod:`vq_admin.launcher.quarantine`.  Exit 0 once recorded on the host (the jobs it lists printed); 1 when
the host's record was not written (it holds in this state directory only, until rerun), or the scheduler could
not be read (the jobs are not known) or ``--hold-jobs`` could not hold a pending job; 3 when the transport failed
mid-append (whether the host's record holds it is not known); 2 for a usage error; 77 for a host without runtime
authority.
"""

from __future__ import annotations

import argparse

from ..config import authority, load_config
from ..launcher import registry
from ..launcher.quarantine import SCHEMA, QuarantineReport, check_reason, hold, record_on_host, statement
from ..launcher.references import CensusError, scan
from ..report.envelope import emit
from ..report.outcome import Outcome, Refused
from ..report.output import safe_text
from ..ssh.transport import Session
from ..core.stamps import utc_now
from ..state.records import StateDir
from .arguments import check_name, full_sha


def run(args: argparse.Namespace) -> int:
    program, name = check_name(args.program, "PROGRAM"), check_name(args.host, "HOST")
    sha = full_sha(args.sha, "SHA")
    assert sha is not None
    reason = check_reason(args.reason, args.lift)
    config = load_config(args.config)
    host = authority.lookup(config, name, program)
    if host.fleet_role == "alias":
        host = authority.lookup(config, host.canonical_host or "")
    host, _ = authority.runtime_profile(config, host.name, program)  # 77 without authority, 2 without a profile
    state = StateDir(args.state_dir)
    root, at = state.root, utc_now()
    try:
        entry = registry.lookup(root, host.name, program, sha)
    except registry.PrunedError:
        entry = None
    except registry.RegistryError as exc:
        raise Refused(f"the verified-launcher registry cannot be trusted: {exc}") from None
    if args.lift:
        local = registry.lift_quarantine(root, host.name, program, sha)
    else:
        from ..record.view import user_at_host

        local = registry.mark_quarantined(root, host.name, program, sha, reason or "", at, user_at_host())
    last_ok = (state.read_record("runtime", host.name, program, "last-ok") or {}).get("sha")
    action = "lift" if args.lift else "quarantine"
    with Session(config.ssh_config) as session:
        transport = session.for_host(host.transport, host.ssh)
        where, problem, unknown = record_on_host(config, state, transport, host, program, statement(
            state, host.name, program, sha, action, reason, at, entry["launcher"] if entry else None,
            entry["launcher_sha256"] if entry else None))
        census_error, jobs, scanned = None, [], 0
        try:
            found = scan(transport, host.agent)
            jobs, scanned = found.jobs_naming([sha])[sha], found.jobs_scanned or 0
        except CensusError as exc:
            census_error = exc.message
        held, failed = hold(transport, jobs) if args.hold_jobs and not args.lift else ([], {})
    doc = QuarantineReport(host=host.name, program=program, sha=sha, action=action, reason=reason,
                           active=last_ok == sha, local=local, host_record=where, host_record_problem=problem,
                           jobs=tuple(jobs), held=tuple(held), hold_failed=failed, census_error=census_error,
                           jobs_scanned=scanned)
    errors = [f"job {job}: not held: {why}" for job, why in failed.items()]
    if census_error:
        errors.append(f"the jobs referencing {sha} are not known: {census_error}")
    if problem is not None:
        errors.insert(0, f"the {action} holds only in this state directory until rerun: the host's record "
                         f"{'may not hold' if unknown else 'does not hold'} it: {problem}")
    outcome = Outcome.UNKNOWN if unknown else Outcome.FAILED if failed or census_error or problem else Outcome.OK
    if args.json:
        return emit(SCHEMA, outcome, {"requested_host": args.host, **doc.to_value()}, errors)
    print("\n".join(safe_text(line) for line in lines(doc)))
    return outcome.exit_code


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
