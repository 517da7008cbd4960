"""``vq admin rollback`` against the real loopback sshd, real Slurm and real git.

The provider is site_example's console script through the built-in
``command`` provider (``update_command``/``verify_command``, and
``activate_command`` where a test says so), on the login host ``cluster``.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from support import AGENT, SITE_EXAMPLE, GitRepo, git, run_vq, tree_digest, write_config
from vq_admin.report.output import receipt_summary

pytestmark = pytest.mark.real

DROPPER = """\
#!/bin/sh
# Activate (or not), then kill this command's own sshd session: a dropped transport.
mode="$1"; shift
if [ "$mode" = after ]; then
    {site} activate "$@" >/dev/null 2>&1 || exit 9
fi
kill -9 $PPID
sleep 5
"""


class World:
    """Commits A and B of a tiny program, a runtime root and a configuration for host ``cluster``."""

    def __init__(self, tmp: Path, ssh_config: str, *, program: str = "vibeqc", activate: str | None = "site",
                 extra_profile: str = "", extra_config: str = ""):
        self.tmp, self.program, self.ssh_config = tmp, program, ssh_config
        self.repo = GitRepo(tmp / "src")
        self.a = self.repo.commit("generation A")
        self.b = self.repo.commit("generation B")
        self.root = tmp / "apps" / program
        self.scratch = tmp / "scratch"
        self.scratch.mkdir(exist_ok=True)
        self.state = tmp / "state"
        self.config = tmp / "admin.toml"
        self.extra_profile, self.extra_config = extra_profile, extra_config
        self.configure(activate)

    def configure(self, activate: str | None = "site") -> None:
        if activate == "site":
            activate = f"{SITE_EXAMPLE} activate --root {self.root}"
        line = f'activate_command = "{activate}"\n' if activate else ""
        write_config(self.config, f'ssh_config = "{self.ssh_config}"\n' + textwrap.dedent(f"""\
            [hosts.cluster]
            fleet_role = "managed"
            ssh = "cluster"
            scratch_root = "{self.scratch}"
            agent = "{AGENT}"

            [hosts.login2]
            fleet_role = "alias"
            canonical_host = "cluster"

            [hosts.cluster.scheduler_runtime_deployments.{self.program}]
            update_command = "{SITE_EXAMPLE} deploy --root {self.root}"
            install_command = "{SITE_EXAMPLE} install --root {self.root}"
            verify_command = "{SITE_EXAMPLE} verify --root {self.root}"
            source_repo = "{self.repo.path}"
            timeout_seconds = 600
            verify_timeout_seconds = 120
            """) + line + self.extra_profile + self.extra_config)

    def vq(self, *args: str, timeout: float = 600):
        return run_vq(*args, config=self.config, state=self.state, timeout=timeout)

    def update(self, sha: str, *extra: str):
        done = self.vq("update", self.program, "cluster", "--expected-sha", sha, "--json", *extra)
        assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.json()

    def rollback(self, *extra: str, host: str = "cluster"):
        return self.vq("rollback", self.program, host, "--json", *extra)

    def current(self) -> str:
        return os.readlink(self.root / "current")

    def record(self, which: str) -> dict:
        path = self.state / "hosts" / "cluster" / "runtime" / self.program / f"{which}.json"
        return json.loads(path.read_text()) if path.exists() else {}


def names(receipt: dict) -> list[str]:
    return [s["name"] for s in receipt["steps"] if s["status"] != "skipped"]


def test_rollback_to_last_good_through_activate(tmp_path, real_sshd):
    w = World(tmp_path, real_sshd.ssh_config)
    w.update(w.a, "--cluster-install")
    w.update(w.b)
    releases = tree_digest(w.root / "releases")
    assert (w.record("last-ok")["sha"], w.record("last-good")["sha"]) == (w.b, w.a)

    plan = w.rollback("--dry-run")
    assert plan.exit_code == 0 and plan.json()["dry_run"] is True, plan.stderr
    assert [s["name"] for s in plan.json()["steps"]] == ["check-commands", "pre-verify", "pre-verify-readback",
                                                         "activate", "verify", "verify-readback"]
    assert w.current() == f"releases/{w.b}" and w.record("last-ok")["sha"] == w.b  # the dry run changed nothing

    done = w.rollback()
    receipt = done.json()
    print("\nrollback receipt:\n" + json.dumps(receipt, indent=2, sort_keys=True))
    assert done.exit_code == 0, done.stderr
    assert receipt["outcome"] == "ok" and receipt["expected_sha"] == w.a
    assert receipt["rollback"] == {"from": w.b, "to": w.a, "via": "activate"}
    assert names(receipt) == ["check-commands", "pre-verify", "pre-verify-readback", "activate", "verify",
                              "verify-readback"]
    activate = next(s for s in receipt["steps"] if s["name"] == "activate")
    assert activate["argv"] == [SITE_EXAMPLE, "activate", "--root", str(w.root), "--program", w.program,
                                "--expected-sha", w.a]
    assert receipt["verify"]["final"]["proven"] is True
    assert w.current() == f"releases/{w.a}"
    assert tree_digest(w.root / "releases") == releases, "activation touched a release"
    assert not list((w.scratch / ".vq-admin").glob("stage/runtime/*/stage.*")), "activation staged source"
    # LAST OK is the target, LAST GOOD the LAST OK before
    assert (w.record("last-ok")["sha"], w.record("last-good")["sha"]) == (w.a, w.b)

    assert f"  rollback  rolled back {w.program} on cluster from {w.b[:12]} to {w.a[:12]} (activation)" \
        in receipt_summary(receipt, None)
    again = w.vq("rollback", w.program, "cluster", "--verbose")  # LAST GOOD is now B: back to B; the summary says so
    assert again.exit_code == 0, again.stderr
    assert f"  rollback  rolled back {w.program} on cluster from {w.a[:12]} to {w.b[:12]} (activation)" \
        in again.stdout.splitlines(), again.stdout
    assert w.current() == f"releases/{w.b}"
    same = w.rollback("--to", w.b)
    assert (same.exit_code, same.json()["outcome"]) == (0, "already-current")
    assert "activate" not in names(same.json())

    table = w.vq("history", "cluster", w.program, "--limit", "4", "--local")
    print("history table:\n" + table.stdout)
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["TIME", "LANE", "HOST", "PROGRAM", "OUTCOME", "SHA", "DURATION"]
    assert [line.split()[1] for line in lines[1:]] == ["runtime/rollback"] * 3 + ["runtime"]
    assert [line.split()[4] for line in lines[1:]] == ["already-current", "ok", "ok", "ok"]


def test_rollback_without_activate_runs_the_update_of_the_target(tmp_path, real_sshd):
    w = World(tmp_path, real_sshd.ssh_config, activate=None)
    w.update(w.a, "--cluster-install")
    w.update(w.b)
    done = w.rollback("--to", w.a)
    receipt = done.json()
    assert done.exit_code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert receipt["rollback"] == {"from": w.b, "to": w.a, "via": "update"}
    assert (f"  rollback  rolled back {w.program} on cluster from {w.b[:12]} to {w.a[:12]} (rebuilt by the "
            "provider's update)") in receipt_summary(receipt, None)
    ran = names(receipt)
    assert "deploy" in ran and "stage-create" in ran and "activate" not in ran
    assert receipt["source"]["sha"] == w.a  # the exact source was staged
    assert w.current() == f"releases/{w.a}"
    assert (w.record("last-ok")["sha"], w.record("last-good")["sha"]) == (w.a, w.b)


def test_rollback_refusals_run_nothing(tmp_path, real_sshd):
    w = World(tmp_path, real_sshd.ssh_config)
    w.update(w.a, "--cluster-install")
    before = tree_digest(w.root)
    cases = {
        "no-last-good": (w.rollback(), "has no LAST GOOD"),
        "never-verified": (w.rollback("--to", w.b), f"{w.b} was never verified"),
        "alias": (w.rollback(host="login2"), "alias of cluster"),
    }
    for label, (done, text) in cases.items():
        assert done.exit_code == 77, (label, done.stdout, done.stderr)
        receipt = done.json()
        assert receipt["outcome"] == "refused" and text in receipt["errors"][-1], (label, receipt["errors"])
        assert all(s["status"] in ("planned", "skipped") for s in receipt["steps"]), label
    assert w.vq("rollback", w.program, "cluster", "--to", w.b[:12]).exit_code == 2  # abbreviation: usage
    listed = w.vq("history", "cluster", w.program, "--local", "--json").json()["runs"]
    assert [(r["verb"], r["outcome"]) for r in listed[:2]] == [("rollback", "refused")] * 2
    assert tree_digest(w.root) == before
    assert w.record("last-ok")["sha"] == w.a and w.current() == f"releases/{w.a}"


@pytest.mark.parametrize("mode,outcome,code", [("after", "ok", 0), ("before", "unknown", 3)])
def test_a_dropped_session_during_activation_is_resolved_by_readback(tmp_path, real_sshd, mode, outcome, code):
    dropper = tmp_path / "dropper"
    dropper.write_text(DROPPER.format(site=SITE_EXAMPLE))
    dropper.chmod(0o755)
    w = World(tmp_path, real_sshd.ssh_config)
    w.update(w.a, "--cluster-install")
    w.update(w.b)
    w.configure(f"{dropper} {mode} --root {w.root}")
    done = w.rollback()
    receipt = done.json()
    assert done.exit_code == code, done.stdout[-3000:] + done.stderr[-2000:]
    assert receipt["outcome"] == outcome
    activate = next(s for s in receipt["steps"] if s["name"] == "activate")
    assert activate["status"] == "interrupted"
    if outcome == "ok":
        assert receipt["readback"]["proven"] is True and w.current() == f"releases/{w.a}"
        assert w.record("last-ok")["sha"] == w.a
    else:
        assert receipt["readback"]["proven"] is False
        assert receipt["readback"]["next_command"] == f"vq admin rollback {w.program} cluster --to {w.a}"
        assert w.current() == f"releases/{w.b}" and w.record("last-ok")["sha"] == w.b


def test_rollback_through_activate_on_an_allocation_profile_submits_no_job(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster.ssh_config, program="rb-alloc",
              extra_profile='update_allocation = { sbatch_args = ["--time=10"] }\n')
    w.update(w.a, "--cluster-install")
    w.update(w.b)
    log = Path(real_cluster.slurm.jobcomp_log)

    def jobs() -> int:
        text = log.read_text() if log.exists() else ""
        return sum(1 for line in text.splitlines() if " Name=vq-deploy-rb-alloc " in line)

    submitted = jobs()
    assert submitted == 2  # the two builds ran as batch jobs
    done = w.rollback()
    receipt = done.json()
    assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert receipt["rollback"]["via"] == "activate" and w.current() == f"releases/{w.a}"
    assert not any("sbatch" in " ".join(s["argv"]) or s["name"].startswith("allocation") for s in receipt["steps"])
    assert "job_id" not in receipt["deploy"]
    queued = real_cluster.slurm.run("squeue", "-h", "-n", "vq-deploy-rb-alloc", "-o", "%A")
    assert queued.returncode == 0 and queued.stdout.strip() == ""
    assert jobs() == submitted


def test_rollback_on_a_mirror_fed_lane_preparer(tmp_path, real_sshd):
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    calls = tmp_path / "prepare.calls"
    prep = tmp_path / "prepare.sh"
    prep.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    prep.chmod(0o755)
    profile = (f'feed_source_mirror = "{mirror}"\nlane = "release"\nprepare_command = "{prep}"\n'
               'preparer_reads = "lane"\n')
    w = World(tmp_path, real_sshd.ssh_config, activate=None, extra_profile=profile)
    w.update(w.a, "--cluster-install")
    w.update(w.b)
    refs = git(mirror, "for-each-ref", "--format=%(refname) %(objectname)")
    prepared = calls.read_text()
    assert git(mirror, "rev-parse", "refs/heads/release") == w.b

    refused = w.rollback()  # without activation: the lane branch would rewind
    receipt = refused.json()
    assert refused.exit_code == 77, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "activate_command" in receipt["errors"][-1] and 'preparer_reads = "pin"' in receipt["errors"][-1]
    assert git(mirror, "for-each-ref", "--format=%(refname) %(objectname)") == refs
    assert w.current() == f"releases/{w.b}"

    w.configure("site")  # with activate_command: nothing is fed, prepared or staged
    done = w.rollback()
    receipt = done.json()
    assert done.exit_code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert names(receipt) == ["check-commands", "pre-verify", "pre-verify-readback", "activate", "verify",
                              "verify-readback"]
    assert receipt["mirror"] is None
    assert git(mirror, "for-each-ref", "--format=%(refname) %(objectname)") == refs
    assert calls.read_text() == prepared, "the preparer ran for a rollback"
    assert w.current() == f"releases/{w.a}"


def test_rollback_through_a_provider_plugins_activate_hook(tmp_path, real_sshd):
    from support import site_example_host

    repo = GitRepo(tmp_path / "src")
    a, b = repo.commit("A"), repo.commit("B")
    root, scratch = tmp_path / "apps", tmp_path / "scratch"
    scratch.mkdir()
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_sshd.ssh_config}"\n' + site_example_host(
        "cluster", root=root, repo=repo.path, scratch=scratch, transport="ssh", ssh="cluster"))
    state = tmp_path / "state"
    for sha, extra in ((a, ["--cluster-install"]), (b, [])):
        done = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--json", *extra, config=config,
                      state=state)
        assert done.exit_code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    done = run_vq("rollback", "vibeqc", "cluster", "--json", config=config, state=state)
    receipt = done.json()
    assert done.exit_code == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert receipt["rollback"] == {"from": b, "to": a, "via": "activate"}
    activate = next(s for s in receipt["steps"] if s["name"] == "activate")
    assert activate["argv"][1:4] == ["activate", "--root", str(root)] and activate["status"] == "ok"
    assert os.readlink(root / "current") == f"releases/{a}"


def test_a_rollback_by_activation_first_establishes_the_build_an_interrupted_update_left(tmp_path, real_sshd):
    """An attempt record of an interrupted allocation build: the activation plans and runs
    previous-attempt before its pre-verify (the agent finds the attempt never started: fenced, ended)."""
    from vq_admin.agent.allocation import new_attempt_name

    w = World(tmp_path, real_sshd.ssh_config)
    w.update(w.a, "--cluster-install")
    w.update(w.b)
    attempt = new_attempt_name()
    record = w.state / "hosts" / "cluster" / "runtime" / w.program / "attempt.json"
    record.write_text(json.dumps({"attempt": attempt, "receipt": "interrupted", "expected_sha": w.b,
                                  "attempt_dir": f"{w.scratch}/.vq-admin/runtime-deploy/{w.program}/{attempt}"}))
    plan = w.rollback("--dry-run")
    assert plan.exit_code == 0, plan.stderr
    assert [s["name"] for s in plan.json()["steps"]][:3] == ["check-commands", "previous-attempt", "pre-verify"]
    done = w.rollback()
    receipt = done.json()
    assert done.exit_code == 0, done.stderr + done.stdout
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["previous-attempt"]["status"] == "ok" and attempt in steps["previous-attempt"]["argv"]
    assert receipt["previous_attempt"]["attempt"] == attempt and not record.exists()
    assert receipt["rollback"]["via"] == "activate" and w.current() == f"releases/{w.a}"
