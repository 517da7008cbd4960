"""The driver <-> agent protocol: every verb's name, flags, argv builder and answer parser.

Both sides read this one module, so they cannot drift: the agent's argparse
tree (:mod:`.cli`) takes its verb and flag names from here, and the driver
builds every agent argv with the builders below and reads every answer with
the parsers below.  No module of the driver spells an agent verb or flag
itself (``tests/test_agent_protocol.py`` scans for one and round-trips every
verb of :data:`VERBS` against the real agent).

A builder takes the agent's words (the configured ``hosts.<name>.agent``, as
the driver invokes it) and typed keyword arguments, and returns the argv; a
placeholder such as ``<stage>`` may stand for a value the plan fills in at
run time.  A parser takes the agent's stdout and returns a small record
(the typed members the driver reads, plus ``data``: the whole JSON object),
or raises :class:`ProtocolError`, whose message names the verb.

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
if TYPE_CHECKING:  # annotations only
    from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, Union

    Words = Sequence[str]
    Output = Union[bytes, str]
    AnswerT = TypeVar("AnswerT", bound="Answer")

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


def encode(answer: Dict[str, Any]) -> str:
    """One answer (or record) as the agent prints it: one JSON object line, keys sorted
    (``json.dumps(answer, sort_keys=True)`` and a newline)."""
    import json

    return json.dumps(answer, sort_keys=True) + "\n"


def encode_request(request: Dict[str, Any]) -> bytes:
    """A ``session`` request as the driver writes it on the agent's stdin: one JSON object line."""
    return encode(request).encode()


def lacks_verb(verb: str, exit_code: Optional[int], stdout: Output, stderr: Output) -> bool:
    """True when an older agent's verb table refused *verb* (argparse's usage error, nothing answered)."""
    from .exits import EXIT_USAGE

    out = stdout.encode("utf-8", "replace") if isinstance(stdout, str) else stdout
    err = stderr.encode("utf-8", "replace") if isinstance(stderr, str) else stderr
    return (exit_code == EXIT_USAGE and not out.strip() and b"invalid choice" in err
            and verb.encode() in err)


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


def alloc_run(agent: Words, *, root: str, program: str, attempt: str, timeout: str, progress: Optional[str],
              sbatch_args: Sequence[str], archive: str, archive_sha256: str, env: Sequence[Tuple[str, str]],
              command: Sequence[str], progress_words: Sequence[str] = ()) -> List[str]:
    """``alloc-run``: the provider *command* as a Slurm batch job in a fresh attempt directory (framed answer).

    *progress_words* go where :func:`progress_option` goes, as they are (the driver's plan puts
    one word there that stands for them)."""
    argv = [*agent, ALLOC_RUN, *_job_words(root, program, attempt, timeout), *progress_option(progress),
            *progress_words]
    argv += [f"{SBATCH_ARG}={arg}" for arg in sbatch_args]
    return argv + _archive_env_command(archive, archive_sha256, env, command)


def detach_run(agent: Words, *, root: str, program: str, attempt: str, timeout: str, progress: Optional[str],
               archive: str, archive_sha256: str, env: Sequence[Tuple[str, str]],
               command: Sequence[str], progress_words: Sequence[str] = ()) -> List[str]:
    """``detach-run``: the provider *command* on this host, detached from the connection (framed answer);
    *progress_words* as for :func:`alloc_run`."""
    argv = [*agent, DETACH_RUN, *_job_words(root, program, attempt, timeout), *progress_option(progress),
            *progress_words]
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

def _object(verb: str, stdout: Output) -> Dict[str, Any]:
    try:
        text = stdout.decode("utf-8") if isinstance(stdout, bytes) else stdout
        value = decode(text)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(verb, "is not JSON") from None
    if not isinstance(value, dict):
        raise ProtocolError(verb, "is not an object")
    return value


def _loose(data: Dict[str, Any], key: str, kind: Any, default: Any = None) -> Any:
    """*key*'s value when it is a *kind*, else *default* (the caller judges what is missing)."""
    value = data.get(key)
    return value if isinstance(value, kind) else default


