"""The confirmation job of a new generation (``confirm-run``, ``confirm-reconcile``; CONTRACT section 13).

``confirm-run`` creates a fresh attempt (:mod:`.allocation`: the same directories, binding by
content hash, transcripts and retention as an allocation build), takes the lease's work lock and
starts a **supervisor** detached from the connection (:func:`.detached.start`).  The supervisor
submits ``sbatch --parsable --wait`` of the confirmation argv (``job.py`` checks ``argv.json``'s
SHA-256 before it runs anything), bounds the wait (``scancel`` at the bound), establishes the end
from Slurm (``scontrol``, else the job completion log), judges the ``VQ-DEPLOY-METRIC`` lines
against the baseline, and -- when the job did not pass and a revert argv was given -- runs the
revert (the profile's ``activate_command`` for the previous generation) on this host.  Then it
writes ``confirm`` (the verdict) atomically and releases the work lock.  A killed driver, a dropped
connection or a killed agent change none of this.

``confirm-run`` follows the supervisor (progress records on request) until ``confirm`` exists, then
streams the transcripts as ``alloc-run`` does.  ``confirm-reconcile`` never submits or reverts: it
waits (bounded) for the recorded supervisor's ``confirm`` and does the same.

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, cast

from . import allocation, detached, lease, slurmjob, spawn
from ..core import procs, protocol, safedirs
from ..core.frames import FrameWriter
from ..core.stamps import utc_now
from .progress import Reporter

if TYPE_CHECKING:
    from ..core.protocol import Revert, Verdict

#: The verdict the supervisor writes, and the spec it reads, inside the attempt.
VERDICT_FILE = "confirm"
SPEC_FILE = "confirm-spec.json"
#: Seconds the revert (activate_command) may take.
REVERT_TIMEOUT = 600.0
#: Largest stdout read for metrics.
METRIC_READ_LIMIT = 16 << 20
METRIC_RE = re.compile(r"^VQ-DEPLOY-METRIC ([A-Za-z0-9_.:-]{1,128})=(.*)$", re.M)
BETTER = ("lower", "higher", "equal")
#: Seconds the job's end state is looked for once sbatch has returned (its record may have aged out).
END_WAIT = 10.0
JOB_NAME = "vq-confirm-{}"



def metric_spec(text: str) -> Tuple[str, str, float]:
    """``NAME=BETTER:TOLERANCE`` (the words the driver passes) as ``(name, better, tolerance)``."""
    name, _, rest = text.partition("=")
    better, _, tol = rest.partition(":")
    if not name or better not in BETTER:
        raise ValueError(f"bad metric spec {text!r} (NAME=lower|higher|equal:TOLERANCE)")
    return name, better, float(tol or 0)


def _number(value: str) -> Optional[float]:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def judge(found: Dict[str, str], specs: Sequence[Tuple[str, str, float]], baseline: Dict[str, str]) -> List[str]:
    """Why the metrics *found* fail their *specs* against *baseline* (empty: they pass).  A metric with
    no baseline passes; a declared metric the job did not report fails."""
    problems = []
    for name, better, tol in specs:
        if name not in found:
            problems.append(f"metric {name} was not reported by the job")
            continue
        if name not in baseline:
            continue
        new, old = found[name], baseline[name]
        n, o = _number(new), _number(old)
        if better == "equal":
            same = (abs(n - o) <= tol * abs(o)) if (n is not None and o is not None) else new == old
            if not same:
                problems.append(f"regressed: {name} {new} != {old}")
        elif n is None or o is None:
            problems.append(f"metric {name}: {new!r} or its baseline {old!r} is not a number")
        elif better == "lower" and n > o * (1 + tol):
            problems.append(f"regressed: {name} {new} > {1 + tol:.2f} x {old}")
        elif better == "higher" and n < o * (1 - tol):
            problems.append(f"regressed: {name} {new} < {1 - tol:.2f} x {old}")
    return problems


def _metrics(attempt: allocation.Attempt) -> Dict[str, str]:
    text = (attempt.read("stdout", METRIC_READ_LIMIT) or b"").decode("utf-8", "replace")
    return {name: value.strip() for name, value in METRIC_RE.findall(text)}


def _end(sub: slurmjob.Submission, program: str) -> Verdict:
    """What Slurm reports of the job's end: state, raw ExitCode, exit status, node."""
    job_id = sub.job_id
    out: Verdict = {"job_id": job_id, "state": None, "exit_code": sub.sbatch_exit_code, "job_exit_code": None,
                    "node": None}
    if job_id is None:
        return out
    how, fields = slurmjob.scontrol_state(job_id, timeout=20.0)
    if how == "known" and fields.get("JobState") in slurmjob.TERMINAL_STATES:
        out.update({"state": fields.get("JobState"), "job_exit_code": fields.get("ExitCode"),
                    "node": fields.get("BatchHost") or fields.get("NodeList") or None})
    else:
        search = slurmjob.wait_for_end(job_id, JOB_NAME.format(program), END_WAIT, poll=1.0)
        if search.end is not None:
            out.update({"state": search.end.state, "job_exit_code": search.end.raw_exit,
                        "exit_code": search.end.exit_code})
    raw = out["job_exit_code"]
    if raw:  # STATUS:SIGNAL, both digits (slurmjob.parse_fields and sacct_end read only that form)
        status, _, sig = raw.partition(":")
        out["exit_code"] = int(status) if sig == "0" else 128 + int(sig)
    return out


