"""Exact source identity on the driver: commit -> archive, checksums, tree, tag.

The requested full SHA is resolved in the configured checkout (never a branch
tip), archived with ``git archive``, and the archive's recomputed git tree id
must equal the commit's tree: an archive altered by export attributes, or a
repository that lies, is refused before anything is staged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from vq_admin_hookspecs import Slot

from ..core.identifiers import SHA_RE, TAG_RE, object_format
from ..report.outcome import READ_ONLY_RAN, Refused, UsageError, VqAdminError
from ..report.sections import Source
from ..ssh.transport import RunResult, run_local_argv

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

    def to_receipt(self) -> Source:
        return Source(repo=self.repo, sha=self.sha, git_tree=self.git_tree, tag=self.tag, tags=list(self.tags),
                      archive_sha256=self.archive_sha256, tree_sha256=self.tree_sha256,
                      archive_bytes=self.archive_bytes)


#: How vq-admin runs git, on the driver and on the login host (one home, CONTRACT section 10): no
#: program a repository names runs, even in a private repository.  No system-wide file is read, and
#: the environment's configuration (which outranks every file) turns hooks off and overrides the
#: repository's fsmonitor, ssh command and ``ext::`` transport; filter drivers and textconv never run
#: (the archive is made where the repository's configuration and attributes are not read,
#: :func:`make_archive`, and the helper lane's status has them emptied, :func:`head_commit`); the
#: mirror's push names the ``receive-pack`` it runs, hooks off (:data:`RECEIVE_PACK`).
GIT_SETTINGS = (("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"), ("core.sshCommand", "ssh"),
                ("protocol.ext.allow", "never"))


def git_env(*extra: tuple[str, str]) -> dict[str, str]:
    """The environment every git vq-admin starts runs with: :data:`GIT_SETTINGS` and *extra* settings."""
    env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_COUNT": str(len(GIT_SETTINGS) + len(extra))}
    for index, (key, value) in enumerate(GIT_SETTINGS + extra):
        env[f"GIT_CONFIG_KEY_{index}"], env[f"GIT_CONFIG_VALUE_{index}"] = key, value
    return env


GIT_ENV = git_env()
#: What a feed's push runs on the mirror: its ``receive-pack`` with hooks off (the pushing user would run them).
RECEIVE_PACK = "git -c core.hooksPath=/dev/null receive-pack"


def run_git(argv: list[str], *, timeout: float = GIT_TIMEOUT, stdin: bytes | None = None,
            env: dict[str, str] | None = None) -> RunResult:
    """Run the git *argv* on the driver with :data:`GIT_ENV` (or *env*)."""
    return run_local_argv(argv, argv, "local", timeout=timeout, stdin=stdin, env=env or GIT_ENV)


def git(repo: str, *args: str, timeout: float = GIT_TIMEOUT) -> RunResult:
    return run_git(["git", "-C", repo, *args], timeout=timeout)


def git_dir_of(repo: str) -> str:
    """The git directory of the checkout (or bare repository) *repo*: where its configuration,
    hooks and objects are (a worktree's ``.git`` file is followed to its common directory)."""
    dot = os.path.join(repo, ".git")
    if os.path.isfile(dot):
        done = git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
        return _checked(done, "the git directory", repo)
    return dot if os.path.isdir(dot) else repo


def check_repository(repo: str, what: str) -> None:
    """Refuse (77) the checkout *repo* unless it, its git directory and its configuration pass the
    secure-path rule: git reads them as the administrator (CONTRACT section 10)."""
    from ..core.securepath import path_problem

    if not os.path.isdir(repo):
        raise Refused(f"{what} {repo} does not exist")
    for path in (repo, git_dir := git_dir_of(repo), os.path.join(git_dir, "config")):
        problem = path_problem(path, what=what, missing_ok=path != repo)
        if problem:
            raise Refused(f"{problem}; refusing it (another user could make git run a program as you)")
    for where, directory in alternates(git_dir):  # object stores git borrows from: their objects are the tree
        problem = path_problem(directory, what=f"{what} {repo}: {where}", missing_ok=True)
        if problem:
            raise Refused(f"{problem}; refusing it (another user could change the objects git reads from there)")


def alternates(git_dir: str) -> list[tuple[str, str]]:
    """Each object directory git borrows from for *git_dir*: (where it is named, absolute path):
    ``objects/info/alternates`` (recursively, as git follows them) and ``GIT_ALTERNATE_OBJECT_DIRECTORIES``."""
    found = [("GIT_ALTERNATE_OBJECT_DIRECTORIES", d) for d in
             os.environ.get("GIT_ALTERNATE_OBJECT_DIRECTORIES", "").split(":") if d]
    todo, seen = [os.path.join(git_dir, "objects")], set[str]()
    while todo and len(seen) < 16:
        objects = os.path.normpath(todo.pop())
        seen.add(objects)
        listed = os.path.join(objects, "info", "alternates")
        try:
            with open(listed, encoding="utf-8", errors="replace") as fh:
                lines = [line.strip() for line in fh.read(1 << 16).splitlines()]
        except OSError:
            continue
        found.append(("objects/info/alternates", listed))  # the list itself: whoever can edit it picks the store
        for line in lines:
            if line and not line.startswith("#"):
                directory = os.path.normpath(os.path.join(objects, line))
                found.append((f"objects/info/alternates ({listed})", directory))
                if directory not in seen:
                    todo.append(directory)
    return found


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


def resolve(repo: str, sha: str, tag: str | None, *, with_tags: bool = True, infer: bool = True) -> SourceIdentity:
    """Resolve *sha* (full, lower case) and its tag in *repo*, read-only.

    The identity's ``tag`` is the requested one (checked to point at *sha*),
    else the one tag at *sha* (:func:`expected_tag`; *infer* false: ``None``, the caller
    infers it from ``tags``); ``tags`` lists every tag at *sha*.

    *with_tags* false (the helper lane) leaves tags out of the identity.

    Two git processes when all is well (what every cron run pays): one
    ``git cat-file --batch`` gives the commit, its full name and its tree, and
    ``git tag --points-at`` the tags.  Anything else (a SHA git does not answer
    as that exact commit, a tag given that is not among those) is resolved step
    by step for the precise refusal.
    """
    check_repository(repo, "source repository")
    tree = _commit_tree(repo, sha) or _tree_stepwise(repo, sha)
    if not with_tags:
        return SourceIdentity(repo=repo, sha=sha, git_tree=tree, tag=None, tags=())
    tags = _tags_at(repo, sha)
    bad = [t for t in tags if not TAG_RE.match(t)]
    if bad:  # the same rule as --tag: no inferred value may pose as an option (a tag named "--help")
        raise Refused(f"tag {bad[0]!r} points at {sha} in {repo} but is not a valid tag name (the rule --tag "
                      "follows: a letter, digit or '_' first, then letters, digits and ._/+-); vq-admin never "
                      "passes it to a provider or feeds it to a mirror; delete or rename it there, then rerun")
    if tag is not None:
        check_tag_name(tag)
        if tag not in tags:
            _check_tag_at(repo, sha, tag)  # the precise refusal
    elif infer:
        tag = expected_tag(sha, tags)
    return SourceIdentity(repo=repo, sha=sha, git_tree=tree, tag=tag, tags=tags)


def expected_tag(sha: str, tags: tuple[str, ...]) -> str | None:
    """Without ``--tag``, the tag the runtime must report (CONTRACT section 1): the one tag at *sha*
    (every one passed the tag rule); none: ``None``; several: a usage error naming them."""
    if len(tags) > 1:
        raise UsageError(f"{len(tags)} tags point at {sha}: {', '.join(tags)}; name the one the runtime must "
                         f"report with --tag TAG; {READ_ONLY_RAN}")
    return tags[0] if tags else None


def _commit_tree(repo: str, sha: str) -> str | None:
    """The tree of commit *sha* from one ``git cat-file --batch``; ``None`` when
    git's answer is not exactly that commit (missing, another object format, ...)."""
    done = run_git(["git", "-C", repo, "cat-file", "--batch"], stdin=f"{sha}^{{commit}}\n".encode())
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


def _tree_stepwise(repo: str, sha: str) -> str:
    """The tree of commit *sha*, one question per git call, for the precise refusal."""
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
    return _checked(git(repo, "rev-parse", "--verify", "--end-of-options", f"{sha}^{{tree}}"),
                    f"the tree of {sha}", repo)


def _check_tag_at(repo: str, sha: str, tag: str) -> None:
    """Refuse (77) unless the tag *tag* of *repo* names commit *sha*."""
    at = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"refs/tags/{tag}^{{commit}}")
    if not at.ok and not _answered(at, 1):
        _checked(at, f"tag {tag}", repo)
    if not at.ok:
        raise Refused(f"tag {tag} does not exist in {repo}")
    if _one_line(at) != sha:
        raise Refused(f"tag {tag} points at {_one_line(at)} in {repo}, not at the requested {sha}")


