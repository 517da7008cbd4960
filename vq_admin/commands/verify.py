"""``vq admin verify PROGRAM HOST [--expected-sha SHA]`` and ``vq admin verify [PROGRAM] --all``: the
read-only drift check (cron, and the Ansible modules' check mode).

For each host and program it runs the runtime lane's own verify step and launcher read-back on the
login host (:mod:`vq_admin.lanes.verify`, as the pre-verify of an update does) and compares what is
active with what LAST OK names (or ``--expected-sha``):

* ``current``: that SHA is active, verified, and its launcher has the SHA-256 LAST OK attested;
* ``drifted``: another SHA, or another launcher hash, is active (both are named);
* ``unhealthy``: the verify could not prove the runtime (a failed check);
* ``broken``: the verifier itself failed (it exited non-zero, printed nothing or no verify receipt), so
  nothing is known of the runtime: the detail names the verify command and its exit status;
* ``unknown``: the login host could not be reached (or there is nothing to compare with);
* ``deploying``: not current, while a run holds the program's host-side lease there (an update,
  rollback or prune under way, or the build or job one left running): the run is named; the same
  agent call reads that without taking the lease.

It takes no lock and no lease and writes nothing: not under the state directory, not on a host.
Exit 0 only when every checked runtime is ``current``; else 3 when one is ``unknown``, else 1 when one
is ``drifted`` or ``unhealthy``, else 75 (``locked``: one is ``deploying``; verify again once it ended).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Literal, get_args

import msgspec
from msgspec import UNSET, UnsetType
from vq_admin_hookspecs import RuntimeRequest

from ..config import authority
from ..config import Config, HostConfig, RuntimeProfile, load_config
from ..context import RunContext
from ..document import Document, JsonObject, given
from ..lanes.confirm_step import HealthJob
from ..lanes.verify import VerifyFound
from ..plan import StepRecord
from ..report.envelope import SCHEMAS, emit
from ..report.outcome import Outcome, UsageError
from ..report.output import safe_text
from ..report.sections import Record
from ..state.records import StateDir
from ..ssh.transport import Session
from .arguments import check_name, full_sha

#: Every state a checked runtime can be in (the module docstring says what each means).
State = Literal["current", "drifted", "unhealthy", "broken", "unknown", "deploying"]
STATES: tuple[str, ...] = get_args(State)

if TYPE_CHECKING:
    from ..lanes.verify import Verification
    from ..lease import LeaseReply
    from ..plan import Plan


class Expected(Document, frozen=True, kw_only=True):
    """What the runtime should be: LAST OK's SHA, tag and launcher, or ``--expected-sha``'s SHA alone."""

    sha: str | None
    tag: str | None = None
    source: Literal["last-ok", "expected-sha"] = msgspec.field(name="from")
    launcher: str | None = None
    launcher_sha256: str | None = None


class Active(Document, frozen=True, kw_only=True):
    """What the verify receipt and the read-back found active."""

    sha: str | None
    tag: str | None
    launcher: str
    launcher_sha256: str | None


class Holder(Document, frozen=True, kw_only=True):
    """A run's held host-side lease: its lock file and its holder's record (as the agent wrote it)."""

    lock: str | None
    holder: JsonObject | None


class RuntimeCheck(Document, frozen=True, kw_only=True):
    """One runtime of the verify document (``hosts.HOST.PROGRAM``)."""

    expected: Expected
    active: Active | None = None
    steps: list[StepRecord] = msgspec.field(default_factory=list)  #: the plan's steps
    verify: VerifyFound | None = None
    record: Record | UnsetType = UNSET  #: what the host's record brought (vq_admin.record.view.take)
    state: State = "unknown"
    detail: str = ""
    lease: Holder | UnsetType = UNSET
    confirm: HealthJob | UnsetType = UNSET


class VerifyDocument(Document, frozen=True, kw_only=True):
    """``vq admin verify --json``'s data: ``{"expected_sha", "hosts": {HOST: {PROGRAM: RuntimeCheck}}}``."""

    expected_sha: str | None
    hosts: dict[str, dict[str, RuntimeCheck]]

    def checks(self) -> list[tuple[str, str, RuntimeCheck]]:
        return [(host, program, entry) for host, programs in self.hosts.items() for program, entry in programs.items()]


def targets(config: Config, args: argparse.Namespace) -> list[tuple[HostConfig, RuntimeProfile]]:
    """``PROGRAM HOST`` (authority and profile as for an update), or with ``--all`` every managed host's
    profile of PROGRAM (of every program without it), in configuration order."""
    program = check_name(args.program, "PROGRAM") if args.program else None
    if not args.all:
        if program is None or args.host is None:
            raise UsageError("verify takes PROGRAM HOST, or [PROGRAM] --all")
        return [authority.runtime_profile(config, check_name(args.host, "HOST"), program)]
    if args.host is not None:
        raise UsageError("verify --all checks every managed host; give no HOST")
    found = [(host, profile) for host in config.hosts.values() if host.fleet_role in authority.RUNTIME_ROLES
             for name, profile in host.runtimes.items() if program in (None, name)]
    if not found:
        raise UsageError(f"no host has fleet_role \"managed\" and a scheduler_runtime_deployments.{program or '*'} "
                         "profile")
    return found


