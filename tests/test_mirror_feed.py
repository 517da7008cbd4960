"""The push-fed source mirror against a real bare repository on the login host,
reached through the real loopback sshd (``real_sshd``).

The driver checkout has a linear history ``a -- b -- c`` on main, with tags
``v1`` (annotated) and ``l1`` (light) at ``b``, ``v2`` (annotated) at ``c``
and ``t-elsewhere`` at ``a``.  Most tests feed the pin ``b`` on lane
``release``.  Every push argv a test sees is checked for force.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from support import GitRepo, git
from vq_admin.source import mirror
from vq_admin.source.mirror_feed import LANE_FED, LANE_LEFT, Feed, plain_runner
from vq_admin.report.outcome import Refused
from vq_admin.source import GIT_ENV, RECEIVE_PACK
from vq_admin.plan import fill
from vq_admin.ssh.transport import Session

pytestmark = pytest.mark.real
DOC = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


# -- fixtures and helpers ------------------------------------------------------------


class Driver:
    def __init__(self, path: Path):
        self.repo = GitRepo(path)
        self.a = self.repo.commit("a")
        self.b = self.repo.commit("b")
        self.c = self.repo.commit("c")
        self.repo.tag("v1", self.b, annotated=True)
        self.repo.tag("l1", self.b)
        self.repo.tag("v2", self.c, annotated=True)
        self.repo.tag("t-elsewhere", self.a)
        self.path = str(self.repo.path)

    def obj(self, ref: str) -> str:
        return git(self.path, "rev-parse", ref)

    def seed(self, mirror_path: Path, *refspecs: str) -> None:
        """Test set-up only: write refs into the mirror directly (never through vq-admin)."""
        git(self.path, "push", "-q", str(mirror_path), *refspecs)


@pytest.fixture
def driver(tmp_path):
    return Driver(tmp_path / "src")


@pytest.fixture
def bare(tmp_path):
    path = tmp_path / "mirror.git"
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


@pytest.fixture
def session(real_sshd):
    with Session(str(real_sshd.ssh_config)) as s:
        yield s


def snapshot(mirror_path: Path) -> str:
    """Every ref of the mirror with its object name and type."""
    return git(mirror_path, "for-each-ref", "--format=%(objectname) %(objecttype) %(refname)")


def ref_map(mirror_path: Path) -> dict[str, str]:
    return {line.split()[2]: line.split()[0] for line in snapshot(mirror_path).splitlines()}


def assert_unforced(argv: list[str]) -> None:
    """A push argv: no force or mirror option, no '+' refspec, only OBJECT:refs/... after '--'."""
    assert argv[:4] == ["git", "-C", argv[2], "push"]
    options, specs = argv[4:argv.index("--")], argv[argv.index("--") + 2:]
    assert options == ["--atomic", "--porcelain", "--no-follow-tags", "--no-recurse-submodules", "--no-verify",
                       f"--receive-pack={RECEIVE_PACK}"]  # the mirror's hooks off
    for word in argv:
        assert word not in mirror.FORBIDDEN_PUSH_OPTIONS
        assert not word.startswith(("--force", "--mirror", "+"))
    assert specs and all(re.fullmatch(r"[0-9a-f]{40}:refs/\S+", s) for s in specs)


class Log:
    """A runner recording every command of a feed."""

    def __init__(self):
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, name, transport, argv, env, timeout, **values):
        self.calls.append((name, fill(argv, values)))
        if name == "mirror-feed":
            assert_unforced(fill(argv, values))
        return plain_runner(name, transport, argv, env, timeout, **values)

    @property
    def names(self) -> list[str]:
        """Step names in order; the per-ref ``mirror-symrefs`` calls count once."""
        found: list[str] = []
        for name, _ in self.calls:
            if not (found and found[-1] == name == "mirror-symrefs"):
                found.append(name)
        return found

    def pushes(self) -> list[list[str]]:
        return [argv for name, argv in self.calls if name == "mirror-feed"]


def make_feed(session, bare, driver, sha, *, lane="release", preparer_reads="lane", before_push=None, log=None):
    return Feed(login=session.ssh("cluster"), path=str(bare), repo=driver.path, sha=sha, lane=lane,
                preparer_reads=preparer_reads, program="vibeqc", host="cluster", run=log or Log(),
                before_push=before_push)


def documented_refusal() -> str:
    """The refusal template exactly as docs/operations.md shows it (the ref line once)."""
    text = DOC.read_text()
    block = text.split("<!-- refusal-text -->", 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0]
    return block


def expected_refusal(bare, rows) -> str:
    """The documented text filled in for *rows* of (ref, held, requested, reason)."""
    head, ref_line, tail = documented_refusal().split("\n")
    lines = [ref_line.format(ref=r, held=h, requested=q, reason=why) for r, h, q, why in rows]
    return "\n".join([head.format(mirror=bare, where="cluster"), *lines,
                      tail.format(program="vibeqc", host="cluster")])


# -- the documentation is the code's text ---------------------------------------------


def test_documented_refusal_is_the_code_template():
    assert documented_refusal() + "\n" == mirror.REFUSAL.replace("{refs}", mirror.REFUSAL_REF).rstrip("\n") + "\n"
    reasons = DOC.read_text().split("<!-- refusal-reasons -->", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\* `(.*)`$", reasons, re.MULTILINE)
    assert listed == [mirror.ADVANCED, mirror.DIVERGED, mirror.UNSEEN, mirror.NOT_A_COMMIT,
                      mirror.TAG_ELSEWHERE, mirror.PIN_ELSEWHERE, mirror.RACED]


def test_documented_probe_refusal_is_the_code_template():
    section = DOC.read_text().split("### A missing or wrong mirror", 1)[1].split("### ", 1)[0]
    block = section.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert block == mirror.PROBE_REFUSAL.replace("{quoted}", "{mirror}")
    for problem in (mirror.MISSING, mirror.NOT_A_REPOSITORY, mirror.WORKING_CHECKOUT):
        assert f"`{problem}`" in section


# -- successful feeds -------------------------------------------------------------------


def test_first_feed_creates_pin_branch_pair_and_tags_at_the_pin(session, bare, driver):
    log = Log()
    feed = make_feed(session, bare, driver, driver.b, log=log)
    feed.feed()
    assert ref_map(bare) == {
        f"refs/vq/pins/{driver.b}": driver.b,
        "refs/heads/release": driver.b,
        "refs/remotes/origin/release": driver.b,
        "refs/tags/l1": driver.b,
        "refs/tags/v1": driver.obj("refs/tags/v1"),
    }
    assert git(bare, "cat-file", "-t", "refs/tags/v1") == "tag"  # the annotated tag object itself
    assert log.names == ["mirror-probe", "mirror-symrefs", "mirror-read", "mirror-feed", "mirror-confirm"]
    assert len(log.pushes()) == 1
    receipt = feed.to_receipt()
    assert receipt["lane_branch"] == LANE_FED and receipt["push"]["exit_code"] == 0
    assert receipt["url"] == f"cluster:{bare}"
    assert {r["ref"]: r["action"] for r in receipt["refs"]} == {
        f"refs/vq/pins/{driver.b}": "create", "refs/heads/release": "create",
        "refs/remotes/origin/release": "create", "refs/tags/l1": "create", "refs/tags/v1": "create"}
    assert all(r["old"] is None and r["new"] == r["requested"] for r in receipt["refs"])


def test_second_feed_of_the_same_pin_changes_nothing(session, bare, driver):
    make_feed(session, bare, driver, driver.b).feed()
    before = snapshot(bare)
    feed = make_feed(session, bare, driver, driver.b)
    feed.feed()
    assert snapshot(bare) == before
    assert {r.action for r in feed.refs} == {"unchanged"}


def test_feed_of_a_descendant_fast_forwards_the_pair_and_adds_its_pin(session, bare, driver):
    make_feed(session, bare, driver, driver.b).feed()
    feed = make_feed(session, bare, driver, driver.c)
    feed.feed()
    refs = ref_map(bare)
    assert refs["refs/heads/release"] == refs["refs/remotes/origin/release"] == driver.c
    assert refs[f"refs/vq/pins/{driver.c}"] == driver.c
    assert refs[f"refs/vq/pins/{driver.b}"] == driver.b  # the older pin stays
    assert refs["refs/tags/v2"] == driver.obj("refs/tags/v2") and refs["refs/tags/v1"] == driver.obj("refs/tags/v1")
    actions = {r.ref: r.action for r in feed.refs}
    assert actions == {f"refs/vq/pins/{driver.c}": "create", "refs/heads/release": "fast-forward",
                       "refs/remotes/origin/release": "fast-forward", "refs/tags/v2": "create"}


def test_refs_outside_the_set_stay_byte_identical(session, bare, driver):
    driver.seed(bare, f"{driver.a}:refs/heads/dev", f"{driver.c}:refs/tags/t-elsewhere",
                f"{driver.obj('refs/tags/v2')}:refs/tags/other", f"{driver.a}:refs/remotes/origin/dev",
                f"{driver.c}:refs/notes/commits", f"{driver.a}:refs/heads/release")
    outside = {k: v for k, v in ref_map(bare).items() if k != "refs/heads/release"}
    assert outside["refs/tags/t-elsewhere"] != driver.obj("refs/tags/t-elsewhere")  # held elsewhere by the driver
    feed = make_feed(session, bare, driver, driver.b)
    feed.feed()
    after = ref_map(bare)
    assert {k: after[k] for k in outside} == outside
    assert set(after) - set(outside) == {r.ref for r in feed.refs}
    assert "refs/tags/t-elsewhere" not in " ".join(feed.push_command())


# -- refusals before any push -----------------------------------------------------------


def refused(feed) -> str:
    with pytest.raises(Refused) as caught:
        feed.feed()
    assert caught.value.outcome.exit_code == 77
    return caught.value.message


def test_branch_advanced_past_the_pin_is_refused_with_the_documented_text(session, bare, driver):
    driver.seed(bare, f"{driver.c}:refs/heads/release", f"{driver.c}:refs/remotes/origin/release",
                f"{driver.a}:refs/heads/dev")
    before = snapshot(bare)
    log = Log()
    message = refused(make_feed(session, bare, driver, driver.b, log=log))
    assert message == expected_refusal(bare, [
        ("refs/heads/release", driver.c, driver.b, mirror.ADVANCED),
        ("refs/remotes/origin/release", driver.c, driver.b, mirror.ADVANCED),
    ])
    assert snapshot(bare) == before
    assert log.pushes() == [] and log.names == ["mirror-probe", "mirror-symrefs", "mirror-read"]


def test_branch_at_a_commit_unknown_to_the_driver_is_refused(session, bare, driver):
    tree = git(bare, "mktree", check=True)
    stranger = git(bare, "commit-tree", tree, "-m", "made on the mirror")
    git(bare, "update-ref", "refs/heads/release", stranger)
    assert subprocess.run(["git", "-C", driver.path, "cat-file", "-e", stranger]).returncode != 0
    before = snapshot(bare)
    log = Log()
    message = refused(make_feed(session, bare, driver, driver.b, log=log))
    assert message == expected_refusal(bare, [("refs/heads/release", stranger, driver.b, mirror.UNSEEN)])
    assert snapshot(bare) == before and log.pushes() == []


def test_diverged_branch_is_refused(session, bare, driver):
    side = driver.repo
    git(side.path, "checkout", "-q", "-b", "side", driver.a)
    other = side.commit("side")
    git(side.path, "checkout", "-q", "main")
    driver.seed(bare, f"{other}:refs/heads/release")
    before = snapshot(bare)
    message = refused(make_feed(session, bare, driver, driver.b))
    assert message == expected_refusal(bare, [("refs/heads/release", other, driver.b, mirror.DIVERGED)])
    assert snapshot(bare) == before


def test_tag_of_the_set_held_at_another_object_is_refused(session, bare, driver):
    driver.seed(bare, f"{driver.a}:refs/tags/v1")
    before = snapshot(bare)
    log = Log()
    message = refused(make_feed(session, bare, driver, driver.b, log=log))
    assert message == expected_refusal(bare, [("refs/tags/v1", driver.a, driver.obj("refs/tags/v1"),
                                               mirror.TAG_ELSEWHERE)])
    assert snapshot(bare) == before and log.pushes() == []


def test_pin_ref_at_another_commit_is_refused(session, bare, driver):
    driver.seed(bare, f"{driver.a}:refs/vq/pins/{driver.b}")
    before = snapshot(bare)
    message = refused(make_feed(session, bare, driver, driver.b))
    assert message == expected_refusal(bare, [(f"refs/vq/pins/{driver.b}", driver.a, driver.b, mirror.PIN_ELSEWHERE)])
    assert snapshot(bare) == before


# -- the mirror changes between the read and the push -------------------------------------


def test_mirror_moved_between_read_and_push_is_refused_with_nothing_half_applied(session, bare, driver):
    driver.seed(bare, f"{driver.a}:refs/heads/release", f"{driver.c}:refs/heads/dev")
    moved = {}

    def advance_branch(m):  # someone else advances the lane branch past the pin
        git(m.path, "update-ref", "refs/heads/release", driver.c)
        moved["snapshot"] = snapshot(bare)

    log = Log()
    feed = make_feed(session, bare, driver, driver.b, before_push=advance_branch, log=log)
    message = refused(feed)
    assert snapshot(bare) == moved["snapshot"]  # no pin ref, no tags, no origin/release: nothing half-applied
    assert f"refs/vq/pins/{driver.b}" not in ref_map(bare)
    assert len(log.pushes()) == 1
    reason = mirror.RACED.format(why="non-fast-forward")
    assert message == expected_refusal(bare, [("refs/heads/release", driver.c, driver.b, reason)])
    assert feed.to_receipt()["push"]["exit_code"] == 1


def test_tag_created_between_read_and_push_is_refused(session, bare, driver):
    def plant_tag(m):
        driver.seed(Path(m.path), f"{driver.a}:refs/tags/l1")

    feed = make_feed(session, bare, driver, driver.b, before_push=plant_tag)
    message = refused(feed)
    assert ref_map(bare) == {"refs/tags/l1": driver.a}
    assert "refs/tags/l1: the mirror holds " + driver.a in message
    assert "(already exists)" in message


# -- preparer_reads = "pin" -------------------------------------------------------------


def test_pin_preparer_is_not_blocked_by_a_drifted_branch(session, bare, driver):
    driver.seed(bare, f"{driver.c}:refs/heads/release", f"{driver.a}:refs/remotes/origin/release")
    log = Log()
    feed = make_feed(session, bare, driver, driver.b, preparer_reads="pin", log=log)
    feed.feed()
    refs = ref_map(bare)
    assert refs["refs/heads/release"] == driver.c and refs["refs/remotes/origin/release"] == driver.a
    assert refs[f"refs/vq/pins/{driver.b}"] == driver.b and refs["refs/tags/v1"] == driver.obj("refs/tags/v1")
    (push,) = log.pushes()
    assert not any(w.endswith("/release") for w in push)
    assert feed.source_ref == f"refs/vq/pins/{driver.b}"
    assert feed.lane_branch == LANE_LEFT and feed.notes and "left exactly as it is" in feed.notes[0]


def test_pin_preparer_still_feeds_an_undrifted_pair(session, bare, driver):
    feed = make_feed(session, bare, driver, driver.b, preparer_reads="pin")
    feed.feed()
    assert ref_map(bare)["refs/heads/release"] == driver.b and feed.lane_branch == LANE_FED


def test_pin_preparer_still_refuses_a_conflicting_tag(session, bare, driver):
    driver.seed(bare, f"{driver.c}:refs/heads/release", f"{driver.a}:refs/tags/l1")
    before = snapshot(bare)
    message = refused(make_feed(session, bare, driver, driver.b, preparer_reads="pin"))
    assert message == expected_refusal(bare, [("refs/tags/l1", driver.a, driver.b, mirror.TAG_ELSEWHERE)])
    assert snapshot(bare) == before


# -- the probe ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "plain", "checkout", "inside-bare"])
def test_a_mirror_that_is_not_a_bare_repository_is_refused_with_the_creation_command(session, tmp_path, driver, kind):
    if kind == "missing":
        path, problem = tmp_path / "no such.git", mirror.MISSING
    elif kind == "plain":
        path, problem = tmp_path / "plain", mirror.NOT_A_REPOSITORY
        path.mkdir()
    elif kind == "checkout":
        path, problem = tmp_path / "checkout", mirror.WORKING_CHECKOUT
        GitRepo(path).commit("x")
    else:
        outer = tmp_path / "outer.git"
        subprocess.run(["git", "init", "-q", "--bare", str(outer)], check=True)
        path, problem = outer / "refs", mirror.NOT_A_REPOSITORY
    before = git(path, "for-each-ref", check=False) if kind == "checkout" else None
    log = Log()
    feed = Feed(login=session.ssh("cluster"), path=str(path), repo=driver.path, sha=driver.b, lane="release",
                preparer_reads="lane", program="vibeqc", host="cluster", run=log)
    message = refused(feed)
    assert problem in message
    assert f"git init --bare {shlex.quote(str(path))}" in message
    assert log.names == ["mirror-probe"]
    if kind == "missing":
        assert not path.exists()
    if kind == "checkout":
        assert git(path, "for-each-ref") == before and not (path / "refs").exists()


# -- the ref set --------------------------------------------------------------------------


def test_ref_set_is_exactly_pin_pair_and_tags_at_the_pin(driver):
    driver.repo.tag("nested", "v1", annotated=True)  # a tag of a tag: git tag --points-at does not list it
    names = [r.ref for r in mirror.ref_set(driver.path, driver.b, "release")]
    assert names == [f"refs/vq/pins/{driver.b}", "refs/heads/release", "refs/remotes/origin/release",
                     "refs/tags/l1", "refs/tags/v1"]
    listed = git(driver.path, "tag", "--points-at", driver.b).split()
    assert sorted("refs/tags/" + t for t in listed) == names[3:]


# -- a login host reached locally, and urls ---------------------------------------------


def test_local_transport_feeds_the_plain_path(tmp_path, bare, driver):
    from vq_admin.ssh.transport import LocalTransport

    log = Log()
    feed = Feed(login=LocalTransport(), path=str(bare), repo=driver.path, sha=driver.b, lane="main",
                preparer_reads="lane", program="vibeqc", host="cluster", run=log)
    feed.feed()
    assert feed.mirror.url == str(bare) and feed.git_env == GIT_ENV  # no ssh: only how git is run
    assert ref_map(bare)["refs/heads/main"] == driver.b


def test_a_destination_git_cannot_put_in_a_url_is_a_usage_error(bare):
    from vq_admin.report.outcome import UsageError
    from vq_admin.ssh.transport import SshTransport

    with pytest.raises(UsageError, match=r"^hosts\.cluster\.ssh: 'fe80::1' contains ':'") as caught:
        mirror.mirror_for(SshTransport("fe80::1", None, None), str(bare), "hosts.cluster.ssh")
    assert caught.value.outcome.exit_code == 2
    assert mirror.mirror_for(SshTransport("ops@login", None, None),
                             "/srv/git/a b.git").url == "ops@login:/srv/git/a b.git"


def test_a_mirror_path_with_a_space_and_a_colon_is_fed_over_ssh(session, tmp_path, driver):
    odd = tmp_path / "odd dir:x" / "mirror's.git"
    subprocess.run(["git", "init", "-q", "--bare", str(odd)], check=True)
    feed = make_feed(session, odd, driver, driver.b)
    feed.feed()
    assert ref_map(odd)[f"refs/vq/pins/{driver.b}"] == driver.b


# -- a push whose transport fails is settled by reading the mirror back ------------------


class DroppedPush(Log):
    """The push's connection 'drops' (git exits 128): after the push ran, or before it could."""

    def __init__(self, push_first: bool, read_back_fails: bool = False,
                 words: str = "fatal: the remote end hung up unexpectedly"):
        super().__init__()
        self.push_first, self.read_back_fails, self.words = push_first, read_back_fails, words

    def __call__(self, name, transport, argv, env, timeout, **values):
        from vq_admin.ssh.transport import RunResult

        if name == "mirror-feed":
            if self.push_first:
                assert super().__call__(name, transport, argv, env, timeout, **values).ok
            else:
                self.calls.append((name, fill(argv, values)))
            return RunResult(fill(argv, values), "local", 128, b"", self.words.encode() + b"\n")
        if name == "mirror-confirm" and self.read_back_fails:
            self.calls.append((name, fill(argv, values)))
            return RunResult(fill(argv, values), "local", 128, b"", b"fatal: Could not read from remote repository.\n")
        return super().__call__(name, transport, argv, env, timeout, **values)