ARCHIVE_NAME = "source.tar"


#: The objects-only repository the archive is made in, below the run's work directory.
OBJECTS_ONLY = "objects-only.git"


def archive_argv(repo: str, sha: str, workdir: str | Slot) -> list[str | Slot]:
    """The ``git archive`` of the exact commit *sha* of *repo* into ``<workdir>/source.tar`` (what the
    ``source`` step runs): made in an objects-only repository below *workdir* whose objects are
    *repo*'s (:func:`make_archive`), so no configuration, hook, filter or ``info/attributes`` of *repo*
    takes part; *workdir* is a directory or (the plan) a slot."""
    def below(name: str, prefix: str = "") -> str | Slot:
        if isinstance(workdir, Slot):
            return Slot(workdir.name, label=workdir.label, prefix=prefix, suffix=f"/{name}")
        return f"{prefix}{workdir}/{name}"

    return ["git", "-C", repo, below(OBJECTS_ONLY, "--git-dir="), "archive", "--format=tar",
            "-o", below(ARCHIVE_NAME), "--end-of-options", sha]


def make_archive(ident: SourceIdentity, workdir: str, argv: list[str] | None = None) -> SourceIdentity:
    """Archive the exact commit into *workdir* and prove the archive's tree.  *argv* is the planned
    ``source`` step's, filled (:func:`archive_argv`); any other argv is refused before git runs.

    git runs in a fresh repository holding only an ``objects/info/alternates`` line naming the
    checkout's objects, with no global configuration either: the archive depends on the commit
    alone (its own ``.gitattributes`` included, which the tree proof then judges)."""
    path = os.path.join(workdir, ARCHIVE_NAME)
    exact = [str(word) for word in archive_argv(ident.repo, ident.sha, workdir)]
    if argv is not None and argv != exact:
        raise VqAdminError(f"the planned archive {argv!r} is not the archive of {ident.sha} into {path}; "
                           "the archive was not written")
    bare = os.path.join(workdir, OBJECTS_ONLY)
    for level in (bare, f"{bare}/objects", f"{bare}/objects/info", f"{bare}/refs"):
        os.mkdir(level, 0o700)
    fmt = object_format(ident.sha)
    files = {"HEAD": "ref: refs/heads/main\n",
             "config": f"[core]\n\trepositoryformatversion = 1\n\tbare = true\n[extensions]\n\tobjectformat = {fmt}\n",
             "objects/info/alternates": os.path.join(os.path.abspath(git_dir_of(ident.repo)), "objects") + "\n"}
    for name, text in files.items():
        with open(os.path.join(bare, name), "x", encoding="utf-8") as fh:
            fh.write(text)
    made = run_git(exact, env={**GIT_ENV, "GIT_CONFIG_GLOBAL": os.devnull})
    return prove_archive(ident, path, made)


