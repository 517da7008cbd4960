"""The census at the scale of a queue, on the real Slurm through the real loopback sshd.

* 500 held jobs (one ssh command runs the ``sbatch --hold`` loop), half naming generation A's
  launcher in their script, and one whose script names it only in Slurm's stored copy (the
  file was changed after ``sbatch``): ``references`` names exactly those, reading every script
  once; the next census reads none; a job released (then running) and the same job requeued
  after the first census keep their references (requeueing gives it a new submit time: its
  script is read again); a cache entry with another SHA written in is not trusted (its script is
  read again), and the cache is owner-only.
* slurmctld stopped while the census reads scripts: ``prune`` exits 77 and removes nothing.

Every wait is on a condition, with a bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from real_jobs import job_state, ssh
from realhosts.procs import wait_until
from support import VQ_ADMIN, GitRepo, run_vq, site_example_host, tree_digest, write_config
from test_prune import Site
from vq_admin.launcher import registry
from vq_admin.state.records import Verified

pytestmark = pytest.mark.real

PROGRAM = "census500"


def submit_loop(cluster, count: int, named: str, every: int) -> list[str]:
    """Submit *count* held jobs in one ssh command (a shell loop on the host); job i (from 1) names
    *named* in its script when ``i % every == 0``.  Their ids, in order."""
    wrap = shlex.quote(f"sleep 600; {named}")
    loop = (f"for i in $(seq 1 {count}); do if [ $((i % {every})) -eq 0 ]; then w={wrap}; else w='sleep 600'; fi; "
            "sbatch --hold --parsable --job-name=census --output=/dev/null --wrap=\"$w\" || exit 1; done")
    done = subprocess.run(cluster.ssh_argv("cluster", loop), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [line.split(";")[0] for line in done.stdout.split()]
    assert len(ids) == count
    return ids


def cache_file(cluster) -> Path:
    """The agent's census cache of this cluster, in the sessions' agent state (see realhosts.sshd)."""
    conf = hashlib.sha256(str(cluster.slurm.conf).encode()).hexdigest()[:12]
    return cluster.sshd.agent_state("cluster") / "vq-admin-agent" / "census" / f"vqtest.{conf}.json"


def submit_time(cluster, job: str) -> str | None:
    shown = ssh(cluster, "squeue", "-h", "-j", job, "-O", "SubmitTime")
    return shown.stdout.strip() or None if shown.returncode == 0 else None


def wait_state(cluster, job: str, wanted: str) -> None:
    assert wait_until(lambda: (job_state(cluster, job) or "") == wanted, timeout=120, interval=0.5), \
        f"job {job} is {job_state(cluster, job)}, not {wanted}"


def test_a_queue_of_500_jobs_is_read_once_and_then_from_the_cache(tmp_path, real_cluster):
    sha = {k: hashlib.sha1(k.encode()).hexdigest() for k in "AB"}
    launcher = {k: f"{tmp_path}/apps/releases/{s}/source/.venv/bin/python" for k, s in sha.items()}
    state = tmp_path / "state"
    for k in "AB":  # verified generations as the registry holds them (references deploys nothing)
        registry.record_verified(state, "cluster", PROGRAM, Verified(sha=sha[k], tag=None, launcher=launcher[k],
                                                                     launcher_sha256="e" * 64, receipt=f"r-{k}",
                                                                     at="2026-11-30T00:00:00Z"))
    repo = GitRepo(tmp_path / "repo")
    repo.commit("A")
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_cluster.ssh_config}"\n' + site_example_host(
        "cluster", root=tmp_path / "apps", repo=repo.path, scratch=tmp_path, transport="ssh", ssh="cluster",
        program=PROGRAM))

    def references() -> tuple[set[str], dict]:
        done = run_vq("references", PROGRAM, "cluster", "--json", config=config, state=state)
        assert done.exit_code == 0, done.stdout[-2000:] + done.stderr[-2000:]
        doc = done.json()
        rows = {row["sha"]: row for row in doc["generations"]}
        assert rows[sha["B"]]["jobs"] == [], "B is named by no job"
        print(f"census: {doc['jobs_scanned']} jobs in {doc['seconds']} s, cost {doc['cost']}")
        return {job["id"] for job in rows[sha["A"]]["jobs"]}, doc["cost"]

    try:
        ids = submit_loop(real_cluster, 500, launcher["A"], every=2)
        script = tmp_path / "job.sh"
        script.write_text(f"#!/bin/sh\nsleep 600\n{launcher['A']} run.py\n")
        stored = ssh(real_cluster, "sbatch", "--hold", "--parsable", "--job-name=census", "--output=/dev/null",
                     str(script))
        assert stored.returncode == 0, stored.stderr
        stored_copy = stored.stdout.strip().split(";")[0]
        script.write_text("#!/bin/sh\ntrue\n")  # only Slurm's stored copy names the launcher now
        named = set(ids[1::2]) | {stored_copy}
        found, cost = references()
        assert found == named and len(named) == 251
        assert cost["scripts_read"] >= 501 and cost["jobs_listed"] >= 501
        assert cost["scheduler_calls"] == cost["scripts_read"] + 1

        found, cost = references()
        assert found == named
        assert (cost["scripts_read"], cost["scheduler_calls"]) == (0, 1) and cost["scripts_cached"] >= 501
        path = cache_file(real_cluster)
        entries = json.loads(path.read_text())["jobs"]
        assert set(entries) >= set(ids) | {stored_copy}
        assert [p.stat().st_mode & 0o777 for p in (path, path.parent / "key", path.parent)] == [0o600, 0o600, 0o700]

        job = ids[1]  # released after the first census: it runs, and keeps its references from the cache
        assert ssh(real_cluster, "scontrol", "release", job).returncode == 0
        wait_state(real_cluster, job, "RUNNING")
        found, cost = references()
        assert found == named and cost["scripts_read"] == 0
        # requeued: queued again with a new submit time, so its stored script is read again
        submitted = submit_time(real_cluster, job)
        requeued = ssh(real_cluster, "scontrol", "requeue", job)
        assert requeued.returncode == 0, requeued.stderr
        assert wait_until(lambda: submit_time(real_cluster, job) not in (submitted, None), timeout=120, interval=0.5)
        found, cost = references()
        assert found == named and cost["scripts_read"] == 1

        doc = json.loads(path.read_text())  # another SHA written into two entries: neither is trusted
        doc["jobs"][ids[3]]["words"] = [w.replace(sha["A"], sha["B"]) for w in doc["jobs"][ids[3]]["words"]]
        doc["jobs"][ids[4]]["words"] = [launcher["B"]]
        path.write_text(json.dumps(doc))
        found, cost = references()
        assert found == named and (cost["cache_rejected"], cost["scripts_read"]) == (2, 2)
    finally:
        ssh(real_cluster, "scancel", "--name=census")


def census_agent(cluster) -> int | None:
    """The pid of an agent of this cluster (its SLURM_CONF in its environment) running its census verb."""
    conf = f"SLURM_CONF={cluster.slurm.conf}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"census" in words and any(w.endswith(b"vq-admin-agent") for w in words) and \
                    conf in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
        except OSError:
            continue
    return None


def reading_scripts(agent: int) -> bool:
    """The census agent *agent* runs ``scontrol write batch_script`` now (one of its children)."""
    try:
        for child in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
            words = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if os.path.basename(words[0]) == b"scontrol" and words[1:3] == [b"write", b"batch_script"]:
                return True
    except (OSError, IndexError):
        pass
    return False


def test_slurmctld_stopped_during_the_census_refuses_the_prune(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "AB", program="census-down")
    site.deploy_all()
    before = tree_digest(site.root)
    submit_loop(real_cluster, 300, "true", every=300)  # scripts no census has read yet
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(site.config), VQ_ADMIN_STATE_DIR=str(site.state))
    prune = subprocess.Popen([VQ_ADMIN, "prune", "census-down", "cluster", "--json"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        agent = wait_until(lambda: census_agent(real_cluster) or prune.poll() is not None, timeout=300,
                           interval=0.01)
        assert type(agent) is int and prune.poll() is None, "the census ended before it could be interrupted"
        assert wait_until(lambda: reading_scripts(agent) or prune.poll() is not None, timeout=60, interval=0.001)
        assert prune.poll() is None, "the census ended before it could be interrupted"
        real_cluster.slurm.stop_controller()
        stdout, stderr = prune.communicate(timeout=600)
    finally:
        if prune.poll() is None:
            prune.kill()
        real_cluster.slurm.start_controller()
        ssh(real_cluster, "scancel", "--name=census")
    receipt = json.loads(stdout)
    assert prune.returncode == 77, stdout[-3000:] + stderr.decode()[-2000:]
    assert receipt["outcome"] == "refused" and "census" in receipt["errors"][-1], receipt["errors"]
    assert "nothing was pruned" in receipt["errors"][-1]
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["census"]["status"] == "failed" and steps["prune"]["status"] == "skipped"
    assert receipt["prune"]["census"]["cost"]["scripts_read"] >= 1  # it was reading scripts when it failed
    assert tree_digest(site.root) == before
    print(f"census refused after {receipt['prune']['census']['cost']}: {receipt['errors'][-1]}")
