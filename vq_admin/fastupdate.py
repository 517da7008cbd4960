"""``update PROGRAM HOST --expected-sha SHA``, what cron runs most: its one ssh process started first.

An already-current update is one ssh session: ``AGENT... session --probe
WORD...`` with its request on stdin (:mod:`vq_admin.early_session`).  Its ssh
handshake and the login shell's start on the host need only the host's ssh
settings and the agent's words.  The console scripts (:func:`vq_admin.entry.main`)
call :func:`start` before argparse, typing and
the rest of the command line are imported: it reads those settings from the
configuration (``tomllib``, the secure-path rule and the anchored identifier
rules; nothing else of vq-admin), or, when that configuration file was read
so before and has not changed since, from the note that read left in the
state directory (see "the note" below: no ``re``, ``tomllib`` or
``subprocess`` then), and starts that ssh process (``posix_spawn``,
:mod:`vq_admin.spawned`).  The full
command line then runs as always, and adopts it: :class:`vq_admin.transport.Session`
takes its control directory (:func:`adopt_control_dir`) and
:func:`vq_admin.early_session.start` its process (:func:`adopt_process`), so the
handshake went on while the driver imported and planned.

Started only for a plainly usual command line and configuration; anything
else starts nothing here, and the full path then behaves exactly as before.
Checked first, as the full path checks them before its ssh starts: PROGRAM,
HOST, SHA and ``--tag`` by the rules of :mod:`vq_admin.agent.identifiers`; the
configuration file's trust (:mod:`vq_admin.agent.securepath`), size and TOML;
HOST is in it with ``fleet_role = "managed"`` and transport ssh, and has a
profile for PROGRAM; the ``ssh_config``'s trust (ssh would run its ``Match
exec`` as the administrator); the agent's words are literal.  The file's other
rules are checked by the full path right after.

Until the request is sent nothing runs on the host but the agent's
``session`` waiting for it.  A run that ends before (a refusal, a usage error,
an exception, a signal) closes the process's stdin (:func:`end_pending`, at
the end of :func:`vq_admin.entry.main`, or the pipe closing with the driver): the
agent reads end-of-file, "nothing asked", and nothing is done.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: this module is imported before the command line is
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, TypeVar

    from .process import LongLived as Process  # posix_spawn's (vq_admin.spawned), or subprocess's

    _T = TypeVar("_T")

#: Seconds :func:`finish` waits for an unused session to end after its stdin closed.
END_TIMEOUT = 10.0

#: ``update`` options this entry takes (each once), and the key each sets; any other word but
#: the two operands leaves the command line to the full parser.
_VALUED = {"--expected-sha": "expected_sha", "--tag": "tag", "--config": "config", "--state-dir": "state_dir"}
_FLAGS = {"--json": "json", "--verbose": "verbose", "-v": "verbose"}


class Pending:
    """The ssh process started by :func:`start`, until the full path adopts it."""

    def __init__(self, ssh_config: str | None, destination: str, control_dir: str, argv: list[str],
                 proc: Process, stderr: IO[bytes]):
        self.ssh_config, self.destination, self.control_dir = ssh_config, destination, control_dir
        self.argv = argv
        self.command = argv[-1]  # the remote command line (what the login shell is given)
        self.proc, self.stderr = proc, stderr
        self.dir_adopted = False


PENDING: Pending | None = None
_TRIED = False


def parse_update(words: list[str]) -> dict[str, str] | None:
    """*words* after ``update``: ``program``, ``host``, ``expected_sha`` and the options given,
    or ``None`` unless they are plainly ``PROGRAM HOST --expected-sha SHA`` with a few options
    (:mod:`vq_admin.plainargs`)."""
    from .plainargs import plain_words

    parsed = plain_words(words, _VALUED, _FLAGS, together=True)
    if parsed is None:
        return None
    operands, values, _flags = parsed
    if len(operands) != 2 or "expected_sha" not in values:
        return None
    values["program"], values["host"] = operands
    return values


def start(words: list[str]) -> None:
    """Start the session's ssh process for ``update`` *words* when they and the configuration are
    plainly usual (at most once per run); never raises: anything unusual starts nothing."""
    global _TRIED, PENDING
    if _TRIED or PENDING is not None:
        return
    _TRIED = True
    try:
        PENDING = _start(words)
    except Exception:  # noqa: BLE001 -- anything unusual is the full path's to report
        PENDING = None


def disable() -> None:
    """This process starts nothing early (a fleet worker: forked from the rollout with every module
    loaded, it has nothing to overlap, and it must never own the parent's process)."""
    global _TRIED, PENDING
    _TRIED, PENDING = True, None


def _start(words: list[str]) -> Pending | None:
    values = parse_update(words)
    if values is None:
        return None
    config = os.path.abspath(values.get("config") or _config_path())
    from .agent.securepath import path_problem

    if path_problem(config, what="configuration file"):  # a missing file too
        return None
    noted = _noted(values, config)
    if noted is not None:
        return _spawn(_trusted_ssh_config(noted[0]), noted[1], noted[2])
    return _start_from_config(values, config)


def _config_path() -> str:
    from .agent import paths

    return paths.config_path()


def _start_from_config(values: dict[str, str], config: str) -> Pending | None:
    """The early start when no note answers: the configuration read and checked here."""
    from .agent.identifiers import DESTINATION_RE, FULL_SHA_RE, NAME_RE, TAG_RE

    if not FULL_SHA_RE.match(values["expected_sha"]):
        return None
    if not (NAME_RE.match(values["program"]) and NAME_RE.match(values["host"])):
        return None
    if "tag" in values and not TAG_RE.match(values["tag"]):
        return None
    read = _read_config(config)
    if read is None:
        return None
    data, digest = read
    hosts = data.get("hosts")
    table = hosts.get(values["host"]) if isinstance(hosts, dict) else None
    if not isinstance(table, dict) or table.get("fleet_role") != "managed" or table.get("transport", "ssh") != "ssh":
        return None
    profiles = table.get("scheduler_runtime_deployments", {})
    if not isinstance(profiles, dict) or not isinstance(profiles.get(values["program"]), dict):
        return None
    destination = table.get("ssh", values["host"])
    if not isinstance(destination, str) or not DESTINATION_RE.match(destination):
        return None
    agent = _agent_words(table.get("agent", "vq-admin-agent"))
    if agent is None:
        return None
    ssh_config = data.get("ssh_config")
    pending = _spawn(_trusted_ssh_config(ssh_config), destination, agent)
    if pending is not None:  # the handshake runs meanwhile
        _note(values, config, digest, ssh_config, destination, agent)
    return pending


def _read_config(path: str) -> tuple[dict[str, object], str] | None:
    """The configuration as the full path reads it, when it passes the same checks (else ``None``),
    and the SHA-256 of the bytes it was read from."""
    from .bounded import MAX_CONFIG_BYTES, InputError, loads_toml, read_regular_file

    try:
        raw = read_regular_file(path, "configuration file", limit=MAX_CONFIG_BYTES)
        return loads_toml(raw, "configuration file", limit=MAX_CONFIG_BYTES), _sha256(raw)
    except (InputError, OSError):
        return None


# -- the note: this configuration's early-start words, without reading it again ----------------
#
# Reading the configuration costs tomllib (and its re) and checking the identifiers costs re: more
# than the rest of the early start together.  So once the words above are found, they are noted in
# the state directory, ``early-start/HOST+PROGRAM.json`` (a flat JSON object, 0600, written
# atomically), with the configuration file's path, the SHA-256 of its bytes and vq-admin's version.
# A later run whose configuration file holds exactly those bytes (read and hashed again, with the
# interpreter's built-in SHA-256: no OpenSSL, no re) takes the words from the note (checked again:
# names, destination, literal agent words, the ssh_config's trust) and starts ssh before anything
# heavy is loaded.  Any other content, however and whenever it was written, is read again.  A
# note that is missing, malformed, of another owner, of another version or below an untrusted
# directory is no note.  The full path then checks everything as always, and ends an early
# process that is not exactly its own.

NOTE_SCHEMA = "vq-admin/early-start/1"
NOTE_DIR = "early-start"
#: Largest note read back (a note is a few hundred bytes).
MAX_NOTE_BYTES = 8192

_HEX_ANY_CASE = frozenset("0123456789abcdefABCDEF")
_DEST_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DEST_REST = _DEST_FIRST | frozenset(".@:+%-")


def is_full_sha(value: str) -> bool:
    """``identifiers.FULL_SHA_RE`` without ``re``: 40 or 64 hex digits of either case."""
    return len(value) in (40, 64) and _HEX_ANY_CASE.issuperset(value)


def is_destination(value: str) -> bool:
    """``identifiers.DESTINATION_RE`` without ``re``: never starting with ``-``, at most 255 characters."""
    return 0 < len(value) <= 255 and value[0] in _DEST_FIRST and _DEST_REST.issuperset(value)


def _version() -> str:
    """The vq-admin that wrote a note (a note of another version is no note: the words may be derived
    otherwise)."""
    from . import __version__

    return __version__


#: Largest configuration file the note route reads (the configuration's own bound is larger; a
#: bigger file takes the configuration's route).
MAX_NOTED_CONFIG = 1 << 20


def _sha256(data: bytes) -> str:
    from .agent.verify_readback import sha256

    h = sha256(len(data))
    h.update(data)
    digest: str = h.hexdigest()
    return digest


def _config_digest(path: str) -> str | None:
    """The SHA-256 of the regular file *path* (at most :data:`MAX_NOTED_CONFIG` bytes; a FIFO never
    blocks), else ``None``."""
    import stat

    from .agent.securepath import read_bounded

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_NOTED_CONFIG:
            return None
        data = read_bounded(fd, MAX_NOTED_CONFIG)
        return None if data is None else _sha256(data)
    except OSError:
        return None
    finally:
        os.close(fd)


def note_name(host: str, program: str) -> str:
    """The note's file name (``+`` is in no name, so the two cannot run together)."""
    return f"{host}+{program}.json"


def _noted(values: dict[str, str], config: str) -> tuple[str | None, str, list[str]] | None:
    """``(ssh_config, destination, agent words)`` from the note of *values*' host and program when it
    was made from the configuration file *config* as it is now; else ``None``."""
    from .agent.securepath import open_trusted_dir, read_trusted_file
    from .fastlookup import flat_object, is_name, state_root
    from .sshargv import literal_words

    host, program = values["host"], values["program"]
    if "tag" in values or not (is_name(host) and is_name(program) and is_full_sha(values["expected_sha"])):
        return None  # a tag's rule is a pattern: the configuration's route checks it
    digest = _config_digest(config)
    if digest is None:
        return None
    dfd = open_trusted_dir(os.path.join(os.path.normpath(os.path.abspath(state_root(values.get("state_dir")))),
                                        NOTE_DIR))
    if dfd is None:
        return None
    try:
        data = read_trusted_file(dfd, note_name(host, program), MAX_NOTE_BYTES)
    finally:
        os.close(dfd)
    note = flat_object(data) if data is not None else None
    if note is None or (note.get("schema"), note.get("config"), note.get("config_sha256"), note.get("host"),
                        note.get("program"), note.get("version")) != (NOTE_SCHEMA, config, digest, host, program,
                                                                      _version()):
        return None
    destination, agent, ssh_config = note.get("destination"), note.get("agent"), note.get("ssh_config")
    if destination is None or not is_destination(destination) or not agent:
        return None
    words = agent.split(" ")
    if not literal_words(words):
        return None
    return ssh_config, destination, words


def _note(values: dict[str, str], config: str, digest: str, ssh_config: object, destination: str,
          agent: list[str]) -> None:
    """Note the words just found (best effort: a note that cannot be written is no note)."""
    if ssh_config is not None and not isinstance(ssh_config, str):
        return
    try:
        import json

        from .fastlookup import state_root
        from .statefs import PrivateTree

        note = {"schema": NOTE_SCHEMA, "config": config, "config_sha256": digest, "host": values["host"],
                "program": values["program"], "ssh_config": ssh_config, "destination": destination,
                "agent": " ".join(agent), "version": _version()}
        tree = PrivateTree(state_root(values.get("state_dir")))
        tree.write_atomic([NOTE_DIR], note_name(values["host"], values["program"]),
                          json.dumps(note, sort_keys=True).encode() + b"\n")
    except Exception:  # noqa: BLE001 -- the state directory's problems are the full path's to report
        pass


def _agent_words(value: object) -> list[str] | None:
    """The agent's words (as the configuration splits them) when every one is literal."""
    import shlex

    from .sshargv import literal_words

    if not isinstance(value, str) or any(c in value for c in "\n\r\0"):
        return None
    words = shlex.split(value, posix=True)
    return words if words and literal_words(words) else None


class Unusual(Exception):
    """Something the full path is to decide (and report): nothing is started here."""


def _trusted_ssh_config(value: object) -> str | None:
    """The ``ssh_config``'s normalised path (``None`` without one) when the full path would take
    it: absolute, no ``..``, a regular file no other user can change; else :class:`Unusual`."""
    from .agent.securepath import ssh_config_problem

    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\n\0"):
        raise Unusual("ssh_config")
    if ".." in value.split("/"):
        raise Unusual("ssh_config")
    path = os.path.normpath(value)
    if not os.path.lexists(path) or ssh_config_problem(path) or not os.path.isfile(path):
        raise Unusual("ssh_config")  # a writable ssh_config's Match exec must never run
    return path


def _spawn(ssh_config: str | None, destination: str, agent: list[str]) -> Pending | None:
    from .agent import protocol
    from .spawned import scratch_file, spawn
    from .sshargv import master_argv, probe_suffix

    control_dir = _control_dir()
    full = master_argv(ssh_config, control_dir, True, destination, protocol.session(agent))
    full[-1] += probe_suffix()
    stderr = scratch_file()
    try:
        proc: Process | None = spawn(full, stderr=stderr)
        if proc is None:  # not plainly posix_spawn's: as the full path starts it
            from .process import spawn as spawn_subprocess

            proc = spawn_subprocess(full, stderr=stderr)
    except OSError:
        stderr.close()  # the full path's own start reports it
        os.rmdir(control_dir)
        return None
    return Pending(ssh_config, destination, control_dir, full, proc, stderr)


def _control_dir() -> str:
    """A new private directory ``/tmp/vqssh-<pid>-XXXXXXXX`` (what the run's Session makes)."""
    from .sshargv import CONTROL_PARENT, CONTROL_PREFIX

    prefix = os.path.join(CONTROL_PARENT, f"{CONTROL_PREFIX}{os.getpid()}-")
    for _ in range(100):
        path = prefix + os.urandom(5).hex()[:8]
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(prefix)


# -- the full path adopts it -----------------------------------------------------------


def _matches(ssh_config: str | None, destination: str) -> bool:
    return PENDING is not None and (PENDING.ssh_config, PENDING.destination) == (ssh_config, destination)


def adopt_control_dir(ssh_config: str | None, destination: str) -> str | None:
    """The early process's control directory, for the run's first ssh destination when it is that
    process's (the Session then owns and removes it); else ``None``."""
    if PENDING is None or PENDING.dir_adopted or not _matches(ssh_config, destination):
        return None
    PENDING.dir_adopted = True
    return PENDING.control_dir


def adopt_process(ssh_config: str | None, destination: str, control_dir: str | None,
                  command: str) -> tuple[Process, IO[bytes]] | None:
    """The early process and its stderr file when it runs exactly *command* as the master of
    *control_dir* on *destination*; the caller owns them then.  A process started for anything
    else is ended here (stdin closed: nothing asked)."""
    global PENDING
    pending = PENDING
    if pending is None:
        return None
    if (_matches(ssh_config, destination) and pending.dir_adopted and control_dir == pending.control_dir
            and command == pending.command):
        PENDING = None
        return pending.proc, pending.stderr
    end_pending()
    return None


def end_pending() -> None:
    """End the early process when nothing adopted it (its stdin closes: nothing asked), and
    remove its control directory unless a Session owns it; ready for another run."""
    global PENDING, _TRIED
    pending, PENDING, _TRIED = PENDING, None, False
    if pending is None:
        return
    finish(pending.proc, pending.stderr)
    if not pending.dir_adopted:
        import shutil

        shutil.rmtree(pending.control_dir, ignore_errors=True)


def finish(proc: Process, stderr: IO[bytes], timeout: float = END_TIMEOUT) -> None:
    """Close the stdin and stdout of an unused session, wait for it (bounded; its process group
    killed past the bound) and close its stderr file: none is ever left behind."""
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    from .process import end  # the one bounded wait-then-kill

    end(proc, timeout)
    stderr.close()


def run_after_start(words: list[str], body: Callable[[], _T]) -> _T:
    """``update`` *words*: :func:`start`, then *body* (the full command line), then
    :func:`end_pending` however it ended."""
    try:
        start(words)
        return body()
    finally:
        end_pending()
