"""The runtime lane: ``vq admin update PROGRAM HOST --expected-sha SHA``.

One update, in order:

1. authority (``managed`` only) and the profile -- before anything runs;
2. the plan: every step, where it runs, with what argv;
3. the lane lock (host, program): a second run exits 75 at once;
4. source: the exact commit in ``source_repo``, its tree and tag;
5. pre-verify on the login host: if the requested identity is already
   active and proven, the outcome is ``already-current`` (``--force`` rebuilds);
   a provider reporting an update still running refuses the build (75);
6. the push-fed source mirror and the site preparer, when configured;
   archive, stage on the build host, verify the stage there (77 on mismatch);
7. the provider's update (or install) on the build host or in an allocation;
8. verify on the login host, with vq-admin's own launcher read-back;
9. an interrupted transport in 7 or 8 is resolved only by a fresh read-only
   verify: proven -> ``ok``; otherwise ``unknown`` (exit 3), naming what to do;
10. reclaim the stage, conclude: receipt, LAST OK / LAST GOOD, admin log.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import TYPE_CHECKING

from vq_admin_hookspecs import ProviderCommand, RuntimeRequest, Slot

from ..config import authority
from ..core.identifiers import TAG_RE
from ..report import progress
from .. import source
from ..evidence import LAUNCHER_TRUST
from ..launcher import registry
from ..context import RunContext
from ..report.outcome import READ_ONLY_RAN, Locked, Outcome, Refused, UsageError, VqAdminError
from ..plan import Step, execute, fill_command, filled, offer, place_command
from ..report.progress import CommandView
from ..report.receipt import Receipt
from ..report.sections import Readback, Reverted, Verify
from ..core.stamps import utc_now
from ..state.records import Verified
from ..ssh.transport import RunResult, Transport, quote_argv
from . import allocation_attempt, first_call, command_files as remote_paths
from .conclude import conclude, provider_ended, rerun_command
from .interrupted import known, rerun_advice
from .runtime_step import RuntimeStep
from .staging import SourceStage
from .verify import Verification, plan_readback_verify, plan_verify, readback_verify_steps, run_verify

#: The staged archive, as the provider's update or install hook receives it (``<stage>/source.tar``).
ARCHIVE = Slot("stage", suffix="/source.tar")
#: Why a run whose read-only pre-verify was interrupted is unknown: what is known of this run.
PRE_VERIFY_CUT = "the read-only pre-verify was interrupted; nothing was deployed or activated"

if TYPE_CHECKING:  # the steps' modules are imported when a profile needs them (an already-current run never does)
    from .allocation_step import AllocationDeploy
    from .confirm_step import Confirmation, Previous
    from .mirror_step import MirrorFeed

class RuntimeUpdate:
    """One runtime update of one program on one host."""

    #: The host-side lease is taken in the run's first agent call (:mod:`.first_call`).
    opens_lease = True

    def __init__(self, ctx: RunContext, host_name: str, program: str, sha: str, tag: str | None):
        self.ctx = ctx
        self.host, self.profile = authority.runtime_profile(ctx.config, host_name, program)
        if ctx.options.cluster_install and not self.profile.has_install:
            raise UsageError(f"--cluster-install: profile {program} on {host_name} has no install operation "
                             f"(install_command is not configured)")
        try:
            mark = registry.quarantined(ctx.state.root, self.host.name, program, sha)
        except registry.RegistryError as exc:
            raise Refused(f"the verified-launcher registry cannot be trusted: {exc}; {READ_ONLY_RAN}") from None
        if mark is not None:
            raise Refused(f"{sha} of {program} on {self.host.name} is quarantined: {mark.reason}; end the "
                          f"quarantine first: vq admin quarantine {program} {self.host.name} {sha} --lift; "
                          f"{READ_ONLY_RAN}")
        self.sha = sha
        self.requested_tag = tag
        #: the label the requested SHA was active under before this run, when not the expected one
        self.active_label: tuple[str | None] | None = None
        self.receipt = Receipt("runtime", self.host.name, program, sha, tag, utc_now())
        self.source: source.SourceIdentity | None = None
        self._deploy: ProviderCommand | None = None
        self.staging = SourceStage(self.receipt, self.build_transport(), self.host.agent, self.host.scratch_root,
                                   "runtime", program, self.profile.timeout_seconds)
        #: What this lane's steps are built from (:mod:`.runtime_step`): they never see the lane itself.
        self.inputs = RuntimeStep(ctx, self.host, self.profile, self.receipt, sha, self.staging)
        self.mirror: MirrorFeed | None = None
        self.deployer: AllocationDeploy | None = None  # an allocation or detached deploy step, once planned
        self.confirmation: Confirmation | None = None  # the confirmation job (confirm_command), once planned
        self.previous: Previous | None = None  # the generation active before this run (a failed confirmation's)

    def request(self, *, archive: str | None, where: str | None = None) -> RuntimeRequest:
        return RuntimeRequest(
            program=self.profile.program,
            host=self.host.name,
            expected_sha=self.sha,
            tag=self.receipt.tag,
            update_script_args=self.ctx.options.update_script_args if archive is not None else (),
            source_archive=archive,
            where=where or ("login-host" if archive is None else self.profile.build_place),
            settings=self.profile.settings(),
        )

    def build_transport(self) -> Transport:
        return self.ctx.remote(self.host, self.profile.update_host)

    def make_plan(self) -> None:
        ctx, plan, p = self.ctx, self.receipt.plan, self.profile
        self.source = source.resolve(p.source_repo, self.sha, self.requested_tag, infer=False)
        self.source = replace(self.source, tag=self.expected_tag(self.source.tags))
        self.receipt.tag = self.source.tag
        self.receipt.source = self.source.to_receipt()
        self.receipt.provider = p.provider
        self.receipt.build_place = p.build_place
        remote_paths.plan(self)  # configured command files on each ssh host, before any of them runs
        allocation_attempt.plan_previous(self.inputs)  # an interrupted run's batch job or build: its end first
        self.pre = plan_verify(ctx, plan, "pre-verify", self.host, p, self.request(archive=None))
        if p.feed_source_mirror is not None:  # the feed and the preparer come before anything is staged
            from .mirror_step import MirrorFeed

            self.mirror = MirrorFeed.like(self.inputs)
            self.mirror.plan()
        self.staging.plan_source(p.source_repo, self.sha, "runtime")
        self.staging.plan_stage(self.source)
        build = self.build_transport().where
        deploy = self.planned_deploy()
        purpose = f"provider {p.provider}: {'install' if ctx.options.cluster_install else 'update'}"
        from . import detached_step
        if p.update_allocation is not None:
            from .allocation_step import AllocationDeploy

            self.deployer = AllocationDeploy.like(self.inputs)
            self.deployer.plan(deploy, purpose)
        elif detached_step.applies(self.inputs):  # a fixed-host build over ssh runs detached
            self.deployer = detached_step.DetachedDeploy.like(self.inputs)
            self.deployer.plan(deploy, purpose)
        else:
            plan.add("deploy", build, deploy.argv, purpose, dict(deploy.env))  # the slot placed: filled in deploy()
        self.post = plan_verify(ctx, plan, "verify", self.host, p, self.request(archive=None))
        plan_readback_verify(plan, self.post)
        if p.confirm is not None:  # after the final verify, before LAST OK and the registry move
            from .confirm_step import Confirmation

            self.confirmation = Confirmation.like(self.inputs)
            self.confirmation.plan()
        self.staging.plan_reclaim()

    def expected_tag(self, tags: tuple[str, ...]) -> str | None:
        """The tag the runtime must report (CONTRACT sections 1 and 15): ``--tag``; else, when LAST OK
        is this SHA, the label it was verified with (the SHA is the identity, a tag a label: a tag added
        since changes nothing); else the one tag of ``source_repo`` at the SHA (several: exit 2)."""
        if self.requested_tag is not None:
            return self.requested_tag
        last = self.ctx.state.verified("runtime", self.host.name, self.profile.program)
        if last is None or last.sha != self.sha:
            return source.expected_tag(self.sha, tags)
        label = last.tag if isinstance(last.tag, str) and TAG_RE.match(last.tag) else None
        if tags != ((label,) if label else ()):
            self.receipt.notes.append(_label_note(tags, label, "the label LAST OK recorded for it"))
        return label

    def proves(self, found: Verification, *, before: bool = False) -> bool:
        """*found* proves the requested identity: every check passed; or, the tag being inferred (no
        ``--tag``), every check but the label's, when the SHA was already active under that label
        before this run (*before*: this is that pre-verify): a tag added after the deploy never fails
        it (CONTRACT section 15), and a note names the tags found and the label."""
        if found.proven:
            return True
        if self.requested_tag is not None or not found.proven_but_label():
            return False
        assert found.receipt is not None and self.source is not None
        label = found.receipt.tag  # passed back to the provider later (--force): the tag rule first
        if label is not None and not TAG_RE.match(label):
            return False
        if before:
            self.active_label = (label,)
        if self.active_label != (label,):  # a build that ends under another label than asked fails
            return False
        note = _label_note(self.source.tags, label, "the label the runtime reports")
        if note not in self.receipt.notes:
            self.receipt.notes.append(note)
        return True

    def planned_deploy(self) -> ProviderCommand:
        """The provider's update (or install) command, asked once per run when the plan is made: the
        staged archive is the :data:`ARCHIVE` slot, which :meth:`deploy` fills with this run's stage."""
        if self._deploy is None:
            providers, request = self.ctx.providers, self.request(archive=ARCHIVE)
            hook = providers.runtime_install if self.ctx.options.cluster_install else providers.runtime_update
            self._deploy = place_command(hook(self.profile.provider, request), ARCHIVE)
        return self._deploy

    def run(self) -> Receipt:
        self.make_plan()
        if self.ctx.options.dry_run:
            return conclude(self.ctx, self.receipt, Outcome.OK)
        pre = first_call.open_runtime(self)  # the lease, the check and (a fixed-host build) the pre-verify
        allocation_attempt.reconcile_previous(self.inputs)  # a batch job or detached build an interrupted run left
        if self.confirmation is not None:  # an unconfirmed SHA: 77 unless asked to prove it again
            from .confirm_step import unconfirmed_refusal

            unconfirmed_refusal(self.inputs)
        if pre is None:
            pre = self.verify(*self.pre, shared=False)
        if pre.interrupted:
            self.receipt.errors.append(f"pre-verify: {pre.error}")
            return self.unknown(PRE_VERIFY_CUT, changed=False)
        self.previous = self.previous_generation(pre)
        self.receipt.verify = Verify(pre=pre.to_dict())
        if self.proves(pre, before=True):
            if self.confirmation is not None and self.reconfirm():
                self.receipt.verify = Verify(pre=pre.to_dict(), final=pre.to_dict())
                return self.confirm(pre)  # the SHA is active already: only its confirmation runs again
            if not self.ctx.options.force:
                self.ctx.narrate(f"{self.profile.program} {self.sha} is already active and verified on "
                                 f"{self.host.name}")
                self.receipt.verify = Verify(pre=pre.to_dict(), final=pre.to_dict())
                return conclude(self.ctx, self.receipt, Outcome.ALREADY_CURRENT, self.verified_identity(pre))
        self.require_quiescent(pre)
        if self.mirror is not None:
            self.mirror.run()
        with tempfile.TemporaryDirectory(prefix="vq-admin-src-") as workdir:
            assert self.source is not None  # make_plan resolved it
            self.source = self.staging.archive(self.source, workdir)
            self.staging.stage()
        result = self.deploy()
        if result.interrupted:
            return self.resolve_unknown(f"deploy: {result.describe()}")
        ended = provider_ended(self.ctx, self.receipt, "deploy: the provider", result.exit_code,
                               self.staging.reclaim)
        if ended is not None:
            return ended
        return self.conclude_final()

    def conclude_final(self) -> Receipt:
        """The planned final verify decides the run: unknown when it was interrupted, failed when
        it proves nothing, else ok with the verified identity; the stage, if any, is reclaimed as
        the run's failure or success."""
        post = self.verify(*self.post)
        self.receipt.verify = self.receipt.verify.replace(final=post.to_dict())
        if post.interrupted:
            return self.resolve_unknown(f"verify: {post.error}")
        if not self.proves(post):
            self.receipt.errors.extend(self.verify_errors(post))
            self.staging.reclaim(success=False)
            return conclude(self.ctx, self.receipt, Outcome.FAILED)
        if self.confirmation is not None:
            return self.confirm(post)
        self.staging.reclaim(success=True)
        return conclude(self.ctx, self.receipt, Outcome.OK, self.verified_identity(post))

    def previous_generation(self, pre: Verification) -> Previous | None:
        """What a failed confirmation reverts to: the generation active before this run (else LAST OK),
        unless it may not be gone back to (:func:`~vq_admin.state.confirmation.skip_as_revert_target`)."""
        if self.confirmation is None:
            return None
        from ..state.confirmation import skip_as_revert_target
        from .confirm_step import Previous

        found, host, program = pre.receipt, self.host.name, self.profile.program
        if found is not None and found.source_sha and found.source_sha.lower() != self.sha:
            previous: Previous | None = Previous(found.source_sha.lower(), found.tag)
        else:
            last = self.ctx.state.verified("runtime", host, program)
            previous = Previous(last.sha, last.tag or None) if last is not None and last.sha != self.sha else None
        if previous is None or not skip_as_revert_target(self.ctx.state, host, program, previous.sha):
            return previous
        # else the newest verified generation that may be gone back to
        for entry in reversed(registry.entries(self.ctx.state.root, host, program)):
            sha = entry.sha
            if (sha != self.sha and registry.pruned(self.ctx.state.root, host, program, sha) is None
                    and not skip_as_revert_target(self.ctx.state, host, program, sha)):
                self.receipt.notes.append(f"revert target: {sha}, the newest verified generation that may be made "
                                          f"current again ({previous.sha}, active before, may not)")
                return Previous(sha, entry.tag)
        self.receipt.notes.append(f"no revert target: {previous.sha}, active before, may not be made current again, "
                                  "nor may any other verified generation")
        return None

    def reconfirm(self) -> bool:
        """The active SHA has no passed confirmation and this run was asked to prove it again."""
        from ..state.confirmation import unconfirmed

        options = self.ctx.options
        return ((options.retry_confirmation or options.accept_regression is not None)
                and unconfirmed(self.ctx.state, self.host.name, self.profile.program, self.sha) is not None)

    def confirm(self, found: Verification) -> Receipt:
        """The confirmation job decides: ok; failed with the previous generation re-activated and proven;
        unknown when that revert (or the verdict) cannot be proven."""
        from .confirm_step import ended_message

        assert self.confirmation is not None and found.receipt is not None
        result = self.confirmation.run(found.receipt.active_path, self.previous, self.request(archive=None))
        if result.passed:
            self.staging.reclaim(success=True)
            if result.accepted:
                self.receipt.notes.append(f"accepted regression ({self.ctx.options.accept_regression}): "
                                          + "; ".join(result.accepted.regressed or []))
            return conclude(self.ctx, self.receipt, Outcome.OK, self.verified_identity(found))
        if result.passed is not False:  # None or UNSET: the verdict could not be read
            return self.unknown(ended_message(result), changed=True)
        self.receipt.errors.append(f"confirm: {ended_message(result)}")
        self.staging.reclaim(success=False)
        if self.previous is None:
            self.receipt.errors.append(f"confirm: nothing to revert to (no earlier generation may be made current); "
                                       f"{self.sha} stays active and unconfirmed: the queue is not given it")
            return conclude(self.ctx, self.receipt, Outcome.FAILED, recorded=self.verified_identity(found))
        prev = self.previous
        request = replace(self.request(archive=None), expected_sha=prev.sha, tag=prev.tag)
        steps = plan_verify(self.ctx, self.receipt.plan, "revert-verify", self.host, self.profile, request)
        proof = run_verify(self.ctx, self.host, self.profile, request, *steps)
        self.receipt.verify = self.receipt.verify.replace(revert=proof.to_dict())
        exit_code = (result.revert or {}).get("exit_code")
        self.receipt.reverted = Reverted(from_=self.sha, to=prev.sha, proven=proof.proven,
                                         activate_exit_code=exit_code if isinstance(exit_code, int) else None)
        if proof.proven:
            self.ctx.narrate(f"reverted {self.profile.program} on {self.host.name} to {prev.sha} (proven)")
            return conclude(self.ctx, self.receipt, Outcome.FAILED, recorded=self.verified_identity(proof).replace(
                sha=prev.sha))
        detail = proof.error or "; ".join(self.verify_errors(proof))
        return self.unknown(f"the revert to {prev.sha} could not be proven ({detail}; activate_command exit "
                            f"{exit_code}): run vq admin rollback {self.profile.program} "
                            f"{self.host.name} --to {prev.sha}", changed=True)

    def require_quiescent(self, pre: Verification) -> None:
        """Never start a build on a verify that cannot start, fails or prints no receipt: it cannot prove
        anything afterwards either (exit 1; a receipt of nothing active, CONTRACT section 4, is "not
        current"); nor while the provider reports one in progress on the host (e.g. the build an
        interrupted run left running): exit 75; nor into a runtime tree another user could change (a
        launcher failing launcher_trust): exit 77.  Only the read-only pre-verify has run in any case."""
        if pre.broken is not None:
            raise VqAdminError(f"pre-verify: {pre.broken}; {READ_ONLY_RAN}"
                               + ("; its output, escaped, is in verify.pre.output" if pre.not_receipt else ""))
        untrusted = [c.detail for c in pre.checks if c.name == LAUNCHER_TRUST and not c.ok]
        if untrusted:  # the runtime tree itself is open to another user: refused before any mutation (77)
            raise Refused(f"pre-verify: {LAUNCHER_TRUST}: {untrusted[0]}; {READ_ONLY_RAN}")
        receipt = pre.receipt
        if receipt is not None and (receipt.quiescent is not True or receipt.updater_pid is not None):
            raise Locked(
                f"{self.profile.program} on {self.host.name} is not quiescent (updater_pid {receipt.updater_pid}): "
                f"an update is still running there; wait for it to end, then rerun ({READ_ONLY_RAN})"
            )

    def verify(self, verify_step: Step, readback_step: Step, *, shared: bool = True) -> Verification:
        return run_verify(self.ctx, self.host, self.profile, self.request(archive=None), verify_step, readback_step,
                          shared=shared)

    def deploy(self) -> RunResult:
        assert self.staging.dir is not None  # staged before the deploy
        command = fill_command(self.planned_deploy(), stage=self.staging.dir)
        if self.deployer is not None:  # an allocation or a detached build
            return self.deployer.deploy(command)
        step = self.receipt.plan.get("deploy")
        values = offer(step, stage=self.staging.dir)  # the provider may not have placed the slot
        argv, _ = filled(step, **values)
        self.ctx.narrate(f"deploying {self.profile.program} {self.sha} on {step.where}: {quote_argv(argv)}")
        view = (CommandView(f"{self.profile.program}: deploy on {step.where}")
                if progress.enabled(self.ctx.options.json) else None)
        with progress.live(self.ctx, view):  # exactly the planned argv, its <stage> slot filled
            result = execute(step, self.build_transport(), timeout=self.profile.timeout_seconds,
                             watch=view.watch if view else None, values=values)
        self.receipt.record_command(result, step.where)
        return result

    def resolve_unknown(self, what: str) -> Receipt:
        """An interrupted transport: only a fresh read-only verify decides."""
        self.receipt.errors.append(what)
        found = self.verify(*readback_verify_steps(self.receipt.plan))  # planned for this, slots and all
        self.receipt.verify = self.receipt.verify.replace(readback=found.to_dict())
        if self.proves(found):
            self.ctx.narrate("the interrupted run is resolved by read-back: the requested identity is active and "
                             "verified")
            self.receipt.readback = Readback(read="fresh read-only verify on the login host", proven=True,
                                             next_command=None)
            if self.receipt.deploy.detached:  # proven: nothing is left for the next run to reconcile
                allocation_attempt.clear(self.inputs)
            self.staging.reclaim(success=True)
            return conclude(self.ctx, self.receipt, Outcome.OK, self.verified_identity(found))
        detail = found.error or "; ".join(self.verify_errors(found))
        return self.unknown(f"read-back could not prove {self.sha} active: {detail}", changed=True)

    def unknown(self, reason: str, *, changed: bool) -> Receipt:
        deploy = self.receipt.deploy
        readback = Readback(
            read="fresh read-only verify on the login host" if changed else "nothing (pre-verify interrupted)",
            proven=False,
            reason=reason,
            stage=self.staging.dir,
            next_command=rerun_command(self.ctx, self.receipt),
            advice=(
                "the build may have finished or may still be running on the build host; rerunning first verifies "
                "read-only and reports already-current if it completed. Do not start a build by hand."
                if changed else "nothing was deployed or activated by this run; rerun when the login host is reachable"
            ),
        )  # an allocation build: the batch job, its final scheduler state and its retained transcripts
        readback = readback.replace(**known(deploy, "job_id", "job_state", "attempt_dir", "log_dir"))
        if deploy.detached and not deploy.established and not deploy.timed_out:
            from .detached_step import left_running

            readback = readback.replace(attempt=deploy.attempt, pid=deploy.pid, build=left_running(deploy))
            if not deploy.fenced:
                pid = deploy.pid or "(in the attempt record)"
                readback = readback.replace(advice=rerun_advice(f"the build pid {pid} on {deploy.where}",
                                                                self.ctx.options.wait_lock, "the build"))
        self.receipt.readback = readback
        return conclude(self.ctx, self.receipt, Outcome.UNKNOWN)

    def verify_errors(self, found: Verification) -> list[str]:
        errors = [f"verify: {e}" for e in found.failed_checks()]
        if found.error:
            errors.insert(0, f"verify: {found.error}")
        return errors or ["verify: not proven"]

    def verified_identity(self, found: Verification) -> Verified:
        assert found.receipt is not None
        return Verified(
            sha=self.sha,
            tag=found.receipt.tag,  # the label it reports: the requested one, or one a later tag left behind
            launcher=found.receipt.active_path,
            launcher_sha256=found.receipt.active_path_sha256,
        )


def _label_note(tags: tuple[str, ...], label: str | None, whose: str) -> str:
    """What a run whose inferred tag is not the label of the generation says (CONTRACT section 15)."""
    found = f"tags it {', '.join(tags)}" if tags else "has no tag at it"
    return (f"tag: source_repo {found}; {whose} is {label or 'no tag'}: the SHA is the identity, a tag a label, "
            "so without --tag that label is expected (an explicit --tag must match what the runtime reports)")


def build_lane(ctx: RunContext, *, host_name: str, program: str, sha: str, tag: str | None) -> RuntimeUpdate:
    """The runtime lane of ``update PROGRAM HOST``: authority, the first call's ssh handshake started, the
    profile's provider loaded."""
    from ..plugins import Providers

    host, profile = authority.runtime_profile(ctx.config, host_name, program)  # no such profile: 2, naming them
    if not ctx.options.dry_run:  # the first call's ssh handshake goes on meanwhile
        from ..ssh.early_session import start_for

        start_for(ctx, host)
    ctx.providers = Providers.load([profile.provider])
    return RuntimeUpdate(ctx, host_name, program, sha, tag)
