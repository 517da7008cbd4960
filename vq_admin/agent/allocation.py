"""Allocation builds on the login host: attempt directories, the batch job,
settle, retention, and reconciliation after a dropped connection.

An attempt is ``<scratch_root>/.vq-admin/runtime-deploy/<program>/deploy.<UTC>.<hex>/``, 0700,
created fresh and never reused, beside the per-program ``.lock`` (layout in
docs/allocation-transcripts.md).  Every level the tool creates is opened with ``O_NOFOLLOW``
below its parent, so a symlink planted at any level is refused and nothing is written through
it.  The job opens its own transcripts (Slurm's ``--output``/``--error`` are ``/dev/null``);
``.live`` is held (shared flock) while a run uses the attempt.

``run`` submits ``sbatch --parsable --wait`` and bounds the wait;
``reconcile`` never submits: it establishes the end of the job recorded in
``job`` (``scontrol``, else the job completion log, else ``sacct``).  Both
then settle the transcripts, apply retention and stream the transcripts
back (:mod:`vq_admin.core.frames`) while the attempt is still live.

Standard library (+ ``xxhash`` when importable), Python 3.8 and later.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypedDict

from ..core import atomic, checksum, safedirs, securepath
from . import lease, retention, slurmjob
from ..core.exits import JOB_TAMPERED
from ..core.frames import FrameWriter
from ..core.identifiers import ENV_NAME_RE, JOB_ID_RE, NAME_RE
from ..core.names import is_sha256
from ..core.stamps import utc_now
from .progress import Reporter, settle_record
from .settle import MAX_OBSERVATIONS, DirectoryObserver, SettleResult, settle

if TYPE_CHECKING:
    from ..core.protocol import Verdict

LOCK_WAIT = 120.0
JOB_ID_WAIT = 120.0
#: The batch job's name (the confirmation job's is :data:`.confirm.JOB_NAME`).
JOB_NAME = "vq-deploy-{}"
#: The first words of the job's stderr line in that case (the driver looks for it).
JOB_TAMPERED_MARK = "vq-admin job: refused:"
#: Largest argv.json the job reads.
JOB_ARGV_LIMIT = 16 << 20
JOB_SCRIPT = """\
# vq-admin allocation job: run the provider argv recorded in the JSON file
# named by the first argument, without any shell, but only if that file and
# the source archive are still exactly what the run prepared:
#   job.py ATTEMPT/argv.json ARGV_SHA256 [ARCHIVE ARCHIVE_SHA256]
import hashlib, os, stat, sys
TAMPERED = %(tampered)d
MARK = %(mark)r
try:
    SAY = [os.dup(2)]  # Slurm's stderr (/dev/null), or the caller's when run by hand; + the transcript once open
except OSError:
    SAY = []
def refuse(why):
    line = ("%%s %%s; the provider was not run\\n" %% (MARK, why)).encode("utf-8", "backslashreplace")
    sys.stderr.flush()
    for fd in SAY:
        try:
            os.write(fd, line)
        except OSError:
            pass
    os._exit(TAMPERED)
try:
    from vq_admin.core import bounds, securepath
except ImportError as exc:
    refuse("cannot import the secure-path and JSON rules (%%s) with %%s" %% (exc, sys.executable))
NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
def open_dir(path, what):
    problem = securepath.path_problem(path, what=what)
    if problem:
        refuse(problem)
    try:
        fd = os.open(path, NOFOLLOW | os.O_DIRECTORY)
    except OSError as exc:
        refuse("cannot open the %%s %%s without following symlinks: %%s" %% (what, path, exc.strerror))
    problem = securepath.level_problem(path, os.fstat(fd), is_dir=True)
    if problem or os.fstat(fd).st_uid != os.geteuid():
        refuse(problem or "the %%s %%s is not owned by the job's user" %% (what, path))
    return fd
