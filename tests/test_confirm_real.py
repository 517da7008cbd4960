"""A generation proven by a real batch job (CONTRACT section 13), against the real loopback sshd and a
real single-node Slurm: the job runs the new launcher on the node, a failed one reverts by itself on
the login host, and a killed driver changes nothing of that.

Each test uses its own program name (job names ``vq-confirm-<program>``).  The confirmation command
is a small script whose behaviour per SHA the test writes (exit status, metric, seconds asleep).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from realhosts.procs import wait_until
from support import AGENT, SITE_EXAMPLE, VQ_ADMIN, GitRepo, run_vq, write_config

pytestmark = pytest.mark.real

CONFIRM = """\
import json, os, subprocess, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
sha, launcher = args["--expected-sha"], args["--launcher"]
plan = json.load(open(os.path.join(%(dir)r, sha))) if os.path.exists(os.path.join(%(dir)r, sha)) else {}
out = subprocess.run([launcher, "-c", "import sys; print(sum(i * i for i in range(1000)))"],
                     capture_output=True, text=True, check=True).stdout.strip()
print("launcher", launcher, "computed", out, "in job", os.environ.get("SLURM_JOB_ID"), flush=True)
time.sleep(plan.get("sleep", 0))
print("VQ-DEPLOY-METRIC seconds_per_step=%%s" %% plan.get("metric", 1.0), flush=True)
sys.exit(plan.get("exit", 0))
"""


class World:
    """Commits A and B, a site_example runtime root, a confirmation script and a configuration."""

    def __init__(self, tmp: Path, cluster, program: str, *, timeout: float = 60, sbatch: str = '["--time=2"]'):
        self.tmp, self.cluster, self.program = tmp, cluster, program
        self.repo = GitRepo(tmp / "src")
        self.a = self.repo.commit("generation A")
        self.b = self.repo.commit("generation B")
        self.root = tmp / "apps" / program
        self.scratch = tmp / "scratch"
        self.scratch.mkdir()
        self.state = tmp / "state"
        self.config = tmp / "admin.toml"
        self.plans = tmp / "plans"
        self.plans.mkdir()
        script = tmp / "confirm.py"
        script.write_text(f"#!{sys.executable}\n" + CONFIRM % {"dir": str(self.plans)})
        script.chmod(0o755)
        write_config(self.config, f'ssh_config = "{cluster.sshd.ssh_config}"\n' + textwrap.dedent(f"""\
            [hosts.cluster]
            fleet_role = "managed"
            ssh = "cluster"
            scratch_root = "{self.scratch}"
            agent = "{AGENT}"

            [hosts.cluster.scheduler_runtime_deployments.{program}]
            update_command = "{SITE_EXAMPLE} deploy --root {self.root}"
            install_command = "{SITE_EXAMPLE} install --root {self.root}"
            verify_command = "{SITE_EXAMPLE} verify --root {self.root}"
            activate_command = "{SITE_EXAMPLE} activate --root {self.root}"
            confirm_command = "{script}"
            confirm_sbatch_args = {sbatch}
            confirm_timeout_seconds = {timeout}
            source_repo = "{self.repo.path}"
            timeout_seconds = 600
            verify_timeout_seconds = 120
            [hosts.cluster.scheduler_runtime_deployments.{program}.confirm_metrics]
            seconds_per_step = {{ better = "lower", tolerance = 0.10 }}
            """))

    def behave(self, sha: str, **plan: object) -> None:
        (self.plans / sha).write_text(json.dumps(plan))

    def vq(self, *args: str, timeout: float = 300):
        return run_vq(*args, config=self.config, state=self.state, timeout=timeout)

    def update(self, sha: str, *extra: str):
        return self.vq("update", self.program, "cluster", "--expected-sha", sha, "--json", *extra)

    def current(self) -> str:
        return os.path.basename(os.readlink(self.root / "current"))

    def launcher(self, sha: str | None = None):
        return self.vq("launcher", self.program, "cluster", *(["--expected-sha", sha] if sha else []))

    def start_update(self, sha: str) -> subprocess.Popen:
        env = dict(os.environ, VQ_ADMIN_CONFIG=str(self.config), VQ_ADMIN_STATE_DIR=str(self.state))
        return subprocess.Popen([VQ_ADMIN, "update", self.program, "cluster", "--expected-sha", sha, "--json"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)

    def job_state(self) -> str | None:
        """The queue state of this world's confirmation job (None: none in the queue)."""
        out = self.cluster.slurm.run("squeue", "-h", "-n", f"vq-confirm-{self.program}", "-o", "%T").stdout
        return out.split()[0] if out.split() else None

    def entry(self, receipt: dict) -> dict:
        """The vqAdmin facts of the run's entry in the host's record (CONTRACT section 12)."""
        name = receipt["record"]["entry"]
        record = self.cluster.sshd.agent_state("cluster") / "vq-admin-agent" / "record" / self.program
        return json.loads((record / name).read_text())["predicate"]["vqAdmin"]

    def first_install(self) -> dict:
        done = self.update(self.a, "--cluster-install")
        assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.json()


