"""The driver <-> agent protocol: every verb's name, flags, argv builder and answer parser.

Both sides read this one module, so they cannot drift: the agent's argparse
tree (:mod:`.cli`) takes its verb and flag names from here, and the driver
builds every agent argv with the builders below and reads every answer with
the parsers below; each answer and request is one ``TypedDict`` declared here
(annotations only), which the agent builds and the driver's parser returns.
No module of the driver spells an agent verb or flag itself
(``tests/test_agent_protocol.py`` scans for one and round-trips every verb of
:data:`VERBS` against the real agent).

A builder takes the agent's words (the configured ``hosts.<name>.agent``, as
the driver invokes it) and typed keyword arguments, and returns the argv; a
placeholder such as ``<stage>`` may stand for a value the plan fills in at
run time.  A parser takes the agent's stdout and returns its JSON object once
the members the driver relies on have their types (:data:`SHAPES`), or raises
:class:`ProtocolError`, whose message names the verb.

``alloc-run``, ``alloc-reconcile``, ``detach-run`` and ``detach-reconcile``
answer with framed records (:mod:`.frames`), read as a stream by the driver.

Every JSON text on both sides goes through :func:`encode` and :func:`decode`
(:func:`encode_request` for the ``session`` request): ``json.dumps(...,
sort_keys=True)`` and the bounded parser :func:`.bounds.loads_json`, imported when first used.

Standard library only, Python 3.8 syntax at run time, and cheap to import
(no ``typing``, ``json`` or ``re`` at run time): :mod:`.entry` dispatches the
agent's fast verbs by the names below.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: each document of the protocol, one TypedDict (both sides read these)
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypedDict, Union

    Words = Sequence[str]
    Output = Union[bytes, str]

    class Hashed(TypedDict, total=False):
        """``hash-file`` (and ``verify-readback``'s ``readback``): ``sha256`` only of a trusted regular file."""

        path: str
        exists: bool
        regular: bool
        untrusted: str
        error: Optional[str]
        is_symlink: bool
        realpath: str
        size: int
        executable: bool
        sha256: str

    class Refused(TypedDict):
        path: str
        problem: str

    class CheckedPaths(TypedDict):
        checked: List[str]
        refused: List[Refused]

    class VerifyRun(TypedDict, total=False):
        """The verify's end (``exit_code`` null when it ran into ``timed_out``, its bound) and output."""

        exit_code: Optional[int]
        stdout: str
        stdout_truncated: bool
        stderr: str
        seconds: float
        timed_out: float

    class VerifyReadback(TypedDict, total=False):
        """``verify-readback`` (and the ``session`` member ``verify``; only ``error`` for a bad request)."""

        verify: VerifyRun
        readback: Optional[Hashed]
        readback_exit: Optional[int]
        readback_seconds: Optional[float]
        lease: LeaseAnswer
        record: RecordRead
        error: str

    class StageCreated(TypedDict):
        stage: str

    class StageReceived(TypedDict):
        stage: str
        bytes: int

    class StageVerdict(TypedDict, total=False):
        stage: str
        verified: bool
        mismatches: List[str]
        computed: Dict[str, str]

    class StageReclaimed(TypedDict):
        removed: List[str]
        abandoned: List[str]

    class Identity(TypedDict):
        version: str
        source_sha: Optional[str]
        tree_sha256: str
        record: str
        record_tree_sha256: Optional[str]
        scope: str
        path: str
        package: str
        interpreter: str
        python_version: str
        problems: List[str]

    class Sinfo(TypedDict, total=False):
        argv: List[str]
        exit_code: Optional[int]
        states: Dict[str, int]
        error: Optional[str]

    class VersionAnswer(TypedDict, total=False):
        """``version``: ``sinfo`` only when asked, ``scratch`` for each ``--root``."""

        version: str
        python_version: str
        interpreter: str
        checksum: str
        sinfo: Sinfo
        scratch: List[Dict[str, Optional[str]]]  # each --root: {"root", "problem"}

    class Installed(TypedDict, total=False):
        """``install-file``: the file installed, its old and new SHA-256 and mode, who installed it."""

        dest: str
        changed: bool
        old_sha256: Optional[str]
        new_sha256: str
        old_mode: Optional[str]
        mode: str
        bytes: int
        interpreter: Optional[Dict[str, object]]
        old_interpreter: Optional[Dict[str, object]]
        user: str
        uid: int
        hostname: str
        at: str

    class LockHolder(TypedDict, total=False):
        pid: int
        command: Optional[str]
        started: Optional[str]

    class Holder(TypedDict, total=False):
        """What holds a lease, as its ``.holder`` record says: a session (the driver's words, then
        ``agent_*``: the agent's own), or what holds its work lock (``kind`` ``build``, ``job`` or
        ``confirm``, with the ``session`` that started it); a record that is missing is
        ``lock_holders`` (``/proc/locks``) and ``settled``."""

        host: str
        driver_host: str
        user: str
        pid: int
        since: str
        run_id: str
        agent_pid: int
        agent_ppid: int
        agent_host: str
        kind: str
        job_id: Optional[str]
        attempt: str
        supervisor_pid: int
        session: Holder
        lock_holders: List[LockHolder]
        settled: float

    class LeaseRequest(TypedDict, total=False):
        lane: str
        host: str
        program: Optional[str]
        holder: Holder

    class ShellProbe(TypedDict, total=False):
        argv: bool
        expected: str

    class RecordRequest(TypedDict, total=False):
        program: Optional[str]
        after: int

    class VerifyRequest(TypedDict, total=False):
        argv: List[str]
        env: Dict[str, str]
        timeout: float

    class SessionRequest(TypedDict, total=False):
        """The ``session`` request line (:mod:`vq_admin.agent.session`); the agent checks each part it reads."""

        protocol: int
        shell_probe: ShellProbe
        lease: LeaseRequest
        check_paths: List[str]
        identity: bool
        record: RecordRequest
        verify: VerifyRequest

    class LeaseAnswer(TypedDict, total=False):
        """``lease`` (and the ``session`` member ``lease``, and ``verify-readback --lease-of``'s ``lease``):
        held, or what holds it and why (``exit``: the status the ``lease`` verb ends with)."""

        held: bool
        exit: int
        lock: str
        holder: Holder
        message: str
        error: str
        record: RecordRead

    class ShellAnswer(TypedDict, total=False):
        """The ``session`` member ``shell``: the login shell's probe words, judged."""

        shell: str
        posix: bool
        via: str
        error: str
        exit_code: int
        stdout: str
        stderr: str

    class SessionAnswer(TypedDict, total=False):
        protocol: int
        shell: ShellAnswer
        lease: LeaseAnswer
        check_paths: CheckedPaths
        identity: Identity
        identity_error: str
        verify: VerifyReadback
        record: RecordRead
        released: str

    class CensusCost(TypedDict, total=False):
        jobs_listed: int
        scripts_read: int
        scripts_cached: int
        cache_rejected: int
        cache_problem: Optional[str]
        scheduler_calls: int
        seconds: float

    class CensusJob(TypedDict):
        id: str
        display: str
        state: str
        user: str

    class CensusGroup(TypedDict):
        words: List[str]
        jobs: List[CensusJob]

    class CensusAnswer(TypedDict):
        """``census``: ``jobs_scanned`` and ``groups`` null (and ``error``) when it failed."""

        complete: bool
        error: Optional[str]
        jobs_scanned: Optional[int]
        cost: CensusCost
        groups: Optional[List[CensusGroup]]

    class RecordEntry(TypedDict, total=False):
        """One entry of the host's record: ``error`` instead of text that is not UTF-8 or too large."""

        seq: int
        name: str
        statement: Optional[str]
        sig: Optional[str]
        error: str

    class RecordRead(TypedDict, total=False):
        entries: List[RecordEntry]
        last: int
        more: bool
        error: str

    class Records(TypedDict):
        """``record-read``: each program's :class:`RecordRead` (:data:`HELPER_RECORD`: the helper lane)."""

        records: Dict[str, RecordRead]

    class Appended(TypedDict):
        seq: int
        name: str
        dir: str

    class AppendAnswer(TypedDict, total=False):
        """The answer to one ``{"append": ...}`` line, and ``record-quarantine``'s (with ``record``)."""

        appended: Appended
        append_error: str
        record: RecordRead

    class Revert(TypedDict, total=False):
        """The revert run when the job did not pass (``error`` when it could not run or end)."""

        argv: List[str]
        exit_code: Optional[int]
        error: str
        stdout: str
        stderr: str

    class Verdict(TypedDict, total=False):
        """The ``confirm`` file the supervisor writes (and the ``summary`` record's ``confirm``): Slurm's word on
        the job's end, the metrics judged against the baseline, and the revert."""

        job_id: Optional[str]
        state: Optional[str]
        exit_code: Optional[int]
        job_exit_code: Optional[str]
        node: Optional[str]
        seconds: float
        timed_out: bool
        cancel: Optional[Dict[str, object]]
        submitted: bool
        sbatch_stderr: str
        metrics: Dict[str, str]
        regressed: List[str]
        accepted: bool
        problems: List[str]
        passed: bool
        revert: Optional[Revert]
        ended: str

# -- verbs ------------------------------------------------------------------------------

HASH_FILE = "hash-file"
CHECK_PATHS = "check-paths"
VERIFY_READBACK = "verify-readback"
STAGE_CREATE = "stage-create"
STAGE_RECEIVE = "stage-receive"
STAGE_VERIFY = "stage-verify"
STAGE_RECLAIM = "stage-reclaim"
IDENTITY = "identity"
VERSION = "version"
INSTALL_FILE = "install-file"
ALLOC_RUN = "alloc-run"
ALLOC_RECONCILE = "alloc-reconcile"
DETACH_RUN = "detach-run"
DETACH_RECONCILE = "detach-reconcile"
LEASE = "lease"
SESSION = "session"
CENSUS = "census"
CONFIRM_RUN = "confirm-run"
CONFIRM_RECONCILE = "confirm-reconcile"
RECORD = "record-read"
RECORD_QUARANTINE = "record-quarantine"
#: The version of the ``session`` exchange both sides speak (request and answer member ``protocol``); a
#: driver and an agent of different versions do nothing together but say so (exit 77 with the update).
SESSION_PROTOCOL = 1

#: Every verb of the agent, in the order of its verb table.
VERBS = (HASH_FILE, CHECK_PATHS, VERIFY_READBACK, STAGE_CREATE, STAGE_RECEIVE, STAGE_VERIFY, STAGE_RECLAIM,
         IDENTITY, VERSION, INSTALL_FILE, ALLOC_RUN, ALLOC_RECONCILE, DETACH_RUN, DETACH_RECONCILE, LEASE, SESSION,
         CENSUS, CONFIRM_RUN, CONFIRM_RECONCILE, RECORD, RECORD_QUARANTINE)
#: The verbs whose answer is a framed stream (:mod:`.frames`), not one JSON object.
FRAMED_VERBS = (ALLOC_RUN, ALLOC_RECONCILE, DETACH_RUN, DETACH_RECONCILE, CONFIRM_RUN, CONFIRM_RECONCILE)

# -- flags ------------------------------------------------------------------------------

END = "--"  # the end of the agent's options: a command's words follow
ROOT = "--root"
KIND = "--kind"
NAME = "--name"
SHA = "--sha"
ARCHIVE_SHA256 = "--archive-sha256"
TREE_SHA256 = "--tree-sha256"
GIT_TREE = "--git-tree"
STAGE = "--stage"
OUTCOME = "--outcome"
KEEP_FAILED = "--keep-failed"
JSON = "--json"
SINFO = "--sinfo"
DEST = "--dest"
MODE = "--mode"
PROGRAM = "--program"
ATTEMPT = "--attempt"
TIMEOUT = "--timeout"
SBATCH_ARG = "--sbatch-arg"
ENV = "--env"
ARCHIVE = "--archive"
PROGRESS = "--progress"
LANE = "--lane"
HOST = "--host"
DRIVER_HOST = "--driver-host"
USER = "--user"
PID = "--pid"
SINCE = "--since"
RUN_ID = "--run-id"
LEASE_OF = "--lease-of"
PROBE = "--probe"
METRIC = "--metric"
BASELINE = "--baseline"
ACCEPT_REGRESSION = "--accept-regression"
REVERT = "--revert"
RECORD_AFTER = "--record-after"

#: Every option of every verb (``--`` aside).
FLAGS = (ROOT, KIND, NAME, SHA, ARCHIVE_SHA256, TREE_SHA256, GIT_TREE, STAGE, OUTCOME, KEEP_FAILED, JSON, SINFO,
         DEST, MODE, PROGRAM, ATTEMPT, TIMEOUT, SBATCH_ARG, ENV, ARCHIVE, PROGRESS, LANE, HOST, DRIVER_HOST, USER,
         PID, SINCE, RUN_ID, PROBE, LEASE_OF, METRIC, BASELINE, ACCEPT_REGRESSION, REVERT, RECORD_AFTER)

#: ``stage-reclaim --outcome`` values.
OUTCOME_SUCCESS, OUTCOME_FAILED = "success", "failed"
OUTCOMES = (OUTCOME_SUCCESS, OUTCOME_FAILED)
#: ``stage-reclaim --keep-failed`` default.
KEEP_FAILED_DEFAULT = 3
#: ``install-file --mode`` default.
MODE_DEFAULT = "0755"


class ProtocolError(ValueError):
    """An agent answer that is not what its verb answers; the message names the verb."""

    def __init__(self, verb: str, problem: str) -> None:
        super().__init__(f"the agent's {verb} answer {problem}")
        self.verb = verb
        self.problem = problem


# -- the JSON codec (both sides) --------------------------------------------------------

#: Largest answer or request decoded (a verify's stdout is at most 4 MiB, escaped).
DECODE_LIMIT = 64 << 20


def decode(text: str) -> Any:
    """The value of JSON *text*, bounded (:func:`.bounds.loads_json`: NaN passes), or a ``ValueError``."""
    from .bounds import loads_json

    return loads_json(text, "the answer", limit=DECODE_LIMIT, nan=True)


def encode(answer: Mapping[str, object]) -> str:
    """One answer (or record) as the agent prints it: one JSON object line, keys sorted
    (``json.dumps(answer, sort_keys=True)`` and a newline)."""
    import json

    return json.dumps(answer, sort_keys=True) + "\n"


def encode_request(request: Mapping[str, object]) -> bytes:
    """A ``session`` request as the driver writes it on the agent's stdin: one JSON object line."""
    return encode(request).encode()


def lacks_verb(verb: str, exit_code: Optional[int], stdout: bytes, stderr: Output) -> bool:
    """True when an older agent's verb table refused *verb* (argparse's usage error, nothing answered)."""
    from .exits import EXIT_USAGE

    err = stderr.encode("utf-8", "replace") if isinstance(stderr, str) else stderr
    return exit_code == EXIT_USAGE and not stdout.strip() and b"invalid choice" in err and verb.encode() in err


# -- builders (the driver's side) -------------------------------------------------------

def _root(root: Optional[str]) -> List[str]:
    return [ROOT, root] if root else []


def _identity_words(sha: str, archive_sha256: str, tree_sha256: str, git_tree: str) -> List[str]:
    return [SHA, sha, ARCHIVE_SHA256, archive_sha256, TREE_SHA256, tree_sha256, GIT_TREE, git_tree]


def hash_file(agent: Words, path: str) -> List[str]:
    """``hash-file PATH``: SHA-256 and facts of one file (following symlinks)."""
    return [*agent, HASH_FILE, path]


def check_paths(agent: Words, paths: Sequence[str]) -> List[str]:
    """``check-paths -- PATH...``: the secure-path rule on each path (exit 4 when one fails)."""
    return [*agent, CHECK_PATHS, END, *paths]


def verify_readback(agent: Words, command: Sequence[str], lease_of: Optional[str] = None,
                    record_after: Optional[int] = None) -> List[str]:
    """``verify-readback [--lease-of PROGRAM [--record-after N]] -- COMMAND...``: the read-only verify, then
    its launcher read back (and, with *lease_of*, who holds that program's runtime lease now, read without
    taking it; with *record_after* too, the host's record of that program after entry N)."""
    after = [RECORD_AFTER, str(record_after)] if lease_of and record_after is not None else []
    return [*agent, VERIFY_READBACK, *([LEASE_OF, lease_of] if lease_of else []), *after, END, *command]


def command_words(argv: Sequence[str], agent: Words) -> List[str]:
    """The words after ``--`` in a :func:`verify_readback` or :func:`check_paths` argv built on *agent*."""
    return list(argv[list(argv).index(END, len(agent)) + 1:])


def stage_create(agent: Words, *, root: Optional[str], kind: str, name: str, sha: str, archive_sha256: str,
                 tree_sha256: str, git_tree: str) -> List[str]:
    """``stage-create``: a fresh stage under *root* (default: the home directory) with its identity files."""
    return [*agent, STAGE_CREATE, *_root(root), KIND, kind, NAME, name,
            *_identity_words(sha, archive_sha256, tree_sha256, git_tree)]


def stage_receive(agent: Words, *, stage: str) -> List[str]:
    """``stage-receive``: the archive on stdin written into *stage*."""
    return [*agent, STAGE_RECEIVE, STAGE, stage]


def stage_verify(agent: Words, *, stage: str, sha: str, archive_sha256: str, tree_sha256: str,
                 git_tree: str) -> List[str]:
    """``stage-verify``: the staged archive's identity proven (exit 3 on a mismatch)."""
    return [*agent, STAGE_VERIFY, STAGE, stage, *_identity_words(sha, archive_sha256, tree_sha256, git_tree)]


def stage_reclaim(agent: Words, *, root: Optional[str], kind: str, name: str, stage: str, outcome: str,
                  keep_failed: int = KEEP_FAILED_DEFAULT) -> List[str]:
    """``stage-reclaim``: remove a succeeded stage or cap failed ones (*outcome*: one of :data:`OUTCOMES`,
    or a placeholder the plan fills)."""
    return [*agent, STAGE_RECLAIM, *_root(root), KIND, kind, NAME, name, STAGE, stage, OUTCOME, outcome,
            KEEP_FAILED, str(keep_failed)]


def identity(agent: Words) -> List[str]:
    """``identity --json``: the running helper's identity, as one JSON object."""
    return [*agent, IDENTITY, JSON]


def version(agent: Words, *, sinfo: bool = False, roots: Sequence[str] = ()) -> List[str]:
    """``version [--sinfo] [--root ROOT]...``: cheap liveness answer (and the node states when *sinfo*, and
    each scratch root as a run would find it, member ``scratch``: ``[{"root", "problem"}]``)."""
    words = [*agent, VERSION, *([SINFO] if sinfo else [])]
    for root in roots:
        words += [ROOT, root]
    return words


def install_file(agent: Words, *, dest: str, mode: str) -> List[str]:
    """``install-file``: replace *dest* atomically with stdin (*mode* octal text)."""
    return [*agent, INSTALL_FILE, DEST, dest, MODE, mode]


def _job_words(root: str, program: str, attempt: str, timeout: str) -> List[str]:
    return [ROOT, root, PROGRAM, program, ATTEMPT, attempt, TIMEOUT, timeout]


def _archive_env_command(archive: str, archive_sha256: str, env: Sequence[Tuple[str, str]],
                         command: Sequence[str]) -> List[str]:
    argv = [ARCHIVE, archive, ARCHIVE_SHA256, archive_sha256]
    for name, value in env:
        argv += [ENV, f"{name}={value}"]
    return [*argv, END, *command]


def progress_option(seconds: Optional[str]) -> List[str]:
    """The words of ``alloc-run``/``detach-run`` that ask for a state record every *seconds*
    (none for ``None``): what fills the driver plan's progress slot."""
    return [] if seconds is None else [PROGRESS, seconds]


def alloc_run(agent: Words, *, root: str, program: str, attempt: str, timeout: str,
              sbatch_args: Sequence[str], archive: str, archive_sha256: str, env: Sequence[Tuple[str, str]],
              command: Sequence[str], progress_words: Sequence[str] = ()) -> List[str]:
    """``alloc-run``: the provider *command* as a Slurm batch job in a fresh attempt directory (framed answer).

    *progress_words* are :func:`progress_option`'s words, or the one word of the driver's plan
    that stands for them."""
    argv = [*agent, ALLOC_RUN, *_job_words(root, program, attempt, timeout), *progress_words]
    argv += [f"{SBATCH_ARG}={arg}" for arg in sbatch_args]
    return argv + _archive_env_command(archive, archive_sha256, env, command)


def detach_run(agent: Words, *, root: str, program: str, attempt: str, timeout: str,
               archive: str, archive_sha256: str, env: Sequence[Tuple[str, str]],
               command: Sequence[str], progress_words: Sequence[str] = ()) -> List[str]:
    """``detach-run``: the provider *command* on this host, detached from the connection (framed answer);
    *progress_words* as for :func:`alloc_run`."""
    argv = [*agent, DETACH_RUN, *_job_words(root, program, attempt, timeout), *progress_words]
    return argv + _archive_env_command(archive, archive_sha256, env, command)


def reconcile(agent: Words, *, detached: bool, root: str, program: str, attempt: str, timeout: str) -> List[str]:
    """``detach-reconcile`` when *detached* (the end of an attempt's detached build, never starting one), else
    ``alloc-reconcile`` (the end of its recorded batch job, never submitting); framed answer."""
    return [*agent, DETACH_RECONCILE if detached else ALLOC_RECONCILE, *_job_words(root, program, attempt, timeout)]


def confirm_run(agent: Words, *, root: str, program: str, attempt: str, timeout: str, sbatch_args: Sequence[str],
                metrics: Sequence[str], baseline: Sequence[Tuple[str, str]], accept_regression: bool,
                revert: Sequence[str], command: Sequence[str], progress_words: Sequence[str] = ()) -> List[str]:
    """``confirm-run``: the confirmation *command* as a Slurm batch job, judged and (failing, with *revert*)
    reverted by a supervisor that outlives the connection (framed answer).  *metrics* are
    ``NAME=BETTER:TOLERANCE``; *revert* the argv run on this host when the job does not pass."""
    argv = [*agent, CONFIRM_RUN, *_job_words(root, program, attempt, timeout), *progress_words]
    argv += [f"{SBATCH_ARG}={arg}" for arg in sbatch_args]
    argv += [f"{METRIC}={spec}" for spec in metrics]
    argv += [f"{BASELINE}={name}={value}" for name, value in baseline]
    argv += [ACCEPT_REGRESSION] if accept_regression else []
    argv += [f"{REVERT}={word}" for word in revert]
    return [*argv, END, *command]


def confirm_reconcile(agent: Words, *, root: str, program: str, attempt: str, timeout: str) -> List[str]:
    """``confirm-reconcile``: the verdict of an attempt's confirmation (never submits or reverts; framed answer)."""
    return [*agent, CONFIRM_RECONCILE, *_job_words(root, program, attempt, timeout)]


def lease(agent: Words, *, lane: str, host: str, program: Optional[str], driver_host: str,
          user: str, pid: int, since: str, run_id: str, record_after: Optional[int] = None) -> List[str]:
    """``lease``: hold the host-side lease of one lane until stdin closes (exit 75 when held elsewhere);
    with *record_after*, its answer also carries the host's record after that entry (member ``record``)."""
    argv = [*agent, LEASE, LANE, lane, HOST, host]
    if program:
        argv += [PROGRAM, program]
    argv += [RECORD_AFTER, str(record_after)] if record_after is not None else []
    return argv + [DRIVER_HOST, driver_host, USER, user, PID, str(pid), SINCE, since, RUN_ID, run_id]


#: The word that stands for the helper lane's record in ``record-read``'s ``NAME=N`` words.
HELPER_RECORD = "_helper"


def record(agent: Words, cursors: Dict[Optional[str], int]) -> List[str]:
    """``record-read``: the entries of the host's record of each program (``None``: the helper lane) after
    its cursor, as ``NAME=N`` words; answer ``{"records": {NAME: {"entries", "last", "more"}}}``."""
    return [*agent, RECORD, *(f"{program or HELPER_RECORD}={after}" for program, after in cursors.items())]


#: The ``predicateType`` of a quarantine or lift entry (the one ``record-quarantine`` appends).
QUARANTINE_PREDICATE = "urn:vq-admin:record:quarantine:v1"


def record_quarantine(agent: Words, *, program: str, record_after: int) -> List[str]:
    """``record-quarantine``: append one quarantine or lift entry of *program* under the record's own lock (no
    lease; the line ``{"append": {"statement", "sig"}}`` on stdin); answer ``appended`` (or ``append_error``,
    exit 1) and ``record``, the entries after *record_after*."""
    return [*agent, RECORD_QUARANTINE, PROGRAM, program, RECORD_AFTER, str(record_after)]


def session(agent: Words) -> List[str]:
    """``session``: a run's first call (its request follows on stdin, see :func:`encode_request`)."""
    return [*agent, SESSION]


def session_probe(words: Sequence[str]) -> List[str]:
    """The words that carry the login-shell probe on a ``session`` command line."""
    return [PROBE, *words]


def census(agent: Words) -> List[str]:
    """``census``: every queued or running job's words that name a full SHA, read with one listing and
    a stored script only for a job not seen before (exit 1 when the queue could not be read completely)."""
    return [*agent, CENSUS]


def agent_words(argv: Sequence[str], verb: str) -> List[str]:
    """The agent's own words in front of *verb* in an argv built here."""
    return list(argv[:list(argv).index(verb)])


# -- parsers (the driver's side) --------------------------------------------------------

def _object(verb: str, stdout: Output) -> Any:
    try:
        text = stdout.decode("utf-8") if isinstance(stdout, bytes) else stdout
        value = decode(text)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(verb, "is not JSON") from None
    if not isinstance(value, dict):
        raise ProtocolError(verb, "is not an object")
    return value


#: The members of each verb's answer the driver relies on, ``(member, type, required)``: a required member
#: missing, or any of them present (not null) with another type, is a :class:`ProtocolError`, so the
#: answer a parser returns holds what its type says.  The answer's ``TypedDict`` states each member's type
#: too, but exists only for the type checker (the agent's start imports no ``typing``);
#: ``tests/test_agent_protocol.py`` checks that the two say the same.
SHAPES: Dict[str, Tuple[Tuple[str, type, bool], ...]] = {
    HASH_FILE: (("path", str, False), ("exists", bool, False), ("sha256", str, False), ("error", str, False)),
    CHECK_PATHS: (("checked", list, True), ("refused", list, True)),
    VERIFY_READBACK: (("readback", dict, False), ("readback_exit", int, False), ("readback_seconds", float, False),
                      ("lease", dict, False), ("record", dict, False)),
    STAGE_RECEIVE: (("stage", str, True), ("bytes", int, True)),
    STAGE_VERIFY: (("stage", str, False), ("verified", bool, False), ("mismatches", list, False)),
    STAGE_RECLAIM: (("removed", list, True), ("abandoned", list, True)),
    IDENTITY: (("version", str, True), ("tree_sha256", str, False)),
    VERSION: (("version", str, True), ("sinfo", dict, False)),
    INSTALL_FILE: (("dest", str, False), ("changed", bool, False), ("new_sha256", str, False),
                   ("old_sha256", str, False)),
    LEASE: (("held", bool, False), ("lock", str, False), ("holder", dict, False), ("record", dict, False)),
    SESSION: (("lease", dict, False), ("check_paths", dict, False), ("verify", dict, False),
              ("record", dict, False)),
    CENSUS: (("complete", bool, False), ("error", str, False), ("cost", dict, True)),
    RECORD: (("records", dict, True),),
    RECORD_QUARANTINE: (("appended", dict, False), ("append_error", str, False), ("record", dict, False)),
}


def _checked(verb: str, data: Any) -> Any:
    """*data* once each member of :data:`SHAPES` is what its verb answers (else :class:`ProtocolError`)."""
    for key, kind, required in SHAPES.get(verb, ()):
        value = data.get(key)
        if value is None and not required:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ProtocolError(verb, f"has no valid {key!r}")
    return data


def _parse(verb: str, stdout: Output) -> Any:
    return _checked(verb, _object(verb, stdout))


def _parser(verb: str) -> Callable[[Output], Any]:
    """The parser of an answer that holds what :data:`SHAPES` says of *verb* and nothing more to check."""
    def parse(stdout: Output) -> Any:
        return _parse(verb, stdout)

    return parse


#: The parsers of the answers :data:`SHAPES` checks whole.
parse_hash_file: Callable[[Output], Hashed] = _parser(HASH_FILE)
parse_check_paths: Callable[[Output], CheckedPaths] = _parser(CHECK_PATHS)
parse_stage_receive: Callable[[Output], StageReceived] = _parser(STAGE_RECEIVE)
parse_stage_verify: Callable[[Output], StageVerdict] = _parser(STAGE_VERIFY)
parse_stage_reclaim: Callable[[Output], StageReclaimed] = _parser(STAGE_RECLAIM)
parse_identity: Callable[[Output], Identity] = _parser(IDENTITY)
parse_version: Callable[[Output], VersionAnswer] = _parser(VERSION)
parse_install_file: Callable[[Output], Installed] = _parser(INSTALL_FILE)
parse_census: Callable[[Output], CensusAnswer] = _parser(CENSUS)
parse_record: Callable[[Output], Records] = _parser(RECORD)
parse_record_quarantine: Callable[[Output], AppendAnswer] = _parser(RECORD_QUARANTINE)


def parse_verify_readback(stdout: Output) -> VerifyReadback:
    """``verify-readback``: the verify's exit status and output (the verify's own bytes:
    :func:`verify_output`), and the launcher's ``hash-file`` answer."""
    answer = _parse(VERIFY_READBACK, stdout)
    verify = answer.get("verify")
    if not (isinstance(verify, dict) and isinstance(verify.get("exit_code"), int)
            and isinstance(verify.get("stdout"), str) and isinstance(verify.get("stderr", ""), str)):
        raise ProtocolError(VERIFY_READBACK, "is not a verify-readback object")
    try:
        verify_output(answer)
    except UnicodeEncodeError:
        raise ProtocolError(VERIFY_READBACK, "holds text that is not the verify's output") from None
    return answer  # type: ignore[no-any-return]


def verify_output(answer: VerifyReadback) -> bytes:
    """The verify's own stdout bytes, as the agent passed them (``surrogateescape``)."""
    return answer["verify"]["stdout"].encode("utf-8", "surrogateescape")


def parse_stage_create(stdout: Output) -> StageCreated:
    """``stage-create``: the new stage's absolute path."""
    answer = _parse(STAGE_CREATE, stdout)
    if not isinstance(answer.get("stage"), str) or not answer["stage"].startswith("/"):
        raise ProtocolError(STAGE_CREATE, "names no stage directory")
    return answer  # type: ignore[no-any-return]


def parse_lease(stdout: Output) -> LeaseAnswer:
    """The first line of a ``lease`` answer (the agent then holds the lease until stdin closes): held, or
    who holds it."""
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    return _parse(LEASE, text.split("\n", 1)[0])  # type: ignore[no-any-return]


def parse_session(stdout: Output) -> SessionAnswer:
    """The session's answer lines (the lease's, then the later parts') as one answer: its ``protocol`` and one
    member per part done (``shell``, ``lease``, ``check_paths``, ``identity``, ``verify``, ``record``)."""
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    first, _, rest = text.partition("\n")
    data = _object(SESSION, first)
    if rest.strip():
        data.update(_object(SESSION, rest.split("\n", 1)[0]))
    lease = _checked(SESSION, data).get("lease")
    if lease is not None:
        _checked(LEASE, lease)
    return data  # type: ignore[no-any-return]


#: Each verb's parser (the round-trip test reads this table).
PARSERS: Dict[str, Callable[[Output], Mapping[str, object]]] = {
    HASH_FILE: parse_hash_file, CHECK_PATHS: parse_check_paths, VERIFY_READBACK: parse_verify_readback,
    STAGE_CREATE: parse_stage_create, STAGE_RECEIVE: parse_stage_receive, STAGE_VERIFY: parse_stage_verify,
    STAGE_RECLAIM: parse_stage_reclaim, IDENTITY: parse_identity, VERSION: parse_version,
    INSTALL_FILE: parse_install_file, LEASE: parse_lease, SESSION: parse_session, CENSUS: parse_census,
    RECORD: parse_record, RECORD_QUARANTINE: parse_record_quarantine,
}