def file_digest(path, what, want, keep=False):
    dfd = open_dir(os.path.dirname(path), what)
    try:
        fd = os.open(os.path.basename(path), NOFOLLOW, dir_fd=dfd)
    except OSError as exc:
        refuse("cannot open %%s without following symlinks: %%s" %% (path, exc.strerror))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        refuse("%%s is not a regular file owned by the job's user and writable by nobody else (mode %%04o)"
               %% (path, stat.S_IMODE(st.st_mode)))
    digest, data = hashlib.sha256(), []
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
            if keep:
                data.append(chunk)
                if sum(map(len, data)) > %(limit)d:
                    refuse("%%s is larger than %(limit)d bytes" %% path)
    got = digest.hexdigest()
    if got != want:
        refuse("%%s changed after the run prepared it (sha256 %%s, expected %%s)" %% (path, got, want))
    return b"".join(data)
TRANSCRIPT = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
def open_transcripts(attempt):
    # Slurm's own --output/--error are /dev/null: the job opens its transcripts itself, relative to
    # the attempt directory it has just checked, never through a symlink, only files it creates (or
    # its own from an earlier start of a requeued job).
    dfd = open_dir(attempt, "attempt directory")
    for name, target in (("stdout", 1), ("stderr", 2)):
        try:
            fd = os.open(name, TRANSCRIPT | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dfd)
        except FileExistsError:
            try:
                fd = os.open(name, TRANSCRIPT | os.O_APPEND, dir_fd=dfd)
            except OSError as exc:
                refuse("cannot open %%s/%%s without following symlinks: %%s" %% (attempt, name, exc.strerror))
            st = os.fstat(fd)
            if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022
                    or st.st_nlink != 1):
                refuse("%%s/%%s is not a regular file of the job's user with no other link, writable by "
                       "nobody else" %% (attempt, name))
        except OSError as exc:
            refuse("cannot create %%s/%%s: %%s" %% (attempt, name, exc.strerror))
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, target)
        os.close(fd)
    SAY.append(2)
    os.close(dfd)
if len(sys.argv) not in (3, 5):
    refuse("called with %%d arguments, not ARGV_JSON ARGV_SHA256 [ARCHIVE ARCHIVE_SHA256]" %% (len(sys.argv) - 1))
open_transcripts(os.path.dirname(sys.argv[1]))
raw = file_digest(sys.argv[1], "attempt directory", sys.argv[2], keep=True)
if len(sys.argv) == 5:
    file_digest(sys.argv[3], "stage directory", sys.argv[4])
try:  # the one bounded JSON reader, from this same agent
    spec = bounds.loads_json(raw, sys.argv[1], limit=%(limit)d)
except ValueError as exc:
    refuse(str(exc))
env = dict(os.environ)
env.update(spec["env"])
sys.stdout.flush()
try:
    os.execvpe(spec["argv"][0], spec["argv"], env)
except OSError as exc:
    sys.stderr.write("vq-admin job: cannot run %%s: %%s\\n" %% (spec["argv"][0], exc.strerror))
    sys.exit(127)
""" % {"tampered": JOB_TAMPERED, "mark": JOB_TAMPERED_MARK, "limit": JOB_ARGV_LIMIT}


#: Seconds the agent looks for a cancelled job's final state after a timeout.
CANCEL_STATE_WAIT = 10.0


class Summary(TypedDict, total=False):
    """The ``summary`` record: ``alloc-run``/``alloc-reconcile`` (:func:`base_summary` and what they add),
    ``detach-run``/``detach-reconcile`` (:mod:`.detached`) and the confirmation's (:mod:`.confirm`); the
    driver reads it as :class:`vq_admin.lanes.allocation_stream.Summary` (docs/allocation-transcripts.md)."""

    attempt: str
    attempt_dir: str
    program: str
    job_id: str | None
    submitted: bool | None
    sbatch_exit_code: int | None
    sbatch_stderr: str
    exit_code: int | None
    job_state: str | None
    job_exit_code: str | None
    end_source: str | None
    never_started: bool
    established: bool
    timed_out: bool
    cancel: Mapping[str, object] | None
    reconciled: bool
    fenced: bool
    notes: list[str]
    settle: dict[str, object]
    retention: dict[str, object]
    build_place: str  # a fixed-host build's (:mod:`.detached`): its pid, signal, start and end
    pid: int | None
    exit_signal: int | None
    started: str | None
    ended: str | None
    confirm: Verdict | None  # the confirmation's verdict (:mod:`.confirm`)


class SettleOptions(TypedDict, total=False):
    """What :func:`finish` passes on to :func:`.settle.settle` (a test's clock, one look for a fixed-host build)."""

    interval: float
    max_observations: int
    required: int
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    on_observation: Callable[[int, Sequence[Any]], None]


def program_parts(program: str) -> list[str]:
    if not NAME_RE.match(program):
        raise safedirs.UnsafePath(f"bad program name {program!r}")
    return [".vq-admin", "runtime-deploy", program]




def new_attempt_name() -> str:
    return safedirs.fresh_name("deploy")


def check_root(root: str) -> None:
    """sbatch expands ``%`` patterns (and ``\\``) in --output/--error paths: refuse them."""
    if "%" in root or "\\" in root:
        raise safedirs.UnsafePath(f"{root}: '%' and '\\' are not allowed in scratch_root "
                                  "(Slurm expands them in file names)")


@contextmanager
def program_lock(program_fd: int, wait: float = LOCK_WAIT) -> Iterator[None]:
    """The per-program lock (``<program>/.lock``, kernel flock, never through a symlink)."""
    fd = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=program_fd)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"the per-program lock was held for more than {wait:.0f} s") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


