"""Exact source identity on the driver: commit -> archive, checksums, tree, tag.

The requested full SHA is resolved in the configured checkout (never a branch
tip), archived with ``git archive``, and the archive's recomputed git tree id
must equal the commit's tree: an archive altered by export attributes, or a
repository that lies, is refused before anything is staged.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from .agent.identifiers import SHA_RE, TAG_RE
from .outcome import Refused, UsageError, VqAdminError
from .transport import RunResult, run_local_argv

GIT_TIMEOUT = 600.0


@dataclass(frozen=True)
class SourceIdentity:
    repo: str
    sha: str
    git_tree: str
    tag: str | None
    tags: tuple[str, ...]
    archive_path: str | None = None
    archive_sha256: str | None = None
    tree_sha256: str | None = None
    archive_bytes: int | None = None

    def identity_files(self) -> dict[str, str]:
        assert self.archive_sha256 and self.tree_sha256
        return {
            "SOURCE-SHA": self.sha,
            "ARCHIVE-SHA256": self.archive_sha256,
            "SOURCE-TREE-SHA256": self.tree_sha256,
            "GIT-TREE": self.git_tree,
        }

    def to_receipt(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("archive_path")
        data["tags"] = list(self.tags)
        return data


def git(repo: str, *args: str, timeout: float = GIT_TIMEOUT) -> RunResult:
    argv = ["git", "-C", repo, *args]
    return run_local_argv(argv, argv, "local", timeout=timeout)


def _one_line(result: RunResult) -> str:
    return result.text().strip()


def _checked(result: RunResult, what: str, repo: str) -> str:
    """The one-line answer of a git read that must succeed (exit 1 with evidence otherwise)."""
    if not result.ok:
        raise VqAdminError(f"cannot read {what} in {repo} ({result.describe()}): {result.error_text()[-300:]}")
    return _one_line(result)


def _answered(result: RunResult, code: int) -> bool:
    """True when git ran to its end and exited *code* (its answer, not a failure to answer)."""
    return result.interrupted is None and result.exit_code == code


def check_tag_name(tag: str) -> str:
    if not TAG_RE.match(tag):
        raise UsageError(f"--tag {tag!r} is not a valid tag name")
    return tag


def resolve(repo: str, sha: str, tag: str | None, *, with_tags: bool = True) -> SourceIdentity:
    """Resolve *sha* (full, lower case) and its tag in *repo*, read-only.

    The identity's ``tag`` is the requested one (checked to point at *sha*),
    else the one tag at *sha* (:func:`expected_tag`); ``tags`` lists every tag at *sha*.

    *with_tags* false (the helper lane) leaves tags out of the identity.

    Two git processes when all is well (what every cron run pays): one
    ``git cat-file --batch`` gives the commit, its full name and its tree, and
    ``git tag --points-at`` the tags.  Anything else (a SHA git does not answer
    as that exact commit, a tag given that is not among those) is resolved step
    by step for the precise refusal.
    """
    if not os.path.isdir(repo):
        raise Refused(f"source repository {repo} does not exist")
    tree = _commit_tree(repo, sha)
    if tree is None:
        return _resolve_stepwise(repo, sha, tag, with_tags=with_tags)
    if not with_tags:
        return SourceIdentity(repo=repo, sha=sha, git_tree=tree, tag=None, tags=())
    tags = _tags_at(repo, sha)
    if (tag is not None and tag not in tags) or any(not TAG_RE.match(t) for t in tags):
        return _resolve_stepwise(repo, sha, tag, with_tags=with_tags)  # the precise refusal
    return SourceIdentity(repo=repo, sha=sha, git_tree=tree, tags=tags,
                          tag=check_tag_name(tag) if tag else expected_tag(sha, tags))


def expected_tag(sha: str, tags: tuple[str, ...]) -> str | None:
    """Without ``--tag``, the tag the runtime must report (CONTRACT section 1): the one tag at *sha*
    (every one passed the tag rule); none: ``None``; several: a usage error naming them."""
    if len(tags) > 1:
        raise UsageError(f"{len(tags)} tags point at {sha}: {', '.join(tags)}; name the one the runtime must "
                         "report with --tag TAG; nothing was run")
    return tags[0] if tags else None


def _commit_tree(repo: str, sha: str) -> str | None:
    """The tree of commit *sha* from one ``git cat-file --batch``; ``None`` when
    git's answer is not exactly that commit (missing, another object format, ...)."""
    argv = ["git", "-C", repo, "cat-file", "--batch"]
    done = run_local_argv(argv, argv, "local", timeout=GIT_TIMEOUT, stdin=f"{sha}^{{commit}}\n".encode())
    if done.interrupted:  # a timed-out or killed git says nothing about the repository
        _checked(done, f"commit {sha}", repo)
    if not done.ok or done.stdout_truncated:
        return None
    header, _, body = done.stdout.partition(b"\n")
    fields = header.split(b" ")
    if len(fields) != 3 or fields[0] != sha.encode() or fields[1] != b"commit":
        return None
    first = body.partition(b"\n")[0]
    tree = first[len(b"tree "):].decode("ascii", "replace")
    if not first.startswith(b"tree ") or len(tree) != len(sha) or not SHA_RE.match(tree):
        return None
    return tree


def _tags_at(repo: str, sha: str) -> tuple[str, ...]:
    listed = git(repo, "tag", "--points-at", sha)
    _checked(listed, f"the tags at {sha}", repo)  # a failed listing must not read as "no tag"
    return tuple(sorted(t for t in listed.text().split() if t))



