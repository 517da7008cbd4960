"""Exact source staging, shared by both lanes.

One :class:`SourceStage` carries one commit from the driver's checkout to the
host that will use it:

* ``source``        (driver)  ``git archive`` of the exact commit; its tree id
  recomputed from the archive must equal the commit's (vq_admin.source);
* ``stage-create``  a fresh private directory holding the identity files;
* ``stage-receive`` the archive, streamed in;
* ``stage-verify``  checksum and tree recomputed *on that host*: a mismatch
  is refused (77) before any provider runs;
* ``stage-reclaim`` the run's own stage removed on success; on failure it is
  marked and kept for forensics, at most ``KEEP_FAILED`` per name.
"""

from __future__ import annotations

import time

from vq_admin_hookspecs import Slot

from .. import source
from ..core import exits, protocol
from ..report.outcome import Refused, VqAdminError
from ..plan import Plan, execute, fill, mark_local
from ..report.receipt import Receipt
from ..report.sections import Interruption, Stage
from ..ssh.transport import RunResult, Transport

KEEP_FAILED = 3
STAGE_TIMEOUT = 120.0
RECLAIM_TIMEOUT = 300.0

#: The run-time values of the staging steps, as named slots of their planned argv.
WORKDIR = Slot("workdir")  # the run's work directory: source.archive_argv places its words below it
STAGE = Slot("stage")
ARCHIVE_SHA256 = Slot("archive_sha256")
TREE_SHA256 = Slot("tree_sha256")
OUTCOME = Slot("outcome", label="success|failed")