@dataclass
class Attempt:
    """An open, live attempt directory (close() releases it)."""

    root: str
    program: str
    name: str
    program_fd: int
    fd: int
    live_fd: int

    @property
    def path(self) -> str:
        return os.path.join(self.root, *program_parts(self.program), self.name)

    def close(self) -> None:
        for fd in (self.live_fd, self.fd, self.program_fd):
            os.close(fd)

    def write_file(self, name: str, data: bytes, mode: int = 0o600) -> None:
        """Write *name* atomically (temp file + rename) inside the attempt."""
        atomic.write(name, data, dir_fd=self.fd, mode=mode)

    def read(self, name: str, limit: int) -> bytes | None:
        """At most *limit* bytes of *name* inside the attempt (never through a symlink), or None."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            return fh.read(limit)

    def read_job_id(self) -> str | None:
        text = (self.read("job", 100) or b"").decode("ascii", "replace").strip()
        return text if JOB_ID_RE.match(text) else None


def _live_lock(attempt_fd: int, create: bool) -> int:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(retention.LIVE_LOCK, flags, 0o600, dir_fd=attempt_fd)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def create_attempt(root: str, program: str, name: str | None = None) -> Attempt:
    """Create a fresh attempt directory (0700) and hold it live."""
    check_root(root)
    if name is not None and not retention.ATTEMPT_RE.match(name):
        raise safedirs.UnsafePath(f"bad attempt name {name!r} (deploy.<yyyymmddTHHMMSSZ>.<hex>)")
    pfd = safedirs.open_chain(root, program_parts(program))
    with safedirs.closed_on_error(pfd), program_lock(pfd):
        if name is None:
            name = safedirs.create_fresh(pfd, "deploy")
        else:
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
            except FileExistsError:
                raise safedirs.UnsafePath(f"attempt {name} already exists; attempts are never reused") from None
        fd = os.open(name, safedirs.DIR_FLAGS, dir_fd=pfd)
        with safedirs.closed_on_error(fd):
            live = _live_lock(fd, create=True)
    return Attempt(root, program, name, pfd, fd, live)


def open_attempt(root: str, program: str, name: str) -> tuple[Attempt, bool, bool]:
    """Open an existing attempt for reconciliation: ``(attempt, fenced, original_alive)``.

    A missing attempt is created (``fenced``), so an agent whose start was
    delayed past the drop can no longer submit under that name.
    """
    check_root(root)
    if not retention.ATTEMPT_RE.match(name):
        raise safedirs.UnsafePath(f"bad attempt name {name!r}")
    pfd = safedirs.open_chain(root, program_parts(program))
    with safedirs.closed_on_error(pfd), program_lock(pfd):
        fenced = False
        try:
            os.mkdir(name, 0o700, dir_fd=pfd)
            fenced = True
        except FileExistsError:
            pass
        fd = os.open(name, safedirs.DIR_FLAGS, dir_fd=pfd)
        with safedirs.closed_on_error(fd):
            alive = not fenced and retention.is_live(pfd, name)
            try:
                live = _live_lock(fd, create=False)
            except FileNotFoundError:
                live = _live_lock(fd, create=True)
    return Attempt(root, program, name, pfd, fd, live), fenced, alive


def job_script() -> bytes:
    """The batch script: a fixed Python program (only the interpreter line varies)."""
    python = sys.executable
    if not python.startswith("/") or any(c.isspace() for c in python) or len(python) > 120:
        python = "/usr/bin/env python3"
    else:
        # isolated: no PYTHONPATH, no user site, no script directory on sys.path; and no site-packages at all
        # when the agent itself runs without (the single-file agent: core/agentjudge)
        python += " -IS" if sys.flags.no_site else " -I"
    # The job imports the secure-path and bounded-JSON rules from this same agent, wherever it lives (a pip
    # installation, a helper-lane release tree, or vq-admin-agent.pyz), not from whatever
    # the interpreter's site-packages may hold.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return f"#!{python}\nimport sys; sys.path.insert(0, {here!r})\n{JOB_SCRIPT}".encode()


@dataclass(frozen=True)
class Binding:
    """What the job must find before it runs the provider: argv.json's and the archive's SHA-256."""

    argv_sha256: str
    archive: str | None = None
    archive_sha256: str | None = None

    def job_args(self, attempt_path: str) -> list[str]:
        args = [f"{attempt_path}/argv.json", self.argv_sha256]
        if self.archive is not None and self.archive_sha256 is not None:
            args += [self.archive, self.archive_sha256]
        return args


def archive_digest(path: str) -> str:
    """SHA-256 of a staged archive, opened without following symlinks below a checked directory."""
    if not path.startswith("/") or not path.endswith("/source.tar") or "\n" in path:
        raise safedirs.UnsafePath(f"{path} is not a staged source.tar")
    directory = os.path.dirname(path)
    problem = securepath.path_problem(directory, what="the stage directory")
    if problem:
        raise safedirs.UnsafePath(problem)
    dfd = os.open(directory, safedirs.DIR_FLAGS)
    try:
        fd = os.open("source.tar", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        raise safedirs.UnsafePath(f"{path}: {exc.strerror}") from None
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise safedirs.UnsafePath(f"{path} is not a regular file of ours writable by nobody else")
        digest = hashlib.sha256()
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def bind(argv_json: bytes, archive: str | None, archive_sha256: str | None) -> Binding:
    """The binding for one submission; the archive must already hold what the driver staged."""
    if archive is None:
        return Binding(hashlib.sha256(argv_json).hexdigest())
    if not is_sha256(archive_sha256):
        raise ValueError("--archive needs --archive-sha256 (64 lower-case hex digits)")
    found = archive_digest(archive)
    if found != archive_sha256:
        raise safedirs.UnsafePath(f"{archive} has sha256 {found}, not the staged {archive_sha256}; "
                                  "it changed after it was verified (nothing was submitted)")
    return Binding(hashlib.sha256(argv_json).hexdigest(), archive, archive_sha256)


def sbatch_argv(attempt: Attempt, sbatch_args: Sequence[str], binding: Binding, job_name: str) -> list[str]:
    path = attempt.path
    return ["sbatch", "--parsable", "--wait", f"--job-name={job_name}", *sbatch_args,
            # Slurm opens these by path when the job starts, perhaps hours later: never a path below
            # the attempt (it could be another user's by then); the job opens its transcripts itself.
            "--output=/dev/null", "--error=/dev/null", f"{path}/job.py", *binding.job_args(path)]


def finish(attempt: Attempt, frames: FrameWriter, summary: Summary, *, settle_kw: SettleOptions | None = None,
           progress: bool = False) -> Summary:
    """Settle, apply retention, stream the transcripts: the common end of run and reconcile.

    A job that was never submitted wrote nothing: its files are observed
    once, not settled for ten seconds.
    """
    kw = SettleOptions(**(settle_kw or {}))
    if summary.get("submitted") is False:
        kw["max_observations"] = 1
    algorithm = checksum.default_algorithm()
    if progress:
        most = kw.get("max_observations", MAX_OBSERVATIONS)
        kw["on_observation"] = lambda k, history: frames.record("progress", settle_record(k, history, most))
    # through the attempt this agent created and holds open, never its path (which another user may
    # have redirected while the job waited)
    result: SettleResult = settle(DirectoryObserver(attempt.fd, algorithm), **kw)
    summary["settle"] = result.to_dict()
    with program_lock(attempt.program_fd):
        summary["retention"] = retention.prune(attempt.program_fd, attempt.name)
    frames.record("summary", summary)
    sent = {}
    for kind, name, state in (("out", "stdout", result.last[0]), ("err", "stderr", result.last[1])):
        limit = state.size if result.settled else None
        sent[name] = frames.stream_file(kind, attempt.fd, name, limit, algorithm)
        sent[name]["settled_digest"] = state.digest if result.settled else None
    frames.record("end", {"sent": sent})
    return summary


def base_summary(attempt: Attempt) -> Summary:
    return {
        "attempt": attempt.name, "attempt_dir": attempt.path, "program": attempt.program,
        "job_id": None, "submitted": None, "sbatch_exit_code": None, "exit_code": None,
        "job_state": None, "job_exit_code": None, "end_source": None, "established": False,
        "timed_out": False, "cancel": None, "reconciled": False, "fenced": False, "notes": [],
        "sbatch_stderr": "",
    }


def prepare(root: str, program: str, argv: Sequence[str], env: dict[str, str], frames: FrameWriter,
            attempt_name: str | None, archive: str | None, archive_sha256: str | None,
            ) -> tuple[Attempt, Binding, int, str]:
    """The start of ``alloc-run`` and ``detach-run``: check the inputs, bind the job to them (a changed
    archive is refused before anything is created), take the lease's work lock, create the attempt and
    write what the job runs there.  Returns ``(attempt, binding, work lock fd, lease path)``."""
    for key in env:
        if not ENV_NAME_RE.match(key):
            raise ValueError(f"bad environment variable name {key!r}")
    check_root(root)
    safedirs.check_scratch(root)
    spec = json.dumps({"argv": list(argv), "env": env}, sort_keys=True).encode()
    binding = bind(spec, archive, archive_sha256)
    work_fd, lease_path = lease.hold_work(program)
    with safedirs.closed_on_error(work_fd):
        attempt = create_attempt(root, program, attempt_name)
        try:
            frames.record("attempt", {"attempt": attempt.name, "attempt_dir": attempt.path})
            attempt.write_file("argv.json", spec)
            attempt.write_file("job.py", job_script(), 0o700)
        except BaseException:
            attempt.close()
            raise
    return attempt, binding, work_fd, lease_path


def run(root: str, program: str, argv: Sequence[str], env: dict[str, str], sbatch_args: Sequence[str],
        timeout: float, frames: FrameWriter, attempt_name: str | None = None, *,
        settle_kw: SettleOptions | None = None, archive: str | None = None, archive_sha256: str | None = None,
        progress: float | None = None) -> Summary:
    """Create the attempt, submit and wait (bounded), then :func:`finish`.

    With *progress* (seconds), ``progress`` records report the queue state
    and the transcript's last line during the wait, and each settle
    observation (see :mod:`.progress`).
    """
    # sbatch --wait keeps the lease's work lock until the job has ended
    attempt, binding, work_fd, lease_path = prepare(root, program, argv, env, frames, attempt_name, archive,
                                                  archive_sha256)
    sub: slurmjob.Submission | None = None
    name = JOB_NAME.format(program)
    try:
        summary = base_summary(attempt)
        reporter = Reporter(lambda payload: frames.record("progress", payload), attempt.fd, progress)

        def on_job_id(job_id: str, sbatch_pid: int) -> None:
            try:
                attempt.write_file("job", f"{job_id}\n".encode())
                lease.record_work(lease_path, {"kind": "job", "job_id": job_id, "attempt": attempt.path,
                                               "pid": sbatch_pid, "since": utc_now()})
            except OSError as exc:
                summary["notes"].append(f"could not write the job file: {exc.strerror or exc}")
            frames.record("job", {"job_id": job_id, "attempt_dir": attempt.path})
            reporter.start(job_id)

        with reporter:
            sub = slurmjob.submit_and_wait(sbatch_argv(attempt, sbatch_args, binding, name), timeout, on_job_id,
                                           pass_fds=(work_fd,))
        summary.update({"job_id": sub.job_id, "submitted": sub.submitted, "sbatch_exit_code": sub.sbatch_exit_code,
                        "timed_out": sub.timed_out, "cancel": sub.cancel, "sbatch_stderr": sub.stderr})
        if sub.error:
            summary["notes"].append(sub.error)
        job_id = sub.job_id  # not None exactly when sub.submitted
        if sub.timed_out:
            summary["notes"].append(f"the job did not finish within {timeout:g} s; "
                                    + sub.cancelled("vq-admin cancelled it"))
            if job_id:  # its final state, for the receipt (bounded: a few seconds)
                search = slurmjob.wait_for_end(job_id, name, CANCEL_STATE_WAIT, poll=1.0)
                if search.end is not None:
                    summary.update({"job_state": search.end.state, "job_exit_code": search.end.raw_exit})
                else:
                    summary["job_state"] = search.last_state
        elif job_id is not None:  # then sbatch's exit code is known
            summary.update({"exit_code": sub.sbatch_exit_code, "established": True, "end_source": "sbatch"})
            how, fields = slurmjob.scontrol_state(job_id, timeout=20.0)  # evidence only; never waited on long
            if how == "known":
                summary.update({"job_state": fields.get("JobState"), "job_exit_code": fields.get("ExitCode"),
                                "never_started": slurmjob.never_started(fields)})
            elif sub.sbatch_exit_code != 0:  # cancelled or killed? the driver reads back before deciding
                end, _, _ = slurmjob.find_end(job_id, name, [])
                if end is not None:
                    summary.update({"job_state": end.state, "job_exit_code": end.raw_exit})
        return finish(attempt, frames, summary, settle_kw=settle_kw, progress=bool(progress))
    finally:
        if sub is not None:  # sbatch has ended (or was ended at the bound): so has the job's hold
            lease.end_work(work_fd, lease_path)
        else:  # sbatch (if it started) keeps the lock and its record until the job ends
            os.close(work_fd)
        attempt.close()


def end_fenced(frames: FrameWriter, summary: Summary, start: str) -> Summary:
    """A reconcile's answer for an attempt it had to create (fenced): nothing ran, nothing to settle.

    *start* is what a delayed agent can no longer do under the attempt's name ("submit", "start a build")."""
    summary["notes"].append("the attempt directory did not exist; it was created now so that a delayed "
                            f"agent cannot {start} under this name")
    frames.record("summary", summary)
    frames.record("end", {"sent": {}})
    return summary


