"""Fixed-host builds (``detach-run``, ``detach-reconcile``), detached from the connection that
started them, in the allocation lane's attempt directories (:mod:`.allocation`; the layout, with
``build`` and ``exit`` in place of ``job``, is in docs/allocation-transcripts.md).

The agent double-forks a **supervisor** in its own session (``setsid``), stdin from
``/dev/null``, no descriptor of the ssh session kept.  The supervisor starts the build
(``job.py``, in a session of its own so a bound can end its whole process group), records
``build`` atomically, waits for it and records ``exit`` atomically; it holds the attempt's
``.live`` lock until then, so no run's retention removes a running build's directory.  A dropped
connection, a killed driver or a killed agent leave the build and its supervisor running to the
end.

``detach-run`` follows the build, bounds it by ``--timeout`` (SIGTERM to its process group, then
SIGKILL), looks at the transcripts once (this host's own files: nothing to settle), applies
retention and streams them as ``alloc-run`` does.  ``detach-reconcile`` never starts anything:
it waits (bounded) for the recorded build's ``exit``, then does the same; a missing attempt is
created (fenced), as ``alloc-reconcile`` does.

Standard library only; Python 3.8 and later.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, Callable, List, TypedDict, cast

from . import allocation, lease, spawn
from ..core import procs, safedirs
from ..core.atomic import TEMP_FLAGS
from ..core.bounds import json_object
from ..core.frames import FrameWriter
from ..core.stamps import utc_now
from .progress import Reporter

#: The build's record and its end, inside the attempt directory.
BUILD_FILE = "build"
EXIT_FILE = "exit"
#: Seconds a reconcile waits for a live original agent to record the build it starts.
START_WAIT = 30.0
#: Largest ``build``/``exit`` record read.
RECORD_LIMIT = 4096
POLL = 0.2


class BuildRecord(TypedDict, total=False):
    """The ``build`` record the supervisor writes once the build has started."""

    pid: int
    start_time: str | None
    supervisor_pid: int
    supervisor_start_time: str | None
    argv_sha256: str
    archive_sha256: str | None
    started: str


class ExitRecord(TypedDict, total=False):
    """The ``exit`` record the supervisor writes once the build has ended (``signal``: what ended it)."""

    exit_code: int | None
    signal: int | None
    pid: int
    ended: str


class Cancel(TypedDict):
    """How a build was ended at the bound: the signals sent to its process group."""

    ok: bool
    signals: List[str]
    message: str


def process_alive(pid: int | None, start_time: str | None) -> bool:
    """True while *pid* runs and is still the process that started at *start_time* (not a zombie)."""
    return pid != 1 and procs.process_alive(pid, start_time)  # which refuses anything but a positive int


def supervisor_alive(record: BuildRecord | None) -> bool:
    """The supervisor that wrote *record* still runs."""
    return record is not None and process_alive(record.get("supervisor_pid"), record.get("supervisor_start_time"))


def read_record(attempt: allocation.Attempt, name: str) -> dict[str, Any] | None:
    """The JSON object in *name* inside the attempt (never through a symlink), or ``None``."""
    return json_object(attempt.read(name, RECORD_LIMIT + 1), limit=RECORD_LIMIT)


def read_build(attempt: allocation.Attempt) -> BuildRecord | None:
    """The ``build`` record (this agent's supervisor wrote it, atomically), or ``None``."""
    return cast("BuildRecord | None", read_record(attempt, BUILD_FILE))


def await_build(attempt: allocation.Attempt, alive: bool, wait: float) -> BuildRecord | None:
    """The ``build`` record, waiting up to *wait* seconds for it while the original agent is *alive* (it
    may still start the supervisor)."""
    deadline = time.monotonic() + wait
    record = read_build(attempt)
    while record is None and alive and time.monotonic() < deadline:
        time.sleep(POLL)
        record = read_build(attempt)
    return record


def read_exit(attempt: allocation.Attempt) -> ExitRecord | None:
    """The ``exit`` record (this agent's supervisor wrote it, atomically), or ``None``."""
    return cast("ExitRecord | None", read_record(attempt, EXIT_FILE))


def quiet(sigpipe: int) -> None:
    """The start of a supervisor: SIGHUP and SIGINT ignored, SIGPIPE set to *sigpipe*, and nothing of the
    ssh session kept open (0, 1 and 2 on ``/dev/null``)."""
    for sig, how in ((signal.SIGHUP, signal.SIG_IGN), (signal.SIGINT, signal.SIG_IGN), (signal.SIGPIPE, sigpipe)):
        signal.signal(sig, how)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def announce(attempt: allocation.Attempt, report_fd: int, record: BuildRecord) -> None:
    """Write the ``build`` record atomically, then hand it to the agent waiting in :func:`start`."""
    line = json.dumps(record, sort_keys=True)
    attempt.write_file(BUILD_FILE, line.encode())
    try:
        os.write(report_fd, (line + "\n").encode())
        os.close(report_fd)
    except OSError:
        pass  # the agent is gone: the supervisor goes on regardless


def _supervise(attempt: allocation.Attempt, binding: allocation.Binding, report_fd: int,
               work: tuple[int, str]) -> None:
    """The supervisor (a grandchild of the agent, in its own session; it holds the lease's work lock,
    inherited from the agent, until it ends): never returns."""
    code = 70
    try:
        quiet(signal.SIG_DFL)
        out, err = (os.open(name, TEMP_FLAGS, 0o600, dir_fd=attempt.fd) for name in ("stdout", "stderr"))
        path = attempt.path
        argv = [os.path.join(path, "job.py"), *binding.job_args(path)]
        proc = spawn.start(argv, stdout=out, stderr=err, cwd=path, new_session=True)
        os.close(out)
        os.close(err)
        record = BuildRecord(pid=proc.pid, start_time=procs.proc_start_time(proc.pid), supervisor_pid=os.getpid(),
                             supervisor_start_time=procs.proc_start_time(os.getpid()),
                             argv_sha256=binding.argv_sha256, archive_sha256=binding.archive_sha256,
                             started=utc_now())
        try:
            lease.record_work(work[1], {"kind": "build", "pid": proc.pid, "supervisor_pid": os.getpid(),
                                           "attempt": attempt.path, "since": record["started"]})
        except OSError:
            pass  # the lock is held all the same; only its record is missing
        announce(attempt, report_fd, record)
        status = proc.wait()
        lease.end_work(*work)  # before the exit record: whoever reads that finds the lease free
        end = ExitRecord(exit_code=status if status >= 0 else None, signal=-status if status < 0 else None,
                         pid=proc.pid, ended=utc_now())
        attempt.write_file(EXIT_FILE, json.dumps(end, sort_keys=True).encode())
        code = 0
    finally:
        os._exit(code)


def start(attempt: allocation.Attempt, binding: allocation.Binding, work: tuple[int, str],
          supervise: Callable[[allocation.Attempt, allocation.Binding, int, tuple[int, str]], None] | None = None,
          ) -> BuildRecord:
    """Start the supervisor (double fork, own session; it inherits the lease's work lock the caller
    holds) and return the ``build`` record it wrote; *supervise* replaces the build's supervisor (the
    confirmation job's, :mod:`.confirm`)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # the intermediate process: a new session, then the supervisor, then gone
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() == 0:
                (supervise or _supervise)(attempt, binding, write_fd, work)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(child, 0)
    with os.fdopen(read_fd, "rb") as fh:  # the record's line, or EOF when the supervisor failed
        data = fh.readline(RECORD_LIMIT)
    record = json_object(data, limit=RECORD_LIMIT)
    if record is None:
        raise OSError(f"the build's supervisor did not start the build in {attempt.path} (see its stderr)")
    return cast(BuildRecord, record)


def _state(record: BuildRecord) -> tuple[str | None, str | None]:
    alive = process_alive(record.get("pid"), record.get("start_time"))
    return ("RUNNING" if alive else None), None


def _running(record: BuildRecord) -> bool:
    """The recorded build or its supervisor still runs."""
    return process_alive(record.get("pid"), record.get("start_time")) or supervisor_alive(record)


def _stop_build(attempt: allocation.Attempt, record: BuildRecord) -> Cancel:
    """End the build's process group (it leads its own session) at the bound: :func:`procs.end_group`."""
    pid, start_time = record["pid"], record.get("start_time")  # the supervisor's record names it

    def gone(grace: float) -> bool:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and read_exit(attempt) is None:
            time.sleep(POLL)
        return read_exit(attempt) is not None or not process_alive(pid, start_time)

    sent = [] if gone(0.0) else procs.end_group(pid, gone)
    ended = read_exit(attempt) is not None
    return Cancel(ok=ended, signals=sent, message="the build's process group was ended" if ended
                  else "the build did not end after SIGKILL")


def _wait_for_exit(attempt: allocation.Attempt, record: BuildRecord | None, timeout: float) -> ExitRecord | None:
    """The ``exit`` record, waiting up to *timeout* while the supervisor (or the build) still runs."""
    deadline = time.monotonic() + timeout
    while True:
        end = read_exit(attempt)
        if end is not None:
            return end
        if record is None or not _running(record) or time.monotonic() >= deadline:
            return None
        time.sleep(POLL)


def _summary(attempt: allocation.Attempt, record: BuildRecord | None) -> allocation.Summary:
    summary = allocation.base_summary(attempt)
    summary.update({"build_place": "fixed-host", "pid": None, "exit_signal": None})
    if record is not None:
        summary.update({"pid": record.get("pid"), "started": record.get("started"), "submitted": True})
    return summary


def _establish(summary: allocation.Summary, end: ExitRecord | None, record: BuildRecord | None) -> None:
    if end is not None:
        summary.update({"exit_code": end.get("exit_code"), "exit_signal": end.get("signal"), "ended": end.get("ended"),
                        "established": True, "end_source": "supervisor"})
        if end.get("signal"):
            summary["notes"].append(f"the build was ended by signal {end['signal']}")
    elif record is not None:
        if _running(record):
            summary["job_state"] = "RUNNING"
            summary["notes"].append(f"the build (pid {record.get('pid')}) is still running")
        else:
            summary["notes"].append("the build and its supervisor are gone and no exit status was recorded "
                                    "(the supervisor was killed?)")


#: A fixed-host build's transcripts are files on this host, written by a build whose end is
#: recorded (or that still runs: then they are incomplete however long they are watched): one
#: observation, no settle.  The settle is for a batch job's files seen through a shared filesystem.
ONE_LOOK: allocation.SettleOptions = {"max_observations": 1, "required": 1}


def run(root: str, program: str, argv: Sequence[str], env: dict[str, str], timeout: float, frames: FrameWriter,
        attempt_name: str | None = None, *, archive: str | None = None, archive_sha256: str | None = None,
        progress: float | None = None) -> allocation.Summary:
    """Create the attempt, start the detached build, follow it (bounded), then :func:`allocation.finish`."""
    # the supervisor keeps the lease's work lock until the build has ended
    attempt, binding, work_fd, lease_path = allocation.prepare(root, program, argv, env, frames, attempt_name,
                                                             archive, archive_sha256)
    try:
        with safedirs.closed_on_error(work_fd):
            record = start(attempt, binding, (work_fd, lease_path))
        os.close(work_fd)
        summary = _summary(attempt, record)
        frames.record("job", {"pid": record.get("pid"), "attempt_dir": attempt.path})
        with Reporter(lambda payload: frames.record("progress", payload), attempt.fd, progress,
                      state=lambda _: _state(record)) as reporter:
            reporter.start(f"pid {record.get('pid')}")
            end = _wait_for_exit(attempt, record, timeout)
        if end is None and process_alive(record.get("pid"), record.get("start_time")):
            cancel = _stop_build(attempt, record)
            summary.update({"timed_out": True, "cancel": cancel})
            summary["notes"].append(f"the build did not finish within {timeout:g} s; vq-admin ended its process "
                                    f"group ({', '.join(cancel['signals']) or 'no signal needed'})")
            end = read_exit(attempt)
            if end is not None:
                summary.update({"exit_code": end.get("exit_code"), "exit_signal": end.get("signal")})
        else:
            _establish(summary, end, record)
        return allocation.finish(attempt, frames, summary, settle_kw=ONE_LOOK, progress=bool(progress))
    finally:
        attempt.close()


def reconcile(root: str, program: str, attempt_name: str, timeout: float, frames: FrameWriter,
              ) -> allocation.Summary:
    """Establish the end of the attempt's detached build (never starts one), then :func:`allocation.finish`."""
    attempt, fenced, alive = allocation.open_attempt(root, program, attempt_name)
    try:
        frames.record("attempt", {"attempt": attempt.name, "attempt_dir": attempt.path})
        summary = _summary(attempt, None)
        summary.update({"reconciled": True, "fenced": fenced})
        if fenced:
            return allocation.end_fenced(frames, summary, "start a build")
        deadline = time.monotonic() + timeout
        record = await_build(attempt, alive, min(timeout, START_WAIT))
        if record is None:
            summary["notes"].append("no build was recorded in the attempt: it never started")
            summary["submitted"] = False if not alive else None
        else:
            summary = _summary(attempt, record)
            summary["reconciled"] = True
            frames.record("job", {"pid": record.get("pid"), "attempt_dir": attempt.path})
        end = _wait_for_exit(attempt, record, max(0.0, deadline - time.monotonic()))
        _establish(summary, end, record)
        return allocation.finish(attempt, frames, summary, settle_kw=ONE_LOOK)
    finally:
        attempt.close()
