"""The example "build": a venv next to the source, and its validation.

A real site replaces :func:`build_runtime` with its compiler, module loads
and wheel installs; it must keep the shape: everything is built below the
partial release directory, nothing outside it is touched, and the launcher
ends up at ``source/.venv/bin/python``.

The build is relocatable on purpose: it happens in
``releases/.partial.<sha>.<random>/`` and is validated there, then the whole
directory is renamed to ``releases/<sha>``.  So the ``.pth`` file holds a path
*relative* to site-packages (``site`` joins relative lines onto the directory
holding the ``.pth``), and the only absolute paths venv writes (the
``bin/activate*`` scripts) are rewritten to the final location *before*
validation, so the validated bytes are the published bytes.
"""

from __future__ import annotations

import os
import sys

from . import fsutil
from .errors import failed

TYPE_CHECKING = False  # not typing's: verify (every update) imports this module for clean_env and SELFTEST
if TYPE_CHECKING:
    import subprocess

PTH_NAME = "vq-site-source.pth"
SELFTEST = "vq_selftest.py"
#: Seconds the build-time validation may take.
VALIDATE_TIMEOUT = 600
#: Seconds the venv creation may take.
VENV_TIMEOUT = 600


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for commands run in a release: ours without PYTHON*
    overrides (so the release cannot import from the deploying tool), with
    bytecode writing off (so running a release never writes into it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


def _run(argv: list[str], what: str, timeout: int, cwd: str | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import subprocess  # here, not at the top: verify (every update) runs its checks with spawn

    try:
        return subprocess.run(argv, cwd=cwd, env=env or clean_env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise failed(f"{what} did not finish within {timeout} s: {argv}") from None
    except OSError as exc:
        raise failed(f"{what} could not start: {argv}: {exc}") from None


def _purelib(python: str) -> str:
    proc = _run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                "asking the venv for its site-packages", 120)
    path = proc.stdout.strip()
    if proc.returncode != 0 or not os.path.isabs(path):
        raise failed(f"the new venv cannot report its site-packages: {proc.stdout.strip()}")
    return path


def _retarget_activate(venv: str, built_at: str, final: str) -> None:
    """Rewrite the absolute venv path in ``bin/activate*`` to its final place."""
    bindir = os.path.join(venv, "bin")
    for name in sorted(os.listdir(bindir)):
        path = os.path.join(bindir, name)
        if not name.lower().startswith("activate") or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        new = data.replace(built_at.encode(), final.encode())
        if new != data:
            fsutil.atomic_write(bindir, name, new, os.stat(path).st_mode & 0o777)


def build_runtime(source: str, final_source: str) -> tuple[str, list[str]]:
    """Create ``source/.venv`` and make ``source`` importable from it.

    *final_source* is where *source* will live once published.  Returns the
    launcher path (below *source*) and log lines.
    """
    venv = os.path.join(source, ".venv")
    log = [f"$ {sys.executable} -m venv --without-pip {venv}"]
    proc = _run([sys.executable, "-m", "venv", "--without-pip", venv], "venv creation", VENV_TIMEOUT)
    log.append(proc.stdout.rstrip())
    if proc.returncode != 0:
        raise failed(f"venv creation exited {proc.returncode}: {proc.stdout.strip()[-2000:]}")
    python = os.path.join(venv, "bin", "python")
    purelib = _purelib(python)
    if not purelib.startswith(venv + os.sep):
        raise failed(f"venv site-packages {purelib} is outside {venv}")
    rel = os.path.relpath(source, purelib)
    fsutil.atomic_write_text(purelib, PTH_NAME, rel + "\n")
    log.append(f"wrote {PTH_NAME} -> {rel} (relative to site-packages)")
    _retarget_activate(venv, os.path.join(source, ".venv"), os.path.join(final_source, ".venv"))
    return python, [line for line in log if line]


def check_argv(python: str, source: str) -> list[str]:
    """The release's own check, run by *python*: ``[python, source/vq_selftest.py]`` when the
    source has one, else ``[python, "-c", "pass"]`` (the build's validation and the verify's
    health check choose alike)."""
    selftest = os.path.join(source, SELFTEST)
    return [python, selftest] if os.path.isfile(selftest) else [python, "-c", "pass"]


def validate(python: str, source: str, timeout: int, extra_env: dict[str, str] | None = None
             ) -> tuple[bool, list[str], str]:
    """Run the release's own check with its launcher.

    ``python source/vq_selftest.py`` when the source has one, else
    ``python -c pass``; cwd is the source, bytecode writing off.  Returns
    ``(ok, log lines, one-line detail)``; never raises for a failing check.
    """
    argv = check_argv(python, source)
    try:
        proc = _run(argv, "validation", timeout, cwd=source, env=clean_env(extra_env))
    except Exception as exc:  # timeout or cannot start: a failed validation
        return False, [f"$ {' '.join(argv)}", str(exc)], str(exc)
    log = [f"$ {' '.join(argv)}", *proc.stdout.rstrip("\n").splitlines(), f"exit status {proc.returncode}"]
    what = SELFTEST if len(argv) == 2 else "python -c pass"
    detail = f"{what} exited {proc.returncode}"
    return proc.returncode == 0, log, detail
