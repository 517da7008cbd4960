"""Allocation builds against a real single-node Slurm (slurmctld, slurmd,
munge) reached through the real loopback sshd.

Every wait here is on a condition, with a bound; nothing sleeps and hopes.
Each test uses its own program name, so job names (``vq-deploy-<program>``)
identify its jobs in the shared cluster's job completion log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plan_match import slot_values
from realhosts.procs import wait_until
from support import (AGENT, NOTHING_ACTIVE, GitRepo, command_host, in_thread, run_vq, site_example_host, tree_digest,
                     write_config)
from vq_admin.core.frames import read_frames

pytestmark = pytest.mark.real

JOB_SCRIPT = """\
import sys, time
seconds, code = float(sys.argv[1]), int(sys.argv[2])
print("VQ-DEPLOY-METRIC compiled_files=12", flush=True)
print("building with", " ".join(sys.argv[3:]), file=sys.stderr, flush=True)
time.sleep(seconds)
print("done", flush=True)
sys.exit(code)
"""
#: nothing is ever active (so every run builds, and its final verify proves nothing)
VERIFY_SCRIPT = f"print({json.dumps(NOTHING_ACTIVE)!r})\n"


class World:
    """A source repository, a scratch root and a configuration for one test."""

    def __init__(self, tmp_path: Path, cluster, program: str):
        self.tmp, self.cluster, self.program = tmp_path, cluster, program
        self.scratch = tmp_path / "scratch"
        self.scratch.mkdir()
        self.repo = GitRepo(tmp_path / "repo")
        self.sha = self.repo.commit("A", {"vq_selftest.py": "print('selftest ok')\n",
                                          "vqmod/__init__.py": "__version__ = 'A'\n"})
        self.state = tmp_path / "state"
        self.config = tmp_path / "admin.toml"

    @property
    def program_dir(self) -> Path:
        return self.scratch / ".vq-admin" / "runtime-deploy" / self.program

    def site_example(self, sbatch_args: str = '["--time=10"]') -> None:
        write_config(self.config, f'ssh_config = "{self.cluster.sshd.ssh_config}"\n' + site_example_host(
            "cluster", root=self.tmp / "apps" / self.program, repo=self.repo.path, scratch=self.scratch,
            transport="ssh", ssh="cluster", program=self.program,
            extra_profile=f"update_allocation = {{ sbatch_args = {sbatch_args} }}"))

    def command(self, seconds: float, code: int, timeout: int = 600) -> None:
        script = self.tmp / "deploy-job.py"
        script.write_text(f"#!{sys.executable}\n{JOB_SCRIPT}")
        script.chmod(0o755)
        verify = self.tmp / "verify.py"
        verify.write_text(f"#!{sys.executable}\n{VERIFY_SCRIPT}")
        verify.chmod(0o755)
        write_config(self.config, f'ssh_config = "{self.cluster.sshd.ssh_config}"\n\n' + command_host(
            self.program, scratch=self.scratch, repo=self.repo.path, update=f"{script} {seconds} {code}",
            verify=str(verify), timeout_seconds=timeout,
            extra_profile='update_allocation = { sbatch_args = ["--time=5"] }'))

    def update(self, *extra: str, timeout: float = 600):
        return run_vq("update", self.program, "cluster", "--expected-sha", self.sha, "--json", *extra,
                      config=self.config, state=self.state, timeout=timeout)

    def jobcomp_records(self) -> list[str]:
        log = self.cluster.slurm.jobcomp_log
        text = log.read_text() if log.exists() else ""
        return [line for line in text.splitlines() if f" Name=vq-deploy-{self.program} " in line]

    def wait_for_job_file(self, timeout: float = 120.0) -> Path:
        def found():
            files = [p for p in self.program_dir.glob("deploy.*/job") if p.read_text().strip()]
            return files[0] if files else None

        job = wait_until(found, timeout, interval=0.05)
        assert job is not None, "the agent never recorded a job id"
        return job


def test_site_example_deploys_and_verifies_in_an_allocation(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster, "alloc-site")
    world.site_example()
    dry = world.update("--cluster-install", "--dry-run")
    assert dry.exit_code == 0, dry.stderr + dry.stdout
    first = world.update("--cluster-install")
    assert first.exit_code == 0, first.stderr + first.stdout
    receipt = first.json()
    assert receipt["outcome"] == "ok"
    # the receipt is the dry run's plan with its slots filled: the agent's alloc-run argv too
    values = slot_values(dry.json()["steps"], receipt["steps"])
    assert values["attempt"] == receipt["deploy"]["attempt"] and values["stage"] == receipt["stage"]["dir"]
    assert values["archive_sha256"] == receipt["source"]["archive_sha256"]
    assert values["progress"] == [], "off a terminal the agent is never asked for progress"
    # the reconcile of a dropped deploy is planned too (listed, slots and all), and ran not at all here
    needed = {s["name"]: s["argv"] for s in dry.json()["when_needed"]}
    assert "alloc-reconcile" in needed["deploy-reconcile"] and "<attempt>" in needed["deploy-reconcile"]
    assert needed["deploy-reconcile"][-2:] == ["--timeout", "<wait_seconds>"]
    assert not any(s["name"].startswith("deploy-reconcile") for s in receipt["steps"])
    deploy, output = receipt["deploy"], receipt["command_output"]
    assert deploy["exit_code"] == 0 and deploy["job_id"].isdigit() and deploy["end_source"] == "sbatch"
    assert deploy["job_state"] in ("COMPLETED", None)  # None only if the record aged out at once
    attempt = Path(deploy["attempt_dir"])
    assert attempt.parent == world.program_dir and (attempt / "job").read_text() == deploy["job_id"] + "\n"
    assert oct(attempt.stat().st_mode & 0o777) == oct(0o700)
    assert output["complete"] is True and output["reason"] is None and output["observations"] == 3
    assert output["log_dir"] == str(attempt)
    transcript = Path(output["transcript"])
    assert transcript.parent == world.state / "receipts"
    for name in ("stdout", "stderr"):
        assert (transcript / name).read_bytes() == (attempt / name).read_bytes()
        assert output[name] == (attempt / name).read_text()
    assert receipt["metrics_complete"] is True and receipt["metrics"]["release_reused"] == 0
    assert receipt["verify"]["final"]["proven"] is True
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["deploy"]["argv"][1:3] == ["alloc-run",
                                            "--root"] and "--sbatch-arg=--time=10" in steps["deploy"]["argv"]
    assert steps["deploy"]["exit_code"] == 0 and steps["deploy"]["where"] == "cluster"
    # a later attempt never overwrites earlier evidence
    before = tree_digest(attempt)
    world.sha = world.repo.commit("B", {"vqmod/__init__.py": "__version__ = 'B'\n"})
    second = world.update()
    assert second.exit_code == 0, second.stderr + second.stdout
    again = second.json()["deploy"]
    assert again["attempt_dir"] != deploy["attempt_dir"] and again["job_id"] != deploy["job_id"]
    assert tree_digest(attempt) == before
    assert len(world.jobcomp_records()) == 2


def test_a_job_exiting_3_fails_with_deployment_exit_status_3(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster, "alloc-exit3")
    world.command(seconds=0, code=3)
    result = world.update()
    assert result.exit_code == 1, result.stderr + result.stdout
    receipt = result.json()
    assert receipt["outcome"] == "failed"
    assert receipt["deploy"]["exit_code"] == 3 and receipt["deploy"]["sbatch_exit_code"] == 3
    assert receipt["deploy"]["job_id"].isdigit() and receipt["deploy"]["job_exit_code"] in ("3:0", None)
    assert any("exited 3" in e for e in receipt["errors"])
    output = receipt["command_output"]
    assert output["complete"] is True and "VQ-DEPLOY-METRIC compiled_files=12" in output["stdout"]
    assert "--expected-sha " + world.sha in output["stderr"]
    assert receipt["metrics"] == {"compiled_files": 12} and receipt["metrics_complete"] is True
    assert [s["exit_code"] for s in receipt["steps"] if s["name"] == "deploy"] == [3]
    assert len(world.jobcomp_records()) == 1


def test_a_dropped_session_during_sbatch_wait_is_reconciled_not_resubmitted(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster, "alloc-drop")
    world.command(seconds=6, code=3)
    join = in_thread(lambda: world.update())
    job = world.wait_for_job_file()
    assert real_cluster.sshd.kill_sessions(), "no ssh session to drop"
    result = join(300)
    assert result.exit_code == 1, result.stderr + result.stdout
    receipt = result.json()
    deploy = receipt["deploy"]
    assert deploy["job_id"] == job.read_text().strip()
    assert deploy["reconciled"] is True and deploy["established"] is True
    assert deploy["exit_code"] == 3 and deploy["end_source"] in ("scontrol", "jobcomp")
    steps = [(s["name"], s["status"], s["exit_code"]) for s in receipt["steps"] if s["name"].startswith("deploy")]
    assert steps == [("deploy", "interrupted", 255), ("deploy-reconcile", "failed", 3)]
    reconcile = next(s for s in receipt["steps"] if s["name"] == "deploy-reconcile")
    at = reconcile["argv"].index("--attempt")
    assert reconcile["argv"][at + 1] == deploy["attempt"] and reconcile["argv"][-2] == "--timeout"
    assert reconcile["argv"][-1].isdigit(), "the planned <wait_seconds> slot, filled"
    assert receipt["command_output"]["complete"] is True and "done" in receipt["command_output"]["stdout"]
    records = world.jobcomp_records()
    assert len(records) == 1 and f"JobId={deploy['job_id']} " in records[0]  # submitted exactly once


def test_an_unestablished_end_is_unknown_with_job_id_and_log_dir(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster, "alloc-unknown")
    world.command(seconds=120, code=0, timeout=5)
    slurm = real_cluster.slurm
    join = in_thread(lambda: world.update())
    job = world.wait_for_job_file()
    job_id = job.read_text().strip()
    running = wait_until(lambda: b"compiled_files" in (job.parent / "stdout").read_bytes()
                         if (job.parent / "stdout").exists() else False, 60.0)
    assert running, "the job never started"
    try:
        slurm.stop_controller()
        assert real_cluster.sshd.kill_sessions(), "no ssh session to drop"
        result = join(400)
    finally:
        slurm.start_controller()
        slurm.run("scancel", job_id)
    assert result.exit_code == 3, result.stderr + result.stdout
    receipt = result.json()
    assert receipt["outcome"] == "unknown"
    assert receipt["readback"]["job_id"] == job_id
    assert receipt["readback"]["log_dir"] == str(job.parent)
    assert receipt["deploy"]["established"] is False and receipt["deploy"]["exit_code"] is None
    output = receipt["command_output"]  # what was read is carried, marked incomplete
    assert output["complete"] is False and output["reason"] == "unstable" and output["log_dir"] == str(job.parent)
    assert "VQ-DEPLOY-METRIC compiled_files=12" in output["stdout"] and receipt["metrics_complete"] is False


def test_the_bound_cancels_the_job_and_says_so(tmp_path, real_cluster):
    world = World(tmp_path, real_cluster, "alloc-bound")
    world.command(seconds=120, code=0, timeout=4)
    result = world.update()
    # The build may have activated before the cancel: resolved by read-back, here not proven -> unknown.
    assert result.exit_code == 3, result.stderr + result.stdout
    receipt = result.json()
    deploy = receipt["deploy"]
    assert deploy["timed_out"] is True and deploy["cancel"]["ok"] is True and deploy["exit_code"] is None
    assert any("did not finish within timeout_seconds (4 s)" in e and "cancelled" in e for e in receipt["errors"])
    readback = receipt["readback"]
    assert readback["job_id"] == deploy["job_id"] and readback["log_dir"] == deploy["log_dir"]
    assert (readback["job_state"] or "").startswith("CANCELLED")
    assert receipt["verify"]["readback"]["proven"] is False
    state = wait_until(lambda: [r for r in world.jobcomp_records() if f"JobId={deploy['job_id']} " in r], 30.0)
    assert state and "JobState=CANCELLED" in state[0]


def _agent(real_cluster, *argv: str, **kw) -> subprocess.Popen:
    kw.setdefault("env", {**os.environ, **real_cluster.slurm.env})
    return subprocess.Popen([AGENT, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _frames(proc: subprocess.Popen) -> tuple[dict, dict[str, int]]:
    import xxhash

    records: dict[str, dict] = {}
    sizes = {"stdout": 0, "stderr": 0}
    hashes = {"stdout": xxhash.xxh3_64(), "stderr": xxhash.xxh3_64()}

    def on_data(name, chunk):
        sizes[name] += len(chunk)
        hashes[name].update(chunk)

    assert read_frames(proc.stdout, records.__setitem__, on_data)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    for name in sizes:
        assert records["end"]["sent"][name]["digest"] == hashes[name].hexdigest()
    return records, sizes


def test_reconcile_reads_the_job_completion_log_once_the_record_aged_out(tmp_path, real_cluster):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = _agent(real_cluster, "alloc-run", "--root", str(scratch), "--program", "alloc-jobcomp", "--timeout", "120",
                 "--", sys.executable, "-c", "import sys; print('VQ-DEPLOY-METRIC x=1'); sys.exit(5)")
    records, _ = _frames(run)
    job_id, attempt = records["summary"]["job_id"], records["summary"]["attempt"]
    assert records["summary"]["exit_code"] == 5
    gone = wait_until(lambda: "Invalid job id" in real_cluster.slurm.run("scontrol", "show", "job", job_id).stderr,
                      120.0, interval=0.5)
    assert gone, "the job record never aged out of scontrol"
    rec = _agent(real_cluster, "alloc-reconcile", "--root", str(scratch), "--program", "alloc-jobcomp",
                 "--attempt", attempt, "--timeout", "30")
    records, sizes = _frames(rec)
    summary = records["summary"]
    assert summary["established"] and summary["end_source"] == "jobcomp"
    assert summary["job_id"] == job_id and summary["exit_code"] == 5 and summary["job_state"] == "FAILED"
    assert summary["settle"]["settled"] and sizes["stdout"] == len("VQ-DEPLOY-METRIC x=1\n")


def test_two_concurrent_runs_never_remove_each_others_current_attempt(tmp_path, real_cluster):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    release = tmp_path / "release"
    writer = ("import os, sys, time\n"
              "sys.stdout.buffer.write(b'x' * (70 << 20)); sys.stdout.flush()\n"
              "gate = sys.argv[1]\n"
              "deadline = time.time() + 120\n"
              "while gate != '-' and not os.path.exists(gate) and time.time() < deadline:\n"
              "    time.sleep(0.05)\n")
    # --mem: by default a job is given the whole node's memory, and the two would run one after the other
    common = ["alloc-run", "--root", str(scratch), "--program", "alloc-twice", "--timeout", "300",
              "--sbatch-arg=--mem=50M", "--",
              sys.executable, "-c", writer]
    first = _agent(real_cluster, *common, str(release))
    program_dir = scratch / ".vq-admin" / "runtime-deploy" / "alloc-twice"

    def first_wrote_all():
        done = [p for p in program_dir.glob("deploy.*/stdout") if p.stat().st_size == 70 << 20]
        return done[0].parent if done else None

    first_dir = wait_until(first_wrote_all, 120.0, interval=0.1)
    assert first_dir is not None
    held = _agent(real_cluster, *common, "-")  # the same account: the first job holds the host-side lease
    _, err = held.communicate(timeout=60)
    assert held.returncode == 75 and b"is held by the allocation job" in err and b"nothing was started" in err, err
    # another account's agent (its own state directory) sharing this scratch: the retention rule decides
    other = tmp_path / "other-account"
    other.mkdir(mode=0o700)
    try:
        second = _agent(real_cluster, *common, "-", env={**os.environ, **real_cluster.slurm.env,
                                                         "XDG_STATE_HOME": str(other)})
        rec2, sizes2 = _frames(second)
    finally:
        release.write_text("go")
    rec1, sizes1 = _frames(first)
    s1, s2 = rec1["summary"], rec2["summary"]
    assert s1["attempt_dir"] == str(first_dir)
    # the second run finished while the first was live: 70 + 70 MiB is over the cap, yet it kept it
    assert s2["retention"]["live_skipped"] == [first_dir.name] and s2["retention"]["removed"] == []
    assert s1["settle"]["settled"] and s2["settle"]["settled"]
    assert sizes1["stdout"] == sizes2["stdout"] == 70 << 20
    # then the first run's own retention applies the rule to the finished second attempt
    assert s1["retention"]["removed"] == [s2["attempt"]], (s1, s2["attempt"])
    assert first_dir.exists() and not Path(s2["attempt_dir"]).exists()
