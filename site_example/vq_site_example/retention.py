"""``prune``: remove old releases that nothing references any more.

::

    vq-site-example prune --root ROOT --program P --referenced-file CENSUS
                          [--keep-sha SHA]... [--max-age SECONDS] [--dry-run]
    vq-site-example prune --root ROOT --program P --keep SHA [--keep SHA]...

The second form is what ``vq admin prune`` runs (``prune_command``, or the
plugin's ``vq_admin_runtime_prune`` hook): vq-admin has computed the keep set
(active, LAST OK, LAST GOOD, recent, every SHA a Slurm job references) and
the report on stdout is ``{"removed": [...], "kept": [...]}`` (plus
``reasons``, ``current``, ``root``).

``CENSUS`` is the output of ``vq admin references P HOST --json`` (schema
``vq-admin/references/1``), taken just before.  A release ``ROOT/releases/<sha>``
is removed only when every one of these holds:

* its name is a full lower-case SHA and it is a real directory (never a
  symlink, never a ``.partial.*`` build);
* ``current`` does not point at it;
* it is not named by ``--keep-sha`` or ``--keep``;
* the census gives it no reason to be kept (``current``, ``last-good``, or a
  queued or running job whose script or command names it);
* its ``PROGRAM`` file names ``P``.

Fail closed: a census that is missing, unreadable, incomplete, for another
program, or older than ``--max-age`` (default 900 s) removes nothing (exit 2
or 1); so does a ``current`` that cannot be read.  The deploy lock is held
for the whole run, so no deploy switches ``current`` meanwhile (exit 75 when
a deploy runs).  A release is first renamed to ``releases/.removing.<sha>.<r>``
(so it never looks complete while half removed), then deleted.  One JSON
object on stdout says what was kept (and why) and what was removed.

The census cannot see a job submitted after it was taken: run the census and
prune back to back, and let the queue driver bind new jobs to the latest
verified generation (``vq admin launcher``), which is always kept as current.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import secrets
import time
from typing import NoReturn, Sequence

from . import fsutil
from .args import FULL_SHA_RE, full_sha, program_name, root_path
from .errors import failed, usage
from .layout import DeployLock, Layout, read_current, RELEASES_NAME

CENSUS_SCHEMA = "vq-admin/references/1"
MAX_CENSUS_BYTES = 64 << 20
DEFAULT_MAX_AGE = 900.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise usage(f"{self.prog}: {message}")


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = _Parser(prog="vq-site-example prune", allow_abbrev=False,
                     description="Remove releases that are not current, not kept and not referenced.")
    parser.add_argument("--root", required=True, type=root_path)
    parser.add_argument("--program", required=True, type=program_name)
    parser.add_argument("--referenced-file", metavar="CENSUS",
                        help="output of 'vq admin references PROGRAM HOST --json'")
    parser.add_argument("--keep", type=full_sha, action="append", default=[], metavar="SHA",
                        help="the keep set computed by 'vq admin prune' (repeatable); prints kept as a list")
    parser.add_argument("--keep-sha", type=full_sha, action="append", default=[], metavar="SHA")
    parser.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE, metavar="SECONDS",
                        help="refuse a census older than this (default 900)")
    parser.add_argument("--dry-run", action="store_true", help="report what would be removed; remove nothing")
    return parser.parse_args(list(argv))


def read_census(path: str, program: str, max_age: float) -> dict[str, list[str]]:
    """``{sha: reasons}`` of every referenced generation in the census; refuses anything doubtful."""
    try:
        doc = json.loads(fsutil.read_small(path, MAX_CENSUS_BYTES))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise usage(f"--referenced-file {path}: not a readable census ({exc}); nothing removed") from None
    if not isinstance(doc, dict) or doc.get("schema") != CENSUS_SCHEMA or doc.get("complete") is not True:
        raise usage(f"--referenced-file {path}: not a complete {CENSUS_SCHEMA} document; nothing removed")
    if doc.get("program") != program:
        raise usage(f"--referenced-file {path} is the census of {doc.get('program')!r}, not {program!r}; "
                    "nothing removed")
    try:
        taken = calendar.timegm(time.strptime(str(doc.get("taken_at")), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        raise usage(f"--referenced-file {path}: taken_at {doc.get('taken_at')!r} is not a UTC time; "
                    "nothing removed") from None
    if time.time() - taken > max_age:
        raise usage(f"--referenced-file {path} was taken at {doc['taken_at']}, more than {max_age:.0f} s ago; "
                    "take a fresh census (vq admin references ... --json); nothing removed")
    referenced: dict[str, list[str]] = {}
    rows = doc.get("generations")
    if not isinstance(rows, list):
        raise usage(f"--referenced-file {path}: generations is not a list; nothing removed")
    for row in rows:
        sha, reasons = (row.get("sha"), row.get("reasons")) if isinstance(row, dict) else (None, None)
        if not isinstance(sha, str) or not FULL_SHA_RE.match(sha) or not isinstance(reasons, list):
            raise usage(f"--referenced-file {path}: a generation without a full sha and reasons; nothing removed")
        if reasons:
            referenced[sha.lower()] = [str(r) for r in reasons]
    return referenced


def _current_sha(lyt: Layout) -> str:
    target = read_current(lyt)
    name = target[len(RELEASES_NAME) + 1:] if target and target.startswith(RELEASES_NAME + "/") else None
    if target and target.startswith(lyt.releases + "/"):
        name = target[len(lyt.releases) + 1:]
    if not name or not FULL_SHA_RE.match(name) or not fsutil.is_real_dir(lyt.release(name)):
        raise failed(f"{lyt.current} -> {target!r} does not name a release; not pruning while current is unknown")
    return name


def _program_of(release: str) -> str | None:
    try:
        return fsutil.read_small(os.path.join(release, "PROGRAM")).strip()
    except (OSError, UnicodeDecodeError):
        return None


def _remove(lyt: Layout, sha: str) -> None:
    doomed = os.path.join(lyt.releases, f".removing.{sha}.{secrets.token_hex(6)}")
    os.rename(lyt.release(sha), doomed)
    fsutil.fsync_dir(lyt.releases)
    fsutil.remove_own_tree(doomed)


def run(argv: Sequence[str]) -> int:
    """Entry point of the ``prune`` verb; returns the exit code."""
    ns = parse(argv)
    if not 0 < ns.max_age < float("inf"):
        raise usage(f"--max-age {ns.max_age} must be a positive number of seconds")
    if ns.referenced_file is None and not ns.keep:
        raise usage("give the keep set (--keep SHA ..., as vq admin prune does) or --referenced-file CENSUS; "
                    "nothing removed")
    referenced = read_census(ns.referenced_file, ns.program, ns.max_age) if ns.referenced_file else {}
    for sha in ns.keep:
        referenced.setdefault(sha, []).append("--keep")
    lyt = Layout(ns.root)
    if not fsutil.is_real_dir(lyt.root) or not fsutil.is_real_dir(lyt.releases):
        raise usage(f"{lyt.releases} is not a real directory; nothing to prune")
    kept: dict[str, list[str]] = {}
    removed: list[str] = []
    with DeployLock(lyt):
        current = _current_sha(lyt)
        for name in sorted(os.listdir(lyt.releases)):
            if not FULL_SHA_RE.match(name) or name != name.lower() or not fsutil.is_real_dir(lyt.release(name)):
                continue
            reasons = (["current"] if name == current else []) + (["--keep-sha"] if name in ns.keep_sha else [])
            reasons += referenced.get(name, [])
            if _program_of(lyt.release(name)) != ns.program:
                reasons.append(f"PROGRAM is not {ns.program}")
            if reasons:
                kept[name] = reasons
                continue
            if not ns.dry_run:
                _remove(lyt, name)
            removed.append(name)
    if ns.keep:  # the vq-admin prune report: kept as a list, the reasons apart
        print(json.dumps({"root": lyt.root, "program": ns.program, "current": current, "dry_run": ns.dry_run,
                          "kept": sorted(kept), "reasons": kept, "removed": removed}, sort_keys=True))
        return 0
    print(json.dumps({"root": lyt.root, "program": ns.program, "current": current, "dry_run": ns.dry_run,
                      "kept": kept, "removed": removed}, sort_keys=True))
    return 0
