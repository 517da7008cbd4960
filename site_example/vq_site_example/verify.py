"""``verify``: read-only report of what IS active, as one JSON object on stdout.

The receipt (CONTRACT section 4) is built only from the runtime root, never
from the request: ``--program``, ``--expected-sha`` and ``--tag`` are
validated and mentioned in ``health_detail`` but never copied into a field.

* ``source_sha``/``program``/``tag``: the ``SOURCE-SHA``/``PROGRAM``/``TAG``
  files of the release ``current`` points at (found with ``readlink``);
* ``activation``: ``"atomic"`` when ``current`` is a symlink to
  ``releases/<full sha>`` (relative, or absolute below ROOT) and that is a
  real directory; ``"none"`` when there is no ``current`` or it is not a
  symlink; ``"unknown"`` when it points anywhere else or dangles;
* ``healthy``: the release carries ``VALIDATED``, its ``SOURCE-SHA`` equals
  its directory name, and one start of the launcher exits 0 within
  :data:`HEALTH_TIMEOUT` seconds: the launcher runs the source's
  ``vq_selftest.py`` when it has one (which proves the launcher starts too),
  else ``-c pass``.  ``health_detail`` names the check and how it failed: the
  launcher could not start at all (``exec`` failed), or the command exited N,
  was killed by a signal, or ran past the bound (its process group is then
  killed);
* ``quiescent``/``updater_pid``: a non-blocking shared flock on
  ``.deploy.lock``; when it is held, the pid from ``.updater.pid``;
* ``active_path``: ``ROOT/releases/<sha>/source/.venv/bin/python`` (never via
  ``current``) and ``active_path_sha256`` the SHA-256 of the file it resolves to.

When nothing is active (no ROOT, no ``current``) verify still prints a
receipt and exits 0: ``healthy`` false, ``activation`` ``"none"``, empty
``program``/``source_sha``/``active_path``/``active_path_sha256``.  Exit 2 is
kept for usage errors, which print nothing on stdout.

Run for every update, so this path loads little: no ``argparse`` (its options
are read by hand, :func:`parse`), no ``re`` (:mod:`~vq_site_example.namecheck`),
no ``json`` (:mod:`~vq_site_example.plainjson` writes the same text) and no
``subprocess`` (:mod:`~vq_site_example.spawn`); ``tests/test_site_example_verify.py``
pins the modules it loads.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

from . import build, fsutil, plainjson, spawn
from .layout import RELEASES_NAME, Layout, probe_quiescent
from .namecheck import is_full_sha, is_program, is_tag

TYPE_CHECKING = False  # not typing's (nor argparse): verify runs for every update
if TYPE_CHECKING:
    import argparse
    from typing import Any, Sequence

#: Seconds the health command (one start of the launcher) may take.
HEALTH_TIMEOUT = 60


def _target_sha(lyt: Layout, target: str) -> str | None:
    """The full SHA when *target* names ``releases/<full sha>`` of this root."""
    for prefix in (RELEASES_NAME + "/", lyt.releases + "/"):
        if target.startswith(prefix):
            name = target[len(prefix):]
            if is_full_sha(name) and name == name.lower():
                return name
    return None


def _meta(release: str, name: str, problems: list[str]) -> str | None:
    try:
        return fsutil.read_small(os.path.join(release, name)).strip()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"cannot read {name}: {exc}")
        return None


def _tail(output: str) -> str:
    lines = output.strip().splitlines()
    return f": {' / '.join(lines[-3:])[-300:]}" if lines else ""


def _health(launcher: str, source: str, problems: list[str], notes: list[str]) -> None:
    """One start of the launcher: the source's selftest when it has one (it starts only if the
    launcher does), else ``-c pass``."""
    if not os.path.isfile(launcher):
        problems.append(f"launcher {launcher} is missing")
        return
    argv = build.check_argv(launcher, source)
    what = f"{build.SELFTEST} (run by the launcher)" if len(argv) == 2 else "launcher -c pass"
    ran = spawn.run(argv, source, build.clean_env(), HEALTH_TIMEOUT)
    if not ran.started:
        problems.append(f"launcher {ran.failure}")
    elif ran.failure:
        problems.append(f"{what} {ran.failure}{_tail(ran.output)}")
    else:
        notes.append(f"{what} ok")


def inspect(lyt: Layout) -> dict[str, Any]:
    """Build the verify receipt for the runtime root *lyt*."""
    quiescent, pid = probe_quiescent(lyt)
    receipt: dict[str, Any] = {
        "program": "", "source_sha": "", "tag": None, "healthy": False, "activation": "none",
        "quiescent": quiescent, "updater_pid": pid, "active_path": "", "active_path_sha256": "",
        "health_detail": "",
    }
    problems: list[str] = []
    notes: list[str] = [] if quiescent else [f"a deploy holds {lyt.lock_path} (pid {pid})"]

    def done() -> dict[str, Any]:
        receipt["health_detail"] = "; ".join(notes + problems)
        receipt["healthy"] = not problems and receipt["activation"] == "atomic"
        return receipt

    if not fsutil.is_real_dir(lyt.root):
        problems.append(f"nothing active: {lyt.root} is not a real directory")
        return done()
    try:
        target = os.readlink(lyt.current)
    except FileNotFoundError:
        problems.append(f"nothing active: {lyt.current} does not exist")
        return done()
    except OSError:
        problems.append(f"{lyt.current} is not a symlink; no atomic activation")
        return done()
    sha = _target_sha(lyt, target)
    release = lyt.release(sha) if sha else ""
    if sha is None or not fsutil.is_real_dir(release):
        receipt["activation"] = "unknown"
        problems.append(f"{lyt.current} -> {target!r} is not a real releases/<full sha> directory")
        return done()
    receipt["activation"] = "atomic"
    notes.append(f"current -> {target}")
    source_sha = _meta(release, "SOURCE-SHA", problems)
    receipt["source_sha"] = source_sha or ""
    receipt["program"] = _meta(release, "PROGRAM", problems) or ""
    receipt["tag"] = _meta(release, "TAG", problems) or None
    if source_sha is not None and source_sha != sha:
        problems.append(f"SOURCE-SHA {source_sha} differs from the release directory name {sha}")
    validated = _meta(release, "VALIDATED", problems)
    if validated:
        notes.append(f"marker: {validated}")
    launcher = lyt.launcher(sha)
    receipt["active_path"] = launcher
    try:
        receipt["active_path_sha256"] = fsutil.sha256_file(launcher)
    except OSError as exc:
        problems.append(f"cannot hash {launcher}: {exc}")
    _health(launcher, os.path.join(release, "source"), problems, notes)
    return done()


#: ``verify``'s options (each required once but ``--tag``) and how each value is checked.
_OPTIONS = {"--root": "root", "--program": "program", "--expected-sha": "expected_sha", "--tag": "tag"}


def parse(words: Sequence[str]) -> SimpleNamespace | None:
    """``verify ROOT/PROGRAM/SHA[/TAG]`` options, read by hand when plainly well-formed: each option
    once, as ``--opt VALUE`` or ``--opt=VALUE``, every value valid.  Anything else returns ``None``:
    the whole grammar (:func:`vq_site_example.args.parse`) then reads them and words any usage error."""
    values: dict[str, str] = {}
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        i += 1
        key = _OPTIONS.get(name)
        if key is None or key in values:
            return None
        if not eq:
            if i >= len(words):
                return None
            value = words[i]
            i += 1
        if not value or value.startswith("-"):
            return None
        values[key] = value
    root, program, sha, tag = (values.get(k) for k in ("root", "program", "expected_sha", "tag"))
    if root is None or not root.startswith("/") or "\0" in root:
        return None
    if program is None or not is_program(program) or sha is None or not is_full_sha(sha):
        return None
    if tag is not None and not is_tag(tag):
        return None
    return SimpleNamespace(verb="verify", root=os.path.normpath(root), program=program, expected_sha=sha.lower(),
                           tag=tag)


def run(ns: argparse.Namespace | SimpleNamespace) -> int:
    """Entry point of the ``verify`` verb: print the receipt, exit 0."""
    receipt = inspect(Layout(ns.root))
    requested = f"requested {ns.program} {ns.expected_sha} tag {ns.tag or '-'}"
    receipt["health_detail"] = f"{receipt['health_detail']}; {requested}".lstrip("; ")
    print(plainjson.dumps(receipt))
    return 0
