"""``prune``: remove old releases that nothing references any more (README.md, "prune").

A release ``ROOT/releases/<sha>`` is removed only when it is a real directory named by a full
lower-case SHA, ``current`` does not point at it, nothing keeps it (``--keep``, ``--keep-sha``,
a reason in the census of ``vq admin references P HOST --json``) and its ``PROGRAM`` file
names the program.  A doubtful census or ``current`` removes nothing; the deploy lock is held
for the whole run.  A release is first renamed to ``releases/.removing.<sha>.<r>`` (so it
never looks complete while half removed), then deleted.

The census cannot see a job submitted after it was taken: run the census and prune back to
back, and let the queue driver bind new jobs to the latest verified generation
(``vq admin launcher``), which is always kept as current.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import secrets
import time

from vq_admin_identifiers import FULL_SHA_RE

from . import fsutil
from .errors import failed, usage
from .layout import DeployLock, Layout, read_current, release_named

CENSUS_SCHEMA = "vq-admin/references/1"
MAX_CENSUS_BYTES = 64 << 20


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
    _check_fresh(path, doc.get("taken_at"), max_age)
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


def _check_fresh(path: str, taken_at: object, max_age: float) -> None:
    """Refuse a census not taken within *max_age* seconds (its ``taken_at``, UTC)."""
    try:
        taken = calendar.timegm(time.strptime(str(taken_at), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        raise usage(f"--referenced-file {path}: taken_at {taken_at!r} is not a UTC time; nothing removed") from None
    if time.time() - taken > max_age:
        raise usage(f"--referenced-file {path} was taken at {taken_at}, more than {max_age:.0f} s ago; "
                    "take a fresh census (vq admin references ... --json); nothing removed")


def _current_sha(lyt: Layout) -> str:
    target = read_current(lyt)
    name = release_named(lyt, target) if target else None
    if not name or not fsutil.is_real_dir(lyt.release(name)):
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


def _releases(lyt: Layout) -> list[str]:
    """The releases: the real directories of ``releases`` named by a full lower-case SHA, sorted."""
    return [name for name in sorted(os.listdir(lyt.releases))
            if FULL_SHA_RE.match(name) and name == name.lower() and fsutil.is_real_dir(lyt.release(name))]


def run(ns: argparse.Namespace) -> int:
    """Entry point of the ``prune`` verb; returns the exit code."""
    if not 0 < ns.max_age < float("inf"):
        raise usage(f"--max-age {ns.max_age} must be a positive number of seconds")
    if ns.referenced_file is None and not ns.keep:
        raise usage("give the keep set (--keep SHA ..., as vq admin prune does) or --referenced-file CENSUS; "
                    "nothing removed")
    referenced = read_census(ns.referenced_file, ns.program, ns.max_age) if ns.referenced_file is not None else {}
    for sha in ns.keep:
        referenced.setdefault(sha, []).append("--keep")
    lyt = Layout(ns.root)
    if not fsutil.is_real_dir(lyt.root) or not fsutil.is_real_dir(lyt.releases):
        raise usage(f"{lyt.releases} is not a real directory; nothing to prune")
    kept: dict[str, list[str]] = {}
    removed: list[str] = []
    with DeployLock(lyt):
        current = _current_sha(lyt)
        for name in _releases(lyt):
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
    report = {"root": lyt.root, "program": ns.program, "current": current, "dry_run": ns.dry_run,
              "kept": kept, "removed": removed}
    if ns.keep:  # the vq-admin prune report: kept as a list, the reasons apart
        report.update(kept=sorted(kept), reasons=kept)
    print(json.dumps(report, sort_keys=True))
    return 0
