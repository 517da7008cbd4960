"""``vq admin update PROGRAM --all``: one program rolled out over the fleet.

The hosts are every ``fleet_role = "managed"`` host with a profile for
PROGRAM, in configuration order; every other host is listed as skipped with
its role (or "no profile") and never touched.

Each host is a normal runtime update -- its own receipt, lane lock and
host-side lease -- run in a worker process forked from this one (so the
modules are loaded once, not once per host) in a session of its own.  The
worker is exactly ``vq admin update PROGRAM HOST --expected-sha SHA --json``;
this module reads the receipt it prints.

Order: ``--canary HOST`` alone first, which must end ``ok`` or
``already-current`` or nothing else starts; then at most ``--parallel N``
hosts at a time; once more than ``--max-failed K`` hosts have ended other
than ``ok``/``already-current``, no further host starts and those left are
``skipped``.

SIGINT, SIGTERM or SIGHUP: no further host starts; each running worker gets
one SIGINT, ends its run as ``unknown`` (its own receipt, its lease closed)
and is waited for (bounded; a worker still there after that is killed, which
frees its lease as well).  Every host's outcome is recorded.

The fleet document (``vq-admin/fleet/1``) is stored under
``<state>/fleet/`` and named by one admin-log line.  Exit status: 0 only when
every host of the rollout ended ``ok``/``already-current``; otherwise the
most severe host code in the order 3, 1, 2, 75, 77 (an interrupted rollout
is at least 3).
"""

from __future__ import annotations

import argparse
import os
import secrets
import select
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

import msgspec

from . import interrupts, lockwait
from .core import exits, procs
from .core.bounds import InputError, json_object
from .document import Document, JsonObject
from .report import envelope
from .config import Config, HostConfig, load_config
from .report.outcome import Outcome, UsageError
from .report.sections import LeaseRecord
from .report.output import safe_text
from .state.records import LogLine, StateDir
from .state.tree import dump_json
from .state.tree import MAX_STATE_FILE
from .core.stamps import NAME, utc_now

SCHEMA = envelope.SCHEMAS["fleet"]
DEFAULT_PARALLEL = 4
DEFAULT_MAX_FAILED = 0
#: After an interruption, how long running workers get to write their receipts.
INTERRUPT_GRACE = 60.0
_OUTCOME_BY_CODE = {o.exit_code: o for o in Outcome if o is not Outcome.ALREADY_CURRENT}


class WorkerAnswer(Document, frozen=True, kw_only=True):
    """What the rollout reads of the document a worker printed: its receipt, its plan or its error."""

    outcome: str | None = None
    exit_code: int | None = None
    id: str | None = None
    dry_run: bool = False
    errors: list[str] = msgspec.field(default_factory=list)
    not_stored: list[str] | None = None
    lease: LeaseRecord | None = None  #: the receipt's: whom it waited for


class FleetHost(Document, frozen=True, kw_only=True, omit_defaults=True):
    """One configured host of the fleet document (``hosts.HOST``); the optional members only when known."""

    outcome: str  #: pending, running, an outcome, planned or skipped
    exit_code: int | None
    receipt: str | None
    role: str
    reason: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    seconds: float | None = None
    #: the hosts of this rollout whose runs held the lease this host shares with them (one home), waited for
    shares_lease_with: list[str] = msgspec.field(default_factory=list)
    errors: list[str] = msgspec.field(default_factory=list)  #: the first three

    @property
    def succeeded(self) -> bool:
        return self.outcome in ("ok", "already-current", "planned")


class FleetDocument(Document, frozen=True, kw_only=True, omit_defaults=True):
    """The fleet document (``vq-admin/fleet/1``), envelope included."""

    schema: str
    outcome: str
    exit_code: int
    id: str | None
    program: str
    expected_sha: str
    tag: str | None
    canary: str | None
    parallel: int
    max_failed: int
    started_at: str
    finished_at: str
    interrupted: str | None
    hosts: dict[str, FleetHost]
    configuration_order: list[str]
    order: list[str]
    dry_run: bool = False
    plans: dict[str, JsonObject] | None = None  #: each host's plan document, as its worker printed it
    errors: list[str]