def ok(done) -> dict:
    assert done.exit_code == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.json()


def test_a_good_generation_is_confirmed_by_a_job_that_ran_its_launcher(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster, "cf-good")
    first = w.first_install()
    assert first["confirm"]["state"] == "COMPLETED" and first["confirm"]["passed"] is True
    plan = {s["name"]: s["argv"] for s in ok(w.update(w.b, "--dry-run"))["steps"]}
    assert "confirm-run" in plan["confirm"] and plan["confirm"][-2:] == ["--launcher", "<launcher>"]
    receipt = ok(w.update(w.b))
    confirm = receipt["confirm"]
    assert receipt["outcome"] == "ok" and confirm["job_id"].isdigit() and confirm["state"] == "COMPLETED"
    assert confirm["exit_code"] == 0 and confirm["node"] and confirm["metrics"] == {"seconds_per_step": "1.0"}
    launcher = receipt["verify"]["final"]["receipt"]["active_path"]
    assert w.b in launcher
    # the job's own transcript: it ran the new SHA's launcher, inside that very job
    assert f"launcher {launcher} computed 332833500 in job {confirm['job_id']}" in confirm["output"]["stdout"]
    assert (Path(confirm["attempt_dir"]) / "stdout").read_text() == confirm["output"]["stdout"]
    assert w.current() == w.b and w.launcher().stdout.strip() == launcher
    # the host's record keeps the confirmation, as Slurm reported it for this run's job
    assert w.entry(receipt)["confirm"] == {
        "sha": w.b, "status": "passed", "job_id": confirm["job_id"], "state": "COMPLETED", "exit_code": 0,
        "node": confirm["node"], "metrics": {"seconds_per_step": "1.0"}, "accepted_regression": None, "reason": None}
    # the cron no-op: no job when the generation is already confirmed
    again = ok(w.update(w.b))
    assert again["outcome"] == "already-current" and "confirm" not in again
    # off a terminal, a confirmed deployment prints nothing at all (cron mails only on failure)
    quiet = w.vq("update", w.program, "cluster", "--expected-sha", w.a)
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "") and w.current() == w.a


def test_a_failing_confirmation_reverts_and_the_queue_keeps_the_previous_launcher(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster, "cf-fail")
    w.first_install()
    previous = w.launcher().stdout.strip()
    w.behave(w.b, exit=3)
    done = w.update(w.b)
    assert done.exit_code == 1, done.stdout[-3000:] + done.stderr[-3000:]
    receipt = done.json()
    assert receipt["outcome"] == "failed" and receipt["reverted"] == {
        "from": w.b, "to": w.a, "proven": True, "activate_exit_code": 0}
    assert receipt["confirm"]["exit_code"] == 3 and receipt["confirm"]["state"] == "FAILED"
    assert receipt["verify"]["revert"]["proven"] is True and w.current() == w.a
    # the record: the revert's proven generation, carrying the new SHA's failed confirmation
    run = w.entry(receipt)
    assert (run["sha"], run["outcome"], run["confirm"]["sha"], run["confirm"]["status"]) == (
        w.a, "failed", w.b, "unconfirmed") and "exit code 3" in run["confirm"]["reason"]
    refused = w.launcher(w.b)
    assert refused.exit_code == 77 and "unconfirmed" in refused.stderr + refused.stdout
    assert w.launcher().stdout.strip() == previous
    # a job bound to the previous generation still runs
    job = real_cluster.slurm.run("sbatch", "--wait", "--output=/dev/null", "--wrap", f"{previous} -c pass")
    assert job.returncode == 0, job.stderr
    # the cron line never flips current back: refused, naming the way past
    again = w.update(w.b)
    assert again.exit_code == 77 and "--retry-confirmation" in again.stdout + again.stderr and w.current() == w.a
    w.behave(w.b)
    retried = ok(w.update(w.b, "--retry-confirmation"))
    assert retried["outcome"] == "ok" and w.current() == w.b