def test_a_dropped_push_that_applied_is_settled_as_fed(session, bare, driver):
    runner = DroppedPush(push_first=True)
    feed = make_feed(session, bare, driver, driver.b, log=runner)
    feed.feed()
    assert feed.push["outcome"].startswith("pushed (git exited 128")
    assert runner.names.count("mirror-confirm") == 1
    assert all(r.new == r.requested for r in feed.refs)


def test_a_push_that_never_reached_the_mirror_fails_with_nothing_changed(session, bare, driver):
    from vq_admin.report.outcome import VqAdminError

    runner = DroppedPush(push_first=False, words="fatal: Could not read from remote repository.")
    feed = make_feed(session, bare, driver, driver.b, log=runner)
    with pytest.raises(VqAdminError, match="read-back shows nothing changed") as caught:
        feed.feed()
    assert caught.value.outcome.exit_code == 1 and snapshot(bare) == ""


def test_a_push_cut_off_before_the_mirror_reported_is_unknown_though_nothing_applied_yet(session, bare, driver):
    """git lost the connection mid-push: the receive left on the mirror may still apply it after the
    read-back (tests/test_chaos_ssh.py shows a real one that does), so "unchanged" is only "not yet"."""
    feed = make_feed(session, bare, driver, driver.b, log=DroppedPush(push_first=False))
    with pytest.raises(mirror.FeedUnknown, match="may still be running") as caught:
        feed.feed()
    assert caught.value.outcome.exit_code == 3 and snapshot(bare) == ""
    assert feed.push["outcome"].startswith("unknown") and "Re-check with: git -C" in caught.value.message


def test_a_dropped_push_that_cannot_be_read_back_is_unknown(session, bare, driver):
    feed = make_feed(session, bare, driver, driver.b, log=DroppedPush(push_first=False, read_back_fails=True))
    with pytest.raises(mirror.FeedUnknown) as caught:
        feed.feed()
    assert caught.value.outcome.exit_code == 3 and feed.push["outcome"].startswith("unknown")