@dataclass
class HostRun:
    """A configured host as the rollout runs it: its entry of the fleet document (:attr:`doc`, replaced as
    the run goes) and what its worker printed."""

    name: str
    in_rollout: bool
    doc: FleetHost
    answer: WorkerAnswer | None = None
    plan: JsonObject | None = None  #: the worker's document as it printed it (a dry run's plan)
    t0: float = 0.0
    out: str = ""  # the worker's stdout and stderr files
    err: str = ""
    pidfd: int = -1  # the running worker's (os.pidfd_open), waited on by Rollout.wait_one

    @property
    def succeeded(self) -> bool:
        return self.doc.succeeded

    def set(self, **changes: Any) -> None:
        self.doc = self.doc.replace(**changes)


def _not_in_rollout(host: HostConfig, program: str) -> str | None:
    """Why *host* is left out of a rollout of *program* (``None``: it is in it)."""
    if host.fleet_role == "alias":
        return f"fleet_role alias (of {host.canonical_host}): never touched"
    if host.fleet_role != "managed":
        return f"fleet_role {host.fleet_role}: no runtime authority, never touched"
    if program not in host.runtimes:
        return f"no scheduler_runtime_deployments.{program} profile"
    return None


def select_hosts(config: Config, program: str) -> list[HostRun]:
    """Every configured host in order; ``in_rollout`` for managed hosts with the profile."""
    runs = []
    for name, host in config.hosts.items():
        reason = _not_in_rollout(host, program)
        runs.append(HostRun(name, reason is None, FleetHost(outcome="pending" if reason is None else "skipped",
                                                            exit_code=None, receipt=None, role=host.fleet_role,
                                                            reason=reason)))
    return runs


def check_args(args: argparse.Namespace) -> None:
    if len(args.targets) != 1:
        raise UsageError("update PROGRAM --all takes exactly one positional, the PROGRAM (no HOST)")
    for option, value in (("--force", args.force), ("--update-script-arg", args.update_script_arg)):
        if value:
            raise UsageError(f"{option} is not accepted with --all: a fleet rollout runs the same update (or, with "
                             "--cluster-install, install) on every host; run that host alone (update PROGRAM HOST)")
    if args.parallel is not None and args.parallel < 1:
        raise UsageError(f"--parallel {args.parallel}: must be at least 1")
    if args.max_failed is not None and args.max_failed < 0:
        raise UsageError(f"--max-failed {args.max_failed}: must be 0 or more")


