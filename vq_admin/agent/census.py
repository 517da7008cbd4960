"""``vq-admin-agent census``: the words of every queued or running Slurm job that name a full SHA,
read on the login host in one call (the driver's side is :mod:`vq_admin.launcher.references`).

The queue is read with one listing, ``squeue -h --all -t all -O ...`` (two RPCs: the jobs and the
partitions), for every job's id, state, user, submit time, batch flag and cluster, and the text
vq-admin searches: command, work directory, stdout, stderr and stdin paths.  Every field ends with
a random token drawn for this call, so no value a user chose (a path or a name holding a newline,
say) can be read as another field or another job.  A job counts unless its state is terminal
(:data:`TERMINAL_STATES`).  A batch job's stored script is read with ``scontrol write batch_script
ID -`` (one RPC) only when the cache does not hold it yet: the stored script of a job never
changes (a requeued job reruns it; requeueing gives it a new submit time, so it is read again).

What is kept of a job's text: its *words* (split at whitespace and quotes) that hold a run of 40 or
more lower-case hex digits, or a path component ``current``.  The driver reads every full SHA, and
every launcher path and stable ``current`` link it knows of, from those words.

The cache: ``${XDG_STATE_HOME:-~/.local/state}/vq-admin-agent/census/<cluster>.<conf>.json``, beside
``locks/`` (``<conf>``: 12 hex digits of the SHA-256 of ``$SLURM_CONF``, so one cache per scheduler
configuration the account's commands read), holds per job id its submit time and its script's
words, each entry sealed with an
HMAC-SHA256 under the key ``census/key`` (32 random bytes, made on first use).  Both are owner-only
files in an owner-only directory that must pass the secure-path rule; a file that does not (another
owner, a loose mode, a symlink, too large, not JSON) or an entry whose seal does not match is not
trusted: its scripts are read again, which costs time and nothing else.  Each census rewrites the
file (temporary file and rename) with the entries of the jobs it listed, so those that left the
queue are dropped; an entry of more than :data:`MAX_ENTRY_BYTES`, or past :data:`MAX_CACHE_BYTES`
in all, is not kept.

Fails closed: ``squeue`` failing or timing out, a listing that does not parse, a script that cannot
be read (``scontrol`` reports that on stderr, with exit status 0) ends the call with exit 1 and
``"complete": false``.  A job whose script read says the job id is invalid has left the queue.

Standard library only, Python 3.8.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import secrets
import time

from ..core import atomic, default_paths, exits, protocol, safedirs, securepath
from ..core.identifiers import JOB_ID_RE
from ..core.names import is_name
from . import spawn

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

    from ..core.protocol import CensusAnswer, CensusCost, CensusJob

    Runner = Callable[[List[str]], Tuple[int, bytes, bytes]]

#: Slurm job states after which a job never runs again as it stands (``SPECIAL_EXIT`` may: it is not one).
TERMINAL_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                             "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED"})
#: The listing's fields (``squeue -O`` names), in order; the last five are the text searched.
FIELDS = ("JobID", "JobArrayID", "State", "UserName", "SubmitTime", "BatchFlag", "Cluster",
          "Command", "WorkDir", "STDOUT", "STDERR", "STDIN")
#: Seconds each scheduler command may take.
TIMEOUT = 120.0
MAX_ENTRY_BYTES = 16 << 10
MAX_CACHE_BYTES = 64 << 20
CACHE_SCHEMA = "vq-admin-agent/census-cache/1"
_WORD_SPLIT = re.compile(r"[\s'\"]+")
_HEX_RUN = re.compile(r"[0-9a-f]{40,}")
_CURRENT = re.compile(r"/current(?:/|$)")
_GONE = re.compile(r"invalid job id", re.IGNORECASE)
_SUBMIT = re.compile(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\Z")


class CensusFailed(Exception):
    """The queue could not be read completely: nothing may be pruned on what was read."""


def words(text: str) -> "List[str]":
    """The words of *text* that name a full SHA (a hex run of 40 or more) or a ``current`` link, sorted."""
    return sorted({w for w in _WORD_SPLIT.split(text) if _HEX_RUN.search(w) or _CURRENT.search(w)})


def cache_dir() -> str:
    return os.path.join(default_paths.state_home(), "vq-admin-agent", "census")


class Cache:
    """The sealed script words of one cluster's jobs (see the module docstring); never raises.  Without a
    *cluster* (no listing has named one yet) it holds nothing, says nothing and writes nothing."""

    def __init__(self, cluster: "Optional[str]") -> None:
        self.cluster, self.key, self.fd = cluster, b"", -1
        self.entries: "Dict[str, Tuple[str, List[str]]]" = {}
        self.problem: "Optional[str]" = None
        self.rejected = 0
        if cluster is None:
            return
        if not is_name(cluster):
            self.problem = f"the cluster name {cluster!r} is not a plain name: no cache"
            return
        directory = cache_dir()
        try:  # as the lease's directory; then opened level by level below the state home, never through a link
            securepath.make_private_dir(directory, what="census cache directory")
            self.fd = safedirs.open_chain(default_paths.state_home(), ["vq-admin-agent", "census"], create=False)
            self.key = self._key()
        except (OSError, securepath.Untrusted, safedirs.UnsafePath) as exc:
            self.problem = f"the cache is not used: {exc}"
            self.close()
            return
        self._load()

    def _key(self) -> bytes:
        found = securepath.read_trusted_file(self.fd, "key", 200)
        if found is not None and re.match(rb"\A[0-9a-f]{64}\Z", found.strip()):
            return bytes.fromhex(found.strip().decode())
        key = secrets.token_hex(32)  # missing or not trusted: a new key (every older seal then fails)
        atomic.write("key", key.encode(), dir_fd=self.fd, sync=False)
        return bytes.fromhex(key)

    def seal(self, job: str, submit: str, found: "List[str]") -> str:
        message = protocol.encode({"cluster": self.cluster, "job": job, "submit": submit, "words": found})
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()

    def _load(self) -> None:
        data = securepath.read_trusted_file(self.fd, self.name, MAX_CACHE_BYTES)
        if data is None:
            if os.path.lexists(os.path.join(cache_dir(), self.name)):
                self.problem = f"{self.name} is not trusted (another owner, a loose mode, not a file, or too large)"
            return
        try:
            doc = protocol.decode(data.decode("utf-8"))
            jobs = doc["jobs"] if doc.get("schema") == CACHE_SCHEMA and doc.get("cluster") == self.cluster else {}
            items = list(jobs.items())
        except (ValueError, TypeError, KeyError, AttributeError):
            self.problem = f"{self.name} is not a census cache: not used"
            return
        for job, entry in items:
            try:
                submit, found, mac = entry["submit"], entry["words"], entry["mac"]
                sealed = hmac.compare_digest(str(mac), self.seal(job, submit, found))
            except (TypeError, KeyError, ValueError):
                sealed = False
            if sealed:  # the seal is this account's key's: the entry is what a census wrote (a list of words)
                self.entries[job] = (submit, found)
            else:
                self.rejected += 1

    @property
    def name(self) -> str:
        """``<cluster>.<12 hex>.json``: the hex of the SHA-256 of ``$SLURM_CONF`` (empty when unset), so two
        clusters of one name that an account reaches through two configurations keep two caches."""
        conf = hashlib.sha256(os.environ.get("SLURM_CONF", "").encode("utf-8", "surrogateescape")).hexdigest()
        return f"{self.cluster}.{conf[:12]}.json"

    def get(self, job: str, submit: str) -> "Optional[List[str]]":
        entry = self.entries.get(job)
        return entry[1] if entry is not None and entry[0] == submit else None

    def save(self, kept: "Dict[str, Tuple[str, List[str]]]") -> None:
        """Replace the cache with *kept* (job id: submit time, words), within the bounds."""
        if self.fd < 0:
            return
        jobs, total = {}, 0
        for job, (submit, found) in sorted(kept.items()):
            size = sum(len(w) + 4 for w in found) + 120
            if size > MAX_ENTRY_BYTES or total + size > MAX_CACHE_BYTES:
                continue
            total += size
            jobs[job] = {"submit": submit, "words": found, "mac": self.seal(job, submit, found)}
        try:
            atomic.write(self.name, protocol.encode({"schema": CACHE_SCHEMA, "cluster": self.cluster,
                                                     "jobs": jobs}).encode(), dir_fd=self.fd, sync=False)
        except OSError as exc:
            self.problem = f"the cache could not be written: {exc}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _listing(out: bytes, token: str) -> "List[List[str]]":
    """The records of the listing *out* (each the :data:`FIELDS`' values), or :class:`CensusFailed`."""
    text = out.decode("utf-8", "replace")  # paths are bytes to Slurm; SHAs are ASCII
    parts = ("\n" + text).split(token)  # each record on a line of its own: the first too
    if parts[-1].strip() or (len(parts) - 1) % len(FIELDS):
        raise CensusFailed(f"the squeue listing does not parse (its last line: {text[-200:]!r})")
    records = [parts[i:i + len(FIELDS)] for i in range(0, len(parts) - 1, len(FIELDS))]
    for record in records:
        if not record[0].startswith("\n"):
            raise CensusFailed(f"the squeue listing does not parse at job {record[0][:40]!r}")
        record[0] = record[0][1:]
        job, _, state, user, submit, batch = record[:6]
        if not (JOB_ID_RE.match(job) and re.match(r"\A[A-Z_]+\Z", state) and user and batch in ("0", "1")):
            raise CensusFailed(f"the squeue listing holds a record that is not a job: {record[:6]!r}")
        if not _SUBMIT.match(submit):
            record[4] = ""  # no usable submit time: the job's script is read every time
    return records


@functools.lru_cache(maxsize=None)
def _which(program: str) -> str:
    """*program* as found on ``PATH`` once per census (each directory that lacks it costs every spawn a
    failed ``exec``), or as it is when none has it (the spawn then says so)."""
    found = (os.path.join(d, program) for d in os.get_exec_path())
    return next((p for p in found if os.path.isfile(p) and os.access(p, os.X_OK)), program)


def _run(argv: "List[str]") -> "Tuple[int, bytes, bytes]":
    """One scheduler command, its times in Slurm's standard form whatever the account's environment says."""
    try:
        return spawn.run_captured([_which(argv[0]), *argv[1:]], env=dict(os.environ, SLURM_TIME_FORMAT="standard"),
                                  timeout=TIMEOUT)
    except spawn.TimeoutExpired:
        raise CensusFailed(f"{' '.join(argv[:3])} did not answer within {TIMEOUT:.0f} s") from None
    except OSError as exc:
        raise CensusFailed(f"{argv[0]}: {exc.strerror or exc}") from None


def _script_words(run: "Runner", job: str) -> "Optional[List[str]]":
    """The words of *job*'s stored batch script; ``None`` when the job has left the queue."""
    code, out, err = run(["scontrol", "write", "batch_script", job, "-"])
    problem = err.decode("utf-8", "replace").strip()
    if _GONE.search(problem) and not out:
        return None
    if code != 0 or problem or not out:
        hint = ("; reading other users' scripts needs a Slurm operator or admin account"
                if re.search(r"denied|permission", problem, re.IGNORECASE) else "")
        raise CensusFailed(f"scontrol write batch_script {job} failed (exit status {code}): "
                           f"{problem[-300:] or 'no script'}{hint}")
    return words(out.decode("utf-8", "replace"))


def _batch_words(run: "Runner", opened: "Cache", job: str, submit: str, cluster: str, cost: "CensusCost",
                 kept: "Dict[str, Tuple[str, List[str]]]") -> "Optional[List[str]]":
    """The words of *job*'s batch script: the cache's when it holds this very submission, else read (counted in
    *cost*); *kept* for the cache when the job is this cluster's.  ``None`` when the job has left the queue."""
    ours = bool(submit) and cluster == opened.cluster
    script = opened.get(job, submit) if ours else None
    if script is None:
        cost["scheduler_calls"] += 1
        cost["scripts_read"] += 1
        script = _script_words(run, job)
        if script is None:
            return None
    else:
        cost["scripts_cached"] += 1
    if ours:
        kept[job] = (submit, script)
    return script


def take(run: "Runner" = _run, cache: "Callable[[str], Cache]" = Cache) -> "CensusAnswer":
    """The census answer (``complete`` true), or :class:`CensusFailed` whose ``args`` are the message and
    the cost so far; *run* runs one scheduler argv (default: :func:`spawn.run_captured`), *cache* opens
    the cache of a cluster."""
    started = time.monotonic()
    cost: "CensusCost" = {"jobs_listed": 0, "scripts_read": 0, "scripts_cached": 0, "cache_rejected": 0,
                              "cache_problem": None, "scheduler_calls": 1}
    token = "@vq" + secrets.token_hex(8)
    opened = Cache(None)  # until the listing names the cluster
    kept: "Dict[str, Tuple[str, List[str]]]" = {}
    try:
        code, out, err = run(["squeue", "-h", "--all", "-t", "all", "-O", ",".join(f"{f}:0{token}" for f in FIELDS)])
        if code != 0:
            raise CensusFailed(f"squeue failed (exit status {code}): {err.decode('utf-8', 'replace').strip()[-300:]}")
        records = _listing(out, token)
        cost["jobs_listed"] = len(records)
        if records:  # an empty listing names no cluster: its cache stays as it is
            opened = cache(records[0][6])
        cost.update({"cache_rejected": opened.rejected, "cache_problem": opened.problem})
        groups: "Dict[Tuple[str, ...], List[CensusJob]]" = {}
        scanned = 0
        for job, display, state, user, submit, batch, cluster, *text in records:
            if state in TERMINAL_STATES:
                continue
            found = words("\n".join(text))
            if batch == "1":
                script = _batch_words(run, opened, job, submit, cluster, cost, kept)
                if script is None:
                    continue  # it ended between the listing and now
                found = sorted(set(found) | set(script))
            scanned += 1
            if found:
                groups.setdefault(tuple(found), []).append({"id": job, "display": display, "state": state,
                                                            "user": user})
        opened.save(kept)  # the jobs listed now: those that left the queue are dropped
        cost["cache_problem"] = opened.problem
        cost["seconds"] = round(time.monotonic() - started, 3)
        return {"complete": True, "error": None, "jobs_scanned": scanned, "cost": cost,
                "groups": [{"words": list(w), "jobs": jobs} for w, jobs in sorted(groups.items())]}
    except CensusFailed as exc:
        opened.save(dict(opened.entries, **kept))  # what was read is right: the next census need not again
        cost["seconds"] = round(time.monotonic() - started, 3)
        raise CensusFailed(str(exc), cost) from None
    finally:
        opened.close()


def answer(run: "Runner" = _run, cache: "Callable[[str], Cache]" = Cache) -> "Tuple[CensusAnswer, int]":
    """The ``census`` verb's answer and exit status: 0 complete, 1 failed (``complete`` false, ``error``)."""
    try:
        return take(run, cache), 0
    except CensusFailed as exc:
        message, cost = exc.args
        return {"complete": False, "error": message, "cost": cost, "jobs_scanned": None, "groups": None}, \
            exits.EXIT_FAILED


def main() -> int:
    """The ``census`` verb: one JSON answer line on stdout (:func:`answer`)."""
    import sys

    found, code = answer()
    if code:
        print(f"vq-admin-agent: census: {found['error']}", file=sys.stderr)
    sys.stdout.write(protocol.encode(found))
    return code