def test_a_metric_out_of_tolerance_reverts_naming_both_values_unless_accepted(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster, "cf-metric")
    w.behave(w.a, metric=1.0)
    w.first_install()
    w.behave(w.b, metric=1.3)
    done = w.update(w.b)
    assert done.exit_code == 1 and w.current() == w.a
    receipt = done.json()
    assert "regressed: seconds_per_step 1.3 > 1.10 x 1.0" in " ".join(receipt["errors"])
    assert receipt["reverted"]["proven"] is True
    accepted = ok(w.update(w.b, "--accept-regression", "new solver"))
    assert accepted["outcome"] == "ok" and accepted["confirm"]["accepted"]["reason"] == "new solver"
    assert w.entry(accepted)["confirm"]["accepted_regression"] == "new solver"
    assert w.current() == w.b


def test_a_job_that_never_starts_is_cancelled_at_the_deadline_and_reverted(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster, "cf-down", timeout=4)
    w.first_install()
    slurm = real_cluster.slurm
    slurm.run("scontrol", "update", "PartitionName=debug", "State=DOWN", check=True)
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(w.config), VQ_ADMIN_STATE_DIR=str(w.state))
    try:  # on a terminal (script(1) gives it one): the live line names the job, its state and the time
        done = subprocess.run(["script", "-qec", f"{VQ_ADMIN} update {w.program} cluster --expected-sha {w.b}",
                               "/dev/null"], env=env, capture_output=True, text=True, timeout=300)
    finally:
        slurm.run("scontrol", "update", "PartitionName=debug", "State=UP", check=True)
    assert done.returncode == 1, done.stdout[-3000:]
    assert re.search(rf"{w.program} confirmation: job \d+ PENDING \(\w+\) 0:0\d", done.stdout), done.stdout[-3000:]
    assert "did not end within confirm_timeout_seconds (4 s); it was cancelled" in done.stdout
    assert re.search(r"reverted +[0-9a-f]{12} -> [0-9a-f]{12} \(proven by a read-only verify\)", done.stdout)
    assert w.current() == w.a and w.launcher(w.b).exit_code == 77


@pytest.mark.parametrize("when", ["PENDING", "RUNNING"])
def test_a_killed_driver_changes_nothing_and_the_next_run_reconciles(tmp_path, real_cluster, when):
    w = World(tmp_path, real_cluster, f"cf-kill-{when.lower()}")
    w.first_install()
    w.behave(w.b, exit=3, sleep=6)
    slurm = real_cluster.slurm
    if when == "PENDING":
        slurm.run("scontrol", "update", "PartitionName=debug", "State=DOWN", check=True)
    try:
        driver = w.start_update(w.b)
        assert wait_until(lambda: w.job_state() == when, 120, interval=0.1), w.job_state()
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        second = w.update(w.b)
        assert second.exit_code == 75, second.stdout[-3000:] + second.stderr[-3000:]
        assert "confirmation job" in second.json()["errors"][0], second.json()["errors"]
    finally:
        if when == "PENDING":
            slurm.run("scontrol", "update", "PartitionName=debug", "State=UP", check=True)
    # with no driver at all, the host ends on the previous generation
    assert wait_until(lambda: w.job_state() is None and w.current() == w.a, 120, interval=0.2)
    reconciled = w.update(w.b)
    assert reconciled.exit_code == 77, reconciled.stdout[-3000:] + reconciled.stderr[-3000:]
    receipt = reconciled.json()
    assert receipt["previous_attempt"]["confirm"]["passed"] is False
    assert "--retry-confirmation" in " ".join(receipt["errors"])
    assert w.launcher(w.b).exit_code == 77


