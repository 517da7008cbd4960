"""Prune: ``vq admin prune PROGRAM HOST [--keep N]`` (CONTRACT section 8).

One prune, in order (the same lane entry, lock and key as ``update``):

1. authority (``managed``), the profile, a prune operation (``prune_command``
   or a provider's ``vq_admin_runtime_prune``; none: exit 2 naming
   ``prune_command``), and LAST OK (none: 77, nothing was verified here);
2. ``verify-active``: a fresh read-only verify of LAST OK on the login host;
   not proven: 77, nothing is called;
3. ``census``: every pending, running, suspended, requeued or held Slurm job
   and the generations it references (:func:`vq_admin.launcher.references.census`:
   one agent call on the login host); incomplete (controller down, timeout, an
   unreadable job script): 77, nothing is called; the receipt's
   ``prune.census.cost`` says what it asked of the scheduler;
4. the keep set, each SHA with its reasons: ``active``, ``last-ok``,
   ``last-good``, ``recent (i of N)`` (the N most recent distinct verified
   SHAs, from the history index), ``used 2026-11-30 (2 d ago)`` (a use
   recorded within ``--used-within`` days: :mod:`vq_admin.launcher.uses`)
   and ``job <id> (<state>)``;
5. ``prune``: the provider's command on the login host with that keep set
   (asked once, when the plan is made: the keep set is the list slot
   :data:`KEEP`, ``[<kept sha>]...``, filled here); its stdout is the prune
   report (``PruneReport``), parsed strictly; a removed SHA that was kept
   fails the run;
6. every removed SHA is marked pruned in the registry of verified launchers
   (its launcher then refuses with reason ``pruned``);
7. ``verify``: the active identity is proven again, and ``kept-readback-*``:
   every kept launcher the registry records still exists and hashes to its
   attested SHA-256 on the login host; otherwise ``failed`` (1), naming it;
   a read-back whose transport was interrupted is ``unknown`` (3): rerun.

``--dry-run`` runs the read-only steps 2 and 3, prints each generation kept,
with its reasons, and each registered generation that would be removed,
each with its last recorded use (``prune.last_used``), and calls nothing; its
plan shows the prune command with the keep set's slot.
"""

from __future__ import annotations

import time
from typing import Any

from vq_admin_hookspecs import EvidenceError, ProviderCommand, PruneReport, PruneRequest, RuntimeRequest, Slot

from ..config import authority
from ..state import history
from ..state.records import Verified
from ..launcher import registry
from ..core import protocol
from ..context import RunContext
from ..report.outcome import Outcome, Refused, UsageError
from ..plan import Step, execute, filled, place_command
from ..plugins import ProviderError
from ..report.receipt import Receipt
from ..report.sections import KeptLauncher, Prune, PruneCensus, Readback, Verify
from ..launcher.references import Census, CensusError, census
from ..launcher.references import TIMEOUT as CENSUS_TIMEOUT
from ..core.stamps import utc_now
from ..ssh.transport import quote_argv
from . import command_files as remote_paths
from .conclude import conclude, exited, rerun_command
from .verify import Verification, plan_verify, run_verify

VERIFIED = ("ok", "already-current")
#: The slot of the ``kept-readback`` step: each kept launcher, one step per launcher at run time.
KEPT_LAUNCHER = Slot("launcher", label="each kept launcher")
#: The keep set in the prune request: a list slot (one word per kept SHA, behind the provider's
#: ``each`` words), filled with the census's keep set when the prune runs.
KEEP = Slot("keep", label="kept sha", many=True)