def _revert(argv: Sequence[str]) -> Revert:
    try:
        code, out, err = spawn.run_captured(argv, timeout=REVERT_TIMEOUT)
    except OSError as exc:
        return {"argv": list(argv), "exit_code": None, "error": f"cannot run {argv[0]}: {exc.strerror or exc}"}
    except spawn.TimeoutExpired:
        return {"argv": list(argv), "exit_code": None, "error": f"did not end within {REVERT_TIMEOUT:.0f} s"}
    return {"argv": list(argv), "exit_code": code, "stdout": out[-2000:].decode("utf-8", "replace"),
            "stderr": err[-2000:].decode("utf-8", "replace")}


def _supervise(attempt: allocation.Attempt, binding: allocation.Binding, report_fd: int,
               work: Tuple[int, str]) -> None:
    """The supervisor (own session; holds the lease's work lock until the verdict is written): never returns."""
    code = 70
    try:
        detached.quiet(signal.SIG_IGN)
        spec = protocol.decode((attempt.read(SPEC_FILE, 1 << 20) or b"{}").decode("utf-8"))
        started = time.monotonic()
        record: detached.BuildRecord = {"supervisor_pid": os.getpid(), "started": utc_now(),
                                        "supervisor_start_time": procs.proc_start_time(os.getpid())}

        def on_job_id(job_id: str | None, sbatch_pid: int = 0) -> None:
            if job_id is not None:
                attempt.write_file("job", f"{job_id}\n".encode())
            try:
                lease.record_work(work[1], {"kind": "confirm", "job_id": job_id, "attempt": attempt.path,
                                            "pid": os.getpid(), "since": record["started"]})
            except OSError:
                pass

        on_job_id(None)
        detached.announce(attempt, report_fd, record)

        argv = allocation.sbatch_argv(attempt, spec["sbatch_args"], binding, JOB_NAME.format(attempt.program))
        sub = slurmjob.submit_and_wait(argv, float(spec["timeout"]), on_job_id)
        verdict = _end(sub, attempt.program)
        verdict.update({"seconds": round(time.monotonic() - started, 3), "timed_out": sub.timed_out,
                        "cancel": sub.cancel, "submitted": sub.submitted, "sbatch_stderr": sub.stderr[-2000:],
                        "metrics": _metrics(attempt)})
        problems = []
        if not sub.submitted:
            problems.append(f"sbatch did not submit the job (exit {sub.sbatch_exit_code}): {sub.stderr.strip()[-300:]}")
        elif sub.timed_out:
            problems.append(f"the job did not end within confirm_timeout_seconds ({spec['timeout']:g} s); "
                            + sub.cancelled("it was cancelled"))
        elif verdict["state"] != "COMPLETED" or verdict["exit_code"] != 0:
            problems.append(f"job {sub.job_id} ended {verdict['state'] or 'in an unknown state'} with exit code "
                            f"{verdict['job_exit_code'] or verdict['exit_code']}")
        regressed = judge(verdict["metrics"], [metric_spec(s) for s in spec["metrics"]], spec["baseline"])
        accepted = bool(regressed) and not problems and spec.get("accept_regression")
        verdict.update({"regressed": regressed, "accepted": bool(accepted),
                        "problems": problems + ([] if accepted else regressed)})
        verdict["passed"] = not verdict["problems"]
        verdict["revert"] = _revert(spec["revert"]) if not verdict["passed"] and spec.get("revert") else None
        verdict["ended"] = utc_now()
        lease.end_work(*work)
        attempt.write_file(VERDICT_FILE, json.dumps(verdict, sort_keys=True).encode())
        code = 0
    finally:
        os._exit(code)