def check_runtime(ctx: RunContext, host: HostConfig, profile: RuntimeProfile, sha: str | None,
                  job: bool = False) -> RuntimeCheck:
    """Verify one runtime read-only and say which state (module docstring) it is in."""
    from ..lanes.verify import plan_verify, run_verify
    from ..plan import Plan

    last_ok = ctx.state.verified("runtime", host.name, profile.program)
    expected = Expected(sha=sha, source="expected-sha")
    if last_ok is not None and sha in (None, last_ok.sha):  # no --expected-sha, or LAST OK's
        expected = Expected(sha=last_ok.sha, source="last-ok", tag=given(last_ok.tag),
                            launcher=given(last_ok.launcher), launcher_sha256=given(last_ok.launcher_sha256))
    sha, same = expected.sha, expected.source == "last-ok"
    entry = RuntimeCheck(expected=expected)
    if not sha:
        return entry.replace(detail=f"no LAST OK for {profile.program} on {host.name} and no --expected-sha: "
                             "nothing to compare with")
    request = RuntimeRequest(program=profile.program, host=host.name, expected_sha=sha, tag=expected.tag,
                             settings=profile.settings())
    plan = Plan()
    found = run_verify(ctx, host, profile, request, *plan_verify(ctx, plan, "verify", host, profile, request,
                                                                 peek_lease=True))
    entry = entry.replace(steps=plan.records(), verify=found.document())
    if found.record is not None:  # the host's record rode on the verify: other drivers' evidence applied first
        from ..record.view import take

        imported = take(ctx.config, ctx.state, host.name, profile.program, found.record)
        moved = ctx.state.verified("runtime", host.name, profile.program)
        if same and (moved.sha if moved else None) != sha:
            # another driver's signed verification moved LAST OK: judged against it, in one more verify (only then)
            return check_runtime(ctx, host, profile, None, job).replace(record=imported)
        entry = entry.replace(record=imported)
    if found.interrupted:
        return entry.replace(detail=f"{host.name} could not be reached: {found.error}")
    judged = _judge(entry, found)
    if judged.state == "current":
        if job and profile.confirm is not None:
            return _job(ctx, host, profile, judged, plan).replace(steps=plan.records())
        return judged
    if found.lease is not None and found.lease.held:  # mid-deploy: not a fault
        return _deploying(judged, found.lease)
    return judged


def _deploying(judged: RuntimeCheck, lease: LeaseReply) -> RuntimeCheck:
    """A runtime a run's held lease is deploying: what it reads meanwhile goes in the detail."""
    return judged.replace(state="deploying", lease=Holder(lock=lease.lock, holder=lease.holder),
                          detail=f"a run holds its host-side lease: {lease.message} (meanwhile the runtime reads "
                                 f"{judged.state}: {judged.detail})")


def _drift(active: Active, expected: Expected) -> str | None:
    """How the *active* runtime differs from the *expected* one (another SHA; a launcher whose bytes, read by
    the verify, are not the ones LAST OK attested), or ``None``."""
    if active.sha != expected.sha:
        now = f"active SHA {active.sha}" if active.sha else "nothing is active"
        return f"{now}; {'LAST OK' if expected.source == 'last-ok' else '--expected-sha'} names {expected.sha}"
    attested = expected.launcher_sha256
    if attested and active.launcher_sha256 is not None and active.launcher_sha256 != attested:
        return f"launcher {active.launcher} has SHA-256 {active.launcher_sha256}; LAST OK attested {attested}"
    return None


def _job(ctx: RunContext, host: HostConfig, profile: RuntimeProfile, judged: RuntimeCheck,
         plan: Plan) -> RuntimeCheck:
    """``--job``: the confirmation job against the active generation (read-only): current, or unhealthy
    naming the job, its state and exit code (deploying when a run's work holds the lease)."""
    from ..lanes.confirm_step import health_job

    assert judged.active is not None  # a current runtime's
    verdict, held = health_job(ctx, host, profile, judged.active.sha or "", judged.active.launcher, plan)
    if verdict.passed:
        return judged.replace(confirm=verdict, detail=f"{judged.detail}; confirmation job {verdict.job_id} COMPLETED")
    state: State = "deploying" if held else "unhealthy" if verdict.passed is False else "unknown"
    return judged.replace(confirm=verdict, state=state, detail=f"confirmation job {verdict.job_id} ended "
                          f"{verdict.state} with exit code {verdict.exit_code}: " + "; ".join(verdict.problems or []))


