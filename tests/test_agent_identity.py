"""``vq-admin-agent identity`` and the site helper updater that installs it.

The tree digest the driver requests (the stage's SOURCE-TREE-SHA256,
computed from the archive) must equal the digest the installed helper
computes over its own files: both definitions are checked against each
other on a tree with executable bits and symlinks, and the installed
helper's record must turn stale when a file changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helper_world import (HERE, PYTHON, bootstrap, helper_repo, live_identity, run_updater, stage_archive)
from support import GitRepo, git
from vq_admin_hookspecs import HelperIdentity

from vq_admin.agent.identity import RECORD_NAME
from vq_admin.core.treeid import archive_identity, directory_tree_sha256

sys.path.insert(0, str(HERE / "site_example"))
from vq_site_example.helper_update import tree_sha256 as site_tree_sha256  # noqa: E402


@pytest.fixture
def odd_tree(tmp_path):
    """A repository with an executable, symlinks to a file, a directory and nowhere, a space in a name."""
    repo = GitRepo(tmp_path / "odd")
    (repo.path / "pkg" / "sub").mkdir(parents=True)
    (repo.path / "pkg" / "sub" / "data.txt").write_text("data\n")
    (repo.path / "run.sh").write_text("#!/bin/sh\necho run\n")
    (repo.path / "run.sh").chmod(0o755)
    os.symlink("pkg/sub/data.txt", repo.path / "file-link")
    os.symlink("pkg", repo.path / "dir-link")
    os.symlink("nowhere", repo.path / "dangling")
    (repo.path / "with space").write_text("x\n")
    sha = repo.commit("odd")
    archive = tmp_path / "odd.tar"
    git(repo.path, "archive", "--format=tar", "-o", str(archive), sha)
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    return archive, unpacked


def test_archive_digest_equals_installed_directory_digest(odd_tree):
    archive, unpacked = odd_tree
    expected = archive_identity(str(archive)).tree_sha256
    assert directory_tree_sha256(str(unpacked)) == expected
    assert site_tree_sha256(str(unpacked)) == expected  # the installer's independent implementation


@pytest.mark.parametrize("change", ["exec-bit", "link-target", "content", "new-file"])
def test_every_kind_of_change_moves_the_digest(odd_tree, change):
    archive, unpacked = odd_tree
    expected = archive_identity(str(archive)).tree_sha256
    if change == "exec-bit":
        (unpacked / "run.sh").chmod(0o644)
    elif change == "link-target":
        os.unlink(unpacked / "file-link")
        os.symlink("run.sh", unpacked / "file-link")
    elif change == "content":
        (unpacked / "pkg" / "sub" / "data.txt").write_text("other\n")
    else:
        (unpacked / "extra.py").write_text("")
    assert directory_tree_sha256(str(unpacked)) != expected
    assert site_tree_sha256(str(unpacked)) != expected


@pytest.fixture
def installed(tmp_path):
    """Commit A of a helper repository installed under ``root`` by the site updater."""
    repo, sha = helper_repo(tmp_path / "repo")
    root = tmp_path / "helper"
    files = bootstrap(root, repo.path, sha, tmp_path)
    return {"root": root, "repo": repo, "sha": sha, "tree": files["SOURCE-TREE-SHA256"], "tmp": tmp_path}


def test_installed_helper_reports_bound_identity(installed):
    root, sha = installed["root"], installed["sha"]
    found = live_identity(root)
    ident = HelperIdentity.parse(json.dumps(found))
    assert ident.record == "bound"
    assert ident.source_sha == sha
    assert ident.tree_sha256 == installed["tree"]
    assert ident.path == os.path.realpath(root / "releases" / sha)
    assert ident.version == "1.0.0"
    assert os.path.realpath(ident.interpreter) == os.path.realpath(PYTHON)
    assert found["scope"] == "release"
    # the entry point ran the installed release, not this checkout, and wrote no bytecode into it
    assert found["package"].startswith(str(root))
    assert not list((root / "releases" / sha).rglob("__pycache__"))
    record = json.loads((root / "releases" / sha / RECORD_NAME).read_text())
    assert (record["sha"], record["tree_sha256"]) == (sha, installed["tree"])


def test_changed_file_makes_the_record_stale(installed):
    root, sha = installed["root"], installed["sha"]
    target = root / "releases" / sha / "vq_admin" / "report" / "outcome.py"
    target.write_text(target.read_text() + "# changed after installation\n")
    found = live_identity(root)
    assert found["record"] == "stale"
    assert found["source_sha"] == sha  # the record's claim, no longer bound
    assert found["tree_sha256"] != installed["tree"]
    assert found["problems"]


def test_malformed_record_is_stale_and_claims_nothing(installed):
    release = installed["root"] / "releases" / installed["sha"]
    (release / RECORD_NAME).write_text("{not json")
    found = live_identity(installed["root"])
    assert found["record"] == "stale" and found["source_sha"] is None
    record = {"schema": "vq-admin/helper-source/1", "sha": installed["sha"], "tree_sha256": "0" * 64}
    (release / RECORD_NAME).write_text(json.dumps(record))
    assert live_identity(installed["root"])["record"] == "stale"


def test_development_checkout_has_no_record():
    done = subprocess.run([sys.executable, "-m", "vq_admin.agent", "identity", "--json"], cwd=HERE,
                          capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert found["record"] == "missing" and found["source_sha"] is None and found["scope"] == "package"
    assert found["tree_sha256"] == directory_tree_sha256(found["path"])
    HelperIdentity.parse(done.stdout)


def test_updater_refuses_a_tree_that_is_not_the_expected_one(installed):
    tmp, repo = installed["tmp"], installed["repo"]
    sha_b = repo.commit("helper B", {"HELPER-NOTE": "B\n"})
    stage, files = stage_archive(repo.path, sha_b, tmp / "scratch", tmp / "work-b")
    wrong = hashlib.sha256(b"not the tree").hexdigest()
    Path(stage, "SOURCE-TREE-SHA256").write_text(wrong + "\n")
    done = run_updater(installed["root"], stage, sha_b, wrong, install=False)
    assert done.returncode == 3, done.stderr
    assert "tree" in done.stderr
    assert os.readlink(installed["root"] / "current") == f"releases/{installed['sha']}"
    assert not (installed["root"] / "releases" / sha_b).exists()
    assert not [p for p in (installed["root"] / "releases").iterdir() if p.name.startswith(".partial")]


def test_updater_keeps_older_releases_and_reuses_a_matching_one(installed):
    tmp, repo, root, sha_a = installed["tmp"], installed["repo"], installed["root"], installed["sha"]
    release_a = root / "releases" / sha_a
    before = sorted((str(p.relative_to(release_a)),
                     p.read_bytes() if p.is_file() else b"") for p in release_a.rglob("*"))
    sha_b = repo.commit("helper B", {"HELPER-NOTE": "B\n"})
    stage, files = stage_archive(repo.path, sha_b, tmp / "scratch", tmp / "work-b")
    done = run_updater(root, stage, sha_b, files["SOURCE-TREE-SHA256"], install=False)
    assert done.returncode == 0, done.stderr
    assert "helper_release_reused=0" in done.stdout
    assert live_identity(root)["source_sha"] == sha_b
    after = sorted((str(p.relative_to(release_a)),
                    p.read_bytes() if p.is_file() else b"") for p in release_a.rglob("*"))
    assert after == before
    stage_a, files_a = stage_archive(repo.path, sha_a, tmp / "scratch", tmp / "work-a2")
    again = run_updater(root, stage_a, sha_a, files_a["SOURCE-TREE-SHA256"], install=False)
    assert again.returncode == 0, again.stderr
    assert "helper_release_reused=1" in again.stdout
    assert live_identity(root)["source_sha"] == sha_a
    assert (root / "releases" / sha_b).is_dir()


def test_updater_needs_install_for_a_missing_root(tmp_path):
    repo, sha = helper_repo(tmp_path / "repo")
    stage, files = stage_archive(repo.path, sha, tmp_path / "scratch", tmp_path / "work")
    done = run_updater(tmp_path / "absent", stage, sha, files["SOURCE-TREE-SHA256"], install=False)
    assert done.returncode == 2
    assert not (tmp_path / "absent").exists()
