"""Exact source identity on the driver: the commit, its tree, its tag (given, or the one at the SHA)."""

from __future__ import annotations

import pytest

from support import GitRepo, git
from vq_admin import source
from vq_admin.report.outcome import Refused, UsageError


@pytest.fixture
def repo(tmp_path):
    repo = GitRepo(tmp_path / "src")
    repo.one = repo.commit("one")
    repo.two = repo.commit("two")
    return repo


def test_no_tag_is_none_never_synthesized(repo):
    ident = source.resolve(str(repo.path), repo.two, None)
    assert ident.tag is None and ident.tags == ()
    assert ident.git_tree == git(repo.path, "rev-parse", f"{repo.two}^{{tree}}")


def test_the_one_tag_at_the_sha_is_the_expected_tag(repo):
    """CONTRACT section 1 (version 3): without --tag, the one tag at the SHA is expected."""
    repo.tag("v1", repo.one, annotated=True)
    ident = source.resolve(str(repo.path), repo.one, None)
    assert ident.tag == "v1" and ident.tags == ("v1",)
    repo.tag("light", repo.two)
    assert source.resolve(str(repo.path), repo.two, None).tag == "light"


def test_several_tags_ask_for_tag_and_one_may_be_chosen(repo):
    repo.tag("v1", repo.one)
    repo.tag("v1-final", repo.one, annotated=True)
    with pytest.raises(UsageError, match=f"2 tags point at {repo.one}: v1, v1-final; name the one .* with --tag"):
        source.resolve(str(repo.path), repo.one, None)
    ident = source.resolve(str(repo.path), repo.one, "v1-final")
    assert ident.tag == "v1-final" and ident.tags == ("v1", "v1-final")


def test_a_given_tag_must_point_at_the_sha(repo):
    repo.tag("v1", repo.one)
    with pytest.raises(Refused, match="points at"):
        source.resolve(str(repo.path), repo.two, "v1")
    with pytest.raises(Refused, match="does not exist"):
        source.resolve(str(repo.path), repo.two, "nope")
    with pytest.raises(UsageError, match="not a valid tag name"):
        source.resolve(str(repo.path), repo.two, "bad..name")


def test_a_sha_missing_from_the_repository_is_refused(repo):
    with pytest.raises(Refused, match="is not in the source repository"):
        source.resolve(str(repo.path), "0" * 40, None)
    with pytest.raises(Refused, match="64 digits"):
        source.resolve(str(repo.path), "a" * 64, None)


def test_a_branch_tip_is_never_used_in_place_of_the_sha(repo):
    ident = source.resolve(str(repo.path), repo.one, None)
    assert ident.sha == repo.one != git(repo.path, "rev-parse", "main")


def test_the_archive_is_of_the_exact_commit_and_its_tree(repo, tmp_path):
    ident = source.make_archive(source.resolve(str(repo.path), repo.one, None), str(tmp_path))
    assert ident.archive_sha256 and ident.tree_sha256 and ident.archive_bytes > 0
    files = ident.identity_files()
    assert files["SOURCE-SHA"] == repo.one and files["GIT-TREE"] == ident.git_tree


def test_export_attributes_that_alter_the_archive_are_refused(repo, tmp_path):
    sha = repo.commit("attrs", {".gitattributes": "vq_selftest.py export-ignore\n", "vq_selftest.py": "print(1)\n"})
    with pytest.raises(Refused, match="export-ignore"):
        source.make_archive(source.resolve(str(repo.path), sha, None), str(tmp_path))


def test_a_dirty_tree_is_refused_for_head(repo):
    assert source.head_commit(str(repo.path)) == repo.two
    (repo.path / "vq_selftest.py").write_text("changed\n")
    with pytest.raises(Refused, match="uncommitted changes"):
        source.head_commit(str(repo.path))