class Rollout:
    def __init__(self, args: argparse.Namespace, config: Config, program: str, sha: str):
        self.args = args
        self.config = config
        self.program = program
        self.sha = sha
        self.tag: str | None = args.tag
        self.parallel: int = DEFAULT_PARALLEL if args.parallel is None else args.parallel
        self.max_failed: int = DEFAULT_MAX_FAILED if args.max_failed is None else args.max_failed
        self._grace_deadline = float("inf")  # until interrupted: then INTERRUPT_GRACE seconds from the signal
        self.order_names: list[str] = []
        self.hosts = select_hosts(config, program)
        self.by_name = {h.name: h for h in self.hosts}
        self.interrupted: str | None = None
        self.running: dict[int, HostRun] = {}
        self.workers: dict[int, str] = {}  # every worker started, by pid: the host it runs
        self.failed = 0
        self.terminal = sys.stdout.isatty() and not args.json
        self.tmp = ""  # the workers' output files; created by run()
        self.started_at = utc_now()
        self.dry_run = bool(args.dry_run)
        self.canary: HostRun | None = None  # the host run alone first (never in a dry run, which plans every host)

    # -- order --------------------------------------------------------------------------

    def order(self) -> list[HostRun]:
        rollout = [h for h in self.hosts if h.in_rollout]
        if not rollout:
            raise UsageError(f"no host has fleet_role \"managed\" and a scheduler_runtime_deployments.{self.program} "
                             f"profile in {self.config.path}")
        lacking = [h.name for h in rollout if not self.config.hosts[h.name].runtimes[self.program].has_install
                   and self.args.cluster_install]
        if lacking:
            raise UsageError(f"--cluster-install: profile {self.program} has no install operation on "
                             f"{', '.join(lacking)} (install_command is not configured)")
        canary = self.args.canary
        if canary is not None:
            host = self.by_name.get(canary)
            if host is None:
                raise UsageError(f"--canary {canary}: the host is not in the configuration")
            if not host.in_rollout:
                raise UsageError(f"--canary {canary}: the host is not in this rollout ({host.doc.reason})")
            rollout.remove(host)
            rollout.insert(0, host)
        return rollout

    # -- workers --------------------------------------------------------------------------

    def worker_argv(self, host: str) -> list[str]:
        """The worker's ``update`` command line: *host* and the program are names of the configuration
        (``NAME_RE``, never an option), and every value is attached to its option (``--opt=value``),
        so no value is read as an option."""
        argv = ["update", self.program, host, f"--expected-sha={self.sha}", "--json"]
        if self.tag is not None:
            argv.append(f"--tag={self.tag}")
        if self.args.cluster_install:
            argv.append("--cluster-install")
        if self.args.wait_lock is not None:
            argv.append(f"--wait-lock={self.args.wait_lock:g}")
        if self.dry_run:
            argv.append("--dry-run")
        if self.args.config is not None:
            argv.append(f"--config={self.args.config}")
        if self.args.state_dir is not None:
            argv.append(f"--state-dir={self.args.state_dir}")
        return argv

    def start(self, host: HostRun) -> None:
        host.out = os.path.join(self.tmp, f"{host.name}.out")
        host.err = os.path.join(self.tmp, f"{host.name}.err")
        argv = self.worker_argv(host.name)
        sys.stdout.flush()
        sys.stderr.flush()
        host.t0 = time.monotonic()
        host.set(started_at=utc_now(), outcome="running")
        pid = os.fork()
        if pid == 0:  # the worker: a normal single-host update in a session of its own
            code = 70
            try:
                os.setsid()
                os.environ[lockwait.FLEET] = str(os.getppid())  # hosts sharing a lease wait for each other
                interrupts.defaults()
                for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                        (1, host.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                        (2, host.err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
                    new = os.open(path, flags | os.O_CLOEXEC, 0o600)
                    os.dup2(new, fd)
                    os.close(new)
                from .entry import main

                sys.argv[:1] = ["vq-admin"]
                code = main(argv)
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001 - a worker must always end with a status
                code = 70
            finally:
                os._exit(code)
        self.running[pid] = host
        self.workers[pid] = host.name
        host.pidfd = os.pidfd_open(pid)

    def reap(self, pid: int) -> None:
        """Wait for the worker *pid* (one of :attr:`running`) and record what its host ended with."""
        host = self.running.pop(pid)  # before it is waited for: on_signal never signals a reaped pid
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        os.close(host.pidfd)
        host.set(seconds=round(time.monotonic() - host.t0, 3), finished_at=utc_now())
        raw, answer = _read_answer(host.out)
        if answer is not None and (answer.outcome is not None or answer.dry_run):
            host.answer, host.plan = answer, raw
            host.set(outcome="planned" if answer.dry_run else str(answer.outcome), receipt=answer.id,
                     exit_code=code if answer.exit_code is None else answer.exit_code, errors=answer.errors,
                     shares_lease_with=self.waited_for(answer))
        else:
            outcome = Outcome.UNKNOWN if self.interrupted else _OUTCOME_BY_CODE.get(code, Outcome.UNKNOWN)
            tail = _tail(host.err)
            host.set(outcome=outcome.value, exit_code=outcome.exit_code,
                     errors=[f"the update of {host.name} ended with status {code} and no receipt"
                             + (f": {tail}" if tail else "")])
        if not host.succeeded:
            self.failed += 1
        self.announce(host)

    def waited_for(self, receipt: WorkerAnswer) -> list[str]:
        """The hosts of this rollout whose runs held the lease the host of *receipt* waited for
        (:mod:`vq_admin.lockwait`: the hosts share one home)."""
        waited = receipt.lease.waited if receipt.lease else None
        pids = [s.pid for s in waited.siblings] if waited else []
        return sorted({self.workers[pid] for pid in pids if pid in self.workers})

    def wait_one(self) -> None:
        """Reap at least one worker.  Wakes twice a second to notice an interruption;
        after one, running workers get :data:`INTERRUPT_GRACE` seconds, then are killed."""
        while self.running:
            ready, _, _ = select.select([h.pidfd for h in self.running.values()], [], [], 0.5)
            done = [pid for pid, h in self.running.items() if h.pidfd in ready]
            if not done and time.monotonic() >= self._grace_deadline:
                done = list(self.running)
                for pid in done:
                    procs.end_group(pid, lambda _grace: False, 0.0)  # its grace was INTERRUPT_GRACE
            for pid in done:
                self.reap(pid)
            if done:
                return

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.interrupted:
            return
        self.interrupted = signal.Signals(signum).name
        self._grace_deadline = time.monotonic() + INTERRUPT_GRACE
        for pid in self.running:  # each not yet reaped, so still ours to signal
            os.kill(pid, signal.SIGINT)

    # -- the run --------------------------------------------------------------------------

    def run(self) -> FleetDocument:
        queue = self.order()
        self.order_names = [h.name for h in queue]
        if self.args.canary is not None and not self.dry_run:
            self.canary = queue[0]
        _preload(self.config, self.program)
        self.tmp = tempfile.mkdtemp(prefix="vq-admin-fleet-")
        try:
            with interrupts.handled_by(self.on_signal):  # it tells the workers
                while queue and self.not_started() is None:
                    if len(self.running) < self.limit():
                        self.start(queue.pop(0))
                    else:
                        self.wait_one()
                while self.running:
                    self.wait_one()
                for host in queue:
                    self.skip(host, self.not_started())
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return self.document()

    def limit(self) -> int:
        """How many workers may run at once: the canary runs alone."""
        return 1 if self.canary is not None and self.canary.doc.outcome == "running" else self.parallel

    def not_started(self) -> str | None:
        """Why the hosts left are not started (``None``: the next one may start)."""
        canary = self.canary
        if canary is not None and canary.doc.finished_at is not None and not canary.succeeded:
            return f"the canary {canary.name} ended {canary.doc.outcome}"
        if self.interrupted:
            return f"not started: vq-admin received {self.interrupted}"
        if not self.dry_run and self.failed > self.max_failed:  # a dry run plans every host
            return (f"not started: {self.failed} host(s) ended other than ok/already-current "
                    f"(--max-failed {self.max_failed})")
        return None

    def unstored(self) -> list[str]:
        """One warning per host whose run could not store its receipt or records (its own document says
        what, and the rerun that records it)."""
        return [f"vq-admin: warning: fleet: {h.name}: {h.doc.outcome}, but not recorded: "
                f"{', '.join(h.answer.not_stored)}; rerun this rollout (it verifies read-only first "
                "and records it)" for h in self.hosts if h.answer and h.answer.not_stored]

    def skip(self, host: HostRun, reason: str | None) -> None:
        host.set(outcome="skipped", reason=reason)
        self.announce(host)

    # -- results --------------------------------------------------------------------------

    def outcome(self, rollout: list[HostRun]) -> Outcome:
        """ok (already-current when every host was) only when every host of *rollout* succeeded; else the
        outcome of the most severe host code (``exits.SEVERITY``; an interrupted rollout is at least unknown)."""
        if all(h.succeeded for h in rollout):
            return Outcome.ALREADY_CURRENT if all(h.doc.outcome == "already-current" for h in rollout) else Outcome.OK
        codes = {h.doc.exit_code for h in rollout if h.doc.exit_code}
        if self.interrupted:
            codes.add(Outcome.UNKNOWN.exit_code)
        code = next((code for code in exits.SEVERITY if code in codes), min(codes, default=Outcome.FAILED.exit_code))
        return _OUTCOME_BY_CODE.get(code, Outcome.FAILED)

    def document(self) -> FleetDocument:
        rollout = [h for h in self.hosts if h.in_rollout]
        outcome = self.outcome(rollout)
        errors = [f"{h.name}: {h.doc.outcome}" + (f": {h.doc.errors[-1]}" if h.doc.errors else
                                                  f" ({h.doc.reason})" if h.doc.reason else "")
                  for h in rollout if not h.succeeded]
        return FleetDocument(
            schema=SCHEMA, outcome=outcome.value, exit_code=outcome.exit_code, id=None, program=self.program,
            expected_sha=self.sha, tag=self.tag, canary=self.args.canary, parallel=self.parallel,
            max_failed=self.max_failed, started_at=self.started_at, finished_at=utc_now(), interrupted=self.interrupted,
            hosts={h.name: h.doc.replace(errors=h.doc.errors[:3]) for h in self.hosts},
            configuration_order=[h.name for h in self.hosts], order=self.order_names, dry_run=self.dry_run,
            plans={h.name: h.plan for h in self.hosts if h.plan is not None} if self.dry_run else None, errors=errors)

    def announce(self, host: HostRun) -> None:
        if self.dry_run:
            return
        line = _host_line(host.name, host.doc)
        if self.terminal:
            print(line, flush=True)
        elif self.args.json and sys.stderr.isatty():
            print(line, file=sys.stderr, flush=True)


def _host_line(name: str, host: FleetHost) -> str:
    code = "-" if host.exit_code is None else str(host.exit_code)
    text = f"vq-admin: fleet: {name}: {host.outcome} (exit {code})"
    if host.seconds is not None:
        text += f" in {host.seconds:.1f} s"
    if host.receipt:
        text += f", receipt {host.receipt}"
    if host.reason:
        text += f" ({host.reason})"
    elif host.errors and not host.succeeded:
        text += f": {host.errors[-1]}"
    return safe_text(text)


def table(doc: FleetDocument) -> list[str]:
    """The final table: one row per configured host."""
    rows = [("HOST", "ROLE", "OUTCOME", "EXIT", "SECONDS", "RECEIPT / REASON")]
    for name in doc.configuration_order:
        h = doc.hosts[name]
        code = "-" if h.exit_code is None else str(h.exit_code)
        seconds = "-" if h.seconds is None else f"{h.seconds:.1f}"
        detail = h.receipt or h.reason or ""
        if h.errors and h.outcome not in ("ok", "already-current", "skipped"):
            detail += f"  {h.errors[-1]}"
        rows.append((name, h.role, h.outcome, code, seconds, detail))
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]  # rstripped below
    head = (f"vq-admin: fleet {doc.program} {doc.expected_sha}: {doc.outcome} (exit {doc.exit_code})"
            + (f", interrupted by {doc.interrupted}" if doc.interrupted else ""))
    return [safe_text(line.rstrip()) for line in [head, *lines]]


def dry_run_lines(doc: FleetDocument) -> list[str]:
    from .report.output import plan_summary

    lines = [f"vq-admin: dry run: fleet {doc.program} {doc.expected_sha}: {len(doc.order)} host(s) in this "
             f"order (--parallel {doc.parallel}, --max-failed {doc.max_failed}"
             + (f", canary {doc.canary} first" if doc.canary else "") + "); nothing is run"]
    for i, name in enumerate(doc.order, 1):
        lines.append(f"{i}. {name}")
        plan = (doc.plans or {}).get(name) or {}
        if plan.get("steps") is not None:
            lines.extend("   " + line for line in plan_summary(plan))
        else:
            said = WorkerAnswer.from_value(plan, name)  # what _read_answer already checked the plan holds
            lines.append(f"   {said.outcome or 'no plan'}: {'; '.join(said.errors)}")
    lines.extend(f"-  {name}: skipped ({doc.hosts[name].reason})" for name in doc.configuration_order
                 if doc.hosts[name].outcome == "skipped")
    return [safe_text(line) for line in lines]


def store(state: StateDir, doc: FleetDocument) -> tuple[FleetDocument, str]:
    """The fleet receipt (immutable, named by its new ``id``) and one admin-log line."""
    doc = doc.replace(id=f"{utc_now(fmt=NAME)}-fleet-{doc.program}-{secrets.token_hex(4)}")
    path = state.root / "fleet" / f"{doc.id}.json"
    state.tree.write_atomic(["fleet"], path.name, dump_json(doc.to_value()), exclusive=True)  # every level checked
    state.append_log(LogLine(at=doc.finished_at, lane="fleet", host=None, program=doc.program,
                             expected_sha=doc.expected_sha, outcome=doc.outcome, exit_code=doc.exit_code,
                             receipt=str(path), errors=(),
                             hosts={name: doc.hosts[name].outcome for name in doc.configuration_order}))
    return doc, str(path)


def run_fleet(args: argparse.Namespace, program: str, sha: str) -> int:
    check_args(args)
    config = load_config(args.config)
    rollout = Rollout(args, config, program, sha)
    doc = rollout.run()
    path, warnings = None, rollout.unstored()
    if not rollout.dry_run:
        try:
            doc, path = store(StateDir(args.state_dir), doc)
        except OSError as exc:  # the hosts' outcomes stand: the document is printed, and says where it is not
            warnings.append(f"vq-admin: warning: fleet {program}: {doc.outcome}, but its document could not be "
                            f"stored in {StateDir(args.state_dir).root}: {exc.strerror or exc}")
    for line in warnings:  # in every mode, --json included: cron mails it
        print(safe_text(line), file=sys.stderr, flush=True)
    if args.json:
        envelope.write(doc.to_value())
    elif rollout.dry_run:
        print("\n".join(dry_run_lines(doc)), flush=True)
    elif doc.exit_code != 0:
        print("\n".join(table(doc) + [f"  receipt   {path or 'not stored'}"]), file=sys.stderr, flush=True)
    elif rollout.terminal or args.verbose:
        print("\n".join(table(doc) + [f"  receipt   {path or 'not stored'}"]), flush=True)
    return doc.exit_code


def _preload(config: Config, program: str) -> None:
    """Import what every worker needs once, before forking (each would otherwise pay
    for it): the lane modules, what a run imports on its way (the early ssh session,
    the deploy steps, the registry and history, ``time.strptime``'s module), and the
    providers the rollout's profiles name."""
    from .ssh import early_session  # noqa: F401
    from .state import history  # noqa: F401
    from .launcher import registry  # noqa: F401
    from .lanes import allocation_step, detached_step, runner, runtime  # noqa: F401
    from .plugins import Providers

    time.strptime("2000", "%Y")  # imports _strptime (and calendar) once, not once per worker

    names = {h.runtimes[program].provider for h in config.hosts.values() if program in h.runtimes}
    try:
        Providers.load(sorted(names))
    except Exception:  # noqa: BLE001 - each worker reports its own provider error in its receipt
        pass


def _read_answer(path: str) -> tuple[JsonObject | None, WorkerAnswer | None]:
    """The document a worker printed (bounded), and what the rollout reads of it; ``None`` when it printed none."""
    try:
        with open(path, "rb") as fh:
            raw = json_object(fh.read(), limit=MAX_STATE_FILE)
        return raw, WorkerAnswer.from_value(raw, path)
    except (OSError, InputError):
        return None, None


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            lines = fh.read()[-2000:].decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""