def _member(verb: str, data: Dict[str, Any], key: str, kind: Any, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(verb, f"has no valid {key!r}")
    return value


class Answer:
    """An agent answer: ``data`` is the whole JSON object, the rest its typed members."""

    verb = ""

    def __init__(self, data: Dict[str, Any]) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Answer) and other.data == self.data

    def __hash__(self) -> int:
        return hash((type(self).__name__, encode(self.data)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.data!r})"

    @classmethod
    def parse(cls: Type[AnswerT], stdout: Output) -> AnswerT:
        """The answer *stdout* holds (one JSON object), or :class:`ProtocolError`."""
        return cls(_object(cls.verb, stdout))


class HashAnswer(Answer):
    """``hash-file``: ``sha256`` is ``None`` when the file could not be read (``error`` says why)."""

    verb = HASH_FILE

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        # lenient: the driver's read-back check judges each member (evidence.readback_check)
        self.path: Optional[str] = _loose(data, "path", str)
        self.exists: bool = data.get("exists") is True
        self.sha256: Optional[str] = _loose(data, "sha256", str)
        self.error: Optional[str] = _loose(data, "error", str)


class CheckedPaths(Answer):
    """``check-paths``: the paths checked and each refused one (``{"path", "problem"}``)."""

    verb = CHECK_PATHS

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.checked: List[str] = _loose(data, "checked", list, [])
        self.refused: List[Dict[str, Any]] = _loose(data, "refused", list, [])


class VerifyReadback(Answer):
    """``verify-readback``: the verify's exit status and output, and the launcher's ``hash-file`` answer."""

    verb = VERIFY_READBACK

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        verify = data.get("verify")
        if not (isinstance(verify, dict) and isinstance(verify.get("exit_code"), int)
                and isinstance(verify.get("stdout"), str) and isinstance(verify.get("stderr", ""), str)):
            raise ProtocolError(self.verb, "is not a verify-readback object")
        try:  # the verify's own bytes, as the agent passed them (surrogateescape)
            stdout_bytes = verify["stdout"].encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise ProtocolError(self.verb, "holds text that is not the verify's output") from None
        self.verify: Dict[str, Any] = verify
        self.stdout_bytes: bytes = stdout_bytes
        self.readback: Optional[Dict[str, Any]] = _loose(data, "readback", dict)


class StageCreated(Answer):
    """``stage-create``: the new stage's absolute path."""

    verb = STAGE_CREATE

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        stage = data.get("stage")
        if not isinstance(stage, str) or not stage.startswith("/"):
            raise ProtocolError(self.verb, "names no stage directory")
        self.stage: str = stage


class StageReceived(Answer):
    """``stage-receive``: the stage and the archive's size in bytes."""

    verb = STAGE_RECEIVE

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.stage: str = _member(self.verb, data, "stage", str)
        self.size: int = _member(self.verb, data, "bytes", int)


class StageVerdict(Answer):
    """``stage-verify``: ``verified`` only when nothing mismatched (exit 3 otherwise)."""

    verb = STAGE_VERIFY

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        mismatches = data.get("mismatches")
        self.stage: Optional[str] = _loose(data, "stage", str)
        self.verified: bool = data.get("verified") is True
        self.mismatches: List[Any] = (mismatches if isinstance(mismatches, list)
                                      else [mismatches] if mismatches else [])


class StageReclaimed(Answer):
    """``stage-reclaim``: the stages removed and those abandoned (could not be removed)."""

    verb = STAGE_RECLAIM

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.removed: List[Any] = _member(self.verb, data, "removed", list)
        self.abandoned: List[Any] = _member(self.verb, data, "abandoned", list)


class IdentityAnswer(Answer):
    """``identity --json``: version, source SHA, tree digest, record state, path and interpreter."""

    verb = IDENTITY

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.version: str = _member(self.verb, data, "version", str)
        self.tree_sha256: Optional[str] = _member(self.verb, data, "tree_sha256", str, optional=True)


#: The members of a ``version`` answer (``sinfo`` only when asked).
VERSION_KEYS = ("version", "python_version", "interpreter", "checksum")


class VersionAnswer(Answer):
    """``version``: the helper's version, Python, interpreter and checksum (and ``sinfo`` when asked)."""

    verb = VERSION

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.version: str = _member(self.verb, data, "version", str)
        self.sinfo: Optional[Dict[str, Any]] = _loose(data, "sinfo", dict)

    def facts(self) -> Dict[str, Any]:
        """The members of :data:`VERSION_KEYS`."""
        return {k: self.data.get(k) for k in VERSION_KEYS}