def test_verify_job_is_read_only(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster, "cf-verify")
    w.first_install()
    def unchanged() -> list[str]:  # the host's record verify reads is kept in record/ (issue 35)
        return sorted(str(p) for p in w.state.rglob("*") if "receipts" not in p.parts and "record" not in p.parts
                      and "admin.log" not in p.name)

    state = unchanged()
    healthy = w.vq("verify", w.program, "cluster", "--job", "--json")
    assert healthy.exit_code == 0, healthy.stdout[-3000:] + healthy.stderr[-3000:]
    w.behave(w.a, exit=3)
    broken = w.vq("verify", w.program, "cluster", "--job", "--json")
    assert broken.exit_code == 1 and "exit code 3" in broken.stdout
    assert unchanged() == state  # before the lookup below, which keeps its own caches (registry seen/, uses)
    assert w.current() == w.a and w.launcher().exit_code == 0


def test_the_demo_proves_its_generation_by_a_job_on_a_cluster(tmp_path, real_cluster):
    """With a cluster at hand the demo's profile confirms through site_example's real computation."""
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "xdg"), **real_cluster.slurm.env)
    done = subprocess.run([sys.executable, "-m", "vq_admin.demo", "--workdir", str(tmp_path / "demo")], env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"\n  confirm +job \d+ COMPLETED exit 0 on \S+ in [\d.]+ s; energy_digest=[0-9a-f]{16} "
                     r"seconds_per_step=[\d.]+\n", out), out[-4000:]


def test_a_confirmation_that_passes_after_its_driver_was_killed_is_taken_by_the_next_run(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster, "cf-kill-pass")
    w.first_install()
    previous = w.launcher().stdout.strip()
    w.behave(w.b, sleep=4)
    driver = w.start_update(w.b)
    assert wait_until(lambda: w.job_state() == "RUNNING", 120, interval=0.1), w.job_state()
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert w.launcher().stdout.strip() == previous  # the queue keeps the previous launcher meanwhile
    assert w.launcher(w.b).exit_code == 77
    # 75 while the supervisor is still judging the job (it holds the lease's work lock), then taken
    taken = ok(wait_until(lambda: (r := w.update(w.b)).exit_code != 75 and r, 120, interval=0.5))
    assert taken["outcome"] == "already-current" and taken["previous_attempt"]["confirm"]["passed"] is True
    assert w.current() == w.b and w.b in w.launcher().stdout
    # the reconciled confirmation rides on that run's entry: the killed driver's job, as Slurm reported it
    confirm = w.entry(taken)["confirm"]
    assert (confirm["sha"], confirm["status"], confirm["job_id"]) == (
        w.b, "passed", taken["previous_attempt"]["confirm"]["job_id"])


def test_a_first_install_that_fails_its_confirmation_is_unconfirmed_with_nothing_to_revert_to(tmp_path, real_cluster):
    w = World(tmp_path, real_cluster, "cf-first")
    w.behave(w.a, exit=3)
    done = w.update(w.a, "--cluster-install")
    assert done.exit_code == 1, done.stdout[-3000:] + done.stderr[-3000:]
    receipt = done.json()
    assert "reverted" not in receipt and any("nothing to revert to" in e for e in receipt["errors"])
    assert w.current() == w.a and w.launcher(w.a).exit_code == 77 and w.launcher().exit_code != 0
    run = w.entry(receipt)  # the new SHA, active and verified, recorded as unconfirmed
    assert (run["sha"], run["outcome"], run["confirm"]["sha"], run["confirm"]["status"]) == (
        w.a, "failed", w.a, "unconfirmed")
    # the generation active before the next one is itself unconfirmed: never a revert target
    w.behave(w.b, exit=3)
    second = w.update(w.b)
    assert second.exit_code == 1 and "reverted" not in second.json() and w.current() == w.b
    assert any("no revert target" in note for note in second.json()["notes"])
