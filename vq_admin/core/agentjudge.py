"""The agent judged before it runs, isolated when it runs, in the same ssh command.

Every agent call runs as ``/usr/bin/python3 -I -S -c CODE BLOB N AGENT-WORDS... VERB...``
(:func:`launch`; the transports apply :func:`judged` where they build the local argv, so plans and
receipts keep the agent's own words): a system interpreter with no site, no ``PYTHON*`` variables and no current
directory runs this module's :func:`judge` (shipped compressed in ``BLOB`` with the secure-path
rule of :mod:`vq_admin.core.securepath`), which, before anything of the agent runs:

* resolves the agent's words: a ``#!`` script (a console script, ``vq-admin-agent.pyz``) and its
  interpreter (``#!/usr/bin/env python3`` looked up in ``PATH``), or an interpreter and a script;
* judges the interpreter, the script, the venv's ``pyvenv.cfg`` and, unless the agent is the
  single-file archive (then it runs with ``-S``: no site-packages at all), every directory on the
  ``sys.path`` the agent will have (read from the interpreter run ``-I -S``), every entry directly
  in them and every ``.pth`` file there and the directories those add;
* runs the agent isolated: ``INTERPRETER -I [-S] SCRIPT WORDS...`` (``exec``: the same process).

A failure exits 77 with one line naming the path, its owner and mode, and "nothing was run" (or,
once the interpreter ran ``-I -S`` to print its ``sys.path``, "only the agent interpreter's own
start-up ran"): the agent's own code never started.  The agent's first word must be a Python
interpreter or a Python script (``#!`` a Python interpreter); any other (a wrapper: ``env``, ``nice``,
a shell script) is refused, exit 77.  The judge is Python 3.8, standard library.
"""

from __future__ import annotations

import os
import stat
import sys

from .securepath import creatable_problem, describe_owner, level_problem, path_problem, read_regular  # in the blob

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, NoReturn, Optional, Sequence, Tuple

#: The interpreter the judge runs on (root's, on every supported login host).
JUDGE_PYTHON = "/usr/bin/python3"
#: What the judge exits with when it refuses (the agent's and vq-admin's refusal status).
REFUSED = 77
#: Interpreter options the agent's words may carry; the judge sets its own (``-I``, ``-S``).
_OPTIONS = ("-I", "-S", "-E", "-s", "-B", "-u")
#: Runs the judge: literal enough for any login shell once single-quoted (no quote, backslash or "!").
CODE = "import base64,sys,zlib;exec(zlib.decompress(base64.urlsafe_b64decode(sys.argv[1])))"
#: What the interpreter run ``-I -S`` prints: its sys.path and the site directories the agent will use.
PROBE = ("import site,sys;a=sys.argv[1:];p=[x for x in a if x!='-']+([sys.base_prefix] if '-' in a or not a else []);"
         "sys.stdout.write(chr(0).join(sys.path+site.getsitepackages(p)))")


def _fail(code: int, text: str) -> "NoReturn":
    sys.stderr.write(f"vq-admin-agent: {'refused: ' if code == REFUSED else ''}{text}\n")
    sys.stderr.flush()
    os._exit(code)


def _which(name: str) -> "Optional[str]":
    for directory in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        path = os.path.join(directory, name)
        if directory.startswith("/") and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


#: What a refusal says ran: nothing, until the interpreter's own start-up ran for :data:`PROBE`.
NOTHING_RAN = "nothing was run"
STARTUP_RAN = "the agent interpreter's own start-up ran"
#: Every refusal of the judge ends with one of these (the driver adds nothing after them).
SAID_WHAT_RAN = (NOTHING_RAN, STARTUP_RAN)
_RAN = [NOTHING_RAN]


def _judged(path: str, what: str, missing_ok: bool = False) -> None:
    problem = path_problem(path, what=what, missing_ok=missing_ok)
    if problem:
        _fail(REFUSED, f"{problem}; the agent would run it; {_RAN[0]}")


def _text(path: str) -> str:
    """The text of the regular file *path* (a FIFO or any other kind is refused, never waited on)."""
    data = read_regular(path, 1 << 20)
    if data is None:
        _fail(REFUSED, f"{path} is not a regular file of at most 1 MiB; the agent would read it; {_RAN[0]}")
    return data.decode("utf-8", "replace")


