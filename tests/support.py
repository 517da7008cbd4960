"""Test support: real git repositories, configuration files, running the CLI.

Import as ``from support import ...`` (``tests/`` is on ``sys.path`` through
pytest's rootdir conftest handling).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPTS = os.path.dirname(sys.executable)
AGENT = os.path.join(SCRIPTS, "vq-admin-agent")
SITE_EXAMPLE = os.path.join(SCRIPTS, "vq-site-example")
#: What operators and cron run: the ``vq-admin`` console script of this environment (``bin/vq-admin``
#: as pip installed it), not ``python -m vq_admin.cli``, which imports the command line before
#: ``vq_admin.entry.main`` runs and so skips the early ssh start of ``update``.
VQ_ADMIN = os.path.join(SCRIPTS, "vq-admin")
#: The verify receipt of nothing active as a site verifier prints it: nulls (CONTRACT section 4).
NOTHING_ACTIVE = {"program": "vibeqc", "source_sha": None, "tag": None, "healthy": False, "activation": "none",
                  "quiescent": True, "updater_pid": None, "active_path": None, "active_path_sha256": None,
                  "health_detail": "nothing is active"}
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path | str, *args: str, check: bool = True) -> str:
    env = dict(os.environ, **GIT_ENV)
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, check=check, capture_output=True, text=True)
    return done.stdout.strip()


class GitRepo:
    """A real git repository holding a tiny Python 'scientific program'."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        git(self.path, "init", "-q", "-b", "main")

    def commit(self, message: str, files: dict[str, str] | None = None) -> str:
        files = files or {"vq_selftest.py": f'print("selftest of {message}")\n'}
        for name, text in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "--allow-empty", "-m", message)
        return git(self.path, "rev-parse", "HEAD")

    def tag(self, name: str, sha: str, annotated: bool = False) -> None:
        if annotated:
            git(self.path, "tag", "-a", "-m", name, name, sha)
        else:
            git(self.path, "tag", name, sha)


def write_config(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    path.chmod(0o600)
    return path


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.stdout)


