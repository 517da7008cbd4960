"""The helper lane: ``vq admin update HOST [--expected-sha SHA] [--cluster-install]``.

One update of the scheduler-side helper, in order:

1. authority (``managed`` or ``helper-only``; anything else exits 77) -- before
   anything runs; the lane lock ("helper", HOST) is taken by the caller (75);
2. source: the exact commit of ``helper_source_repo`` (without
   ``--expected-sha`` its ``HEAD``, refusing uncommitted changes), archived
   and its tree proven;
3. pre-identity on the login host: when the live helper already reports the
   requested commit and tree with a bound record, the outcome is
   ``already-current`` and nothing is staged (``--force`` reinstalls);
4. a fresh stage on ``helper_update_host`` (or the login host) holding the
   archive, ``SOURCE-SHA``, ``SOURCE-TREE-SHA256``, ``ARCHIVE-SHA256`` and
   ``GIT-TREE``, verified there before anything runs (77 on mismatch);
5. the helper command of ``helper_provider`` (``helper_update``, or
   ``helper_install`` with ``--cluster-install``) with ``VQ_HELPER_STAGE``,
   ``VQ_HELPER_EXPECTED_SHA`` and ``VQ_HELPER_EXPECTED_TREE_SHA256``, within
   ``helper_timeout_seconds``;
6. readback: the configured ``agent`` on the login host reports its identity;
   a well-formed mismatch is re-read (bounded); only a match writes the
   activation receipt ``<state>/hosts/<host>/helper/activation.json`` and the
   helper's LAST OK.  An interrupted transport is resolved only by this
   readback: a match is ``ok``, anything else ``unknown`` (3).

This lane calls only the helper hooks of the helper provider: it never asks a
runtime provider for anything and never runs a runtime command.
"""

from __future__ import annotations

import json
import tempfile
import time
from typing import Any

from vq_admin_hookspecs import HelperRequest, ProviderCommand

from .. import authority, source
from ..config import HostConfig
from ..context import RunContext
from ..outcome import Outcome, Refused, UsageError, VqAdminError
from ..plan import Step, execute, mark_local
from ..receipt import Receipt, parse_metrics
from ..state import dump_json, utc_now, write_atomic
from ..transport import RunResult, Transport, quote_argv
from .common import conclude
from .helper_readback import IdentityRead, Readback, identity_argv, read_identity, readback

KEEP_FAILED_STAGES = 3
STAGE_NAME = "helper"
ACTIVATION = "activation.json"
PLACEHOLDER_TREE = "0" * 64