def _resolve_stepwise(repo: str, sha: str, tag: str | None, *, with_tags: bool = True) -> SourceIdentity:
    """:func:`resolve` one question per git call, for the precise refusal."""
    if not os.path.isdir(repo):
        raise Refused(f"source repository {repo} does not exist")
    fmt = git(repo, "rev-parse", "--show-object-format")
    if not fmt.ok:
        if _answered(fmt, 128):  # git's own answer; a timeout or a killed git proves nothing
            raise Refused(f"{repo} is not a git repository: {fmt.error_text()}")
        _checked(fmt, "the object format", repo)
    algo_len = 64 if _one_line(fmt) == "sha256" else 40
    if len(sha) != algo_len:
        raise Refused(f"{sha} has {len(sha)} digits but {repo} uses {_one_line(fmt)} object names ({algo_len} digits)")
    found = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{sha}^{{commit}}")
    if not found.ok and not _answered(found, 1):
        _checked(found, f"commit {sha}", repo)
    if not found.ok or _one_line(found) != sha:
        raise Refused(f"commit {sha} is not in the source repository {repo} (fetch it there first)")
    tree = _checked(git(repo, "rev-parse", "--verify", "--end-of-options", f"{sha}^{{tree}}"),
                    f"the tree of {sha}", repo)
    if not with_tags:
        return SourceIdentity(repo=repo, sha=sha, git_tree=tree, tag=None, tags=())
    listed = git(repo, "tag", "--points-at", sha)
    _checked(listed, f"the tags at {sha}", repo)  # a failed listing must not read as "no tag"
    tags = tuple(sorted(t for t in listed.text().split() if t))
    bad = [t for t in tags if not TAG_RE.match(t)]
    if bad:  # the same rule as --tag: no inferred value may pose as an option (a tag named "--help")
        raise Refused(f"tag {bad[0]!r} points at {sha} in {repo} but is not a valid tag name (the rule --tag "
                      "follows: a letter, digit or '_' first, then letters, digits and ._/+-); vq-admin never "
                      "passes it to a provider or feeds it to a mirror; delete or rename it there, then rerun")
    if tag is not None:
        check_tag_name(tag)
        at = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"refs/tags/{tag}^{{commit}}")
        if not at.ok and not _answered(at, 1):
            _checked(at, f"tag {tag}", repo)
        if not at.ok:
            raise Refused(f"tag {tag} does not exist in {repo}")
        if _one_line(at) != sha:
            raise Refused(f"tag {tag} points at {_one_line(at)} in {repo}, not at the requested {sha}")
    return SourceIdentity(repo=repo, sha=sha, git_tree=tree, tag=tag if tag is not None else expected_tag(sha, tags),
                          tags=tags)


ARCHIVE_NAME = "source.tar"


def archive_argv(repo: str, sha: str, path: str) -> list[str]:
    """The ``git archive`` of the exact commit *sha* of *repo* into *path* (what the ``source`` step runs)."""
    return ["git", "-C", repo, "archive", "--format=tar", "-o", path, "--end-of-options", sha]


def make_archive(ident: SourceIdentity, workdir: str, argv: list[str] | None = None) -> SourceIdentity:
    """Archive the exact commit into *workdir* and prove the archive's tree.  *argv* is the planned
    ``source`` step's, filled (:func:`archive_argv`); any other argv is refused before git runs."""
    path = os.path.join(workdir, ARCHIVE_NAME)
    exact = archive_argv(ident.repo, ident.sha, path)
    if argv is not None and argv != exact:
        raise VqAdminError(f"the planned archive {argv!r} is not the archive of {ident.sha} into {path}; "
                           "nothing was run")
    return prove_archive(ident, path, run_local_argv(exact, exact, "local", timeout=GIT_TIMEOUT))


def prove_archive(ident: SourceIdentity, path: str, made: RunResult) -> SourceIdentity:
    """The identity of the archive ``git archive`` (*made*) wrote to *path*: its tree must be the
    commit's, or the run is refused."""
    if made.interrupted:  # a timed-out or dropped git says nothing about the repository
        _checked(made, f"the archive of {ident.sha}", ident.repo)
    if not made.ok:
        raise Refused(f"git archive {ident.sha} failed in {ident.repo}: {made.error_text()}")
    from .agent.treeid import archive_identity  # tarfile: only when an archive is made

    algo = "sha256" if len(ident.sha) == 64 else "sha1"
    computed = archive_identity(path, algo)
    if computed.git_tree != ident.git_tree:
        raise Refused(
            f"the archive of {ident.sha} holds tree {computed.git_tree}, not the commit's tree {ident.git_tree} "
            "(export-ignore/export-subst attributes alter archives; remove them for this repository)"
        )
    if computed.commit != ident.sha:
        raise Refused(f"the archive of {ident.sha} names commit {computed.commit!r}")
    return SourceIdentity(
        repo=ident.repo, sha=ident.sha, git_tree=ident.git_tree, tag=ident.tag, tags=ident.tags,
        archive_path=path, archive_sha256=computed.archive_sha256, tree_sha256=computed.tree_sha256,
        archive_bytes=os.path.getsize(path),
    )


def head_commit(repo: str) -> str:
    """The full SHA of HEAD, refusing a dirty working tree (helper lane)."""
    status = git(repo, "status", "--porcelain", "--untracked-files=no")
    if not status.ok:
        raise Refused(f"{repo} is not a git repository: {status.error_text()}")
    if status.text().strip():
        raise Refused(f"{repo} has uncommitted changes; commit them or pass --expected-sha")
    head = git(repo, "rev-parse", "--verify", "HEAD^{commit}")
    if not head.ok:
        raise Refused(f"{repo} has no HEAD commit")
    return _one_line(head)
