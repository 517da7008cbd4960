"""The helper lane: ``vq admin update HOST [--expected-sha SHA] [--cluster-install]``.

One update of the scheduler-side helper, in order:

1. authority (``managed`` or ``helper-only``; anything else exits 77) -- before
   anything runs; the lane lock ("helper", HOST) is taken by the caller (75);
2. source: the exact commit of ``helper_source_repo`` (without
   ``--expected-sha`` its ``HEAD``, refusing uncommitted changes), archived
   and its tree proven;
3. ``check-commands``: on each ssh host, every absolute word of the agent
   and of the helper command is checked with the secure-path rule from
   ``stat`` (:mod:`.command_files_stat`) -- 77 before anything runs there;
4. pre-identity on the login host: when the live helper already reports the
   requested commit and tree with a bound record, the outcome is
   ``already-current`` and nothing is staged (``--force`` reinstalls);
5. a fresh stage on ``helper_update_host`` (or the login host) holding the
   archive, ``SOURCE-SHA``, ``SOURCE-TREE-SHA256``, ``ARCHIVE-SHA256`` and
   ``GIT-TREE``, verified there before anything runs (77 on mismatch);
6. the helper command of ``helper_provider`` (``helper_update``, or
   ``helper_install`` with ``--cluster-install``) with ``VQ_HELPER_STAGE``,
   ``VQ_HELPER_EXPECTED_SHA`` and ``VQ_HELPER_EXPECTED_TREE_SHA256``, within
   ``helper_timeout_seconds``;
7. readback: the configured ``agent`` on the login host reports its identity;
   a well-formed mismatch is re-read (bounded); only a match writes the
   activation receipt ``<state>/hosts/<host>/helper/activation.json`` and the
   helper's LAST OK.  An interrupted transport is resolved only by this
   readback: a match is ``ok``, anything else ``unknown`` (3).

This lane calls only the helper hooks of the helper provider: it never asks a
runtime provider for anything and never runs a runtime command.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

from vq_admin_hookspecs import HelperRequest, ProviderCommand

from ..config import authority
from .. import source
from ..config import HostConfig
from ..core import protocol
from ..core.failpoints import failpoint
from ..context import RunContext
from ..lease import AGENT_NOT_RUN, AgentMissing, Lease, OtherProtocol
from ..report.outcome import READ_ONLY_RAN, Outcome, Refused, UsageError
from ..plan import execute, filled, offer, place_command, record
from ..report import sections
from ..report.receipt import Receipt
from ..core.stamps import utc_now
from ..state.records import Verified
from ..document import JsonObject
from ..ssh.transport import RunResult, SshTransport, Transport, quote_argv
from . import command_files as remote_paths, command_files_stat as stat_paths
from . import first_call
from .conclude import conclude, provider_ended, rerun_command
from .staging import STAGE, TREE_SHA256, SourceStage
from .helper_identity import IdentityRead, Readback, judge_identity, read_identity, readback

STAGE_NAME = "helper"
ACTIVATION = "activation.json"


class HelperUpdate:
    """One helper update of one host."""

    #: The host-side lease is taken in the run's first agent call (:func:`open_helper`).
    opens_lease = True

    def __init__(self, ctx: RunContext, host_name: str, sha: str | None):
        self.ctx = ctx
        self.host: HostConfig = authority.helper_host(ctx.config, host_name)
        if self.host.helper_source_repo is None:
            raise UsageError(f"hosts.{host_name}.helper_source_repo: is not configured; the helper lane stages "
                             "the helper from that checkout")
        self.sha = sha
        self.receipt = Receipt("helper", self.host.name, None, sha, None, utc_now())
        self.source: source.SourceIdentity | None = None
        self._command: ProviderCommand | None = None
        self.staging = SourceStage(self.receipt, self.stage_transport(), self.host.agent, self.host.scratch_root,
                                   "helper", STAGE_NAME, self.host.helper_timeout_seconds)

    def settings(self) -> dict[str, Any]:
        h = self.host
        return {"provider": h.helper_provider, "helper_update_command": h.helper_update_command,
                "helper_install_command": h.helper_install_command, "helper_update_host": h.helper_update_host,
                "helper_source_repo": h.helper_source_repo, "helper_timeout_seconds": h.helper_timeout_seconds,
                "agent": list(h.agent), "scratch_root": h.scratch_root}

    def command(self) -> ProviderCommand:
        """The helper provider's command, asked once per run when the plan is made: the stage and
        its tree digest are the ``<stage>`` and ``<tree_sha256>`` slots, filled in :meth:`run_command`."""
        if self._command is None:
            assert self.sha is not None  # make_plan resolved it
            request = HelperRequest(host=self.host.name, expected_sha=self.sha, expected_tree_sha256=TREE_SHA256,
                                    stage_dir=STAGE, update_script_args=self.ctx.options.update_script_args,
                                    settings=self.settings())
            providers = self.ctx.providers
            hook = providers.helper_install if self.ctx.options.cluster_install else providers.helper_update
            self._command = place_command(hook(self.host.helper_provider, request), STAGE, TREE_SHA256)
        return self._command

    def stage_transport(self) -> Transport:
        return self.ctx.remote(self.host, self.host.helper_update_host)

    def make_plan(self) -> None:
        repo, plan = self.host.helper_source_repo, self.receipt.plan
        assert repo is not None  # checked in __init__
        if self.sha is None:
            self.sha = source.head_commit(repo)
            self.receipt.expected_sha = self.sha
        self.source = source.resolve(repo, self.sha, None, with_tags=False)
        self.receipt.source = self.source.to_receipt()
        self.receipt.provider = self.host.helper_provider
        login, build = self.ctx.login(self.host).where, self.stage_transport().where
        identity = protocol.identity(self.host.agent)  # the agent exactly as the driver invokes it
        self.staging.plan_source(repo, self.sha, "helper")
        stat_paths.plan_places(plan, self.command_places())  # before the agent or the helper command runs there
        plan.add("pre-identity", login, identity, "is the requested helper already live? (read-only)")
        self.staging.plan_stage(self.source)
        cmd = self.command()
        verb = "install" if self.ctx.options.cluster_install else "update"
        plan.add("helper", build, cmd.argv, f"helper provider {self.host.helper_provider}: {verb}",
                 {**dict(cmd.env), "VQ_HELPER_STAGE": STAGE, "VQ_HELPER_EXPECTED_SHA": str(self.sha),
                  "VQ_HELPER_EXPECTED_TREE_SHA256": TREE_SHA256})  # the slots filled when it runs
        plan.add("readback", login, identity,
                 "read the live helper's identity on the login host (re-read while a shared filesystem lags)")
        self.staging.plan_reclaim()

    def command_places(self) -> list[remote_paths.Place]:
        """The command files this lane runs on each ssh host: the agent on the login host (identity)
        and on the stage host (stage verbs), the helper command on the stage host."""
        prefix, h = f"hosts.{self.host.name}", self.host
        key = "helper_install_command" if self.ctx.options.cluster_install else "helper_update_command"
        argv = self.command().argv
        words = list(getattr(h, key) or ()) if h.helper_provider == "command" else remote_paths.leading_words(argv)
        stage = self.stage_transport()
        return remote_paths.gather([(self.ctx.login(h), f"{prefix}.agent", h.agent),
                                    (stage, f"{prefix}.agent", h.agent),
                                    (stage, f"{prefix}.{key}", words)])

    def run(self) -> Receipt:
        self.make_plan()
        if self.ctx.options.dry_run:
            return conclude(self.ctx, self.receipt, Outcome.OK)
        stat_paths.run_places(self.receipt.plan, self.command_places())
        with tempfile.TemporaryDirectory(prefix="vq-admin-helper-") as workdir:
            assert self.source is not None  # make_plan resolved it
            self.source = self.staging.archive(self.source, workdir)
            # the lease and the pre-identity in one agent call over the run's connection master
            try:
                pre = open_helper(self)
            except AgentMissing as exc:
                why = exc.message.removesuffix(f"; {AGENT_NOT_RUN}")
                raise Refused(f"no helper is installed on {self.host.name}: {why}; {self.first_install()}; "
                              f"{READ_ONLY_RAN}") from None
            if pre is None:
                pre = read_identity(self.ctx, self.host, self.receipt.plan.get("pre-identity"), self.sha, self.tree)
            self.receipt.verify = sections.Verify(pre=pre.to_dict())
            if pre.identity is not None and pre.identity.record == "missing" and not self.ctx.options.cluster_install:
                raise Refused(f"{self.not_installed(pre)}: no helper this lane installed is there yet; a first "
                              f"installation is {self.install_line}, with `agent` naming the entry "
                              "point the helper command installs; nothing was staged or installed")
            if pre.interrupted:
                self.receipt.errors.append(f"pre-identity: {pre.error}")
                return self.unknown("the read-only pre-identity read was interrupted; nothing was staged or installed",
                                    changed=False)
            if pre.matched and not self.ctx.options.force:
                self.ctx.narrate(f"helper {self.sha} is already live and bound on {self.host.name}")
                return conclude(self.ctx, self.receipt, Outcome.ALREADY_CURRENT, self.verified(pre))
            self.staging.stage()
        result = self.run_command()
        if result.interrupted:
            self.receipt.errors.append(f"helper: {result.describe()}")
            return self.conclude_readback(interrupted=True)
        ended = provider_ended(self.ctx, self.receipt, "helper: the helper command", result.exit_code,
                               self.staging.reclaim)
        if ended is not None:
            return ended
        return self.conclude_readback(interrupted=False)

    @property
    def tree(self) -> str:
        assert self.source is not None and self.source.tree_sha256
        return self.source.tree_sha256

    def run_command(self) -> RunResult:
        step = self.receipt.plan.get("helper")
        assert self.staging.dir is not None  # staged before the command runs
        values = offer(step, stage=self.staging.dir, tree_sha256=self.tree)
        argv, _ = filled(step, **values)
        self.ctx.narrate(f"installing helper {self.sha} on {step.where}: {quote_argv(argv)}")
        result = execute(step, self.stage_transport(), timeout=self.host.helper_timeout_seconds, values=values)
        self.receipt.record_command(result, step.where)
        return result

    def update_argv(self, *options: str) -> list[str]:
        return ["vq", "admin", "update", self.host.name, *options, "--expected-sha", str(self.sha)]

    @property
    def install_line(self) -> str:
        return quote_argv(self.update_argv("--cluster-install"))

    def not_installed(self, read: IdentityRead) -> str:
        """The configured agent runs a helper without an install record (*read*: a package, the
        single-file agent or a checkout), which no read-back can bind to a commit."""
        ident = read.identity
        assert ident is not None
        return (f"the agent configured for {self.host.name} ({quote_argv(self.host.agent)}) runs {ident.path}, "
                "which has no install record")

    def first_install(self) -> str:
        """The commands of a first installation: the single-file agent put where ``agent`` names (on
        the login host and the stage host), then an install through it, which replaces that file with
        the entry point the helper command installs (so ``agent`` must name that entry point)."""
        target, config = self.host.agent[-1], self.ctx.config.ssh_config
        if not os.path.isabs(target):
            return "set `agent` to the absolute path of the entry point the helper command installs and run this again"
        # built in a private directory (mktemp -d, 0700): nobody else can swap it before it is copied, and
        # each copy's SHA-256 is read back on arrival
        built = '"$d/vq-admin-agent.pyz"'
        commands = ["d=$(mktemp -d)", f"{quote_argv([sys.executable, '-m', 'vq_admin.agent.pyz'])} {built}",
                    f's=$(sha256sum < {built})']
        for transport in {t.where: t for t in (self.ctx.login(self.host), self.stage_transport())}.values():
            if isinstance(transport, SshTransport):
                options = ["-F", config] if config else []  # the destination after "--": never an option
                ssh = ["ssh", *options, "--", transport.destination]
                dest, read = quote_argv([f"{transport.destination}:{target}"]), "sha256sum < " + quote_argv([target])
                commands += [quote_argv([*ssh, "mkdir", "-p", os.path.dirname(target)]),
                             f"{quote_argv(['scp', *options, '--'])} {built} {dest}",
                             f'test "$({quote_argv([*ssh, read])})" = "$s"']
            else:
                commands += [quote_argv(["mkdir", "-p", os.path.dirname(target)]), f"cp {built} {quote_argv([target])}",
                             f'test "$(sha256sum < {quote_argv([target])})" = "$s"']
        commands.append('rm -r "$d"')
        return (f"put the single-file agent at {target} once and install the helper through it: "
                f"{' && '.join(commands)}, then {self.install_line}")

    def conclude_readback(self, *, interrupted: bool) -> Receipt:
        assert self.sha is not None  # make_plan resolved it
        found: Readback = readback(self.ctx, self.host, self.receipt.plan, self.receipt.plan.get("readback"),
                                   self.sha, self.tree)
        self.receipt.verify = self.receipt.verify.replace(readback=found.to_dict())
        final = found.final
        if final.matched:
            if interrupted:
                self.receipt.readback = sections.Readback(read="live helper identity on the login host",
                                                          proven=True, next_command=None)
            return self.activated(found)
        if interrupted or final.interrupted:
            why = final.error or "; ".join(final.mismatches) or "not proven"
            self.receipt.errors.append(f"readback: {why}")
            return self.unknown(f"read-back could not prove helper {self.sha} live: {why}", changed=True)
        if final.identity is None:
            self.receipt.errors.append(f"readback: {final.error}")
        elif final.identity.record == "missing":  # a first installation read back through another helper
            self.receipt.errors.append(f"readback: {self.not_installed(final)}, so the helper the command installed "
                                       "cannot be read back through it; set `agent` to the entry point the helper "
                                       f"command installs and run {quote_argv(self.update_argv())}")
        else:
            self.receipt.errors.append(f"readback: after {len(found.attempts)} reads the live helper on "
                                       f"{self.host.name} is not {self.sha}: " + "; ".join(final.mismatches))
        self.staging.reclaim(success=False)
        return conclude(self.ctx, self.receipt, Outcome.FAILED)

    def activated(self, found: Readback) -> Receipt:
        """The live helper matches: the activation receipt, then LAST OK."""
        ident = found.final.identity
        assert ident is not None and self.source is not None
        self.receipt.id = self.ctx.state.new_receipt_id("helper", self.host.name, None)
        activation: JsonObject = {
            "schema": "vq-admin/helper-activation/1", "host": self.host.name, "expected_sha": self.sha,
            "tree_sha256": self.tree, "archive_sha256": self.source.archive_sha256, "git_tree": self.source.git_tree,
            "identity": ident.to_dict(), "reads": len(found.attempts), "agent": list(self.host.agent),
            "read_on": self.ctx.login(self.host).where, "receipt": self.receipt.id, "at": utc_now(),
        }
        path = self.ctx.state.write_record("helper", self.host.name, None, ACTIVATION, activation)
        self.receipt.activation = sections.Activation.from_value({"path": str(path), **activation}, "activation")
        self.staging.reclaim(success=True)
        return conclude(self.ctx, self.receipt, Outcome.OK, self.verified(found.final))

    def verified(self, read: IdentityRead) -> Verified:
        ident = read.identity
        assert ident is not None and self.sha is not None
        return Verified(sha=self.sha, tree_sha256=ident.tree_sha256, record=ident.record, path=ident.path,
                        version=ident.version, interpreter=ident.interpreter)

    def unknown(self, reason: str, *, changed: bool) -> Receipt:
        self.receipt.readback = sections.Readback(
            read="live helper identity on the login host" if changed else "nothing (pre-identity interrupted)",
            proven=False, reason=reason, stage=self.staging.dir,
            next_command=rerun_command(self.ctx, self.receipt),
            advice=("the helper command may have finished or may still be running; rerunning reads the live "
                    "identity first and reports already-current if it completed. Do not install by hand."
                    if changed else "nothing was staged or installed by this run; rerun when the login host is "
                    "reachable"),
        )
        return conclude(self.ctx, self.receipt, Outcome.UNKNOWN)


def build_lane(ctx: RunContext, *, host_name: str, sha: str | None) -> HelperUpdate:
    """The helper lane of ``update HOST``: authority, then only the host's ``helper_provider`` loaded."""
    from ..plugins import Providers

    host = authority.helper_host(ctx.config, host_name)
    ctx.providers = Providers.load([host.helper_provider])
    return HelperUpdate(ctx, host_name, sha)


