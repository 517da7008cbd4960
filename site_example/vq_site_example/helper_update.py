"""Console script ``vq-site-example-helper-update``: install the staged vq helper
(``vq-admin-agent``) out of place, prove it, and switch to it atomically.

vq-admin runs it as ``helper_update_command`` (or ``helper_install_command``) with the
verified stage in ``VQ_HELPER_STAGE``, ``VQ_HELPER_EXPECTED_SHA`` and
``VQ_HELPER_EXPECTED_TREE_SHA256``.  It reuses the runtime root's layout, deploy lock and
exit codes; README.md ("The helper updater") gives the layout, the order of one run and
what the wrapper ``ROOT/bin/vq-admin-agent`` does.  An existing ``releases/<sha>`` is reused
only when its record and files match; releases are never rewritten or removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from typing import Sequence

from vq_admin_identifiers import FULL_SHA_RE, SHA256_RE

from . import fsutil, layout as lay
from .cli import Parser, terminate
from .errors import SiteError, failed, identity, usage
from .identity import VerifiedArchive, check_archive, stage_value
from .unpack import extract

RECORD_NAME = ".vq-admin-source.json"
WRAPPER_NAME = "vq-admin-agent"
VALIDATE_TIMEOUT = 120
#: Runs ``vq_admin.agent`` from the release given as the first argument.
BOOT = ("import sys; sys.dont_write_bytecode = True; sys.path.insert(0, sys.argv.pop(1)); "
        "from vq_admin.agent.cli import main; sys.exit(main(sys.argv[1:]))")
WRAPPER = """#!{python} -I
# vq-admin-agent: written by vq-site-example-helper-update. It runs the helper
# release that {current} names (resolved once per run) with a fixed
# interpreter, writing no bytecode into the release. Do not edit by hand.
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.realpath({current!r}))
from vq_admin.agent.cli import main

sys.exit(main())
"""


def _say(text: str) -> None:
    print(f"vq-site-example-helper-update: {text}", file=sys.stderr, flush=True)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line; the request itself comes from the environment."""
    parser = Parser(prog="vq-site-example-helper-update", allow_abbrev=False)
    parser.add_argument("--root", required=True, help="absolute helper root")
    parser.add_argument("--install", action="store_true", help="create ROOT when missing (first installation)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter the wrapper runs (default: the one running this installer)")
    ns = parser.parse_args(list(argv))
    for name in ("root", "python"):
        value = getattr(ns, name)
        if not os.path.isabs(value) or any(c.isspace() for c in value) or os.path.normpath(value) != value:
            raise usage(f"--{name} must be an absolute, normalised path without whitespace (got {value!r})")
    env = os.environ
    ns.stage = env.get("VQ_HELPER_STAGE", "")
    ns.sha = env.get("VQ_HELPER_EXPECTED_SHA", "").lower()
    ns.tree = env.get("VQ_HELPER_EXPECTED_TREE_SHA256", "").lower()
    if not os.path.isabs(ns.stage):
        raise usage("VQ_HELPER_STAGE must name the verified stage directory (absolute path)")
    if not FULL_SHA_RE.match(ns.sha):
        raise usage("VQ_HELPER_EXPECTED_SHA must be a full commit SHA (40 or 64 hex digits)")
    if not SHA256_RE.match(ns.tree):
        raise usage("VQ_HELPER_EXPECTED_TREE_SHA256 must be 64 hex digits")
    return ns


def tree_sha256(root: str, skip: str = RECORD_NAME) -> str:
    """SHA-256 over the sorted lines ``<git mode> <sha256> <path>\\n`` of every
    file and symlink below *root* except ``skip`` at the top.

    An independent implementation of the digest vq-admin computes from the
    archive: if the two ever disagree, installation fails closed.
    """
    lines: list[bytes] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):  # never into a symlinked directory
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if rel == skip:
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                mode, digest = b"120000", hashlib.sha256(os.fsencode(os.readlink(full))).hexdigest()
            elif stat.S_ISREG(st.st_mode):
                mode = b"100755" if st.st_mode & 0o100 else b"100644"
                digest = fsutil.sha256_file(full)
            else:
                raise failed(f"{full} is neither a file nor a symlink")
            lines.append(mode + b" " + digest.encode() + b" " + os.fsencode(rel) + b"\n")
    lines.sort(key=lambda line: line.split(b" ", 2)[2])
    return hashlib.sha256(b"".join(lines)).hexdigest()