def reconcile(root: str, program: str, attempt_name: str, timeout: float, frames: FrameWriter) -> Summary:
    """Establish the end of the attempt's recorded job without resubmitting, then :func:`finish`."""
    attempt, fenced, alive = open_attempt(root, program, attempt_name)
    try:
        frames.record("attempt", {"attempt": attempt.name, "attempt_dir": attempt.path})
        summary = base_summary(attempt)
        summary.update({"reconciled": True, "fenced": fenced})
        if fenced:
            return end_fenced(frames, summary, "submit")
        deadline = time.monotonic() + timeout
        id_deadline = min(deadline, time.monotonic() + JOB_ID_WAIT)
        job_id = attempt.read_job_id()
        while job_id is None and alive and time.monotonic() < id_deadline:
            time.sleep(0.5)  # the original agent is alive and may still record the id
            job_id = attempt.read_job_id()
        summary["job_id"] = job_id
        if job_id is None:
            summary["notes"].append("no job id was recorded in the attempt; the job's end cannot be established")
        else:
            summary["submitted"] = True
            frames.record("job", {"job_id": job_id, "attempt_dir": attempt.path})
            search = slurmjob.wait_for_end(job_id, JOB_NAME.format(program), max(0.0, deadline - time.monotonic()))
            summary["notes"].extend(search.notes)
            summary["job_state"] = search.last_state
            if search.end is not None:
                end = search.end
                summary.update({"job_state": end.state, "job_exit_code": end.raw_exit, "exit_code": end.exit_code,
                                "end_source": end.source, "established": True})
        return finish(attempt, frames, summary)
    finally:
        attempt.close()