def _judge(entry: RuntimeCheck, found: Verification) -> RuntimeCheck:
    """The state the verify *found* shows: current, drifted, unhealthy or broken (module docstring)."""
    if found.broken is not None:  # a verifier problem, not a runtime one
        return entry.replace(state="broken", detail=f"the verifier is broken: {found.broken}")
    receipt = found.receipt
    if receipt is None:
        return entry.replace(state="unhealthy", detail=f"no verify receipt: {found.error}")
    read = {c.name: c for c in found.checks}.get("active_path_sha256")
    hashed = read is not None and read.ok  # the verify read the launcher's bytes
    active = Active(sha=receipt.source_sha.lower() or None, tag=receipt.tag, launcher=receipt.active_path,
                    launcher_sha256=receipt.active_path_sha256 if hashed else None)
    expected = entry.expected
    entry = entry.replace(active=active)
    drift = _drift(active, expected)
    if drift:
        return entry.replace(state="drifted", detail=drift)
    failed = _failed(found, expected.tag)
    if failed:
        return entry.replace(state="unhealthy", detail="; ".join(failed))
    attested = expected.launcher_sha256
    return entry.replace(state="current", detail=f"{expected.sha} active and verified" +
                         (f", launcher SHA-256 {attested} as LAST OK attested" if attested else ""))


def _failed(found: Verification, tag: str | None) -> list[str]:
    """What the verify found wrong: its error, then each failed check (the tag's aside when none is expected)."""
    return ([found.error] if found.error else []) + [
        f"{c.name}: {c.detail}" for c in found.checks if not c.ok and not (c.name == "tag" and tag is None)]


def outcome_of(doc: VerifyDocument) -> Outcome:
    states = {entry.state for _, _, entry in doc.checks()}
    if states <= {"current"}:
        return Outcome.OK
    if "unknown" in states:
        return Outcome.UNKNOWN
    return Outcome.LOCKED if states <= {"current", "deploying"} else Outcome.FAILED


def table(doc: VerifyDocument) -> list[str]:
    rows = [(host, program, entry.state, entry.detail) for host, program, entry in doc.checks()]
    widths = [max(len(row[i]) for row in rows + [("HOST", "PROGRAM", "STATE", "")]) for i in range(3)]
    return [safe_text(f"{h:<{widths[0]}}  {p:<{widths[1]}}  {s:<{widths[2]}}  {d}".rstrip())
            for h, p, s, d in [("HOST", "PROGRAM", "STATE", "DETAIL"), *rows]]


def _check_all(config: Config, args: argparse.Namespace, chosen: list[tuple[HostConfig, RuntimeProfile]],
               sha: str | None) -> VerifyDocument:
    """Each chosen runtime checked (:func:`check_runtime`), in one ssh session."""
    from ..plugins import Providers

    hosts: dict[str, dict[str, RuntimeCheck]] = {}
    with Session(config.ssh_config) as session:
        ctx = RunContext(config, StateDir(args.state_dir), session,
                         Providers.load({profile.provider for _, profile in chosen}))
        for host, profile in chosen:
            hosts.setdefault(host.name, {})[profile.program] = check_runtime(ctx, host, profile, sha, args.job)
    return VerifyDocument(expected_sha=sha, hosts=hosts)


def run(args: argparse.Namespace) -> int:
    prometheus, textfile = args.prometheus, args.textfile
    publishing = bool(prometheus or textfile)
    if args.json and publishing:
        raise UsageError("--json and --prometheus/--textfile are different outputs; give one")
    sha = full_sha(args.expected_sha)
    config = load_config(args.config)
    chosen = targets(config, args)  # one runtime without --all
    if sha is not None and len({profile.program for _, profile in chosen}) > 1:
        raise UsageError("verify --all --expected-sha needs PROGRAM (one SHA names one program's commit)")
    if textfile:
        from ..report.metrics import check_textfile

        textfile = check_textfile(textfile)
    doc = _check_all(config, args, chosen, sha)
    outcome = outcome_of(doc)
    errors = [f"{host} {program}: {entry.state}: {entry.detail}" for host, program, entry in doc.checks()
              if entry.state != "current"]
    if publishing:
        from ..report.metrics import drift_registry, publish

        found = [(host, program, entry.state) for host, program, entry in doc.checks()]
        publish(drift_registry(found, STATES), prometheus=prometheus, textfile=textfile)
    elif args.json:
        emit(SCHEMAS["verify"], outcome, doc.to_value(), errors)
    elif errors or args.verbose or sys.stdout.isatty():
        print("\n".join(table(doc)))
    return outcome.exit_code