def _follow(attempt: allocation.Attempt, record: Optional[detached.BuildRecord], timeout: float, frames: FrameWriter,
            progress: Optional[float]) -> Optional[Verdict]:
    """The verdict, waiting up to *timeout* while the supervisor lives; the ``job`` record once the id is known
    (and ``progress`` records every *progress* seconds from then on)."""
    deadline = time.monotonic() + timeout
    job_id = None
    with Reporter(lambda payload: frames.record("progress", payload), attempt.fd, progress) as reporter:
        while True:
            if job_id is None:
                job_id = attempt.read_job_id()
                if job_id is not None:
                    frames.record("job", {"job_id": job_id, "attempt_dir": attempt.path})
                    reporter.start(job_id)
            verdict = cast("Optional[Verdict]", detached.read_record(attempt, VERDICT_FILE))
            if verdict is not None or not detached.supervisor_alive(record) or time.monotonic() >= deadline:
                return verdict
            time.sleep(detached.POLL)


def _summary(attempt: allocation.Attempt, verdict: Optional[Verdict], record: Optional[detached.BuildRecord],
             ) -> allocation.Summary:
    summary = allocation.base_summary(attempt)
    summary.update({"confirm": verdict, "established": verdict is not None, "submitted": True if record else None})
    if verdict is not None:
        summary.update({"job_id": verdict.get("job_id"), "job_state": verdict.get("state"),
                        "exit_code": verdict.get("exit_code"), "job_exit_code": verdict.get("job_exit_code")})
    elif record is not None and detached.supervisor_alive(record):
        summary["job_id"] = attempt.read_job_id()
        summary["job_state"] = "RUNNING"
        summary["notes"].append(f"the confirmation (supervisor pid {record.get('supervisor_pid')}) is still under way")
    else:
        summary["notes"].append("the confirmation's supervisor is gone and wrote no verdict")
    return summary


def run(root: str, program: str, argv: Sequence[str], sbatch_args: Sequence[str], timeout: float,
        frames: FrameWriter, attempt_name: Optional[str], *, metrics: Sequence[str], baseline: Dict[str, str],
        accept_regression: bool, revert: Sequence[str], progress: Optional[float] = None) -> allocation.Summary:
    """Create the attempt, start the supervisor, follow it to its verdict, then :func:`allocation.finish`."""
    for text in metrics:
        metric_spec(text)
    attempt, binding, work_fd, lease_path = allocation.prepare(root, program, argv, {}, frames, attempt_name,
                                                             None, None)
    try:
        with safedirs.closed_on_error(work_fd):
            attempt.write_file(SPEC_FILE, json.dumps({
                "sbatch_args": list(sbatch_args), "timeout": timeout, "metrics": list(metrics), "baseline": baseline,
                "accept_regression": accept_regression, "revert": list(revert)}, sort_keys=True).encode())
            record = detached.start(attempt, binding, (work_fd, lease_path), supervise=_supervise)
        os.close(work_fd)
        # the supervisor bounds the job; this bound only covers a wedged scheduler
        verdict = _follow(attempt, record, timeout + REVERT_TIMEOUT + 120.0, frames, progress)
        return allocation.finish(attempt, frames, _summary(attempt, verdict, record),
                                 settle_kw=detached.ONE_LOOK, progress=bool(progress))
    finally:
        attempt.close()


def reconcile(root: str, program: str, attempt_name: str, timeout: float, frames: FrameWriter,
              ) -> allocation.Summary:
    """The verdict of an attempt's confirmation (never submits, never reverts), then :func:`allocation.finish`."""
    attempt, fenced, alive = allocation.open_attempt(root, program, attempt_name)
    try:
        frames.record("attempt", {"attempt": attempt.name, "attempt_dir": attempt.path})
        if fenced:
            return allocation.end_fenced(frames, allocation.base_summary(attempt), "submit")
        record = detached.await_build(attempt, alive, min(timeout, detached.START_WAIT))
        verdict = _follow(attempt, record, timeout, frames, None)
        summary = _summary(attempt, verdict, record)
        summary["reconciled"] = True
        return allocation.finish(attempt, frames, summary, settle_kw=detached.ONE_LOOK)
    finally:
        attempt.close()