class Installed(Answer):
    """``install-file``: the file installed, its old and new SHA-256 and whether it changed."""

    verb = INSTALL_FILE

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.dest: Optional[str] = _loose(data, "dest", str)
        self.changed: bool = data.get("changed") is True
        self.new_sha256: Optional[str] = _loose(data, "new_sha256", str)
        self.old_sha256: Optional[str] = _loose(data, "old_sha256", str)


parse_hash_file = HashAnswer.parse
parse_check_paths = CheckedPaths.parse
parse_verify_readback = VerifyReadback.parse
parse_stage_create = StageCreated.parse
parse_stage_receive = StageReceived.parse
parse_stage_verify = StageVerdict.parse
parse_stage_reclaim = StageReclaimed.parse
parse_identity = IdentityAnswer.parse
parse_version = VersionAnswer.parse
parse_install_file = Installed.parse


class LeaseAnswer(Answer):
    """``lease`` (and the ``lease`` member of a ``session`` answer): held, or who holds it."""

    verb = LEASE

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.held: bool = data.get("held") is True
        self.lock: Optional[str] = _loose(data, "lock", str)
        self.holder: Optional[Dict[str, Any]] = _loose(data, "holder", dict)


def parse_lease(stdout: Output) -> LeaseAnswer:
    """The first line of a ``lease`` answer (the agent then holds the lease until stdin closes)."""
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    return LeaseAnswer(_object(LEASE, text.split("\n", 1)[0]))


class SessionAnswer(Answer):
    """``session``: its ``protocol`` and one member per part done (``shell``, ``lease``, ``check_paths``,
    ``identity``, ``verify``); ``lease`` is ``None`` when no lease was asked or answered."""

    verb = SESSION

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        lease = _loose(data, "lease", dict)
        self.lease: Optional[LeaseAnswer] = None if lease is None else LeaseAnswer(lease)


def parse_session(stdout: Output) -> SessionAnswer:
    """The session's answer lines (the lease's, then the later parts') as one answer."""
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    first, _, rest = text.partition("\n")
    data = _object(SESSION, first)
    if rest.strip():
        data.update(_object(SESSION, rest.split("\n", 1)[0]))
    return SessionAnswer(data)


class CensusAnswer(Answer):
    """``census``: ``complete`` (false with ``error`` when the queue could not be read completely) and
    ``cost``; the driver reads the whole answer as a document (:mod:`vq_admin.launcher.references`)."""

    verb = CENSUS

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.complete: bool = data.get("complete") is True
        self.error: Optional[str] = _loose(data, "error", str)
        self.cost: Dict[str, Any] = _member(self.verb, data, "cost", dict)


parse_census = CensusAnswer.parse


class RecordAnswer(Answer):
    """``record-read``: ``records``, by program (``_helper``: the helper lane), each ``entries`` (each
    ``seq``, ``name``, ``statement``, ``sig``), ``last`` and ``more``; the driver reads the entries as
    documents (:mod:`vq_admin.record`)."""

    verb = RECORD

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.records: Dict[str, Any] = _member(self.verb, data, "records", dict)


parse_record = RecordAnswer.parse


class RecordQuarantineAnswer(Answer):
    """``record-quarantine``: ``appended`` (``seq``, ``name``, ``dir``) or ``append_error``, and ``record``."""

    verb = RECORD_QUARANTINE

    def __init__(self, data: Dict[str, Any]) -> None:
        super().__init__(data)
        self.appended: Optional[Dict[str, Any]] = _loose(data, "appended", dict)
        self.error: Optional[str] = _loose(data, "append_error", str)
        self.record: Optional[Dict[str, Any]] = _loose(data, "record", dict)


parse_record_quarantine = RecordQuarantineAnswer.parse

#: Each verb's parser (the round-trip test reads this table).
PARSERS = {
    HASH_FILE: parse_hash_file, CHECK_PATHS: parse_check_paths, VERIFY_READBACK: parse_verify_readback,
    STAGE_CREATE: parse_stage_create, STAGE_RECEIVE: parse_stage_receive, STAGE_VERIFY: parse_stage_verify,
    STAGE_RECLAIM: parse_stage_reclaim, IDENTITY: parse_identity, VERSION: parse_version,
    INSTALL_FILE: parse_install_file, LEASE: parse_lease, SESSION: parse_session, CENSUS: parse_census,
    RECORD: parse_record, RECORD_QUARANTINE: parse_record_quarantine,
}