class HelperUpdate:
    """One helper update of one host."""

    def __init__(self, ctx: RunContext, host_name: str, sha: str | None):
        self.ctx = ctx
        self.host: HostConfig = authority.helper_host(ctx.config, host_name)
        if self.host.helper_source_repo is None:
            raise UsageError(f"hosts.{host_name}.helper_source_repo: is not configured; the helper lane stages "
                             "the helper from that checkout")
        self.sha = sha
        self.receipt = Receipt("helper", self.host.name, None, sha, None, utc_now())
        self.source: source.SourceIdentity | None = None
        self.stage_dir: str | None = None

    # -- the plan ---------------------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        h = self.host
        return {"provider": h.helper_provider, "helper_update_command": h.helper_update_command,
                "helper_install_command": h.helper_install_command, "helper_update_host": h.helper_update_host,
                "helper_source_repo": h.helper_source_repo, "helper_timeout_seconds": h.helper_timeout_seconds,
                "agent": list(h.agent), "scratch_root": h.scratch_root}

    def command(self, stage_dir: str, tree: str) -> ProviderCommand:
        request = HelperRequest(host=self.host.name, expected_sha=self.sha, expected_tree_sha256=tree,
                                stage_dir=stage_dir, update_script_args=self.ctx.options.update_script_args,
                                settings=self.settings())
        providers = self.ctx.providers
        if self.ctx.options.cluster_install:
            return providers.helper_install(self.host.helper_provider, request)
        return providers.helper_update(self.host.helper_provider, request)

    def stage_transport(self) -> Transport:
        return self.ctx.remote(self.host, self.host.helper_update_host)

    def agent(self, *args: str) -> list[str]:
        return [*self.host.agent, *args]

    def root_args(self) -> list[str]:
        return ["--root", self.host.scratch_root] if self.host.scratch_root else []

    def make_plan(self) -> None:
        repo, plan = self.host.helper_source_repo, self.receipt.plan
        if self.sha is None:
            self.sha = source.head_commit(repo)
            self.receipt.expected_sha = self.sha
        self.source = resolve_helper_source(repo, self.sha)
        self.receipt.source = self.source.to_receipt()
        self.receipt.extra["provider"] = self.host.helper_provider
        login, build = self.ctx.login(self.host).where, self.stage_transport().where
        ident = ["--sha", self.sha, "--archive-sha256", "<archive_sha256>", "--tree-sha256", "<tree_sha256>",
                 "--git-tree", self.source.git_tree]
        plan.add("source", "local", ["git", "-C", repo, "archive", "--format=tar", "-o", "<workdir>/source.tar", self.sha],
                 "archive the exact helper commit and prove its tree")
        plan.add("pre-identity", login, identity_argv(self.host), "is the requested helper already live? (read-only)")
        plan.add("stage-create", build, self.agent("stage-create", *self.root_args(), "--kind", "helper", "--name",
                                                   STAGE_NAME, *ident), "create a fresh helper stage")
        plan.add("stage-receive", build, self.agent("stage-receive", "--stage", "<stage>"), "copy the archive into the stage")
        plan.add("stage-verify", build, self.agent("stage-verify", "--stage", "<stage>", *ident),
                 "prove the staged archive's checksum and tree where the helper command runs")
        cmd = self.command("<stage>", PLACEHOLDER_TREE)
        verb = "install" if self.ctx.options.cluster_install else "update"
        plan.add("helper", build, [a.replace(PLACEHOLDER_TREE, "<tree_sha256>") for a in cmd.argv],
                 f"helper provider {self.host.helper_provider}: {verb}", self.helper_env(cmd, "<stage>", "<tree_sha256>"))
        plan.add("readback", login, identity_argv(self.host),
                 "read the live helper's identity on the login host (re-read while a shared filesystem lags)")
        plan.add("stage-reclaim", build, self.agent("stage-reclaim", *self.root_args(), "--kind", "helper", "--name",
                                                    STAGE_NAME, "--stage", "<stage>", "--outcome", "<success|failed>",
                                                    "--keep-failed", str(KEEP_FAILED_STAGES)),
                 "remove this run's stage on success; keep at most 3 failed stages")

    def helper_env(self, cmd: ProviderCommand, stage: str, tree: str) -> dict[str, str]:
        env = dict(cmd.env)
        env.update(VQ_HELPER_STAGE=stage, VQ_HELPER_EXPECTED_SHA=str(self.sha), VQ_HELPER_EXPECTED_TREE_SHA256=tree)
        return env

    # -- the run ----------------------------------------------------------------------

    def run(self) -> Receipt:
        self.make_plan()
        if self.ctx.options.dry_run:
            return conclude(self.ctx, self.receipt, Outcome.OK)
        with tempfile.TemporaryDirectory(prefix="vq-admin-helper-") as workdir:
            self.archive(workdir)
            pre = read_identity(self.ctx, self.host, self.receipt.plan.get("pre-identity"), self.sha, self.tree)
            self.receipt.verify = {"pre": pre.to_dict()}
            if pre.interrupted:
                self.receipt.errors.append(f"pre-identity: {pre.error}")
                return self.unknown("the read-only pre-identity read was interrupted; this run changed nothing",
                                    changed=False)
            if pre.matched and not self.ctx.options.force:
                self.ctx.narrate(f"helper {self.sha} is already live and bound on {self.host.name}")
                return conclude(self.ctx, self.receipt, Outcome.ALREADY_CURRENT, self.verified(pre))
            self.stage()
        result = self.run_command()
        if result.interrupted:
            self.receipt.errors.append(f"helper: {result.describe()}")
            return self.conclude_readback(interrupted=True)
        if result.exit_code != 0:
            self.receipt.errors.append(f"helper: the helper command exited {result.exit_code}")
            self.reclaim(success=False)
            return conclude(self.ctx, self.receipt, Outcome.FAILED)
        return self.conclude_readback(interrupted=False)

    @property
    def tree(self) -> str:
        assert self.source is not None and self.source.tree_sha256
        return self.source.tree_sha256

    def archive(self, workdir: str) -> None:
        step, started = self.receipt.plan.get("source"), time.monotonic()
        try:
            self.source = source.make_archive(self.source, workdir)
        except VqAdminError as exc:
            mark_local(step, False, started, exc.message)
            raise
        step.planned_argv = [a.replace("<workdir>", workdir) for a in step.planned_argv]
        mark_local(step, True, started)
        self.receipt.source = self.source.to_receipt()

    def actual(self, step: Step) -> list[str]:
        ident = self.source.identity_files()
        words = [a.replace("<archive_sha256>", ident["ARCHIVE-SHA256"]).replace("<tree_sha256>", self.tree)
                 for a in step.planned_argv]
        return [w.replace("<stage>", self.stage_dir) if self.stage_dir else w for w in words]

    def stage(self) -> None:
        plan, build, timeout = self.receipt.plan, self.stage_transport(), self.host.helper_timeout_seconds
        created = execute(plan.get("stage-create"), build, self.actual(plan.get("stage-create")), timeout=120)
        self.require(created, "stage-create")
        self.stage_dir = _json(created).get("stage")
        if not isinstance(self.stage_dir, str) or not self.stage_dir.startswith("/"):
            raise VqAdminError(f"stage-create on {build.where} did not name a stage directory")
        self.receipt.extra["stage"] = {"where": build.where, "dir": self.stage_dir}
        received = execute(plan.get("stage-receive"), build, self.actual(plan.get("stage-receive")),
                           timeout=timeout, stdin=self.source.archive_path)
        self.require(received, "stage-receive")
        checked = execute(plan.get("stage-verify"), build, self.actual(plan.get("stage-verify")), timeout=timeout)
        if checked.exit_code == 3 and not checked.interrupted:
            mismatches = _json(checked).get("mismatches") or ["identity mismatch"]
            self.reclaim(success=False)
            raise Refused(f"the staged helper archive on {build.where} does not match {self.sha}: "
                          + "; ".join(map(str, mismatches)))
        self.require(checked, "stage-verify")

    def require(self, result: RunResult, what: str) -> None:
        """A staging step must succeed; nothing has been installed yet."""
        if not result.ok:
            if self.stage_dir:
                self.reclaim(success=False)
            raise VqAdminError(f"{what}: {result.describe()}: {result.error_text()[-300:]}")

    def run_command(self) -> RunResult:
        step = self.receipt.plan.get("helper")
        cmd = self.command(self.stage_dir, self.tree)
        env = self.helper_env(cmd, self.stage_dir, self.tree)
        self.ctx.narrate(f"installing helper {self.sha} on {step.where}: {quote_argv(cmd.argv)}")
        result = execute(step, self.stage_transport(), list(cmd.argv), timeout=self.host.helper_timeout_seconds, env=env)
        stdout, stderr = result.text(), result.stderr.decode("utf-8", "replace")
        self.receipt.deploy = {"exit_code": result.exit_code, "where": step.where, "interrupted": result.interrupted}
        complete = result.interrupted is None and not result.stdout_truncated
        self.receipt.command_output = {"complete": complete, "reason": None if complete else "unavailable",
                                       "log_dir": None, "observations": 0, "stdout": stdout, "stderr": stderr}
        self.receipt.metrics = parse_metrics(stdout, stderr)
        self.receipt.metrics_complete = complete
        return result

    def reclaim(self, success: bool) -> None:
        if not self.stage_dir:
            return
        step = self.receipt.plan.get("stage-reclaim")
        argv = [a.replace("<stage>", self.stage_dir).replace("<success|failed>", "success" if success else "failed")
                for a in step.planned_argv]
        result = execute(step, self.stage_transport(), argv, timeout=300)
        if not result.ok:
            self.receipt.errors.append(f"stage-reclaim: {result.describe()} (the stage {self.stage_dir} was kept)")
        self.stage_dir = None

    # -- readback and conclusions ----------------------------------------------------

    def conclude_readback(self, *, interrupted: bool) -> Receipt:
        found: Readback = readback(self.ctx, self.host, self.receipt.plan, self.receipt.plan.get("readback"),
                                   self.sha, self.tree)
        self.receipt.verify["readback"] = found.to_dict()
        final = found.final
        if final.matched:
            if interrupted:
                self.receipt.readback = {"read": "live helper identity on the login host", "proven": True,
                                         "next_command": None}
            return self.activated(found)
        if interrupted or final.interrupted:
            why = final.error or "; ".join(final.mismatches) or "not proven"
            return self.unknown(f"read-back could not prove helper {self.sha} live: {why}", changed=True)
        if final.identity is None:
            self.receipt.errors.append(f"readback: {final.error}")
        else:
            self.receipt.errors.append(f"readback: after {len(found.attempts)} reads the live helper on "
                                       f"{self.host.name} is not {self.sha}: " + "; ".join(final.mismatches))
        self.reclaim(success=False)
        return conclude(self.ctx, self.receipt, Outcome.FAILED)

    def activated(self, found: Readback) -> Receipt:
        """The live helper matches: the activation receipt, then LAST OK."""
        ident = found.final.identity
        assert ident is not None
        self.receipt.id = self.ctx.state.new_receipt_id("helper", self.host.name, None)
        activation = {
            "schema": "vq-admin/helper-activation/1", "host": self.host.name, "expected_sha": self.sha,
            "tree_sha256": self.tree, "archive_sha256": self.source.archive_sha256, "git_tree": self.source.git_tree,
            "identity": ident.to_dict(), "reads": len(found.attempts), "agent": list(self.host.agent),
            "read_on": self.ctx.login(self.host).where, "receipt": self.receipt.id, "at": utc_now(),
        }
        path = self.ctx.state.lane_dir("helper", self.host.name, None) / ACTIVATION
        write_atomic(path, dump_json(activation))
        self.receipt.extra["activation"] = {"path": str(path), **activation}
        self.reclaim(success=True)
        return conclude(self.ctx, self.receipt, Outcome.OK, self.verified(found.final))

    def verified(self, read: IdentityRead) -> dict[str, Any]:
        ident = read.identity
        assert ident is not None
        return {"sha": self.sha, "tree_sha256": ident.tree_sha256, "record": ident.record, "path": ident.path,
                "version": ident.version, "interpreter": ident.interpreter}

    def unknown(self, reason: str, *, changed: bool) -> Receipt:
        command = ["vq", "admin", "update", self.host.name, "--expected-sha", str(self.sha)]
        self.receipt.readback = {
            "read": "live helper identity on the login host" if changed else "nothing (pre-identity interrupted)",
            "proven": False, "reason": reason, "stage": self.stage_dir, "next_command": quote_argv(command),
            "advice": ("the helper command may have finished or may still be running; rerunning reads the live "
                       "identity first and reports already-current if it completed. Do not install by hand."
                       if changed else "nothing was changed by this run; rerun when the login host is reachable"),
        }
        return conclude(self.ctx, self.receipt, Outcome.UNKNOWN)


def resolve_helper_source(repo: str, sha: str) -> source.SourceIdentity:
    """The commit and tree of *sha* in *repo* (tags are not part of a helper's identity)."""
    fmt = source.git(repo, "rev-parse", "--show-object-format")
    if not fmt.ok:
        raise Refused(f"helper_source_repo {repo} is not a git repository: {fmt.error_text()}")
    want = 64 if fmt.text().strip() == "sha256" else 40
    if len(sha) != want:
        raise Refused(f"{sha} has {len(sha)} digits but {repo} uses {want}-digit object names")
    found = source.git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{sha}^{{commit}}")
    if not found.ok or found.text().strip() != sha:
        raise Refused(f"commit {sha} is not in the helper source repository {repo} (fetch it there first)")
    tree = source.git(repo, "rev-parse", "--verify", "--end-of-options", f"{sha}^{{tree}}").text().strip()
    return source.SourceIdentity(repo=repo, sha=sha, git_tree=tree, tag=None, tags=())


def _json(result: RunResult) -> dict[str, Any]:
    try:
        value = json.loads(result.text())
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
