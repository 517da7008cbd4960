"""One Slurm batch job: submit with ``sbatch --parsable --wait``, bound the
wait, cancel at the bound; and establish a job's end by its id afterwards.

Facts this relies on (Slurm 22.05): ``--parsable`` prints the job id at
once, before waiting; ``sbatch --wait`` exits with the job's exit status
(a cancelled or killed job gives 1, an sbatch usage error 255); while the
controller is unreachable sbatch retries forever, so the wait needs a bound
of our own.  A finished job stays in ``scontrol show job`` for MinJobAge
seconds; after that the job completion log (``jobcomp/filetxt``, path from
``scontrol show config``) or ``sacct`` tells its end.

Standard library only: runs inside ``vq-admin-agent``.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from . import spawn
from ..core.identifiers import JOB_ID_RULE

TERMINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
})
#: sbatch --parsable's line: the job id (:data:`~vq_admin.core.identifiers.JOB_ID_RULE`), then ``;cluster``.
PARSABLE_RE = re.compile(rf"\A({JOB_ID_RULE})(?:;\S+)?\Z")
QUERY_TIMEOUT = 60.0
CANCEL_GRACE = 15.0
_FIELD_RE = {
    "JobId": re.compile(r"(?:^|\s)JobId=(\d+)(?=\s|$)"),
    "JobState": re.compile(r"(?:^|\s)JobState=([A-Z_]+)"),
    "ExitCode": re.compile(r"(?:^|\s)ExitCode=(\d+):(\d+)"),
    "Name": re.compile(r"(?:^|\s)(?:Job)?Name=(\S*)"),
    "NodeList": re.compile(r"(?:^|\s)NodeList=(\S*)"),
    "BatchHost": re.compile(r"(?:^|\s)BatchHost=(\S*)"),
}


@dataclass(frozen=True)
class JobEnd:
    """How a job ended, and which source said so."""

    job_id: str
    state: str
    exit_code: int
    raw_exit: str | None
    source: str  # scontrol | jobcomp | sacct


def wait_status(state: str, status: int | None, signal: int | None) -> int:
    """The exit status ``sbatch --wait`` gives for a job that ended so.

    A normal exit gives its status; a signal gives 1; a job that did not
    complete but shows status 0 (cancelled while pending, node failure)
    gives 1, so no unfinished job ever reads as success.
    """
    code = status if (status is not None and not signal) else 1
    if code == 0 and state != "COMPLETED":
        return 1
    return code


def parse_fields(line: str) -> dict[str, str]:
    """``JobId``, ``JobState``, ``ExitCode`` (``"3:0"``), ``Name``, ``NodeList`` and ``BatchHost`` (both empty
    or missing for a job that never started) of one record line."""
    found: dict[str, str] = {}
    for key, rx in _FIELD_RE.items():
        m = rx.search(line)
        if m:
            found[key] = ":".join(m.groups()) if key == "ExitCode" else m.group(1)
    return found


def never_started(fields: dict[str, str]) -> bool:
    """A cancelled job that the scheduler never gave a node (no ``BatchHost``, an empty ``NodeList``)."""
    return (fields.get("JobState") == "CANCELLED" and not fields.get("BatchHost")
            and fields.get("NodeList", "(null)") in ("", "(null)"))


def _end_from(fields: dict[str, str], job_id: str, source: str) -> JobEnd | None:
    state = fields.get("JobState", "")
    if state not in TERMINAL_STATES:
        return None
    raw = fields.get("ExitCode")
    status = signal = None
    if raw:
        status, signal = (int(x) for x in raw.split(":"))
    return JobEnd(job_id, state, wait_status(state, status, signal), raw, source)


def query(argv: Sequence[str], timeout: float = QUERY_TIMEOUT) -> tuple[int | None, str, str]:
    """``(exit code, stdout, stderr)`` of a Slurm command; ``(None, "", why)`` when it did not answer."""
    try:
        code, out, err = spawn.run_captured(argv, timeout=timeout)
    except spawn.TimeoutExpired:
        return None, "", f"{argv[0]}: no answer within {timeout:.0f} s"
    except OSError as exc:
        return None, "", f"{argv[0]}: {exc.strerror or exc}"
    return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def scontrol_state(job_id: str, timeout: float = QUERY_TIMEOUT) -> tuple[str, dict[str, str]]:
    """``("known", fields)``, ``("gone", {})`` when the record aged out, or ``("unreachable", {"error": ...})``."""
    code, out, err = query(["scontrol", "show", "job", "-o", job_id], timeout)
    if code == 0:
        for line in out.splitlines():
            fields = parse_fields(line)
            if fields.get("JobId") == job_id:
                return "known", fields
    if "Invalid job id" in err:
        return "gone", {}
    return "unreachable", {"error": (err or out).strip()[-300:]}


def jobcomp_path() -> str | None:
    """``JobCompLoc`` when ``JobCompType`` is ``jobcomp/filetxt``."""
    code, out, _err = query(["scontrol", "show", "config"])
    if code != 0:
        return None
    conf = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    conf = {k.strip(): v.strip() for k, v in conf.items()}
    if conf.get("JobCompType") != "jobcomp/filetxt" or not conf.get("JobCompLoc", "").startswith("/"):
        return None
    return conf["JobCompLoc"]


def jobcomp_end(job_id: str, job_name: str, path: str | None) -> JobEnd | None:
    """The last completion record of *job_id* and *job_name* in the log at *path*."""
    if not path:
        return None
    needle = f"JobId={job_id} "
    found: dict[str, str] | None = None
    try:
        with open(path, "r", errors="replace") as fh:
            for line in fh:
                if not line.startswith(needle):
                    continue
                fields = parse_fields(line)
                if fields.get("Name") == job_name:
                    found = fields
    except OSError:
        return None
    return _end_from(found, job_id, "jobcomp") if found else None


def sacct_end(job_id: str) -> JobEnd | None:
    code, out, _err = query(["sacct", "-X", "-n", "-P", "-j", job_id, "--format=JobID,State,ExitCode"])
    if code != 0:
        return None
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0] == job_id:
            state = parts[1].split()[0] if parts[1] else ""
            fields = {"JobState": state, "ExitCode": parts[2]} if re.match(r"\A\d+:\d+\Z",
                                                                           parts[2]) else {"JobState": state}
            return _end_from(fields, job_id, "sacct")
    return None


@dataclass
class EndSearch:
    """What :func:`wait_for_end` found."""

    end: JobEnd | None = None
    last_state: str | None = None
    notes: list[str] = field(default_factory=list)


def find_end(job_id: str, job_name: str, jobcomp: list[str | None]) -> tuple[JobEnd | None, str | None, str | None]:
    """One look: ``(end, last seen state, note)``.

    ``scontrol`` first; once the record has aged out of it, the job
    completion log (its path asked once and remembered in *jobcomp*), then
    ``sacct``.  While the controller does not answer there is nothing more
    to ask: the end stays unknown.
    """
    how, fields = scontrol_state(job_id)
    if how == "known":
        return _end_from(fields, job_id, "scontrol"), fields.get("JobState"), None
    if how == "unreachable":
        return None, None, f"scontrol: {fields.get('error') or 'no answer'}"
    if not jobcomp:
        jobcomp.append(jobcomp_path())
    end = jobcomp_end(job_id, job_name, jobcomp[0]) or sacct_end(job_id)
    if end is not None:
        return end, end.state, None
    return None, None, (f"job {job_id} is no longer known to scontrol and no completion record was found "
                        f"(job completion log: {jobcomp[0] or 'not jobcomp/filetxt'}; sacct: no record)")


def wait_for_end(job_id: str, job_name: str, timeout: float, *, poll: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> EndSearch:
    """Look for the job's end until it is found or *timeout* seconds pass."""
    deadline = clock() + timeout
    search = EndSearch()
    jobcomp: list[str | None] = []
    while True:
        end, state, note = find_end(job_id, job_name, jobcomp)
        if end is not None:
            search.end, search.last_state = end, end.state
            return search
        search.last_state = state or search.last_state
        if note and search.notes[-1:] != [note]:  # each note once, unless another came between
            search.notes.append(note)
        remaining = deadline - clock()
        if remaining <= 0:
            return search
        sleep(min(poll, remaining))


