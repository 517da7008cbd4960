"""Everything ssh will load for us, judged by the secure-path rule before ssh runs.

:data:`SSH_LOADS` is the table (``docs/security.md`` renders it): each ``ssh_config(5)`` option
that names a file ssh reads, a library it loads or a program it runs, and how it is judged.  Two
passes, both before the connection:

* :func:`text_problem` reads the files themselves (the ``-F`` file and every file it
  ``Include``s): ``Include`` and ``Match exec`` are judged from the text, because ``ssh -G`` would
  already run a ``Match exec``;
* :func:`effective_problem` judges the effective options of one destination, as ``ssh -G`` prints
  them (:mod:`vq_admin.ssh.effective` runs it with the same ``-F``), so an option set by a
  ``Match``, a default or a ``Host *`` block is judged for the host it applies to.

Standard library only (the per-job launcher read-back imports it).
"""

from __future__ import annotations

import glob
import os

from .securepath import command_problem, creatable_problem, path_problem, read_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator

#: How an option's value is judged:
FILE = "file"          # each path: it and every directory above it (a missing one: nobody else may create it)
LIBRARY = "library"    # a shared library ssh (or its helper) loads: as FILE; ``internal`` / ``none`` skipped
PROGRAM = "program"    # a program ssh runs: as FILE
COMMAND = "command"    # a command line ssh runs: every absolute word, as FILE
SOCKET = "socket"      # a socket ssh connects to or creates: the directory it is in
INCLUDE = "include"    # read from the text: each file a pattern matches, and the directory a glob reads
HOSTS = "hosts"        # the hosts ssh goes through: each judged like the destination (ssh -G again)

#: (option as ``ssh_config(5)`` spells it; kind; when ssh uses it).  ``tests/trust/test_trust_round_three.py``
#: has an attack for each entry and fails when one has none.
SSH_LOADS = (
    ("Include", INCLUDE, "always: read as configuration"),
    ("Match exec", COMMAND, "always: run while the configuration is read"),
    ("ProxyCommand", COMMAND, "to connect"),
    ("LocalCommand", COMMAND, "after connecting, with PermitLocalCommand"),
    ("KnownHostsCommand", COMMAND, "to verify the host key"),
    ("PKCS11Provider", LIBRARY, "loaded by ssh-pkcs11-helper to find keys"),
    ("SecurityKeyProvider", LIBRARY, "loaded by ssh-sk-helper for FIDO keys"),
    ("XAuthLocation", PROGRAM, "run with ForwardX11 and a DISPLAY"),
    ("IdentityFile", FILE, "private keys offered"),
    ("CertificateFile", FILE, "certificates offered"),
    ("UserKnownHostsFile", FILE, "host keys trusted"),
    ("GlobalKnownHostsFile", FILE, "host keys trusted"),
    ("RevokedHostKeys", FILE, "host keys refused"),
    ("IdentityAgent", SOCKET, "the agent that signs for you"),
    ("ControlPath", SOCKET, "the connection-sharing socket"),
    ("ProxyJump", HOSTS, "jump hosts, each judged with its own options"),
)
_KINDS = {option.lower(): (option, kind) for option, kind, _ in SSH_LOADS}
#: Values that name nothing.
_NONE = {"none", "internal", ""}


_PRIVATE = "use a directory only you and root can write"


def loaded_problem(path: str, what: str) -> str | None:
    """The rule for a path ssh will load: the path and every directory above it; a missing path
    also in a directory nobody else can create it in (a sticky ``/tmp`` is not one)."""
    return path_problem(path, what=what, missing_ok=True) or (
        None if os.path.lexists(path) else creatable_problem(path, what=what, fix=_PRIVATE))


def _words(value: str) -> list[str]:
    return [os.path.expanduser(w) for w in value.replace('"', " ").replace("'", " ").split()]


def text_problem(path: str, *, what: str = "ssh_config", depth: int = 0) -> str | None:
    """``None`` when the ssh configuration *path*, every file it ``Include``s (recursively, each
    ``Include`` glob's directory included) and every absolute word of a ``Match exec``,
    ``ProxyCommand``, ``LocalCommand`` or ``KnownHostsCommand`` pass the rule; else one line
    naming the offender and the line that names it."""
    problem = path_problem(path, what=what)
    if problem or depth > 16:
        return problem or f"{what} {path}: Include nested more than 16 files deep"
    try:
        data = read_regular(path, 1 << 20)
    except OSError as exc:
        return f"cannot read {what} {path}: {exc.strerror or exc}"
    if data is None:
        return f"{what} {path} is not a regular file of at most 1 MiB"
    for keyword, value in _lines(data.decode("utf-8", "replace")):
        judge = _TEXT_JUDGES.get(keyword)
        problem = judge(keyword, _words(value), f"{what} {path}", depth) if judge else None
        if problem:
            return problem
    return None