def validate(python: str, release: str, sha: str, tree: str) -> None:
    """Run the helper in *release* itself: its identity must be bound to *sha* and *tree*."""
    argv = [python, "-I", "-B", "-c", BOOT, release, "identity", "--json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=VALIDATE_TIMEOUT,
                              stdin=subprocess.DEVNULL, check=False)
    except OSError as exc:
        raise failed(f"the new helper in {release} could not be started: {exc}") from None
    except subprocess.TimeoutExpired:  # it ran, and may have done anything it does: never "did not run"
        raise failed(f"the new helper in {release} did not answer within {VALIDATE_TIMEOUT:g} s") from None
    if proc.returncode != 0:
        raise failed(f"the new helper in {release} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    try:
        found = json.loads(proc.stdout)
    except ValueError:
        raise failed(f"the new helper in {release} printed no identity: {proc.stdout[-300:]!r}") from None
    if not isinstance(found, dict):
        raise failed(f"the new helper in {release} printed no identity object: {proc.stdout[-300:]!r}")
    want = {"record": "bound", "source_sha": sha, "tree_sha256": tree, "path": os.path.realpath(release)}
    wrong = {k: found.get(k) for k, v in want.items() if found.get(k) != v}
    if wrong:
        raise failed(f"the new helper in {release} does not report the requested identity: {wrong} (wanted {want})")


def _reuse(lyt: lay.Layout, sha: str, tree: str) -> None:
    release = lyt.release(sha)
    if not fsutil.is_real_dir(release):
        raise failed(f"{release} exists but is not a real directory; not touching it")
    try:
        record = json.loads(fsutil.read_small(os.path.join(release, RECORD_NAME)))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise failed(f"{release} exists without a readable {RECORD_NAME} ({exc}); releases are immutable, "
                     "so it is neither rewritten nor activated: move it aside deliberately") from None
    actual = tree_sha256(release)
    if record.get("sha") != sha or record.get("tree_sha256") != tree or actual != tree:
        raise failed(f"{release} exists but records {record.get('sha')}/{record.get('tree_sha256')} and holds "
                     f"tree {actual}; the request is {sha}/{tree}; not rewritten, not activated")


def _install_new(lyt: lay.Layout, ns: argparse.Namespace, archive: VerifiedArchive) -> None:
    with lay.new_release(lyt, ns.sha) as partial:
        with archive.open_tar() as tar:
            count = extract(tar, partial)
        actual = tree_sha256(partial)
        if actual != ns.tree:
            raise identity(f"the unpacked helper tree is {actual}, the stage says {ns.tree}; not installed")
        record = {"schema": "vq-admin/helper-source/1", "sha": ns.sha, "tree_sha256": actual,
                  "archive_sha256": archive.sha256, "installed_by": "vq-site-example-helper-update",
                  "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "uid": os.geteuid()}
        fsutil.atomic_write(partial, RECORD_NAME, json.dumps(record, sort_keys=True, indent=2) + "\n")
        validate(ns.python, partial, ns.sha, ns.tree)
        _say(f"unpacked {count} members, tree {actual} validated in {partial}")


def write_wrapper(lyt: lay.Layout, python: str) -> str:
    """Write ``ROOT/bin/vq-admin-agent`` atomically when its content differs."""
    bindir = os.path.join(lyt.root, "bin")
    if os.path.islink(bindir):
        raise failed(f"{bindir} is a symlink; refusing to write through it")
    os.makedirs(bindir, mode=0o755, exist_ok=True)
    data = WRAPPER.format(python=python, current=lyt.current).encode()
    path = os.path.join(bindir, WRAPPER_NAME)
    try:
        same = fsutil.read_small(path).encode() == data and os.stat(path).st_mode & 0o777 == 0o755
    except (OSError, UnicodeDecodeError):
        same = False
    if not same:
        fsutil.atomic_write(bindir, WRAPPER_NAME, data, 0o755)
    return path


def run(ns: argparse.Namespace) -> int:
    """Install (or reuse) ``releases/<sha>``, validate it, then switch ``current``."""
    os.umask(0o022)
    lyt = lay.Layout(ns.root)
    lay.check_layout(lyt, create=ns.install)
    started = time.monotonic()
    with lay.DeployLock(lyt):
        if stage_value(ns.stage, "SOURCE-TREE-SHA256", SHA256_RE) != ns.tree:
            raise identity(f"{ns.stage}/SOURCE-TREE-SHA256 differs from VQ_HELPER_EXPECTED_TREE_SHA256 {ns.tree}")
        with check_archive(os.path.join(ns.stage, "source.tar"), ns.sha) as archive:
            reused = os.path.lexists(lyt.release(ns.sha))
            if reused:
                _say(f"releases/{ns.sha} exists; checking it for reuse (never rewritten)")
                _reuse(lyt, ns.sha, ns.tree)
                validate(ns.python, lyt.release(ns.sha), ns.sha, ns.tree)
            else:
                _install_new(lyt, ns, archive)
        wrapper = write_wrapper(lyt, ns.python)
        previous = lay.switch_current(lyt, ns.sha)
    print(f"VQ-DEPLOY-METRIC helper_install_seconds={time.monotonic() - started:.3f}")
    print(f"VQ-DEPLOY-METRIC helper_release_reused={int(reused)}", flush=True)
    _say(f"current -> releases/{ns.sha} (was {previous or 'absent'}); entry point {wrapper}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vq-site-example-helper-update``; returns the exit code."""
    try:
        ns = parse(sys.argv[1:] if argv is None else argv)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, terminate)
        return run(ns)
    except SiteError as exc:
        print(f"vq-site-example-helper-update: error: {exc}", file=sys.stderr)
        return exc.code