def open_helper(update: HelperUpdate) -> IdentityRead | None:
    """The helper lane's first call: the login-shell probe, the lease and the pre-identity read in
    one agent start.  Returns the pre-identity when it was read here, else ``None`` (the caller
    reads it); an agent of another session protocol (how it gets updated) runs without a lease
    and says so."""
    lease: Lease | None = update.ctx.lease
    if lease is None:
        return None
    step = update.receipt.plan.get("pre-identity")
    failpoint("step-before", step.name)
    started = time.monotonic()
    try:
        answer = lease.open_session({"lease": first_call.lease_request(lease), "identity": True,
                                     "record": first_call.record_request(update.ctx, update.host.name, None)})
    except OtherProtocol as exc:  # the helper lane is how that agent gets updated: without a lease, and says so
        note = exc.message.replace(f"; {READ_ONLY_RAN}", "; this helper update runs without a lease")
        lease.update(note=note)
        update.receipt.notes.append(note)
        update.ctx.narrate(note)
        return None
    seconds = time.monotonic() - started
    step.argv, step.seconds = step.planned_argv, seconds
    interrupted = answer.get("interrupted")
    if interrupted is not None:
        step.status, step.detail = "interrupted", str(interrupted)
        if answer.get("unreached"):  # nothing ran on the host: failed, not unknown
            first_call.unreached(update.ctx, update.receipt, str(interrupted))
        failpoint("step-after", step.name)
        return IdentityRead(step=step.name, interrupted=True, error=str(interrupted))
    update.ctx.narrate(f"holding the host-side lease {lease.record.lock} on {lease.where}")
    lease.take_record(update.ctx, update.receipt, update.host.name, None)
    step.purpose += first_call.PURPOSE
    if "identity" in answer:
        result = RunResult(step.planned_argv, lease.where, 0, json.dumps(answer["identity"]).encode(), b"", seconds)
    else:
        result = RunResult(step.planned_argv, lease.where, 1, b"",
                           str(answer.get("identity_error") or "no identity in the answer").encode(), seconds)
    record(step, result)
    found = judge_identity(step, result, update.sha, update.tree)
    failpoint("step-after", step.name)
    return found
