"""What a run that vq-admin itself did not finish (SIGTERM, SIGINT, SIGHUP) leaves behind, said exactly
in its receipt's ``readback``: a batch job or detached build is never cancelled, and the next run of the
lane reconciles it (:mod:`.allocation_attempt`) and reclaims the source stage."""

from __future__ import annotations

from msgspec import UNSET

from ..document import JsonValue
from ..report.receipt import Receipt
from ..report.sections import Deploy, Readback
from .staging import left_stage


def left_behind(receipt: Receipt, readback: Readback) -> Readback:
    """*readback* with the facts of what an interrupted run may have left running or on disk."""
    deploy, facts = receipt.deploy, {}
    steps = {s.name: s for s in receipt.plan.steps}
    step, prepare = steps.get("deploy"), steps.get("prepare")
    if step is None or step.argv is None:
        build = "no build was started"
    elif deploy.build_place == "allocation":
        facts = known(deploy, "job_id", "job_state", "attempt", "attempt_dir", "log_dir")
        job = deploy.job_id or f"the job whose id is recorded in {deploy.attempt_dir}/job (if it was submitted)"
        build = (f"batch job {job} was not cancelled: it keeps running, or waiting in the queue, to its end; "
                 "the next run of this lane reconciles it from the attempt record before building")
    elif deploy.detached and not deploy.established and not deploy.timed_out:
        from .detached_step import left_running

        facts = known(deploy, "attempt", "attempt_dir", "log_dir", "pid")
        build = left_running(deploy)
    elif step.status in ("ok", "failed"):
        build = f"the deploy on {step.where} had ended ({step.status})"
    else:
        build = f"the provider's deploy may still be running on {step.where}"
    # interrupted: execute() started it (its argv recorded), and its end was never read
    preparer = (f"the site preparer may still be running on {prepare.where}"
                if prepare is not None and prepare.status == "interrupted" else UNSET)
    return readback.replace(stage=left_stage(receipt), build=build, preparer=preparer, **facts)


def known(deploy: Deploy, *keys: str) -> dict[str, JsonValue]:
    """The members *keys* of *deploy* that are set and not null."""
    values = {key: getattr(deploy, key) for key in keys}
    return {key: value for key, value in values.items() if value is not None and value is not UNSET}


def interrupted_readback(receipt: Receipt, signal_text: str, next_command: str,
                         wait_lock: float | None = None) -> Readback:
    """The ``readback`` of a run that vq-admin itself did not finish (a signal)."""
    readback = left_behind(receipt, Readback(
        read=f"nothing after the signal ({signal_text}): vq-admin stopped at once and read nothing back",
        proven=False, next_command=next_command))
    running = None
    if readback.job_id or (readback.attempt_dir and receipt.deploy.build_place == "allocation"):
        running = f"batch job {readback.job_id or '(its id is in the attempt record)'}"
    elif readback.attempt_dir:
        running = f"the build pid {readback.pid or '(in the attempt record)'} on {receipt.deploy.where}"
    return readback.replace(advice=rerun_advice(running, wait_lock, "the interrupted run"))


def rerun_advice(running: str | None, wait_lock: float | None, what: str) -> str:
    """What the rerun (``next_command``) does now: one short line, then the details.  *running*
    names the build or batch job this run left running (it holds the host-side lease until it ends)."""
    verify = f"it verifies read-only first and reports already-current if {what} completed"
    if running is None:
        return f"the rerun is safe now: {verify}"
    if wait_lock:
        first = f"the rerun waits up to {wait_lock:g} s (--wait-lock) for {running} to end"
    else:
        first = f"a rerun is 75 (locked) until {running} ends; with --wait-lock SECONDS it waits for it"
    return (f"{first}\nthen it reconciles that build's end from its attempt record (exit status and transcript) "
            f"and {verify.removeprefix('it ')}; do not start a build by hand")