class RuntimePrune:
    """One prune of one program on one host."""

    def __init__(self, ctx: RunContext, host_name: str, program: str, keep_recent: int,
                 forget: str | None = None, used_within: float = 14):
        self.ctx = ctx
        self.used_within = used_within
        #: ``--forget-driver ID``: a retired driver whose roots this prune drops, recorded on the host
        self.forget = forget
        self.host, self.profile = authority.runtime_profile(ctx.config, host_name, program)
        self.keep_recent = keep_recent
        where = f"hosts.{host_name}.scheduler_runtime_deployments.{program}"
        last_ok = ctx.state.verified("runtime", host_name, program)
        self._command: ProviderCommand | None = None
        try:
            self.prune_command()
        except ProviderError as exc:
            raise UsageError(f"{where} has no prune operation: configure prune_command (or use a provider that "
                             f"implements vq_admin_runtime_prune); {exc.message}") from None
        if last_ok is None:
            raise Refused(f"{program} on {host_name} has no LAST OK in {ctx.state.root}: nothing was verified here, "
                          "so the active generation cannot be proven; nothing was pruned")
        self.sha, self.tag = last_ok.sha, last_ok.tag or None
        self.receipt = Receipt("runtime", self.host.name, program, self.sha, self.tag, utc_now())
        self.keep: dict[str, list[str]] = {}
        self.receipt.prune = Prune(keep=self.keep, removed=[], keep_recent=keep_recent, used_within_days=used_within)
        self.receipt.rerun = ["vq", "admin", "prune", program, host_name, "--keep", str(keep_recent),
                              *(["--used-within", f"{used_within:g}"] if used_within != 14 else [])]

    def note(self, **members: Any) -> Prune:
        """The receipt's ``prune`` section, with *members* added."""
        assert self.receipt.prune is not None  # set by __init__
        self.receipt.prune = self.receipt.prune.replace(**members)
        return self.receipt.prune

    def request(self) -> RuntimeRequest:
        return RuntimeRequest(program=self.profile.program, host=self.host.name, expected_sha=self.sha, tag=self.tag,
                              where="login-host", settings=self.profile.settings())

    def prune_command(self) -> ProviderCommand:
        """The provider's prune command, asked once per run when the plan is made, with the keep set
        as the list slot :data:`KEEP`; it must place that slot exactly once, as a whole argv word
        (a prune command that does not carry the keep set is refused: exit 2, nothing runs)."""
        if self._command is None:
            request = PruneRequest(self.profile.program, self.host.name, KEEP, self.profile.settings())
            self._command = place_keep(self.profile.provider, self.ctx.providers.runtime_prune(self.profile.provider,
                                                                                               request))
        return self._command

    def make_plan(self) -> None:
        ctx, plan, p = self.ctx, self.receipt.plan, self.profile
        where = ctx.login(self.host).where
        remote_paths.plan_places(plan, self.host.agent, self.command_places())  # before any of them runs
        self.pre = plan_verify(ctx, plan, "verify-active", self.host, p, self.request())
        plan.add("census", where, protocol.census(self.host.agent), "every queued, running, suspended or held job "
                 "and the generations it references (one squeue listing; a stored script only for a job not seen "
                 "by an earlier census)")
        command = self.prune_command()  # the keep set is the KEEP slot, filled in prune()
        plan.add("prune", where, command.argv, f"provider {p.provider}: remove releases outside the keep set",
                 dict(command.env))
        self.post = plan_verify(ctx, plan, "verify", self.host, p, self.request())
        plan.add("kept-readback", where, protocol.hash_file(self.host.agent, KEPT_LAUNCHER),
                 "every kept launcher still hashes to its attested SHA-256")

    def command_places(self) -> list[remote_paths.Place]:
        """The command files of a prune on the login host: the agent, ``verify_command`` and
        ``prune_command`` (a dry run runs the verify too, so it is checked as well)."""
        p = self.profile
        key = f"hosts.{self.host.name}.scheduler_runtime_deployments.{p.program}.prune_command"
        return remote_paths.gather([
            *remote_paths.login_entries(self.ctx, self.host, p, self.request()),
            (self.ctx.login(self.host), key, remote_paths.profile_words(p, "prune_command",
                                                                         self.prune_command().argv))])

    def verify(self, steps: tuple[Step, Step]) -> Verification:
        return run_verify(self.ctx, self.host, self.profile, self.request(), *steps)

    def run(self) -> Receipt:
        self.make_plan()
        remote_paths.run_places(self.receipt.plan, self.host.agent, self.host.name, self.command_places())
        pre = self.verify(self.pre)
        self.receipt.verify = Verify(pre=pre.to_dict())
        if not pre.proven:
            raise Refused(f"verify-active: the active generation of {self.profile.program} on {self.host.name} is not "
                          f"proven to be LAST OK {self.sha} ({pre.why()}); nothing was pruned")
        assert pre.receipt is not None  # proven
        #: what the host's record gets of this prune: the active generation it proved (LAST OK stays as it is)
        self.proved = Verified(sha=self.sha, tag=pre.receipt.tag, launcher=pre.receipt.active_path,
                               launcher_sha256=pre.receipt.active_path_sha256)
        self.add(self.sha, "active")
        self.add(self.sha, "last-ok")
        last_good = self.ctx.state.verified("runtime", self.host.name, self.profile.program, "last-good")
        if last_good is not None:
            self.add(last_good.sha, "last-good")
        for i, sha in enumerate(self.recent(), 1):
            self.add(sha, f"recent ({i} of {self.keep_recent})")
        self.keep_used()
        self.add_roots()
        doc = self.take_census()
        for row in doc.generations:
            for job in row.jobs:
                self.add(row.sha, f"job {job.id} ({job.state})")
        for sha, labels in doc.unregistered.items():
            for label in labels:
                self.add(sha, label)
        self.note(census=PruneCensus(where=doc.where, cost=doc.cost.to_value(), taken_at=doc.taken_at,
                                     jobs_scanned=doc.jobs_scanned, warnings=list(doc.warnings)))
        if self.ctx.options.dry_run:
            return self.dry_run()
        return self.prune()

    def add_roots(self) -> None:
        """Every other driver's newest roots on the host's record, signed or not (CONTRACT section 12):
        ``root of USER@HOST/ID (last-ok)``; after ``--forget-driver ID``, that driver's are no longer kept."""
        from ..record import view

        host, program = self.host.name, self.profile.program
        forgotten = self.forget
        if forgotten is not None and not self.ctx.options.dry_run:
            self.note(forgot={"driver": forgotten, **view.forget_driver(self.ctx, self.receipt, forgotten).to_value()})
        me = view.driver_id(self.ctx.state)
        found = view.newest_roots(view.entries(self.ctx.state, host, program), self.ctx.config.signing is not None)
        for driver, roots in sorted(found.items()):
            if driver in (me, forgotten):
                continue
            for root in roots.roots:
                self.add(root.sha, f"root of {driver} ({root.kind})")

    def add(self, sha: str, reason: str) -> None:
        reasons = self.keep.setdefault(sha.lower(), [])
        if reason not in reasons:
            reasons.append(reason)

    def recent(self) -> list[str]:
        """The N most recent distinct verified SHAs of this host and program (the history index)."""
        found: list[str] = []
        if self.keep_recent <= 0:
            return found
        for item in history.newest_first(self.ctx.state.root):
            if (item.host, item.program, item.lane) != (self.host.name, self.profile.program, "runtime"):
                continue
            sha = item.expected_sha
            if (item.outcome in VERIFIED and item.verb in ("update", "rollback")
                    and isinstance(sha, str) and sha not in found):
                found.append(sha)
                if len(found) >= self.keep_recent:
                    break
        return found

    def keep_used(self) -> None:
        """Keep every generation with a use recorded within ``--used-within`` days (``used DAY (N d ago)``);
        the receipt's ``prune.last_used`` names each generation's last recorded use."""
        from ..launcher.recall import read_uses
        from ..core.stamps import parse_utc
        from ..launcher.uses import stamp

        now = time.time()
        cutoff = stamp(now - self.used_within * 86400)
        found = read_uses(self.ctx.state.root, self.host.name, self.profile.program)
        self.note(last_used={sha: usage.last for sha, usage in sorted(found.items()) if usage.last})
        for sha, usage in sorted(found.items()):
            if usage.last and usage.last >= cutoff:
                ago = int((now - (parse_utc(usage.last[:19] + "Z") or now)) // 86400)
                self.add(sha, f"used {usage.last[:10]} ({ago} d ago)")

    def take_census(self) -> Census:
        """The census: its one agent call is the planned step ``census``, whose detail says what it cost."""
        step, login = self.receipt.plan.get("census"), self.ctx.login(self.host)
        started = time.monotonic()
        try:
            doc = census(self.ctx.state, login, self.host.agent, self.host.name, self.profile.program,
                         lambda: execute(step, login, timeout=CENSUS_TIMEOUT))
        except CensusError as exc:
            step.seconds = time.monotonic() - started
            if step.status in ("planned", "ok"):  # the agent answered; its answer failed the census
                step.status, step.exit_code = "failed", step.exit_code or 1
            step.detail = exc.message
            if exc.cost is not None:
                self.note(census=PruneCensus(where=login.where, cost=exc.cost.to_value()))
            raise Refused(f"census: {exc.message}; the jobs that still need a generation are not known, so nothing "
                          "was pruned (under-keeping breaks running jobs); rerun when the scheduler answers") from None
        step.seconds = time.monotonic() - started
        cost = doc.cost
        step.detail = (f"{doc.jobs_scanned} jobs read: {cost.scripts_read} scripts read, "
                       f"{cost.scripts_cached} cached, {cost.scheduler_calls} scheduler calls")
        return doc

    def candidates(self) -> list[str]:
        """Registered generations outside the keep set and not pruned yet."""
        return [e.sha for e in registry.entries(self.ctx.state.root, self.host.name, self.profile.program)
                if e.sha not in self.keep
                and registry.pruned(self.ctx.state.root, self.host.name, self.profile.program, e.sha) is None]

    def dry_run(self) -> Receipt:
        would = self.candidates()
        last_used = self.note(would_remove=would).last_used  # the plan's prune step keeps its keep-set slot
        if not self.ctx.options.json:
            print("\n".join(keep_lines(self.profile.program, self.host.name, self.keep, would, last_used or {})),
                  flush=True)
        return conclude(self.ctx, self.receipt, Outcome.OK)

    def prune(self) -> Receipt:
        ctx, receipt = self.ctx, self.receipt
        try:  # the keep set by the request's own rule (full SHAs, lower-cased, at least one) before it is a word
            keep = list(PruneRequest(self.profile.program, self.host.name, tuple(self.keep)).keep)
        except EvidenceError as exc:
            receipt.errors.append(f"prune: the keep set is not well-formed, so the prune was not run: {exc}")
            return conclude(ctx, receipt, Outcome.FAILED)
        step = receipt.plan.get("prune")
        argv, _ = filled(step, keep=keep)
        ctx.narrate(f"pruning {self.profile.program} on {step.where}, keeping {len(keep)}: {quote_argv(argv)}")
        result = execute(step, ctx.login(self.host), timeout=self.profile.timeout_seconds, keep=keep)
        receipt.record_command(result, step.where)
        if result.interrupted:
            receipt.errors.append(f"prune: {result.describe()}")
            receipt.readback = Readback(read="nothing (the prune command's transport was interrupted)", proven=False,
                                        next_command=rerun_command(ctx, receipt),
                                        advice="what the provider removed is not known; rerunning prunes again "
                                               "with a fresh census and reports what is gone")
            return conclude(ctx, receipt, Outcome.UNKNOWN)
        failures = ([exited("prune: the provider", result.exit_code, result.error_text())]
                    if result.exit_code != 0 else [])
        try:
            report = PruneReport.parse(result.stdout)
        except EvidenceError as exc:
            failures.append(f"prune: {exc}")
        else:
            self.note(removed=list(report.removed), kept=list(report.kept))
            for sha in report.removed:
                receipt.id = receipt.id or ctx.state.new_receipt_id("runtime", self.host.name, self.profile.program)
                registry.mark_pruned(ctx.state.root, self.host.name, self.profile.program, sha, receipt.id, utc_now())
            failures += [f"prune: the provider removed {sha}, which was kept ({', '.join(self.keep[sha])})"
                         for sha in sorted(set(report.removed) & set(self.keep))]
        post = self.verify(self.post)
        receipt.verify = receipt.verify.replace(final=post.to_dict())
        unread: list[str] = []
        if post.interrupted:
            unread.append(f"verify: {post.error}")
        elif not post.proven:
            failures.append(f"verify: the active generation {self.sha} is no longer proven after the prune: "
                            f"{post.why()}")
        kept_failures, kept_unread = self.check_kept()
        failures += kept_failures
        unread += kept_unread
        if failures:
            receipt.errors.extend(failures + unread)
            return conclude(ctx, receipt, Outcome.FAILED)
        if unread:  # the prune ran; whether what must stay is intact could not be read back
            receipt.errors.extend(unread)
            receipt.readback = Readback(read="fresh read-only verify and kept-launcher read-back on the login host",
                                        proven=False, next_command=rerun_command(ctx, receipt),
                                        advice="the transport was interrupted while checking what was kept; "
                                               "rerunning verifies the active generation and every kept launcher "
                                               "again")
            return conclude(ctx, receipt, Outcome.UNKNOWN)
        return conclude(ctx, receipt, Outcome.OK, recorded=self.proved)

    def check_kept(self) -> tuple[list[str], list[str]]:
        """Every kept launcher the registry records must exist and hash to its attested SHA-256.

        Returns ``(failures, unread)``: what is proven broken, and what could not be read back."""
        failures: list[str] = []
        unread: list[str] = []
        checked: dict[str, KeptLauncher] = {}
        root, host, program = self.ctx.state.root, self.host.name, self.profile.program
        for sha in sorted(self.keep):
            try:
                entry = registry.lookup(root, host, program, sha)
            except registry.PrunedError:
                continue  # pruned by an earlier run: nothing left to check
            except registry.RegistryError as exc:
                failures.append(f"kept {sha}: {exc}")
                continue
            if entry is None:
                continue
            # one step per kept launcher, a copy of the planned one
            step = self.receipt.plan.again("kept-readback", f"kept-readback-{sha[:12]}",
                                           f"kept launcher of {sha}: still there, same bytes")
            result = execute(step, self.ctx.login(self.host), timeout=self.profile.verify_timeout_seconds,
                             launcher=entry.launcher)
            answer = _hash_answer(result.stdout)
            if result.interrupted:
                checked[sha] = KeptLauncher(launcher=entry.launcher, ok=None, detail=result.describe())
                unread.append(f"kept {sha}: could not be read back: {result.describe()}")
                continue
            if answer is not None and answer.get("exists") is False:
                problem = f"its launcher {entry.launcher} no longer exists"
            elif answer is None or answer.get("sha256") != entry.launcher_sha256:
                now = answer and (answer.get("sha256") or answer.get("error"))
                problem = f"its launcher {entry.launcher} now hashes to {now}, attested {entry.launcher_sha256}"
            else:
                problem = None
            checked[sha] = KeptLauncher(launcher=entry.launcher, ok=problem is None, detail=problem)
            if problem:
                failures.append(f"kept {sha} ({', '.join(self.keep[sha])}): {problem}")
        if self.receipt.plan.has("kept-readback"):
            self.receipt.plan.steps.remove(self.receipt.plan.get("kept-readback"))
        self.note(kept_launchers=checked)
        return failures, unread


def place_keep(provider: str, command: ProviderCommand) -> ProviderCommand:
    """*command*, the answer of *provider*'s prune hook to a request holding :data:`KEEP`, with the
    keep set's list slot found again; it must place that slot exactly once, as a whole argv word
    (:class:`UsageError`, exit 2, otherwise: a prune that does not carry the keep set never runs)."""
    try:
        keeping = place_command(command, KEEP)
    except ValueError as exc:
        raise UsageError(f"provider {provider!r}: vq_admin_runtime_prune: {exc}") from None
    placed = [w for w in keeping.argv if isinstance(w, Slot) and w.many and w.name == KEEP.name]
    if len(placed) != 1:
        raise UsageError(f"provider {provider!r}: the command of vq_admin_runtime_prune places the keep set "
                         f"{len(placed)} times (it must carry it exactly once, e.g. request.keep_words('--keep')): "
                         f"{quote_argv(list(command.argv))}")
    return keeping


def _hash_answer(stdout: bytes) -> protocol.Hashed | None:
    """The agent's ``hash-file`` answer; ``None`` when unreadable (the launcher is then not proven)."""
    try:
        return protocol.parse_hash_file(stdout)
    except protocol.ProtocolError:
        return None


def keep_lines(program: str, host: str, keep: dict[str, list[str]], would: list[str],
               last_used: dict[str, str] | None = None) -> list[str]:
    from ..report.output import generation_lines, safe_text

    lines = [f"vq-admin: dry run: prune {program} on {host} keeps {len(keep)} generation(s) and would remove "
             f"{len(would)}; nothing is called",
             *generation_lines(keep, would, dry_run=True, last_used=last_used or {})]
    return [safe_text(line) for line in lines]
