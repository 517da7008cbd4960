"""The deploy step on a fixed host (no ``update_allocation``), detached from the connection.

The provider's update (or install) runs on the build host the way an
allocation build runs (``detach-run``), with a supervising process in place of
the batch job (:mod:`vq_admin.agent.detached`): the same attempt record
(``"kind": "detached"``), framed stream, transcript copy and settle checksums.

A dropped connection, a killed ssh client or a killed driver leave the build
running to its end.  After an interrupted call the driver asks the build
host once (``detach-reconcile``, a one-second wait, never starts anything):
an ended build's exit status and settled transcript are this run's
evidence; a build still running makes this run ``unknown`` unless the
read-only verify already proves the requested identity.  The next run of the
lane reconciles from the record before it decides anything (75 while the
build still runs).

``transport = "local"`` hosts, and hosts without ``scratch_root``, run the
provider attached (:func:`applies`).
"""

from __future__ import annotations

from vq_admin_hookspecs import ProviderCommand

from ..core import exits
from ..report.sections import Deploy
from ..ssh.transport import RunResult, SshTransport
from . import allocation_step
from .allocation_stream import StreamCall, TranscriptSink, discard
from .runtime_step import RuntimeStep

def applies(step: RuntimeStep) -> bool:
    """A fixed-host build over ssh with a scratch root runs detached."""
    return (step.profile.update_allocation is None and bool(step.host.scratch_root)
            and isinstance(step.build_transport(), SshTransport))


def left_running(deploy: Deploy) -> str:
    """What an interrupted run leaves behind on the build host (said in its receipt)."""
    if deploy.fenced:
        return (f"no build was started on {deploy.where}: the connection dropped before the agent started, "
                f"and the attempt {deploy.attempt_dir} is now fenced so that none can start under it")
    pid = deploy.pid or f"recorded in {deploy.attempt_dir}/build"
    return (f"the build keeps running on {deploy.where} under attempt {deploy.attempt_dir} "
            f"(pid {pid}); the next run reconciles it")


def _still_running(deploy: Deploy, why: str) -> str:
    first = f"{deploy.interruption}; " if deploy.interruption else ""
    return f"{first}the build's end is not known yet ({why}): {left_running(deploy)}"


class DetachedDeploy(allocation_step.AllocationDeploy):
    """The deploy step of a fixed-host build over ssh, detached; built from the step's inputs (it shares
    the allocation deploy's framed call, reconcile, transcript and unknown-outcome machinery)."""

    KIND = "detached"

    def plan(self, command: ProviderCommand, purpose: str) -> None:
        """Add the ``deploy`` step: the agent on the build host starts the build detached."""
        where = self.build_transport().where
        self.receipt.plan.add("deploy", where, self.planned_argv(command),
                              f"{purpose}, detached on the build host (it survives a dropped connection)")
        self.plan_reconcile(where, detached=True,
                            purpose="after a dropped deploy: establish the detached build's end from its attempt "
                                    "(never starts one)")

    def deploy(self, command: ProviderCommand) -> RunResult:
        """Run the deploy step; the result's exit_code is the build's exit status."""
        transport = self.build_transport()
        return self.run_attempt(command, transport, f"on {transport.where}, detached", Deploy(
            build_place=self.profile.build_place, detached=True, where=transport.where, pid=None, exit_code=None))

    def _conclude(self, command: ProviderCommand, call: StreamCall,
                  sinks: dict[str, TranscriptSink]) -> RunResult:
        where, summary = call.where, call.summary
        if summary is None:
            discard(sinks)
            return self._unknown(command, call, "the helper's report never arrived",
                                 message=_still_running(self.receipt.deploy, "the helper's report never arrived"))
        signal = summary.exit_signal
        self._record_end(summary, call, sinks, ("pid", "exit_code", "exit_signal", "job_state", "established",
                                                "timed_out", "cancel", "reconciled", "fenced", "notes"),
                         signal, "the build's end was not established")
        if summary.timed_out:  # the build may have activated before it was ended: only a read-back decides
            return RunResult(list(command.argv), where, None, seconds=call.seconds, interrupted="job", stderr=(
                f"the build on {where} did not finish within timeout_seconds "
                f"({allocation_step._seconds(self.profile.timeout_seconds)} s); vq-admin ended its process group "
                f"({summary.cancel.message if summary.cancel else None}); transcripts in "
                f"{self.receipt.deploy.log_dir}").encode())
        if not summary.established:
            why = "; ".join(summary.notes) or "the build's end was not established"
            return self._unknown(command, call, why, message=_still_running(self.receipt.deploy, why))
        if summary.exit_code == exits.JOB_TAMPERED:
            self.tampered(sinks, f"the build on {where}")
        if signal:  # the build did not choose its exit status: read back before deciding
            return RunResult(list(command.argv), where, 128 + signal, seconds=call.seconds, interrupted="job",
                             stderr=(f"the build on {where} was ended by signal {signal}; transcripts in "
                                     f"{self.receipt.deploy.log_dir}").encode())
        return RunResult(list(command.argv), where, allocation_step._status(summary), seconds=call.seconds)

