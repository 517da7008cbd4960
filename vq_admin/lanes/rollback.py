"""Rollback: ``vq admin rollback PROGRAM HOST [--to SHA]`` (CONTRACT section 8).

The runtime lane, aimed at an earlier generation:

1. authority (``managed``), the profile, and the target: ``--to SHA`` or
   LAST GOOD, which must have verified deployment evidence in this state
   directory (its registry entry and the ``ok``/``already-current`` receipt
   it names); otherwise 77 before anything runs;
2. with an activation operation (``activate_command``, or a provider's
   ``vq_admin_runtime_activate`` hook): pre-verify (``already-current`` when
   the target is active), the provider's activation where ``update_command``
   runs (never inside an allocation: nothing is built, staged, fed or
   prepared), then the read-only verify;
3. without one: exactly the runtime update of the target
   (:class:`~vq_admin.lanes.runtime.RuntimeUpdate`): the exact source is
   staged and the provider's update runs; the mirror is never rewound, so a
   mirror-fed profile whose preparer reads the lane branch is refused, naming
   both ways out;
4. any interruption is ``unknown`` until a fresh read-only verify proves the
   target; the receipt adds ``"rollback": {"from", "to"}``.  On success LAST
   OK becomes the target and LAST GOOD the previous LAST OK
   (:meth:`vq_admin.state.records.StateDir.record_run`).
"""

from __future__ import annotations


from vq_admin_hookspecs import ProviderCommand

from ..config import Signing
from ..launcher import registry
from ..context import RunContext
from ..report.outcome import Outcome, Refused
from ..plan import Step, execute
from ..report.receipt import Receipt
from ..report.sections import Rollback, Verify
from ..state.records import StateDir, read_json
from ..ssh.transport import quote_argv
from . import allocation_attempt, command_files as remote_paths
from .conclude import conclude, provider_ended
from .runtime import PRE_VERIFY_CUT, RuntimeUpdate
from .verify import Verification, plan_readback_verify, plan_verify
from ..record.view import FROM_RECORD, record_problem

VERIFIED = ("ok", "already-current")


def verified_target(state: StateDir, host: str, program: str, to: str | None,
                    signing: Signing | None) -> registry.Entry:
    """The registry entry of the rollback target, or :class:`Refused` naming what is missing."""
    if to is None:
        last_good = state.verified("runtime", host, program, "last-good")
        to = last_good.sha if last_good is not None else None
        if not to:
            raise Refused(f"{program} on {host} has no LAST GOOD in {state.root} (no earlier verified generation "
                          f"to return to); give --to SHA of a generation verified here (vq admin history {host} "
                          f"{program}); nothing was run")
    try:
        entry = registry.lookup(state.root, host, program, to)
    except registry.PrunedError as exc:
        raise Refused(f"{to} of {program} on {host} was pruned ({exc}); it cannot be re-activated; deploy it "
                      f"again with vq admin update {program} {host} --expected-sha {to}; nothing was run") from None
    except registry.RegistryError as exc:
        raise Refused(f"the verified-launcher registry cannot be trusted for {to}: {exc}; nothing was run") from None
    missing = (f"{to} was never verified for {program} on {host} in {state.root} (no ok or already-current "
               f"receipt); rollback only returns to a generation verified here; deploy it with vq admin update "
               f"{program} {host} --expected-sha {to}; nothing was run")
    if entry is None:
        raise Refused(missing)
    if entry.receipt.startswith(FROM_RECORD):  # another driver's signed entry of the host's record
        problem = record_problem(state, host, program, entry, signing)
        if problem is not None:
            raise Refused(f"{missing} ({problem})")
        return entry
    receipt = read_json(state.receipt_path(entry.receipt))
    if (receipt is None or receipt.get("outcome") not in VERIFIED or receipt.get("host") != host
            or receipt.get("program") != program or receipt.get("expected_sha") != to):
        raise Refused(f"{missing} (the registry names receipt {entry.receipt}, which is missing or is not "
                      "a verified success of that generation)")
    return entry


