"""A real, non-editable install of the tree into a temporary venv, shared by the tests
that check what ``pip install`` puts under the prefix (man pages, shell completion).

The wheels are built from the tree (``pip wheel --no-deps``) for the project and its
``hookspecs`` distribution; the install takes the other dependencies from the
configured package index, as an operator's ``pip install`` does.  Built once per
test session, under pytest's base temporary directory (with pytest-xdist: once for all
workers, in the directory that holds theirs, behind a file lock, since ``pip wheel``
builds in the source tree and two builds at once would share its ``build/``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import venv
from pathlib import Path

from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
#: Bounds for the slow steps; a build or install that hangs fails the test instead.
BUILD_TIMEOUT = 600


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False, **kwargs)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@functools.lru_cache(maxsize=None)
def installed_prefix(base: Path) -> Path:
    """The prefix of a fresh venv holding the wheels built from this tree.

    *base* is pytest's base temporary directory; under pytest-xdist each worker has its
    own, and the venv is built once in their common parent (the first worker builds it,
    the others wait on the lock and find it complete).
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    with FileLock(str(base / "installed-venv.lock")):
        return _build(base)


def _build(base: Path) -> Path:
    wheels = base / "wheels"
    prefix = base / "venv"
    done = base / "venv.complete"
    if done.exists():
        return prefix
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels),
          str(ROOT / "hookspecs"), str(ROOT)], cwd=base, env=env)
    venv.EnvBuilder(with_pip=False, clear=True).create(prefix)
    # This pip installs into the new venv (--python): no ensurepip, and the wheel is what gets installed.
    _run([sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install", "-q",
          "--find-links", str(wheels), "vq-admin"], cwd=base, env=env)
    done.write_text("")
    return prefix


def clean_env(prefix: Path) -> dict[str, str]:
    """An environment with the venv's bin first on PATH, no MANPATH and no project on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("MANPATH", "PYTHONPATH", "VIRTUAL_ENV")}
    system = [p for p in env.get("PATH", "").split(os.pathsep) if p and ".venv" not in p]
    env["PATH"] = os.pathsep.join([str(prefix / "bin"), *system])
    env["LC_ALL"] = "C.UTF-8"
    return env
