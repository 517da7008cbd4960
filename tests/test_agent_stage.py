"""The agent's staging verbs and tree identity, against real git archives."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import GitRepo, git, plant_symlink
from vq_admin.agent import stage
from vq_admin.core import protocol, safedirs
from vq_admin.core.treeid import archive_identity, directory_tree_sha256


def archive(repo: GitRepo, sha: str, out) -> str:
    path = str(out / "source.tar")
    git(repo.path, "archive", "--format=tar", "-o", path, sha)
    return path


@pytest.mark.parametrize("fmt", ["sha1", "sha256"])
def test_the_recomputed_git_tree_id_equals_gits(tmp_path, fmt):
    repo_path = tmp_path / "src"
    repo_path.mkdir()
    git(repo_path, "init", "-q", f"--object-format={fmt}")
    repo = GitRepo.__new__(GitRepo)
    repo.path = repo_path
    files = {"a/b/c.txt": "x\n", "a.txt": "y\n", "a-b/q": "z\n", "run.sh": "#!/bin/sh\n", "ü.txt": "u\n"}
    sha = repo.commit("one", files)
    os.chmod(repo_path / "run.sh", 0o755)
    os.symlink("a.txt", repo_path / "link")
    sha = repo.commit("two", {})
    ident = archive_identity(archive(repo, sha, tmp_path), fmt)
    assert ident.git_tree == git(repo_path, "rev-parse", f"{sha}^{{tree}}")
    assert ident.commit == sha and ident.files == 7  # five files, the symlink, vq_selftest.py


def test_tree_digest_of_an_unpacked_archive_equals_the_archive_digest(tmp_path):
    repo = GitRepo(tmp_path / "src")
    (tmp_path / "src" / "bin").mkdir()
    sha = repo.commit("one", {"pkg/__init__.py": "", "bin/tool": "#!/bin/sh\n"})
    os.chmod(tmp_path / "src" / "bin" / "tool", 0o755)
    sha = repo.commit("exec bit", {})
    path = archive(repo, sha, tmp_path)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xf", path, "-C", str(unpacked)], check=True)
    assert directory_tree_sha256(str(unpacked)) == archive_identity(path).tree_sha256


def make_stage(root, repo, sha, tmp_path):
    path = archive(repo, sha, tmp_path)
    ident = archive_identity(path)
    identity = {"SOURCE-SHA": sha, "ARCHIVE-SHA256": ident.archive_sha256, "SOURCE-TREE-SHA256": ident.tree_sha256,
                "GIT-TREE": ident.git_tree}
    created = stage.create(str(root), "runtime", "vibeqc", identity)["stage"]
    with open(path, "rb") as fh:
        stage.receive(created, fh)
    return created, identity


def stage_world(tmp_path: Path) -> tuple[GitRepo, str, Path, Path]:
    """``(repo, its one commit, scratch root, the runtime lane's stage directory below it)``."""
    repo = GitRepo(tmp_path / "src")
    root = tmp_path / "scratch"
    root.mkdir()
    return repo, repo.commit("one"), root, root / ".vq-admin" / "stage" / "runtime" / "vibeqc"


def test_a_stage_verifies_and_a_flipped_byte_does_not(tmp_path):
    repo, sha, root, _ = stage_world(tmp_path)
    created, identity = make_stage(root, repo, sha, tmp_path)
    assert stage.verify(created, identity)["verified"] is True
    assert oct(os.stat(created).st_mode & 0o777) == "0o700"
    with open(os.path.join(created, "source.tar"), "r+b") as fh:
        fh.seek(700)
        b = fh.read(1)
        fh.seek(700)
        fh.write(bytes([b[0] ^ 1]))
    result = stage.verify(created, identity)
    assert result["verified"] is False
    assert any("ARCHIVE-SHA256 of the staged archive" in m for m in result["mismatches"])


def test_receive_never_overwrites(tmp_path):
    repo, sha, root, _ = stage_world(tmp_path)
    created, _ = make_stage(root, repo, sha, tmp_path)
    with pytest.raises(FileExistsError):
        stage.receive(created, io.BytesIO(b"other"))


#: stage-receive through the agent's console entry: the imports it made, then its exit status, on stderr.
RECEIVE_PROBE = ("import sys\n_before = set(sys.modules)\nfrom vq_admin.agent.entry import main\n"
                 "code = main(sys.argv[1:])\n"
                 "sys.stderr.write('\\nMODULES ' + repr(sorted(set(sys.modules) - _before)) + '\\n')\n"
                 "sys.exit(code)\n")


@pytest.mark.parametrize("case, code, said", [("fresh", 0, ""), ("again", 1, "File exists"),
                                               ("not-a-stage", 4, "refused: ")])
def test_stage_receive_is_answered_before_the_verb_table(tmp_path, case, code, said):
    """The driver's ``stage-receive --stage DIR``: the archive written whole across 1 MiB reads, or the
    verb table's exit status and message, without argparse, tarfile or the verb table imported."""
    root = tmp_path / "scratch"
    root.mkdir()
    created = stage.create(str(root), "runtime", "vibeqc", {n: "x" for n in stage.IDENTITY_FILES})["stage"]
    data = os.urandom(5 << 19)  # 2.5 MiB: two full reads and a partial one
    if case == "again":
        Path(created, stage.ARCHIVE).write_bytes(b"first")
    where = created if case != "not-a-stage" else str(tmp_path)
    done = subprocess.run([sys.executable, "-c", RECEIVE_PROBE, *protocol.stage_receive([], stage=where)],
                          input=data, capture_output=True, timeout=120)
    stderr = done.stderr.decode()
    assert done.returncode == code and said in stderr, stderr
    found = set(ast.literal_eval([ln for ln in stderr.splitlines() if ln.startswith("MODULES ")][-1][8:]))
    assert not found & {"argparse", "tarfile", "vq_admin.agent.cli", "vq_admin.core.treeid",
                        "vq_admin.core.identifiers"}, sorted(found)
    if case == "fresh":
        assert json.loads(done.stdout) == {"stage": created, "bytes": len(data)}
        assert Path(created, stage.ARCHIVE).read_bytes() == data
    elif case == "again":
        assert done.stdout == b"" and Path(created, stage.ARCHIVE).read_bytes() == b"first"
    else:
        assert done.stdout == b"" and not Path(created, stage.ARCHIVE).exists()


@pytest.mark.parametrize("level", [".vq-admin", ".vq-admin/stage", ".vq-admin/stage/runtime"])
def test_a_planted_symlink_is_refused_and_nothing_is_written_through_it(tmp_path, level):
    root = tmp_path / "scratch"
    target = plant_symlink(root / level, tmp_path)
    with pytest.raises(safedirs.UnsafePath, match="symlink"):
        stage.create(str(root), "runtime", "vibeqc", {n: "x" for n in stage.IDENTITY_FILES})
    assert list(target.iterdir()) == []


def test_reclaim_removes_success_and_keeps_three_failed(tmp_path):
    repo, sha, root, parent = stage_world(tmp_path)
    failed = []
    for i in range(5):
        created, _ = make_stage(root, repo, sha, tmp_path)
        new_name = f"stage.2026010{i}T000000Z.0000000{i}"
        os.rename(created, parent / new_name)
        stage.reclaim(str(root), "runtime", "vibeqc", str(parent / new_name), succeeded=False, keep_failed=3)
        failed.append(new_name)
    (parent / "unrelated-file").write_text("keep me")
    remaining = sorted(p.name for p in parent.iterdir())
    assert remaining == sorted(failed[2:] + ["unrelated-file"])
    created, _ = make_stage(root, repo, sha, tmp_path)
    stage.reclaim(str(root), "runtime", "vibeqc", created, succeeded=True, keep_failed=3)
    assert sorted(p.name for p in parent.iterdir()) == remaining


def test_reclaim_takes_in_the_unmarked_stages_of_interrupted_runs(tmp_path):
    """Five interrupted runs left unmarked stages; the next run of the lane marks them failed and keeps 3."""
    repo, sha, root, parent = stage_world(tmp_path)
    left = []
    for i in range(5):
        created, _ = make_stage(root, repo, sha, tmp_path)
        left.append(f"stage.2026010{i}T000000Z.0000000{i}")
        os.rename(created, parent / left[-1])
    created, _ = make_stage(root, repo, sha, tmp_path)
    later = parent / "stage.20990101T000000Z.0000000f"  # a later run's stage (not older): never touched
    later.mkdir()
    result = stage.reclaim(str(root), "runtime", "vibeqc", created, succeeded=True, keep_failed=3)
    assert sorted(result["abandoned"]) == left
    assert sorted(p.name for p in parent.iterdir()) == sorted(left[2:] + [later.name])
    assert all((parent / n / "FAILED").read_text().startswith("abandoned") for n in left[2:])
    assert not (later / "FAILED").exists()