def _include_problem(keyword: str, patterns: list[str], where: str, depth: int) -> str | None:
    """An ``Include`` line of *where*: each file a pattern matches, read as configuration, and the
    directory of a glob (or of a file not there yet): a file created there later is read."""
    for pattern in patterns:
        pattern = pattern if pattern.startswith("/") else os.path.expanduser(f"~/.ssh/{pattern}")
        found = sorted(glob.glob(pattern))
        problem = creatable_problem(pattern, what=f"{where} Include", fix=_PRIVATE) \
            if (glob.has_magic(pattern) or not found) else None
        for name in found:
            problem = problem or text_problem(name, what=f"{where} Includes", depth=depth + 1)
        if problem:
            return problem
    return None


def _runs_problem(keyword: str, words: list[str], where: str, depth: int) -> str | None:
    """A line of *where* that names a program ssh runs (a ``Match``'s ``exec`` criterion: the words after it)."""
    if keyword == "match":
        criteria = [w.lstrip("!").lower() for w in words]  # OpenSSH: any case, "!exec" too
        words = words[criteria.index("exec") + 1:] if "exec" in criteria else []
    problem = command_problem(words, what=f"program {where} names ({keyword})")
    return f"{problem}; ssh would run it as you" if problem else None


#: How :func:`text_problem` judges a line of the text, by its keyword.
_TEXT_JUDGES = {"include": _include_problem, "match": _runs_problem, "proxycommand": _runs_problem,
                "localcommand": _runs_problem, "knownhostscommand": _runs_problem}


def _lines(text: str) -> "Iterator[tuple[str, str]]":
    """(keyword in lower case, value) of each option line of an ssh configuration or ``ssh -G``."""
    for line in text.splitlines():
        line = line.strip()
        cut = min((i for i in (line.find(" "), line.find("\t"), line.find("=")) if i > 0), default=len(line))
        if line and not line.startswith("#"):
            yield line[:cut].lower(), line[cut:].strip(" \t=")


def effective_problem(printed: str, destination: str) -> tuple[str | None, list[str]]:
    """Judge the options ``ssh -G`` *printed* for *destination*: (one line naming the first option
    and path that fail the rule, or ``None``; the jump hosts to judge the same way)."""
    jumps: list[str] = []
    for keyword, value in _lines(printed):
        option, kind = _KINDS.get(keyword, (keyword, ""))
        if kind in ("", INCLUDE) or value.lower() in _NONE:
            continue
        if kind == HOSTS:
            jumps += [j.split("@")[-1].split(":")[0] for j in value.split(",") if j]
            continue
        if keyword == "identityagent" and value == "SSH_AUTH_SOCK":
            value = os.environ.get("SSH_AUTH_SOCK", "")
        what = f"{option} ({kind} ssh uses for {destination})"
        problem = command_problem(_words(value), what=what) if kind == COMMAND else \
            _paths_problem(keyword, kind, value, what)
        if problem:
            return f"{problem}; ssh would {'run' if kind in (COMMAND, PROGRAM) else 'load'} it as you", jumps
    return None, jumps


def _paths_problem(keyword: str, kind: str, value: str, what: str) -> str | None:
    """The first path of an option's *value* that fails the rule (``%d``, ``%u`` expanded; a path with
    another token, or a socket, judged as its directory, where nobody else may create a socket)."""
    user = os.environ.get("USER") or "root"
    for path in _words(value) if keyword.endswith("knownhostsfile") else [os.path.expanduser(value)]:
        path = path.replace("%d", os.path.expanduser("~")).replace("%u", user).replace("%%", "%")
        if "%" in path or kind == SOCKET:  # judged up to its first unexpanded token: the directory
            path = os.path.dirname(path.split("%")[0] + "x")
        if not path.startswith("/"):
            continue
        problem = loaded_problem(path, what) or (
            creatable_problem(f"{path}/socket", what=what, fix=_PRIVATE) if kind == SOCKET else None)
        if problem:
            return problem
    return None