def run_vq(*args: str, config: Path | str | None = None, state: Path | str | None = None,
           env: dict[str, str] | None = None, timeout: float = 600) -> CliResult:
    """Run ``vq-admin ARGS`` in a fresh interpreter (the :data:`VQ_ADMIN` console script, as an
    operator or cron would)."""
    full_env = dict(os.environ)
    if config is not None:
        full_env["VQ_ADMIN_CONFIG"] = str(config)
    if state is not None:
        full_env["VQ_ADMIN_STATE_DIR"] = str(state)
    full_env.update(env or {})
    done = subprocess.run([VQ_ADMIN, *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return CliResult(done.returncode, done.stdout, done.stderr)


def site_example_host(name: str, *, root: Path, repo: Path, scratch: Path, transport: str = "local",
                      ssh: str | None = None, program: str = "vibeqc", extra_host: str = "",
                      extra_profile: str = "") -> str:
    """A managed host table whose one profile uses the site_example plugin."""
    ssh_line = f'ssh = "{ssh}"\n' if ssh else ""
    return (
        f'[hosts.{name}]\nfleet_role = "managed"\ntransport = "{transport}"\n{ssh_line}'
        f'scratch_root = "{scratch}"\nagent = "{AGENT}"\n{extra_host}\n'
        f'[hosts.{name}.scheduler_runtime_deployments.{program}]\nprovider = "site_example"\n'
        f'provider_options = {{ root = "{root}", command = "{SITE_EXAMPLE}" }}\n'
        f'source_repo = "{repo}"\ntimeout_seconds = 600\nverify_timeout_seconds = 120\n{extra_profile}\n'
    )


def command_host(program: str, *, scratch: Path | str, repo: Path, update: str, verify: str,
                 install: str | None = None, host: str = "cluster", transport: str = "ssh",
                 timeout_seconds: int | None = 600, verify_timeout_seconds: int | None = 60,
                 extra_profile: str = "") -> str:
    """A managed host table whose one profile runs configured commands (the built-in command
    provider): *update* and *verify*, *install* when given.  Over ssh the host's ssh destination
    is its own name (``ssh = "cluster"``); ``transport="local"`` runs on this machine.  A timeout
    given as ``None`` is left to its default."""
    where = f'ssh = "{host}"\n' if transport == "ssh" else f'transport = "{transport}"\n'
    install_line = f'install_command = "{install}"\n' if install else ""
    timeouts = "" if timeout_seconds is None else f"timeout_seconds = {timeout_seconds}\n"
    if verify_timeout_seconds is not None:
        timeouts += f"verify_timeout_seconds = {verify_timeout_seconds}\n"
    return (
        f'[hosts.{host}]\nfleet_role = "managed"\n{where}scratch_root = "{scratch}"\nagent = "{AGENT}"\n\n'
        f'[hosts.{host}.scheduler_runtime_deployments.{program}]\nupdate_command = "{update}"\n{install_line}'
        f'verify_command = "{verify}"\nsource_repo = "{repo}"\n{timeouts}{extra_profile}\n'
    )


def plant_symlink(link: Path, tmp_path: Path) -> Path:
    """Plant a symlink at *link* (its parents created) to a fresh empty directory
    ``tmp_path/elsewhere``, as another user could; returns that directory, which a refusal
    must leave empty."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)
    return target


def tree_digest(root: Path) -> dict[str, str]:
    """Path -> (type, content hash) of everything below *root*, for byte-identity checks."""
    import hashlib

    out: dict[str, str] = {}
    root = Path(root)
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest()
            elif p.is_dir():
                out[rel] = "dir"
    return out


def in_thread(fn):
    """Run *fn* in a thread; returns a function that joins it and gives its result."""
    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", fn()), daemon=True)
    thread.start()

    def join(timeout: float):
        thread.join(timeout)
        assert not thread.is_alive(), "the run did not finish in time"
        return box["result"]

    return join


def run_vq_inprocess(*args: str, config: Path | str | None = None, state: Path | str | None = None,
                     env: dict[str, str] | None = None) -> CliResult:
    """``vq-admin ARGS`` as :func:`run_vq` runs it, but in this interpreter (``vq_admin.entry.main``),
    the way pytest's ``runpytest_inprocess`` runs pytest: no new interpreter to start.

    Same environment (``VQ_ADMIN_CONFIG``, ``VQ_ADMIN_STATE_DIR``, *env*: set for the call and
    restored after it), same result: the exit status (``SystemExit`` from ``--help`` too) and
    what reached file descriptors 1 and 2, so the output of any child process counts as it does
    in a subprocess.  For verbs checked for their usage, ``--help`` and ``--json`` shapes; a test
    of the installed entry point, of signals, of a closed pipe or of what a fresh interpreter
    imports keeps :func:`run_vq`.
    """
    import io
    import signal
    import tempfile

    from vq_admin import entry

    overrides = dict(env or {})
    if config is not None:
        overrides["VQ_ADMIN_CONFIG"] = str(config)
    if state is not None:
        overrides["VQ_ADMIN_STATE_DIR"] = str(state)
    saved_env = dict(os.environ)
    saved_streams = sys.stdout, sys.stderr
    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", write_through=True)
        try:
            os.environ.update(overrides)
            try:
                code = entry.main(list(args))
            except SystemExit as exc:  # --help, --version
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            os.close(saved_fds[0])
            os.close(saved_fds[1])
            os.environ.clear()
            os.environ.update(saved_env)
            for sig, handler in saved_signals.items():  # the console script handles them for its process
                signal.signal(sig, handler)
        out.seek(0)
        err.seek(0)
        return CliResult(code, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"))


def flock_free(path: Path) -> bool:
    """True when nobody holds the kernel lock of *path* (a non-blocking flock succeeds, or no file)."""
    if not path.exists():
        return True
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
