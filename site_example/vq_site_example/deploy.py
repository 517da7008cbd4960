"""``deploy`` and ``install``: build one immutable release, then switch ``current``;
``activate``: switch ``current`` back to an existing release (rollback).

README.md ("The runtime root") gives the order of one deploy: each step runs only after the
previous one succeeded, and a failure before the switch leaves ``current`` and every existing
release untouched and removes only this run's partial directory (exit 1, or 3 for identity).
``activate`` builds nothing: it accepts ``releases/<sha>`` as a reuse would, then switches.
Metrics go to stdout as ``VQ-DEPLOY-METRIC name=value``; narration and the build log to stderr.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from . import build, fsutil, layout as lay
from .errors import failed, usage
from .identity import VerifiedArchive, check_archive
from .unpack import extract

VALIDATED = "VALIDATED"


def _say(text: str) -> None:
    print(f"vq-site-example: {text}", file=sys.stderr, flush=True)


def _metric(name: str, value: object) -> None:
    print(f"VQ-DEPLOY-METRIC {name}={value}", flush=True)


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _echo_log(lines: list[str]) -> None:
    """Copy log lines to stderr, indented so no line can pose as a metric."""
    for line in lines:
        print(f"  | {line}", file=sys.stderr)
    sys.stderr.flush()


def _extra_env(ns: argparse.Namespace) -> dict[str, str]:
    jobs = getattr(ns, "jobs", None)  # activate has no --jobs
    return {"VQ_BUILD_JOBS": str(jobs)} if jobs is not None else {}


def _read_meta(release: str, name: str) -> str:
    try:
        return fsutil.read_small(os.path.join(release, name)).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise failed(f"existing release {release} has no readable {name}: {exc}; "
                     "it is left as it is; move it aside deliberately to rebuild") from None


def _reuse(lyt: lay.Layout, ns: argparse.Namespace) -> None:
    """Accept an existing ``releases/<sha>`` only when it is complete and matches."""
    release = lyt.release(ns.expected_sha)
    if not fsutil.is_real_dir(release):
        raise failed(f"{release} exists but is not a real directory; not touching it")
    if not os.path.lexists(os.path.join(release, VALIDATED)):
        raise failed(f"{release} exists but has no {VALIDATED} marker (not built by a completed "
                     "deploy); it is left as it is; move it aside deliberately to rebuild")
    for name, want in (("SOURCE-SHA", ns.expected_sha), ("PROGRAM", ns.program), ("TAG", ns.tag or "")):
        have = _read_meta(release, name)
        if have != want:
            raise failed(f"existing release {release} records {name} {have!r}, the request is {want!r}; "
                         "releases are immutable, so it is neither rewritten nor activated")
    ok, detail, output = build.check(lyt.launcher(ns.expected_sha, ns.program), os.path.join(release, "source"),
                                     build.BUILD_TIMEOUT, _extra_env(ns))
    _echo_log([*output.splitlines(), detail])
    if not ok:
        raise failed(f"existing release {release} fails validation now ({detail}); current unchanged")


def _header(ns: argparse.Namespace, archive: VerifiedArchive) -> list[str]:
    return [
        f"vq-site-example {ns.verb} of {ns.program} {ns.expected_sha}",
        f"tag: {ns.tag or '-'}",
        f"archive: {archive.path} sha256 {archive.sha256} ({archive.size} bytes)",
        f"host: {socket.gethostname()}  started: {_utc_now()}  pid: {os.getpid()}",
        f"builder python: {sys.executable}",
        f"jobs: {ns.jobs if ns.jobs is not None else '-'}",
        f"note: {ns.note or '-'}",
    ]


def _build_new(lyt: lay.Layout, ns: argparse.Namespace, archive: VerifiedArchive) -> None:
    """Unpack, build and validate in a fresh partial dir, then publish it."""
    sha = ns.expected_sha
    with lay.new_release(lyt, sha) as partial:
        source = os.path.join(partial, "source")
        os.mkdir(source, 0o755)
        with archive.open_tar() as tar:
            count = extract(tar, source)
        log = _header(ns, archive) + [f"unpacked {count} members into {source}"]
        launcher, build_log = build.build_runtime(partial, lyt.release(sha), ns.program, sha)
        log += build_log
        ok, detail, output = build.check(launcher, source, build.BUILD_TIMEOUT, _extra_env(ns))
        log += [*output.splitlines(), f"validation: {'passed' if ok else 'FAILED'} ({detail})"]
        fsutil.atomic_write(partial, "BUILD-LOG", "\n".join(log) + "\n")
        _echo_log(log)
        if not ok:
            raise failed(f"validation failed: {detail}; releases/{sha} not created, current unchanged")
        fsutil.atomic_write(partial, "SOURCE-SHA", sha + "\n")
        fsutil.atomic_write(partial, "TAG", (ns.tag + "\n") if ns.tag else "")
        fsutil.atomic_write(partial, "PROGRAM", ns.program + "\n")
        fsutil.atomic_write(partial, "ARCHIVE-SHA256", archive.sha256 + "\n")
        fsutil.atomic_write(partial, VALIDATED, f"validated {_utc_now()}: {detail}\n")


def _locked(lyt: lay.Layout, ns: argparse.Namespace) -> int:
    with check_archive(ns.source_archive, ns.expected_sha) as archive:
        _say(f"archive identity ok: {ns.source_archive} is commit {ns.expected_sha} "
             f"(sha256 {archive.sha256})")
        started = time.monotonic()
        reused = os.path.lexists(lyt.release(ns.expected_sha))
        if reused:
            _say(f"releases/{ns.expected_sha} already exists; reusing it (not rebuilt)")
            _reuse(lyt, ns)
        else:
            _build_new(lyt, ns, archive)
    _metric("build_seconds", f"{time.monotonic() - started:.3f}")
    _metric("release_bytes", fsutil.tree_bytes(lyt.release(ns.expected_sha)))
    _metric("release_reused", int(reused))
    previous = lay.switch_current(lyt, ns.expected_sha)
    _say(f"current -> releases/{ns.expected_sha} (was {previous or 'absent'}); "
         f"launcher {lyt.launcher(ns.expected_sha, ns.program)}")
    return 0


def run(ns: argparse.Namespace) -> int:
    """Entry point of the ``deploy`` and ``install`` verbs; returns the exit code."""
    if ns.source_archive is None:
        raise usage("this provider builds from the staged archive: --source-archive PATH is required")
    os.umask(0o022)
    lyt = lay.Layout(ns.root)
    lay.check_layout(lyt, create=(ns.verb == "install"))
    with lay.DeployLock(lyt):
        return _locked(lyt, ns)


def activate(ns: argparse.Namespace) -> int:
    """Entry point of the ``activate`` verb (``vq admin rollback``); returns the exit code."""
    lyt = lay.Layout(ns.root)
    lay.check_layout(lyt, create=False)
    with lay.DeployLock(lyt):
        release = lyt.release(ns.expected_sha)
        if not os.path.lexists(release):
            raise failed(f"{release} does not exist; activation never builds: deploy {ns.expected_sha} instead")
        _reuse(lyt, ns)
        previous = lay.switch_current(lyt, ns.expected_sha)
    _say(f"current -> releases/{ns.expected_sha} (was {previous or 'absent'}); nothing built")
    return 0