def prove_archive(ident: SourceIdentity, path: str, made: RunResult) -> SourceIdentity:
    """The identity of the archive ``git archive`` (*made*) wrote to *path*: its tree must be the
    commit's, or the run is refused."""
    if made.interrupted:  # a timed-out or dropped git says nothing about the repository
        _checked(made, f"the archive of {ident.sha}", ident.repo)
    if not made.ok:
        raise Refused(f"git archive {ident.sha} failed in {ident.repo}: {made.error_text()}")
    from ..core.treeid import archive_identity  # tarfile: only when an archive is made

    computed = archive_identity(path, object_format(ident.sha))
    if computed.git_tree != ident.git_tree:
        raise Refused(
            f"the archive of {ident.sha} holds tree {computed.git_tree}, not the commit's tree {ident.git_tree} "
            "(export-ignore/export-subst attributes alter archives; remove them for this repository)"
        )
    if computed.commit != ident.sha:
        raise Refused(f"the archive of {ident.sha} names commit {computed.commit!r}")
    return replace(ident, archive_path=path, archive_sha256=computed.archive_sha256,
                   tree_sha256=computed.tree_sha256, archive_bytes=os.path.getsize(path))


def head_commit(repo: str) -> str:
    """The full SHA of HEAD, refusing a dirty working tree (helper lane).  ``git status`` cleans
    changed files through their filter drivers: every one configured is emptied for it."""
    check_repository(repo, "helper source repository")
    drivers = git(repo, "config", "--name-only", "--get-regexp", r"^filter\.")
    emptied = tuple((key, "false" if key.endswith(".required") else "")
                    for key in sorted(set(drivers.text().split())) if drivers.ok)
    status = run_git(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"], env=git_env(*emptied))
    if not status.ok:
        raise Refused(f"{repo} is not a git repository: {status.error_text()}")
    if status.text().strip():
        raise Refused(f"{repo} has uncommitted changes; commit them or pass --expected-sha")
    head = git(repo, "rev-parse", "--verify", "HEAD^{commit}")
    if not head.ok:
        raise Refused(f"{repo} has no HEAD commit")
    return _one_line(head)