class SourceStage:
    def __init__(self, receipt: Receipt, transport: Transport, agent: tuple[str, ...], scratch_root: str | None,
                 kind: str, name: str, timeout: float):
        self.receipt = receipt
        self.transport = transport
        self.agent = agent
        self.root = scratch_root
        self.kind, self.name, self.timeout = kind, name, timeout
        self.ident: source.SourceIdentity | None = None
        self.dir: str | None = None

    @property
    def plan(self) -> Plan:
        return self.receipt.plan

    def plan_source(self, repo: str, sha: str, what: str) -> None:
        # the argv make_archive runs (source.archive_argv), <workdir> filled when the run records it
        self.plan.add("source", "local", source.archive_argv(repo, sha, WORKDIR),
                      f"archive the exact {what} commit and prove its tree id")

    def plan_stage(self, ident: source.SourceIdentity) -> None:
        where = self.transport.where
        words = {"sha": ident.sha, "archive_sha256": ARCHIVE_SHA256, "tree_sha256": TREE_SHA256,
                 "git_tree": ident.git_tree}
        self.plan.add("stage-create", where, protocol.stage_create(self.agent, root=self.root, kind=self.kind,
                                                                   name=self.name, **words), "create a fresh stage")
        self.plan.add("stage-receive", where, protocol.stage_receive(self.agent, stage=STAGE),
                      "copy the archive into the stage")
        self.plan.add("stage-verify", where, protocol.stage_verify(self.agent, stage=STAGE, **words),
                      "prove the staged archive's checksum and tree where it will be used")

    def plan_reclaim(self) -> None:
        self.plan.add("stage-reclaim", self.transport.where,
                      protocol.stage_reclaim(self.agent, root=self.root, kind=self.kind, name=self.name,
                                             stage=STAGE, outcome=OUTCOME, keep_failed=KEEP_FAILED),
                      f"remove this run's stage on success; keep at most {KEEP_FAILED} failed stages")

    def archive(self, ident: source.SourceIdentity, workdir: str) -> source.SourceIdentity:
        step, started = self.plan.get("source"), time.monotonic()
        argv = fill(step.planned_argv, {"workdir": workdir})  # exactly the planned git archive
        try:
            self.ident = source.make_archive(ident, workdir, argv)
        except VqAdminError as exc:
            mark_local(step, False, started, exc.message, argv)
            raise
        mark_local(step, True, started, argv=argv)
        self.receipt.source = self.ident.to_receipt()
        return self.ident

    def digests(self) -> dict[str, str]:
        """This run's values of the ``<archive_sha256>`` and ``<tree_sha256>`` slots."""
        assert self.ident is not None
        files = self.ident.identity_files()
        return {"archive_sha256": files["ARCHIVE-SHA256"], "tree_sha256": files["SOURCE-TREE-SHA256"]}

    def stage(self) -> str:
        """Create, fill and verify the stage; returns its path on the host."""
        assert self.ident is not None and self.ident.archive_path
        create = self.plan.get("stage-create")
        created = execute(create, self.transport, timeout=STAGE_TIMEOUT, values=self.digests())
        self.require(created, create.name)
        try:
            path = protocol.parse_stage_create(created.stdout)["stage"]
        except protocol.ProtocolError:
            raise VqAdminError(f"stage-create on {self.transport.where} did not name a stage directory") from None
        self.dir = path
        self.receipt.stage = Stage(where=self.transport.where, dir=path)
        receive, verify = self.plan.get("stage-receive"), self.plan.get("stage-verify")
        received = execute(receive, self.transport, timeout=self.timeout, stdin=self.ident.archive_path, stage=path)
        self.require(received, receive.name)
        checked = execute(verify, self.transport, timeout=self.timeout, stage=path, values=self.digests())
        if checked.exit_code == exits.EXIT_MISMATCH and not checked.interrupted:
            mismatches = _verdict(checked).get("mismatches") or ["identity mismatch"]
            self.reclaim(success=False)
            raise Refused(f"the staged archive on {self.transport.where} does not match {self.ident.sha}: "
                          + "; ".join(map(str, mismatches)))
        self.require(checked, verify.name)
        verdict = _verdict(checked)  # exit 0 alone proves nothing: the agent's verdict must say so
        if not verdict.get("verified") or verdict.get("stage") != path or verdict.get("mismatches"):
            self.reclaim(success=False)
            raise VqAdminError(f"stage-verify on {self.transport.where} exited 0 without a verdict proving the "
                               f"stage {path} (answer: {checked.text()[:300]!r}); nothing was installed")
        return path

    def require(self, result: RunResult, what: str) -> None:
        """A staging step must succeed; nothing has been installed yet."""
        if result.ok:
            return
        if result.interrupted:  # nothing was installed, so failed is honest; say what may be left
            interruption = self.receipt.interruption = Interruption(
                step=what, transport=result.describe(), installed="nothing", stage=left_stage(self.receipt))
            self.reclaim(success=False)
            self.receipt.interruption = interruption.replace(
                reclaimed_now=self.plan.get("stage-reclaim").status == "ok")
            raise VqAdminError(f"{what}: the transport was interrupted ({result.describe()}); nothing was "
                               f"installed; {interruption.stage}")
        self.reclaim(success=False)
        if result.exit_code == exits.EXIT_UNSAFE:
            raise Refused(f"{what} on {self.transport.where}: {result.error_text()[-500:]} (nothing was installed)")
        raise VqAdminError(f"{what}: {result.describe()}: {result.error_text()[-300:]} (nothing was installed)")

    def reclaim(self, success: bool) -> None:
        if not self.dir:
            return
        step = self.plan.get("stage-reclaim")
        result = execute(step, self.transport, timeout=RECLAIM_TIMEOUT, stage=self.dir,
                         outcome=protocol.OUTCOME_SUCCESS if success else protocol.OUTCOME_FAILED)
        if result.interrupted:  # the reclaim may have run on the host before its answer was lost
            self.receipt.errors.append(f"stage-reclaim: {result.describe()} (the stage {self.dir} may have been "
                                       "reclaimed or kept; the next run of this lane that stages reclaims it)")
        elif not result.ok:
            self.receipt.errors.append(f"stage-reclaim: {result.describe()} (the stage {self.dir} was kept)")
        self.dir = None


def _verdict(result: RunResult) -> protocol.StageVerdict:
    """The agent's ``stage-verify`` verdict; an unreadable one verifies nothing."""
    try:
        return protocol.parse_stage_verify(result.stdout)
    except protocol.ProtocolError:
        return {}


def left_stage(receipt: Receipt) -> str:
    """What this run knows it left of its source stage (an interrupted run's receipt says it)."""
    stage = receipt.stage.dir if receipt.stage else None
    if stage:
        return f"the source stage {stage} may be left behind; the next run of this lane reclaims it"
    steps = {s.name: s for s in receipt.plan.steps}
    create = steps.get("stage-create")
    if create is not None and create.argv is not None and create.status != "ok":
        return ("stage-create may have created a stage before it was interrupted; the next run of this lane "
                "reclaims it")
    return "no source stage was created"
