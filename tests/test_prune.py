"""``vq admin prune`` against real Slurm through the real loopback sshd, with real git.

Five generations A..E of a tiny program are deployed with the site_example
provider (its ``vq_admin_runtime_prune`` hook); a held Slurm job is bound to
A's verified launcher.  ``prune --keep 1`` keeps E (active, LAST OK, most
recent), D (LAST GOOD) and A (the held job), removes B and C; the job,
released afterwards, runs A.  Every wait is on a condition, with a bound.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from real_jobs import SELFTEST, release_and_wait, ssh, submit_held_selftest
from support import AGENT, SITE_EXAMPLE, GitRepo, run_vq, site_example_host, tree_digest, write_config
from vq_admin.report.output import receipt_summary

pytestmark = pytest.mark.real


class Site:
    def __init__(self, tmp: Path, cluster, labels: str, *, program: str = "vibeqc", profile: str | None = None):
        self.tmp, self.cluster, self.program = tmp, cluster, program
        repo = GitRepo(tmp / "repo")
        self.sha = {label: repo.commit(label, {"vq_selftest.py": SELFTEST.format(label=label)}) for label in labels}
        self.root, scratch = tmp / "apps" / program, tmp / "scratch"
        scratch.mkdir()
        host = site_example_host("cluster", root=self.root, repo=repo.path, scratch=scratch, transport="ssh",
                                 ssh="cluster", program=program)
        if profile is not None:
            head, _, _ = host.partition(f"[hosts.cluster.scheduler_runtime_deployments.{program}]")
            host = head + textwrap.dedent(profile.format(root=self.root, repo=repo.path, site=SITE_EXAMPLE,
                                                         program=program))
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{cluster.ssh_config}"\n' + host)
        self.state = tmp / "state"

    def vq(self, *args: str, timeout: float = 600):
        return run_vq(*args, config=self.config, state=self.state, timeout=timeout)

    def deploy(self, label: str, *extra: str) -> None:
        done = self.vq("update", self.program, "cluster", "--expected-sha", self.sha[label], "--json", *extra)
        assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def deploy_all(self) -> None:
        for i, label in enumerate(self.sha):
            self.deploy(label, *(["--cluster-install"] if i == 0 else []))

    def releases(self) -> list[str]:
        return sorted(p.name for p in (self.root / "releases").iterdir())

    def shas(self, labels: str) -> list[str]:
        return sorted(self.sha[k] for k in labels)


def test_prune_keeps_what_a_held_job_needs_and_the_job_then_runs(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "ABCDE", program="prune-held")
    # its own program: the login host's record is the worker's sshd account's, shared with the tests
    # before it, and their drivers' roots of a program would be kept here too (CONTRACT section 12)
    sha, root = site.sha, site.root
    site.deploy_all()
    bound = site.vq("launcher", site.program, "cluster", "--expected-sha", sha["A"], "--json")
    assert bound.exit_code == 0, bound.stderr
    launcher = bound.json()["launcher"]
    job, output = submit_held_selftest(real_cluster, launcher, tmp_path)
    try:
        before = tree_digest(root)
        dry = site.vq("prune", site.program, "cluster", "--keep", "1", "--used-within", "0", "--dry-run", "--json")
        assert dry.exit_code == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
        plan = dry.json()
        assert plan["dry_run"] is True and sorted(plan["prune"]["would_remove"]) == site.shas("BC")
        assert plan["prune"]["keep"][sha["A"]] == [f"job {job} (PENDING)"]
        assert tree_digest(root) == before, "--dry-run changed the runtime root"
        text = site.vq("prune", site.program, "cluster", "--keep", "1", "--used-within", "0", "--dry-run")
        print("dry run:\n" + text.stdout)
        lines = text.stdout.splitlines()
        assert text.exit_code == 0 and lines[0] == ("vq-admin: dry run: prune prune-held on cluster keeps 3 "
                                                    "generation(s) and would remove 2; nothing is called")
        assert any(line.startswith(f"  keep      {sha['A']}  job {job} (PENDING)  (last use: 20") for line in lines)
        assert f"  keep      {sha['E']}  active, last-ok, recent (1 of 1)  (last use: none recorded)" in lines
        assert sorted(line for line in lines if line.startswith("  remove ")) == [
            f"  remove    {s}  (last use: none recorded)" for s in site.shas("BC")]

        done = site.vq("prune", site.program, "cluster", "--keep", "1", "--used-within", "0", "--json")
        receipt = done.json()
        print("\nprune receipt:\n" + json.dumps(receipt, indent=2, sort_keys=True))
        assert done.exit_code == 0, done.stdout[-4000:] + done.stderr[-3000:]
        assert receipt["outcome"] == "ok" and receipt["expected_sha"] == sha["E"]
        assert receipt["prune"]["keep"] == {
            sha["E"]: ["active", "last-ok", "recent (1 of 1)"],
            sha["D"]: ["last-good"],
            sha["A"]: [f"job {job} (PENDING)"],
        }
        assert sorted(receipt["prune"]["removed"]) == site.shas("BC")
        summary = receipt_summary(receipt, None)  # what the operator reads: each kept with its reasons, each removed
        assert f"  kept      {sha['D']}  last-good" in summary
        assert sorted(line for line in summary if line.startswith("  removed ")) == [
            f"  removed   {s}" for s in site.shas("BC")]
        prune_step = next(s for s in receipt["steps"] if s["name"] == "prune")
        assert prune_step["where"] == "cluster" and prune_step["argv"][:2] == [SITE_EXAMPLE, "prune"]
        assert [w for w in prune_step["argv"] if re.fullmatch(r"[0-9a-f]{40}", w)] == sorted(site.shas("ADE"))
        assert site.releases() == site.shas("ADE")
        # the census is one planned agent call; the dry run's census read the held job's script, so this
        # one reads none, and the receipt says what it asked of the scheduler
        census_step = next(s for s in receipt["steps"] if s["name"] == "census")
        assert census_step["status"] == "ok" and census_step["argv"] == [AGENT, "census"]
        assert next(s for s in plan["steps"] if s["name"] == "census")["argv"] == [AGENT, "census"]
        cost = receipt["prune"]["census"]["cost"]
        assert cost["scripts_read"] == 0 and cost["scripts_cached"] >= 1 and cost["scheduler_calls"] == 1
        assert " 0 scripts read, " in census_step["detail"]
        assert all(v["ok"] for v in receipt["prune"]["kept_launchers"].values())
        assert sorted(receipt["prune"]["kept_launchers"]) == site.shas("ADE")
        log = (site.state / "admin.log").read_text().splitlines()
        last = json.loads(log[-1])
        assert last["outcome"] == "ok" and last["receipt"].endswith(f"{receipt['id']}.json")
        # a pruned generation's launcher refuses, naming why
        gone = site.vq("launcher", site.program, "cluster", "--expected-sha", sha["B"])
        assert gone.exit_code == 77 and "refused (pruned)" in gone.stderr, gone.stderr
        assert site.vq("launcher", site.program, "cluster", "--expected-sha", sha["A"]).exit_code == 0
        # the held job, released, runs generation A
        state = release_and_wait(real_cluster, job)
        assert state == "COMPLETED", f"job {job}: {state}; {output.read_text() if output.exists() else '-'}"
        assert output.read_text().strip() == f"selftest of A {root}/releases/{sha['A']}/source/.venv"
    finally:
        ssh(real_cluster, "scancel", job)
    table = site.vq("history", "cluster", site.program, "--local")
    print("history table:\n" + table.stdout)
    assert table.stdout.splitlines()[1].split()[1] == "runtime/prune"


def test_prune_with_the_controller_stopped_removes_nothing(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "ABC", program="prune-down")
    site.deploy_all()
    before = tree_digest(site.root)
    real_cluster.slurm.stop_controller()
    try:
        done = site.vq("prune", "prune-down", "cluster", "--keep", "1", "--json", timeout=300)
    finally:
        real_cluster.slurm.start_controller()
    receipt = done.json()
    assert done.exit_code == 77, done.stdout[-3000:] + done.stderr[-2000:]
    assert receipt["outcome"] == "refused" and "census" in receipt["errors"][-1]
    assert "nothing was pruned" in receipt["errors"][-1]
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["census"]["status"] == "failed" and steps["prune"]["status"] == "skipped"
    assert tree_digest(site.root) == before
    assert site.vq("launcher", "prune-down", "cluster", "--expected-sha", site.sha["A"]).exit_code == 0


EVIL = """\
#!/bin/sh
# A provider that removes a release it was told to keep (LAST GOOD) and says it removed nothing.
rm -rf {root}/releases/{victim}
printf '{{"removed": [], "kept": []}}\\n'
"""


def test_a_provider_that_removes_a_kept_release_fails_naming_it(tmp_path, real_cluster):
    profile = """\
        [hosts.cluster.scheduler_runtime_deployments.{program}]
        update_command = "{site} deploy --root {root}"
        install_command = "{site} install --root {root}"
        verify_command = "{site} verify --root {root}"
        prune_command = "{root}-evil-prune"
        source_repo = "{repo}"
        timeout_seconds = 600
        """
    site = Site(tmp_path, real_cluster, "AB", program="prune-evil", profile=profile)
    site.deploy_all()
    evil = Path(f"{site.root}-evil-prune")
    evil.write_text(EVIL.format(root=site.root, victim=site.sha["A"]))
    evil.chmod(0o755)
    done = site.vq("prune", "prune-evil", "cluster", "--json")
    receipt = done.json()
    assert done.exit_code == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert receipt["outcome"] == "failed"
    prune_step = next(s for s in receipt["steps"] if s["name"] == "prune")
    assert prune_step["argv"] == [str(evil), "--program", "prune-evil",
                                  *[w for s in site.shas("AB") for w in ("--keep", s)]]
    broken = [e for e in receipt["errors"] if site.sha["A"] in e]
    assert broken and "last-good" in broken[0] and "no longer exists" in broken[0], receipt["errors"]
    assert receipt["prune"]["kept_launchers"][site.sha["A"]]["ok"] is False


def test_a_profile_without_a_prune_operation_is_a_usage_error(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    repo.commit("A")
    config = write_config(tmp_path / "admin.toml", f"""
        [hosts.cluster]
        fleet_role = "managed"
        transport = "local"
        agent = "{AGENT}"
        [hosts.cluster.scheduler_runtime_deployments.tool]
        update_command = "/bin/true"
        verify_command = "/bin/true"
        source_repo = "{repo.path}"
        """)
    done = run_vq("prune", "tool", "cluster", "--json", config=config, state=tmp_path / "state")
    assert done.exit_code == 2 and done.json()["outcome"] == "usage"
    assert "prune_command" in done.json()["errors"][-1]


def test_a_pruned_mark_refuses_the_launcher_until_the_sha_is_verified_again(tmp_path):
    from vq_admin.launcher import registry
    from vq_admin.state.records import Verified
    from vq_admin.bindings import LauncherRefused, resolve_launcher

    state = tmp_path / "state"
    sha = "a" * 40
    verified = {"sha": sha, "tag": None, "launcher": f"/apps/v/releases/{sha}/source/.venv/bin/python",
                "launcher_sha256": "e" * 64, "receipt": "r-1", "at": "2026-11-30T00:00:00Z"}
    registry.record_verified(state, "cluster", "vibeqc", Verified(**verified))
    registry.mark_pruned(state, "cluster", "vibeqc", sha, "r-2", "2026-11-30T01:00:00Z")
    with pytest.raises(registry.PrunedError):
        registry.lookup(state, "cluster", "vibeqc", sha)
    with pytest.raises(LauncherRefused) as refused:
        resolve_launcher("vibeqc", "cluster", expected_sha=sha, state_dir=state)
    assert refused.value.code == "pruned" and "r-2" in refused.value.reason
    registry.record_verified(state, "cluster", "vibeqc", Verified(**dict(verified, receipt="r-3")))  # deployed again
    assert registry.lookup(state, "cluster", "vibeqc", sha).launcher == verified["launcher"]


@pytest.mark.parametrize("stdout,problem", [
    ('{"removed": [], "kept": []} {"removed": []}', "more than one JSON document"),
    ('{"removed": [], "removed": [], "kept": []}', "appears twice"),
    ('{"removed": ["' + "A" * 40 + '"], "kept": []}', "full lower-case SHA"),
    ('{"removed": ["' + "a" * 12 + '"], "kept": []}', "full lower-case SHA"),
    ('{"removed": ["' + "a" * 40 + '"], "kept": ["' + "a" * 40 + '"]}', "both removed and kept"),
    ('{"removed": ["' + "a" * 40 + '", "' + "a" * 40 + '"], "kept": []}', "twice"),
    ('{"kept": []}', "no field 'removed'"),
    ('{"removed": "all", "kept": []}', "must be list"),
    ("", "is empty"),
    ("[]", "not an object"),
])
def test_the_prune_report_is_parsed_strictly(stdout, problem):
    from vq_admin_hookspecs import EvidenceError, PruneReport

    with pytest.raises(EvidenceError, match=problem):
        PruneReport.parse(stdout)


def test_command_provider_argv_for_activate_and_prune():
    from vq_admin_hookspecs import PruneRequest, RuntimeRequest

    from vq_admin.config import parse_config
    from vq_admin.plugins import Providers

    def profile(extra: dict):
        table = {"update_command": "/site/deploy", "verify_command": "/site/verify", "source_repo": "/src", **extra}
        return parse_config({"hosts": {"cluster": {"fleet_role": "managed", "scheduler_runtime_deployments": {
            "vibeqc": table}}}}).hosts["cluster"].runtimes["vibeqc"]

    providers = Providers.load([])
    sha, other = "a" * 40, "b" * 40
    with_keys = profile({"activate_command": "/site/activate --root '/apps/v i'", "prune_command": "/site/prune -x"})
    request = RuntimeRequest("vibeqc", "cluster", sha, "v1", settings=with_keys.settings())
    assert providers.runtime_activate("command", request).argv == (
        "/site/activate", "--root", "/apps/v i", "--program", "vibeqc", "--expected-sha", sha, "--tag", "v1")
    prune = providers.runtime_prune("command", PruneRequest("vibeqc", "cluster", (other, sha.upper(), sha),
                                                            with_keys.settings()))
    assert prune.argv == ("/site/prune", "-x", "--program", "vibeqc", "--keep", sha, "--keep", other)
    bare = profile({})
    assert providers.runtime_activate("command", RuntimeRequest("vibeqc", "cluster", sha, None,
                                                                settings=bare.settings())) is None
    from vq_admin.plugins import ProviderError

    with pytest.raises(ProviderError):
        providers.runtime_prune("command", PruneRequest("vibeqc", "cluster", (sha,), bare.settings()))


def test_dropped_transport_during_or_after_the_prune_is_unknown(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "AB", program="prune-drop")
    site.deploy_all()
    log = tmp_path / "calls.jsonl"
    first = run_vq("prune", "prune-drop", "cluster", "--json", config=site.config, state=site.state,
                   env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_FAULT_LOG": str(log)})
    assert first.exit_code == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert first.json()["prune"]["removed"] == []  # A is LAST GOOD and recent: nothing to remove
    step, calls = None, {}  # the external calls of each step, in order
    for entry in map(json.loads, log.read_text().splitlines()):
        if entry.get("when") == "before":
            step = entry["step"]
        elif "index" in entry:
            calls.setdefault(step, []).append(entry["index"])
    prune_call = calls["prune"][0]
    readback = calls[next(name for name in calls if name.startswith("kept-readback-"))][0]
    assert readback > prune_call
    for index in (prune_call, readback):
        done = run_vq("prune", "prune-drop", "cluster", "--json", config=site.config, state=site.state,
                      env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_FAULT": f"call:{index}:drop-after"})
        receipt = done.json()
        assert done.exit_code == 3, (index, done.stdout[-3000:], done.stderr[-2000:])
        assert receipt["outcome"] == "unknown" and receipt["readback"]["proven"] is False
        assert receipt["readback"]["next_command"] == "vq admin prune prune-drop cluster --keep 3"
    assert site.releases() == site.shas("AB")