@dataclass
class Submission:
    """What ``sbatch --parsable --wait`` did."""

    job_id: str | None = None
    sbatch_exit_code: int | None = None
    timed_out: bool = False
    cancel: dict[str, object] | None = None
    stderr: str = ""
    error: str | None = None

    @property
    def submitted(self) -> bool:
        return self.job_id is not None

    def cancelled(self, done: str) -> str:
        """*done* when the job was cancelled at the bound, else why cancelling it failed."""
        cancel = self.cancel or {}
        return done if cancel.get("ok") else f"cancelling it failed: {cancel.get('message')}"


def cancel(job_id: str) -> dict[str, object]:
    code, out, err = query(["scancel", job_id])
    return {"job_id": job_id, "exit_code": code, "ok": code == 0, "message": (err or out).strip()[-300:]}


def submit_and_wait(argv: Sequence[str], timeout: float, on_job_id: Callable[[str, int], None],
                    pass_fds: Sequence[int] = ()) -> Submission:
    """Run sbatch; call *on_job_id* (job id, sbatch's pid) the moment it prints the id; bound the wait
    by *timeout*.  *pass_fds* stay open in sbatch for as long as it waits (the lease's work lock).

    At the bound the job is cancelled (``scancel``), sbatch is given
    :data:`CANCEL_GRACE` seconds to notice and is then killed.
    """
    result = Submission()
    with tempfile.TemporaryFile() as errfile:
        try:
            proc = spawn.start(argv, stdout=spawn.PIPE, stderr=errfile, pass_fds=pass_fds)
        except OSError as exc:
            result.error = f"{argv[0]}: {exc.strerror or exc}"
            return result

        def read_stdout() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                m = PARSABLE_RE.match(raw.decode("utf-8", "replace").strip())
                if m and result.job_id is None:
                    result.job_id = m.group(1)
                    on_job_id(result.job_id, proc.pid)

        reader = threading.Thread(target=read_stdout, name="sbatch-stdout", daemon=True)
        reader.start()
        try:
            result.sbatch_exit_code = proc.wait(timeout=timeout)
        except spawn.TimeoutExpired:
            result.timed_out = True
            if result.job_id is not None:
                result.cancel = cancel(result.job_id)
            else:
                result.cancel = {"job_id": None, "ok": False, "exit_code": None,
                                 "message": "sbatch printed no job id before the bound; nothing to cancel"}
            try:
                result.sbatch_exit_code = proc.wait(timeout=CANCEL_GRACE if result.cancel["ok"] else 0.1)
            except spawn.TimeoutExpired:
                proc.kill()
                proc.wait()
                result.sbatch_exit_code = None
        reader.join(timeout=5)
        errfile.seek(0)
        result.stderr = errfile.read()[-4000:].decode("utf-8", "replace")
    return result