def _head(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        _fail(127, f"{path}: {exc.strerror}; nothing was run")
    try:
        return os.read(fd, 512)
    finally:
        os.close(fd)


def _import_path(interp: str) -> "List[str]":
    """Judge what the interpreter reads first (its venv's ``pyvenv.cfg``, its library directory), then
    return the directories its ``sys.path`` will hold with the site directories and what their ``.pth``
    files add: a venv's from its ``pyvenv.cfg``, any other's from the interpreter run ``-I -S``."""
    venv, keys = _venv(interp)
    base = os.path.dirname(keys.get("home") or os.path.dirname(os.path.realpath(interp)))
    _judged(os.path.join(base, "lib"), "the agent interpreter's library", missing_ok=True)
    version = ".".join(keys.get("version", "").split(".")[:2])
    if venv and version and keys.get("include-system-site-packages", "").lower() != "true":
        found = [f"{prefix}/{lib}/python{version}{sub}" for lib in ("lib", "lib64") for prefix, sub in (
            (base, ""), (base, "/lib-dynload"), (venv, "/site-packages"))]
        found += [f"{base}/{lib}/python{version.replace('.', '')}.zip" for lib in ("lib", "lib64")]
    else:
        found = _probed_path(interp, venv, version)
    return found + _pth_added(found)


def _venv(interp: str) -> "Tuple[str, Dict[str, str]]":
    """The venv of *interp* (the directory of the ``pyvenv.cfg`` next to it or one up, judged) and that
    file's keys, in lower case; ``("", {})`` for an interpreter that is no venv's (or an empty file)."""
    for venv in (os.path.dirname(interp), os.path.dirname(os.path.dirname(interp))):
        cfg = os.path.join(venv, "pyvenv.cfg")
        if os.path.exists(cfg):
            _judged(cfg, "the agent's pyvenv.cfg")
            keys = dict((k.strip().lower(), v.strip()) for k, _, v in
                        (line.partition("=") for line in _text(cfg).splitlines()))
            return (venv, keys) if keys else ("", {})
    return "", {}


def _probed_path(interp: str, venv: str, version: str) -> "List[str]":
    """The ``sys.path`` and site directories the interpreter prints, run ``-I -S`` (and a *venv*'s own
    site-packages: Debian's site module names only dist-packages)."""
    import subprocess

    done = subprocess.run([interp, "-I", "-S", "-c", PROBE, *([venv, "-"] if venv else [])],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, timeout=60)
    _RAN[0] = f"only {STARTUP_RAN} ({interp} -I -S); the agent never started"
    if done.returncode != 0:
        _fail(127, f"the agent interpreter {interp} did not start (exit {done.returncode}); {_RAN[0]}")
    found = [p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    if venv and version:
        found += [f"{venv}/{lib}/python{version}/site-packages" for lib in ("lib", "lib64")]
    return found


def _pth_added(sites: "List[str]") -> "List[str]":
    """The directories the ``.pth`` files directly in *sites* add (their lines that are not comments
    or ``import`` lines)."""
    added: "List[str]" = []
    for site in sites:
        try:
            pths = [name for name in sorted(os.listdir(site)) if name.endswith(".pth")]
        except OSError:
            continue
        for name in pths:
            added += [os.path.join(site, line.rstrip()) for line in _text(os.path.join(site, name)).splitlines()
                      if line.strip() and not line.startswith(("#", "import ", "import\t"))]
    return added


def _entries_problem(directory: str) -> "Optional[str]":
    """Each entry directly in *directory* (a module, a package, a ``.pth``) and everything in the
    ``vq_admin`` package there: owned by you or root and not writable by others (a symlink: its owner,
    and what it points to by the whole rule; one pointing nowhere: nobody else may create its target)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    me = os.geteuid()
    paths = [os.path.join(directory, name) for name in names]
    for top, dirs, files in os.walk(os.path.join(directory, "vq_admin")):  # the installed agent package, whole
        paths += [os.path.join(top, name) for name in dirs + files]
    for path in paths:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, me):
                return f"symlink {path} is owned by {describe_owner(st.st_uid)}"
            real = os.path.realpath(path)
            problem = path_problem(real, what=f"the target of symlink {path}", missing_ok=True) or (
                None if os.path.exists(real) else creatable_problem(real, what=f"the target of symlink {path}"))
            if problem:
                return problem
            continue
        problem = level_problem(path, st, is_dir=stat.S_ISDIR(st.st_mode))
        if problem:
            return problem
    return None


def judge(argv: "List[str]") -> "NoReturn":
    """``BLOB N AGENT-WORDS... VERB...``: judge the agent, then ``exec`` it isolated (see the module)."""
    count = int(argv[1])
    words, rest = argv[2:2 + count], argv[2 + count:]
    interp, script = _interpreter(_first_word(words[0]))
    script, lead, args = _what_runs(script, words[1:])
    standalone = script is not None and b"PK\x03\x04" in _head(script)  # vq-admin-agent.pyz: no site-packages
    if not standalone:
        entered: "set[str]" = set()
        for directory in _import_path(interp):
            _judged(directory, "a directory on the agent's import path", missing_ok=True)
            if os.path.realpath(directory) in entered:  # a venv's lib64 -> lib: the same entries, judged once
                continue
            entered.add(os.path.realpath(directory))
            problem = _entries_problem(directory)
            if problem:
                _fail(REFUSED, f"{problem} (on the agent's import path); another user could change what the "
                               f"agent imports; {_RAN[0]}")
    try:
        os.execv(interp, [interp, "-I", *(["-S"] if standalone else []), *lead, *args, *rest])
    except OSError as exc:
        _fail(127, f"{interp}: {exc.strerror}; {_RAN[0]}")


def _first_word(word: str) -> str:
    """The agent's first word as a path (a bare name looked up in ``PATH``), judged, and there."""
    first = word if "/" in word else _which(word)
    if first is None:
        _fail(127, f"{word}: not found in PATH; nothing was run")
    _judged(first, "the agent", missing_ok=True)  # a missing one: nobody else may create it
    if not os.path.exists(first):
        _fail(127, f"{first}: not found; nothing was run")
    return first


def _interpreter(first: str) -> "Tuple[str, Optional[str]]":
    """(the Python interpreter that runs the agent, judged; the script it runs when *first* is a ``#!``
    script, else ``None``); anything but Python (a wrapper: env, nice, sh) is refused."""
    interp, script = first, None
    head = _head(first)
    if head.startswith(b"#!"):
        shebang = head[2:].split(b"\n")[0].decode("utf-8", "replace").split()
        named = _which(shebang[1]) if shebang[1:] and os.path.basename(shebang[0]) == "env" else (shebang or [""])[0]
        if not named:
            _fail(127, f"{first}: its interpreter ({' '.join(shebang)}) was not found; nothing was run")
        _judged(named, "the agent's interpreter")
        interp, script = named, first
    if not os.path.basename(os.path.realpath(interp)).startswith("python"):  # a wrapper: env, nice, sh
        _fail(REFUSED, f"the agent's first word must be a Python interpreter or a Python script; {first} "
                       f"{'is' if interp == first else 'runs ' + interp + ', which is'} not Python and would run "
                       "the agent unjudged; nothing was run")
    return interp, script


def _what_runs(script: "Optional[str]", args: "List[str]") -> "Tuple[Optional[str], List[str], List[str]]":
    """(the agent's script, judged, or ``None``; the words naming what the interpreter runs: ``-m MODULE``,
    the script or none; the words after them) from the words after the interpreter (its options dropped)."""
    while script is None and args and args[0] in _OPTIONS:
        args = args[1:]
    if args[:1] == ["-m"]:
        return script, args[:2], args[2:]
    if script is None and args:
        script, args = args[0], args[1:]
        _judged(script, "the agent")
    return script, [script] if script else [], args


_BLOB: "List[str]" = []


def blob() -> str:
    """The judge's program (the secure-path rule's module and this one, as they are, then a call of
    :func:`judge`), compressed, in a word that every login shell reads literally; built once per process."""
    if not _BLOB:
        import base64
        import zlib

        from . import securepath

        parts: "List[str]" = []
        for module in (securepath, sys.modules[__name__]):
            with open(module.__file__ or "", encoding="utf-8") as fh:
                text = fh.read().replace("from .securepath import", "# (in the blob) from .securepath import")
                parts.append(text if not parts else text.replace("from __future__ import", "# from __future__ import"))
        packed = zlib.compress("\n".join(parts + ["judge(sys.argv[1:])\n"]).encode(), 6)
        packed += b"\0" * (-len(packed) % 3)  # no "=" padding: zlib ignores what follows its stream
        _BLOB.append(base64.urlsafe_b64encode(packed).decode())
    return _BLOB[0]


def launch(agent: "Sequence[str]") -> "List[str]":
    """The words that run the configured *agent* words judged and isolated (the verb's words follow)."""
    return [JUDGE_PYTHON, "-I", "-S", "-c", CODE, blob(), str(len(agent)), *agent]


#: Every configured agent's words (:class:`vq_admin.config.HostConfig` adds its own): an argv that starts
#: with one of them and a verb of the protocol runs the agent, and is judged (:func:`judged`).
AGENTS: "set[tuple[str, ...]]" = set()


def judged(argv: "Sequence[str]") -> "List[str]":
    """*argv* as it is run: an agent call (a configured agent's words, then a verb of
    :data:`vq_admin.core.protocol.VERBS`) behind :func:`launch`; any other argv as it is.  Every
    transport applies it where it builds the local argv, so receipts and plans keep the agent's
    own words and no agent call runs unjudged."""
    from .protocol import VERBS

    for words in AGENTS:
        if len(argv) > len(words) and tuple(argv[:len(words)]) == words and argv[len(words)] in VERBS:
            return launch(words) + list(argv[len(words):])
    return list(argv)
