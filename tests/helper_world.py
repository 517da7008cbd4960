"""Test support for the helper lane: a helper source repository made from this
checkout's ``vq_admin`` package, a helper root installed the way a site does
(``vq-site-example-helper-update``), configuration tables, identity reads.

Import as ``from helper_world import ...`` (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from support import AGENT, SCRIPTS, GitRepo

from vq_admin import source

HERE = Path(__file__).resolve().parents[1]
HELPER_UPDATE = os.path.join(SCRIPTS, "vq-site-example-helper-update")
PYTHON = sys.executable
FAST_REREADS = {"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_HELPER_REREADS": "3", "VQ_ADMIN_HELPER_REREAD_INTERVAL": "0.05"}


def helper_repo(path: Path) -> tuple[GitRepo, str]:
    """A git repository holding a copy of this checkout's ``vq_admin`` package; commit A."""
    repo = GitRepo(path)
    shutil.copytree(HERE / "vq_admin", repo.path / "vq_admin",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(HERE / "setup.cfg", repo.path / "setup.cfg")
    sha = repo.commit("helper A", {"HELPER-NOTE": "A\n"})
    return repo, sha


def stage_archive(repo: Path, sha: str, scratch: Path, workdir: Path) -> tuple[str, dict[str, str]]:
    """Stage *sha* of *repo* with the installed agent; ``(stage dir, identity files)``."""
    workdir.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    ident = source.make_archive(source.resolve(str(repo), sha, None), str(workdir))
    files = ident.identity_files()
    words = ["--sha", sha, "--archive-sha256", files["ARCHIVE-SHA256"], "--tree-sha256",
             files["SOURCE-TREE-SHA256"], "--git-tree", ident.git_tree]
    made = subprocess.run([AGENT, "stage-create", "--root", str(scratch), "--kind", "helper", "--name", "helper",
                           *words], capture_output=True, text=True, check=True)
    stage = json.loads(made.stdout)["stage"]
    with open(ident.archive_path, "rb") as fh:
        subprocess.run([AGENT, "stage-receive", "--stage", stage], stdin=fh, capture_output=True, check=True)
    subprocess.run([AGENT, "stage-verify", "--stage", stage, *words], capture_output=True, check=True)
    return stage, files


def run_updater(root: Path, stage: str, sha: str, tree: str, *, install: bool = True,
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the site helper updater exactly as the helper lane does (environment in, argv fixed)."""
    env = dict(os.environ, VQ_HELPER_STAGE=stage, VQ_HELPER_EXPECTED_SHA=sha, VQ_HELPER_EXPECTED_TREE_SHA256=tree,
               **(extra_env or {}))
    argv = [HELPER_UPDATE, "--root", str(root)] + (["--install"] if install else [])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def bootstrap(root: Path, repo: Path, sha: str, base: Path) -> dict[str, str]:
    """First installation by hand (the documented bootstrap): stage, then the site updater."""
    stage, files = stage_archive(repo, sha, base / "boot-scratch", base / f"boot-work-{sha[:8]}")
    done = run_updater(root, stage, sha, files["SOURCE-TREE-SHA256"])
    assert done.returncode == 0, done.stderr
    return files


def live_identity(root: Path, agent: str | None = None) -> dict:
    """What the installed entry point reports, run the way the driver runs it."""
    done = subprocess.run([agent or str(root / "bin" / "vq-admin-agent"), "identity", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@dataclass
class TwoLanes:
    """What a test of both lanes on one host starts from: a helper installed at commit *a* of its
    repository (which holds *b* too), and a runtime program with one commit, not yet deployed."""

    repo: GitRepo
    a: str
    b: str
    helper_root: Path
    program: GitRepo
    runtime_sha: str
    runtime_root: Path


def two_lanes(tmp_path: Path) -> TwoLanes:
    """:class:`TwoLanes` below *tmp_path* (``helper``, ``vibeqc``, ``apps/vibeqc``), and an empty
    ``scratch`` directory."""
    repo, sha_a = helper_repo(tmp_path / "helper-repo")
    helper_root = tmp_path / "helper"
    bootstrap(helper_root, repo.path, sha_a, tmp_path)
    sha_b = repo.commit("helper B", {"HELPER-NOTE": "B\n"})
    program = GitRepo(tmp_path / "vibeqc")
    runtime_sha = program.commit("vibeqc 1")
    (tmp_path / "scratch").mkdir()
    return TwoLanes(repo, sha_a, sha_b, helper_root, program, runtime_sha, tmp_path / "apps" / "vibeqc")


def helper_table(name: str, *, root: Path, repo: Path, scratch: Path, role: str = "managed",
                 transport: str = "local", ssh: str | None = None, update_host: str | None = None,
                 command: str | None = None, agent: str | None = None, extra: str = "") -> str:
    """One ``[hosts.NAME]`` table for the helper lane."""
    lines = [f"[hosts.{name}]", f'fleet_role = "{role}"', f'transport = "{transport}"',
             f'scratch_root = "{scratch}"', f'agent = "{agent or root / "bin" / "vq-admin-agent"}"',
             f'helper_update_command = "{command or f"{HELPER_UPDATE} --root {root}"}"',
             f'helper_install_command = "{HELPER_UPDATE} --root {root} --install"',
             f'helper_source_repo = "{repo}"', "helper_timeout_seconds = 600"]
    if ssh:
        lines.append(f'ssh = "{ssh}"')
    if update_host:
        lines.append(f'helper_update_host = "{update_host}"')
    return "\n".join(lines) + "\n" + extra + "\n"


def write_script(path: Path, text: str) -> str:
    """An executable test script (a stand-in a site could have installed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path)
