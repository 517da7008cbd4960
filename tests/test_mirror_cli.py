"""Full ``vq-admin update PROGRAM HOST`` runs with ``feed_source_mirror`` set: the
site_example provider over the real loopback sshd, a real bare mirror, and a
site preparer that records its argv and what the mirror's source ref names.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from support import run_vq, site_example_host, write_config
from test_mirror_feed import Driver, assert_unforced, expected_refusal, ref_map, snapshot
from vq_admin.source import mirror
from vq_admin.core import failpoints
from vq_admin.source.mirror_feed import LANE_FED, LANE_LEFT

pytestmark = pytest.mark.real
MIRROR_STEPS = ["mirror-probe", "mirror-symrefs", "mirror-read", "mirror-feed", "mirror-confirm"]


class Site:
    """A driver checkout, a bare mirror, a preparer and a configuration for host ``cluster``."""

    def __init__(self, tmp: Path, sshd, *, preparer_reads: str = "lane", mirror_path: Path | None = None,
                 prepare_exit: int = 0):
        self.tmp = tmp
        self.driver = Driver(tmp / "src")
        self.mirror = mirror_path or tmp / "mirror.git"
        if mirror_path is None:
            subprocess.run(["git", "init", "-q", "--bare", str(self.mirror)], check=True)
        for d in ("scratch", "root"):
            (tmp / d).mkdir()
        self.prep_out = tmp / "prep"
        prep = tmp / "prepare.sh"
        prep.write_text("#!/bin/sh\n"
                        f"printf '%s\\n' \"$@\" > {shlex.quote(str(self.prep_out))}.args\n"
                        f"git -C {shlex.quote(str(self.mirror))} rev-parse --verify \"$2\" "
                        f"> {shlex.quote(str(self.prep_out))}.resolved\n"
                        f"echo 'preparer says no' >&2\nexit {prepare_exit}\n")
        prep.chmod(0o755)
        profile = (f'feed_source_mirror = "{self.mirror}"\nlane = "release"\n'
                   f'prepare_command = "{prep}"\npreparer_reads = "{preparer_reads}"\n')
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{sshd.ssh_config}"\n' + site_example_host(
            "cluster", root=tmp / "root", repo=self.driver.repo.path, scratch=tmp / "scratch", transport="ssh",
            ssh="cluster", extra_profile=profile))

    def update(self, sha: str, *extra: str, env: dict[str, str] | None = None):
        result = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--tag", "v1", "--cluster-install",
                        "--json", "-v",
                        *extra, config=self.config, state=self.tmp / "state", env=env)
        return result, result.json()

    def prepared(self) -> tuple[list[str], str] | None:
        args = Path(f"{self.prep_out}.args")
        if not args.exists():
            return None
        return args.read_text().splitlines(), Path(f"{self.prep_out}.resolved").read_text().strip()


def steps(receipt) -> dict[str, dict]:
    return {s["name"]: s for s in receipt["steps"]}


def test_feed_runs_before_staging_the_preparer_and_the_deploy(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd)
    b = site.driver.b
    result, receipt = site.update(b)
    assert result.exit_code == 0, result.stderr
    names = [s["name"] for s in receipt["steps"]]
    at = names.index
    assert at("pre-verify") < at("mirror-probe") < at("mirror-read") < at("mirror-feed") < at("mirror-confirm") \
        < at("prepare") < at("stage-create") < at("deploy")
    by_name = steps(receipt)
    for name in MIRROR_STEPS + ["prepare", "deploy"]:
        step = by_name[name]
        code = 1 if name == "mirror-symrefs" else 0  # git symbolic-ref -q: 1 is "not a symbolic ref"
        assert step["status"] == "ok" and step["exit_code"] == code and isinstance(step["seconds"], float), step
    assert by_name["mirror-probe"]["argv"] == ["git", "-C", str(site.mirror), "rev-parse", "--is-bare-repository"]
    assert by_name["mirror-probe"]["where"] == "cluster"
    ssh_command = shlex.split(by_name["mirror-feed"]["env"]["GIT_SSH_COMMAND"])
    assert ssh_command[:3] == ["ssh", "-F", str(real_sshd.ssh_config)] and "BatchMode=yes" in ssh_command
    assert_unforced(by_name["mirror-feed"]["argv"])
    # the preparer ran after the feed, on the fed mirror, reading the lane branch
    assert site.prepared() == (["--source-ref", "refs/heads/release", "--program", "vibeqc", "--expected-sha", b], b)
    m = receipt["mirror"]
    assert m["mirror"] == str(site.mirror) and m["preparer_reads"] == "lane" and m["lane_branch"] == LANE_FED
    assert m["source_ref"] == "refs/heads/release"
    assert m["push"]["argv"] == by_name["mirror-feed"]["argv"] and m["push"]["exit_code"] == 0
    assert {r["ref"]: (r["old"], r["new"], r["action"]) for r in m["refs"]} == {
        f"refs/vq/pins/{b}": (None, b, "create"),
        "refs/heads/release": (None, b, "create"),
        "refs/remotes/origin/release": (None, b, "create"),
        "refs/tags/l1": (None, b, "create"),
        "refs/tags/v1": (None, site.driver.obj("refs/tags/v1"), "create"),
    }
    assert set(ref_map(site.mirror)) == {r["ref"] for r in m["refs"]}


def test_drifted_lane_branch_is_refused_before_the_preparer_and_the_deploy(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd)
    d = site.driver
    d.seed(site.mirror, f"{d.c}:refs/heads/release", f"{d.a}:refs/heads/dev")
    before = snapshot(site.mirror)
    result, receipt = site.update(d.b)
    assert result.exit_code == 77 and receipt["outcome"] == "refused"
    assert receipt["errors"] == [expected_refusal(site.mirror, [("refs/heads/release", d.c, d.b, mirror.ADVANCED)])]
    by_name = steps(receipt)
    assert by_name["mirror-feed"]["status"] == "skipped" and by_name["mirror-feed"]["exit_code"] is None
    assert by_name["prepare"]["status"] == "skipped" and by_name["deploy"]["status"] == "skipped"
    assert by_name["stage-create"]["status"] == "skipped"  # refused before anything was staged
    assert snapshot(site.mirror) == before and site.prepared() is None
    assert receipt["mirror"]["push"]["argv"] is None
    assert [r["action"] for r in receipt["mirror"]["refs"] if r["ref"] == "refs/heads/release"] == ["refuse"]


def test_pin_preparer_deploys_past_a_drifted_branch_and_says_so(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd, preparer_reads="pin")
    d = site.driver
    d.seed(site.mirror, f"{d.c}:refs/heads/release", f"{d.c}:refs/remotes/origin/release")
    result, receipt = site.update(d.b)
    assert result.exit_code == 0, result.stderr
    assert site.prepared() == (["--source-ref", f"refs/vq/pins/{d.b}", "--program", "vibeqc", "--expected-sha", d.b],
                               d.b)
    refs = ref_map(site.mirror)
    assert refs["refs/heads/release"] == refs["refs/remotes/origin/release"] == d.c  # left exactly as it was
    assert refs[f"refs/vq/pins/{d.b}"] == d.b
    m = receipt["mirror"]
    assert m["lane_branch"] == LANE_LEFT and m["preparer_reads"] == "pin"
    assert {r["ref"]: r["action"] for r in m["refs"] if r["kind"] == "branch"} == {
        "refs/heads/release": "left-drifted", "refs/remotes/origin/release": "left-drifted"}
    assert not any(w.endswith("/release") for w in m["push"]["argv"])
    assert receipt["notes"] and "left exactly as it is" in receipt["notes"][0]
    assert "left exactly as it is because the preparer reads refs/vq/pins/" in result.stderr


def test_test_hook_moving_the_mirror_before_the_push_ends_refused_with_nothing_half_applied(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd)
    d = site.driver
    d.seed(site.mirror, f"{d.a}:refs/heads/release", f"{d.c}:refs/heads/dev")
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\ngit -C "$1" update-ref refs/heads/release {d.c}\n'
                    f'git -C "$1" for-each-ref --format="%(objectname) %(objecttype) %(refname)" > {tmp_path}/moved\n')
    hook.chmod(0o755)
    result, receipt = site.update(d.b, env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_TEST_HOOK_BEFORE_PUSH": str(hook)})
    assert result.exit_code == 77, result.stderr
    assert snapshot(site.mirror) == (tmp_path / "moved").read_text().strip()
    reason = mirror.RACED.format(why="non-fast-forward")
    assert receipt["errors"] == [expected_refusal(site.mirror, [("refs/heads/release", d.c, d.b, reason)])]
    assert steps(receipt)["mirror-feed"]["exit_code"] == 1 and steps(receipt)["deploy"]["status"] == "skipped"
    assert_unforced(receipt["mirror"]["push"]["argv"])


def test_test_hook_is_ignored_without_the_testing_switch(tmp_path):
    marker, hook = tmp_path / "ran", tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    m = mirror.Mirror(path=str(tmp_path / "m.git"), where="local", url=str(tmp_path / "m.git"))
    env = {"VQ_ADMIN_TEST_HOOK_BEFORE_PUSH": str(hook)}
    try:
        failpoints.configure(env)  # the environment a process would start with, without VQ_ADMIN_TESTING
        mirror.run_test_hook(m)
        assert not marker.exists()
        failpoints.configure({**env, "VQ_ADMIN_TESTING": "1"})
        mirror.run_test_hook(m)
        assert marker.exists()
    finally:
        failpoints.configure()


def test_missing_mirror_is_refused_with_the_creation_command(tmp_path, real_sshd):
    missing = tmp_path / "srv" / "vibeqc.git"
    site = Site(tmp_path, real_sshd, mirror_path=missing)
    result, receipt = site.update(site.driver.b)
    assert result.exit_code == 77
    assert f"git init --bare {missing}" in receipt["errors"][0] and mirror.MISSING in receipt["errors"][0]
    assert [s["name"] for s in receipt["steps"] if s["status"] not in ("skipped",) and s["name"].startswith("mirror")] \
        == ["mirror-probe"]
    assert not missing.exists() and not missing.parent.exists() and site.prepared() is None


def test_dry_run_lists_the_feed_and_changes_nothing(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd)
    result, plan = site.update(site.driver.b, "--dry-run")
    assert result.exit_code == 0, result.stderr
    names = [s["name"] for s in plan["steps"]]
    assert names[names.index("mirror-probe"):names.index("source")] == MIRROR_STEPS + ["prepare"]
    push = steps(plan)["mirror-feed"]["argv"]
    assert push.count("[<lane branch pair>]...") == 1  # the list slot the mirror's read fills
    assert_unforced([w for w in push if w != "[<lane branch pair>]..."])
    assert snapshot(site.mirror) == "" and site.prepared() is None
    assert not os.listdir(tmp_path / "scratch")


def test_a_failing_preparer_fails_the_run_before_the_deploy(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd, prepare_exit=3)
    result, receipt = site.update(site.driver.b)
    assert result.exit_code == 1 and receipt["outcome"] == "failed"
    assert receipt["errors"] == ["prepare: the preparer exited 3 on cluster: preparer says no"]
    by_name = steps(receipt)
    assert by_name["prepare"]["exit_code"] == 3 and by_name["prepare"]["status"] == "failed"
    assert by_name["deploy"]["status"] == "skipped" and by_name["stage-create"]["status"] == "skipped"
    assert site.prepared()[1] == site.driver.b  # the feed had happened: the preparer read the fed branch
