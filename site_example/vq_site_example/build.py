"""The example "build": a venv next to the source, the generation's launcher, and their check.

A real site replaces :func:`build_runtime` with its compiler, module loads and wheel
installs; it must keep the shape: everything is built below the partial release
directory, nothing outside it is touched, and the release's launcher is
``bin/<program>-<sha>``.

The launcher is a small shell script written for its generation (:data:`LAUNCHER`): it
carries the program and the full SHA, initialises the environment and then execs the
generation's interpreter, ``source/.venv/bin/python``.  That ``python`` is only a symlink
to the shared base interpreter, the same file for every release, so its SHA-256 cannot
tell two generations apart; the launcher's can.  It is what verify reports as
``active_path``, what vq-admin attests and binds jobs to, and what it re-hashes before a
job runs: a launcher swapped in from another generation is caught there.

The build is relocatable on purpose: it happens in ``releases/.partial.<sha>.<random>/``
and is checked there, then the whole directory is renamed to ``releases/<sha>``.  So the
launcher finds the interpreter from its own path (``$0``), the ``.pth`` file holds a path
*relative* to site-packages, and the only absolute paths venv writes (``bin/activate*``)
are rewritten to the final location *before* the check: the checked bytes are the
published bytes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from . import fsutil
from .errors import failed

PTH_NAME = "vq-site-source.pth"
SELFTEST = "vq_selftest.py"
#: Seconds the venv creation and the build-time check may take.
BUILD_TIMEOUT = 600
#: The generation's launcher: its bytes name the generation (program and full SHA).
LAUNCHER = """#!/bin/sh
# The launcher of {program} {sha}, written by vq-site-example; do not edit.
# It names its generation, sets up the environment and runs the generation's interpreter.
case $0 in */*) ;; *) echo "$0: run this launcher by its path" >&2; exit 127 ;; esac
VQ_PROGRAM={program}
VQ_SOURCE_SHA={sha}
PYTHONDONTWRITEBYTECODE=1
export VQ_PROGRAM VQ_SOURCE_SHA PYTHONDONTWRITEBYTECODE
unset PYTHONHOME PYTHONPATH
exec "${{0%/*}}/../source/.venv/bin/python" "$@"
"""


def run(argv: list[str], timeout: float, cwd: str | None = None,
        extra_env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """Run *argv* in a session of its own, stdin from ``/dev/null``, with our environment less
    ``PYTHON*`` overrides; ``(exit status, stdout and stderr)``.  Past *timeout* seconds its whole
    process group is killed and the status is ``None`` unless it had exited already.  OSError
    when it cannot start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONDONTWRITEBYTECODE="1", **(extra_env or {}))
    with subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True) as proc:
        try:
            output = proc.communicate(timeout=timeout)[0]
            return proc.returncode, output
        except subprocess.TimeoutExpired:
            status = proc.poll()
            with contextlib.suppress(ProcessLookupError):  # the group may be gone already
                os.killpg(proc.pid, signal.SIGKILL)
            return status, proc.communicate()[0]


def _builder(argv: list[str], what: str) -> str:
    """Run one build command; its output, or SiteError(1) naming how it failed."""
    try:
        status, output = run(argv, BUILD_TIMEOUT)
    except OSError as exc:
        raise failed(f"{what} could not start: {argv}: {exc}") from None
    if status != 0:
        raise failed(f"{what} failed ({'timed out' if status is None else f'exit {status}'}): {output[-2000:]}")
    return output.strip()


def _retarget_activate(venv: str, built_at: str, final: str) -> None:
    """Rewrite the absolute venv path in ``bin/activate*`` to its final place."""
    bindir = os.path.join(venv, "bin")
    for name in sorted(os.listdir(bindir)):
        path = os.path.join(bindir, name)
        if not name.lower().startswith("activate") or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as handle:
            data = handle.read()
        if built_at.encode() in data:
            fsutil.atomic_write(bindir, name, data.replace(built_at.encode(), final.encode()),
                                os.stat(path).st_mode & 0o777)


def build_runtime(release: str, final_release: str, program: str, sha: str) -> tuple[str, list[str]]:
    """Create ``source/.venv`` below *release* (where the unpacked source is), make the source
    importable from it and write the launcher ``bin/<program>-<sha>``.

    *final_release* is where *release* will live once published.  Returns the launcher path
    and log lines.
    """
    source = os.path.join(release, "source")
    venv = os.path.join(source, ".venv")
    log = [f"$ {sys.executable} -m venv --without-pip {venv}",
           _builder([sys.executable, "-m", "venv", "--without-pip", venv], "venv creation")]
    python = os.path.join(venv, "bin", "python")
    purelib = _builder([python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                       "asking the venv for its site-packages")
    if not purelib.startswith(venv + os.sep):
        raise failed(f"venv site-packages {purelib!r} is not below {venv}")
    rel = os.path.relpath(source, purelib)
    fsutil.atomic_write(purelib, PTH_NAME, rel + "\n")
    log.append(f"wrote {PTH_NAME} -> {rel} (relative to site-packages)")
    _retarget_activate(venv, venv, os.path.join(final_release, "source", ".venv"))
    bindir = os.path.join(release, "bin")
    os.mkdir(bindir, 0o755)
    launcher = fsutil.atomic_write(bindir, f"{program}-{sha}", LAUNCHER.format(program=program, sha=sha), 0o755)
    log.append(f"wrote the launcher bin/{program}-{sha}")
    return launcher, [line for line in log if line]


def check(launcher: str, source: str, timeout: float, extra_env: dict[str, str] | None = None
          ) -> tuple[bool, str, str]:
    """One start of the release through its launcher, in *source*: the source's ``vq_selftest.py``
    when it has one (it starts only if the launcher does), else ``-c pass``.  The build's check
    and verify's health check are this one.  Returns ``(ok, one-line detail, output)``; never
    raises."""
    selftest = os.path.join(source, SELFTEST)
    has_selftest = os.path.isfile(selftest)
    what = f"{SELFTEST} (run by the launcher)" if has_selftest else "launcher -c pass"
    try:
        status, output = run([launcher, selftest] if has_selftest else [launcher, "-c", "pass"], timeout,
                             cwd=source, extra_env=extra_env)
    except OSError as exc:
        return False, f"launcher could not start: {exc.strerror or exc}", ""
    if status is None:
        return False, f"{what} did not finish within {timeout:g} s; its process group was killed", output
    if status < 0:
        return False, f"{what} was killed by signal {-status}", output
    return status == 0, f"{what} {'ok' if status == 0 else f'exited {status}'}", output
