"""A minimal runtime provider command for tests/test_conformance.py.

``conformance_mini.py deploy|verify --root ROOT --fault F --program P
--expected-sha SHA [--source-archive PATH]``.  With ``--fault none`` it keeps
the provider contract (immutable ``releases/<sha>`` with the launcher
``bin/run-<sha>``, validated before ``current`` moves); each other fault
breaks exactly one rule:

* ``current-first``: publishes and switches ``current`` before validating;
* ``delete-old``: removes every other release after switching;
* ``short-sha``: verify reports a 12-digit ``source_sha``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile

LAUNCHER = '#!/bin/sh\ncd "$(dirname "$0")/../source" || exit 1\nexec {python} vq_selftest.py "$@"\n'


def switch(root: str, sha: str) -> None:
    tmp = os.path.join(root, f".current.{secrets.token_hex(4)}")
    os.symlink(f"releases/{sha}", tmp)
    os.replace(tmp, os.path.join(root, "current"))


def validate(release: str, sha: str) -> bool:
    return subprocess.call([os.path.join(release, "bin", f"run-{sha}")], stdout=subprocess.DEVNULL) == 0


def deploy(ns: argparse.Namespace) -> int:
    releases = os.path.join(ns.root, "releases")
    os.makedirs(releases, exist_ok=True)
    final = os.path.join(releases, ns.expected_sha)
    if not os.path.exists(os.path.join(final, "VALIDATED")):
        partial = os.path.join(releases, f".partial.{secrets.token_hex(4)}")
        os.makedirs(os.path.join(partial, "bin"))
        with tarfile.open(ns.source_archive) as tar:
            tar.extractall(os.path.join(partial, "source"), filter="data")
        launcher = os.path.join(partial, "bin", f"run-{ns.expected_sha}")
        with open(launcher, "w") as fh:
            fh.write(LAUNCHER.format(python=sys.executable))
        os.chmod(launcher, 0o755)
        with open(os.path.join(partial, "SOURCE-SHA"), "w") as fh:
            fh.write(ns.expected_sha + "\n")
        with open(os.path.join(partial, "PROGRAM"), "w") as fh:
            fh.write(ns.program + "\n")
        if ns.fault == "current-first":
            os.rename(partial, final)
            switch(ns.root, ns.expected_sha)
            if not validate(final, ns.expected_sha):
                return 1
        else:
            if not validate(partial, ns.expected_sha):
                shutil.rmtree(partial)
                return 1
            os.rename(partial, final)
        open(os.path.join(final, "VALIDATED"), "w").close()
    switch(ns.root, ns.expected_sha)
    if ns.fault == "delete-old":
        for name in os.listdir(releases):
            if name != ns.expected_sha:
                shutil.rmtree(os.path.join(releases, name))
    return 0


def verify(ns: argparse.Namespace) -> int:
    receipt = {"program": "", "source_sha": "", "tag": None, "healthy": False, "activation": "none",
               "quiescent": True, "updater_pid": None, "active_path": "", "active_path_sha256": ""}
    try:
        sha = os.path.basename(os.readlink(os.path.join(ns.root, "current")))
    except OSError:
        print(json.dumps(receipt))
        return 0
    release = os.path.join(ns.root, "releases", sha)
    launcher = os.path.join(release, "bin", f"run-{sha}")
    with open(os.path.join(release, "PROGRAM")) as fh:
        receipt["program"] = fh.read().strip()
    with open(launcher, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    receipt.update(source_sha=sha[:12] if ns.fault == "short-sha" else sha, activation="atomic",
                   healthy=os.path.exists(os.path.join(release, "VALIDATED")) and validate(release, sha),
                   active_path=launcher, active_path_sha256=digest)
    print(json.dumps(receipt))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("verb", choices=("deploy", "verify"))
    parser.add_argument("--root", required=True)
    parser.add_argument("--fault", default="none", choices=("none", "current-first", "delete-old", "short-sha"))
    parser.add_argument("--program", required=True)
    parser.add_argument("--expected-sha", required=True)
    parser.add_argument("--source-archive")
    ns = parser.parse_args()
    return deploy(ns) if ns.verb == "deploy" else verify(ns)


if __name__ == "__main__":
    sys.exit(main())