class RuntimeRollback(RuntimeUpdate):
    """One rollback of one program on one host."""

    #: The lease is taken before the body (its own pre-verify records "from"; the activation path
    #: has no first call), not in the update's first agent call.
    opens_lease = False

    def __init__(self, ctx: RunContext, host_name: str, program: str, to: str | None):
        self.entry = verified_target(ctx.state, host_name, program, to, ctx.config.signing)
        from ..state.confirmation import unconfirmed

        reason = unconfirmed(ctx.state, host_name, program, self.entry.sha)
        if reason is not None:  # CONTRACT section 13: never made current again by a rollback
            raise Refused(f"unconfirmed: {program} {self.entry.sha} on {host_name}: {reason}; nothing was run; "
                          f"to prove it again: vq admin update {program} {host_name} --expected-sha "
                          f"{self.entry.sha} --retry-confirmation")
        super().__init__(ctx, host_name, program, self.entry.sha, self.entry.tag)
        self.activation: ProviderCommand | None = ctx.providers.runtime_activate(
            self.profile.provider,
            self.request(archive=None, where="build-host" if self.profile.update_host else "login-host"))
        self.receipt.rollback = Rollback(from_=None, to=self.sha, via="activate" if self.activation else "update")
        self.receipt.rerun = ["vq", "admin", "rollback", self.profile.program, self.host.name, "--to", self.sha]

    def make_plan(self) -> None:
        if self.activation is None:
            super().make_plan()
            return
        ctx, plan, p = self.ctx, self.receipt.plan, self.profile
        self.receipt.provider = p.provider
        self.receipt.build_place = "none (activation of an existing release)"
        remote_paths.plan_places(plan, self.host.agent, self.command_places())  # before any of them runs
        allocation_attempt.plan_previous(self.inputs)  # a build an interrupted update left: its end first
        self.pre = plan_verify(ctx, plan, "pre-verify", self.host, p, self.request(archive=None))
        plan.add("activate", self.build_transport().where, list(self.activation.argv),
                 f"provider {p.provider}: switch current to the existing release {self.sha} (nothing is built)",
                 dict(self.activation.env))
        self.post = plan_verify(ctx, plan, "verify", self.host, p, self.request(archive=None))
        plan_readback_verify(plan, self.post)

    def command_places(self) -> list[remote_paths.Place]:
        """The command files of an activation on each ssh host: the agent and ``verify_command`` on
        the login host, ``activate_command`` (and the agent that checks it) where it runs."""
        assert self.activation is not None
        p, build = self.profile, self.build_transport()
        key = f"hosts.{self.host.name}.scheduler_runtime_deployments.{p.program}.activate_command"
        return remote_paths.gather([
            *remote_paths.login_entries(self.ctx, self.host, p, self.request(archive=None)),
            (build, f"hosts.{self.host.name}.agent", self.host.agent),
            (build, key, remote_paths.profile_words(p, "activate_command", self.activation.argv))])

    def verify(self, verify_step: Step, readback_step: Step, *, shared: bool = True) -> Verification:
        found = super().verify(verify_step, readback_step, shared=shared)
        if verify_step.name == "pre-verify" and found.receipt is not None:
            assert self.receipt.rollback is not None  # make_plan recorded it
            self.receipt.rollback = self.receipt.rollback.replace(from_=found.receipt.source_sha.lower())
        return found

    def run(self) -> Receipt:
        if self.activation is not None:
            return self.run_activation()
        try:
            return super().run()
        except Refused as exc:
            p = self.profile
            if p.feed_source_mirror is not None and p.preparer_reads == "lane":
                raise Refused(
                    f"{exc.message}. Rolling back {p.program} on {self.host.name} without an activation operation "
                    f"rebuilds {self.sha} from the mirror, whose lane branch is never rewound; two ways out: "
                    f"configure activate_command in hosts.{self.host.name}.scheduler_runtime_deployments."
                    f"{p.program} (rollback then switches current to the existing release and feeds nothing), "
                    "or move the preparer to preparer_reads = \"pin\"") from None
            raise

    def run_activation(self) -> Receipt:
        self.make_plan()
        if self.ctx.options.dry_run:
            return conclude(self.ctx, self.receipt, Outcome.OK)
        remote_paths.run_places(self.receipt.plan, self.host.agent, self.host.name, self.command_places())
        allocation_attempt.reconcile_previous(self.inputs)  # a build left running could switch current after us
        pre = self.verify(*self.pre)
        if pre.interrupted:
            self.receipt.errors.append(f"pre-verify: {pre.error}")
            return self.unknown(PRE_VERIFY_CUT, changed=False)
        if pre.proven:
            self.ctx.narrate(f"{self.profile.program} {self.sha} is already active and verified on {self.host.name}")
            self.receipt.verify = Verify(pre=pre.to_dict(), final=pre.to_dict())
            return conclude(self.ctx, self.receipt, Outcome.ALREADY_CURRENT, self.verified_identity(pre))
        self.receipt.verify = Verify(pre=pre.to_dict())
        self.require_quiescent(pre)
        step = self.receipt.plan.get("activate")  # planned by make_plan, as run() found an activation
        self.ctx.narrate(f"activating {self.profile.program} {self.sha} on {step.where}: "
                         f"{quote_argv(step.planned_argv)}")
        result = execute(step, self.build_transport(), timeout=self.profile.timeout_seconds)
        self.receipt.record_command(result, step.where)
        if result.interrupted:
            return self.resolve_unknown(f"activate: {result.describe()}")
        ended = provider_ended(self.ctx, self.receipt, "activate: the provider", result.exit_code,
                               self.staging.reclaim)  # an activation staged nothing: a no-op
        if ended is not None:
            return ended
        return self.conclude_final()
