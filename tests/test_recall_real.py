"""Recall against real Slurm through the loopback sshd (CONTRACT section 14).

* ``vq admin jobs``: three lookups of generation A and two of B with job references, then sixteen
  concurrent lookups of B: ``jobs --sha B --json`` lists exactly B's references, every one of them,
  and the held job that names B's launcher;
* A's release removed on the host: ``launcher`` for A, whose path is visible on this driver, is 77;
* ``quarantine --hold-jobs``: the pending job on the generation is held (JobHeldAdmin), the running
  one untouched; launcher, update and rollback refuse it (naming ``--lift``) until ``--lift``;
* a quarantine is an entry of the host's record: driver A quarantines driver B's generation (one
  configuration, two state directories); B's next contact (``history HOST``) makes its ``launcher`` 77
  ``quarantined: TEXT``; A's ``--lift`` lets B answer again after its next contact;
* ``prune`` keeps a generation used yesterday (``used DAY (1 d ago)``) and removes one last used
  30 days ago; its dry run shows each generation's last use.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from real_jobs import job_state, ssh, submit_held_selftest
from realhosts.procs import wait_until
from support import VQ_ADMIN, run_vq
from test_prune import Site
from vq_admin.launcher import uses

pytestmark = pytest.mark.real


def lookup(site: Site, label: str, *extra: str):
    done = site.vq("launcher", site.program, "cluster", "--expected-sha", site.sha[label], *extra)
    assert done.exit_code == 0, done.stderr
    return done.stdout.strip()


def test_jobs_lists_every_reference_of_a_generation_and_its_queued_jobs(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "AB", program="recall")
    site.deploy_all()
    for ref in ("a1", "a2", "a3"):
        lookup(site, "A", "--job", ref)
    launcher = lookup(site, "B", "--job", "b1")
    lookup(site, "B", "--job", "b2")
    job, _ = submit_held_selftest(real_cluster, launcher, tmp_path)
    try:
        done = site.vq("jobs", "recall", "cluster", "--sha", site.sha["B"], "--json")
        assert done.exit_code == 0, done.stdout[-2000:] + done.stderr[-2000:]
        doc = done.json()
        assert doc["schema"] == "vq-admin/jobs/1" and len(doc["generations"]) == 1
        gen = doc["generations"][0]
        assert gen["sha"] == site.sha["B"] and gen["launcher"] == launcher
        assert gen["uses"]["references"] == ["b1", "b2"] and gen["uses"]["count"] == 2
        assert [(j["id"], j["state"]) for j in gen["jobs"]] == [(job, "PENDING")]
        every = site.vq("jobs", "recall", "cluster", "--json").json()
        assert {g["sha"]: g["uses"]["references"] for g in every["generations"]} == {
            site.sha["A"]: ["a1", "a2", "a3"], site.sha["B"]: ["b1", "b2"]}
        env = dict(os.environ, VQ_ADMIN_CONFIG=str(site.config), VQ_ADMIN_STATE_DIR=str(site.state))
        lookups = [subprocess.Popen([VQ_ADMIN, "launcher", "recall", "cluster", "--expected-sha", site.sha["B"],
                                     "--job", f"c{i:02d}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for i in range(16)]
        assert [p.wait(timeout=120) for p in lookups] == [0] * 16
        after = site.vq("jobs", "recall", "cluster", "--sha", site.sha["B"], "--json").json()["generations"][0]
        assert after["uses"]["references"] == ["b1", "b2", *(f"c{i:02d}" for i in range(16))]
        assert after["uses"]["count"] == 18
        text = site.vq("jobs", "recall", "cluster")
        assert text.exit_code == 0 and f"{job} (PENDING," in text.stdout, text.stdout
        # A's release removed on the host (as another driver's prune could): its launcher, visible here, is
        # refused (77), never printed as a dead path
        shutil.rmtree(site.root / "releases" / site.sha["A"])
        gone = site.vq("launcher", "recall", "cluster", "--expected-sha", site.sha["A"], "--job", "a4")
        assert (gone.exit_code, gone.stdout) == (77, ""), gone.stderr
        assert "refused (launcher-gone)" in gone.stderr and "missing:" in gone.stderr
    finally:
        ssh(real_cluster, "scancel", job)


def test_prune_keeps_a_generation_used_yesterday_and_removes_one_unused_for_30_days(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "ABCD", program="retire")
    site.deploy_all()  # D is active and LAST OK, C LAST GOOD
    now = time.time()
    fd = os.open(site.state, os.O_RDONLY)
    try:
        for label, days in (("A", 30), ("B", 1)):
            launcher = lookup(site, label)  # a use now, and (as if recorded then) one days ago
            os.unlink(site.state / "uses" / "cluster" / "retire" / site.sha[label] / uses.CURRENT)
            uses.append(fd, "cluster", "retire", site.sha[label], launcher, "old", at=now - days * 86400)
    finally:
        os.close(fd)
    yesterday = time.strftime("%Y-%m-%d", time.gmtime(now - 86400))
    dry = site.vq("prune", "retire", "cluster", "--keep", "0", "--dry-run")
    assert dry.exit_code == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    month_ago = time.strftime("%Y-%m-%d", time.gmtime(now - 30 * 86400))
    assert f"  remove    {site.sha['A']}  (last use: {month_ago}T" in dry.stdout, dry.stdout
    assert f"  keep      {site.sha['B']}  used {yesterday} (1 d ago)  (last use: {yesterday}" in dry.stdout
    done = site.vq("prune", "retire", "cluster", "--keep", "0", "--json")
    receipt = done.json()
    assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert receipt["prune"]["keep"][site.sha["B"]] == [f"used {yesterday} (1 d ago)"]
    assert receipt["prune"]["removed"] == [site.sha["A"]]
    assert site.releases() == site.shas("BCD")


def submit(cluster, tmp, name: str, launcher: str, *options: str) -> str:
    script = tmp / f"{name}.sh"
    script.write_text(f"#!/bin/sh\n# bound to {launcher}\nsleep 300\n")
    done = ssh(cluster, "sbatch", "--parsable", f"--output={tmp / name}.out", *options, str(script))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_quarantine_holds_pending_jobs_and_refuses_the_generation_until_lifted(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "AB", program="recallq")
    site.deploy_all()  # B is active and LAST OK, A LAST GOOD
    sha = site.sha["B"]
    launcher = lookup(site, "B", "--job", "r1")
    running = submit(real_cluster, tmp_path, "running", launcher)
    pending = submit(real_cluster, tmp_path, "pending", launcher, "--begin=now+3600")
    try:
        assert wait_until(lambda: job_state(real_cluster, running) == "RUNNING", timeout=60, interval=0.5)
        done = site.vq("quarantine", "recallq", "cluster", sha, "--reason", "wrong results", "--hold-jobs", "--json")
        assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]
        doc = done.json()
        assert doc["schema"] == "vq-admin/quarantine/1" and doc["active"] is True
        assert sorted((j["id"], j["state"]) for j in doc["jobs"]) == sorted([(running, "RUNNING"),
                                                                             (pending, "PENDING")])
        assert doc["held"] == [pending] and doc["hold_failed"] == {}
        shown = ssh(real_cluster, "scontrol", "show", "job", "-o", pending).stdout
        assert "Reason=JobHeldAdmin" in shown and "JobState=PENDING" in shown, shown
        assert job_state(real_cluster, running) == "RUNNING"  # never touched
        for extra in ((), ("--expected-sha", sha), ("--expected-sha", sha, "--json")):
            refused = site.vq("launcher", "recallq", "cluster", *extra)
            assert refused.exit_code == 77 and "quarantined: wrong results" in refused.stderr + refused.stdout
        lift = f"vq admin quarantine recallq cluster {sha} --lift"
        back = site.vq("rollback", "recallq", "cluster", "--to", sha)
        again = site.vq("update", "recallq", "cluster", "--expected-sha", sha)
        for refused in (back, again):
            assert refused.exit_code == 77 and lift in refused.stderr, refused.stderr
        lifted = site.vq("quarantine", "recallq", "cluster", sha, "--lift", "--json")
        assert lifted.exit_code == 0 and lifted.json()["action"] == "lift", lifted.stdout + lifted.stderr
        assert lookup(site, "B") == launcher
        assert site.vq("update", "recallq", "cluster", "--expected-sha", sha, "--json").exit_code == 0
    finally:
        ssh(real_cluster, "scancel", running, pending)


def test_a_quarantine_by_one_driver_is_refused_by_another_after_its_next_contact(tmp_path, real_cluster):
    site = Site(tmp_path, real_cluster, "AB", program="recallx")  # driver B: site.state
    site.deploy_all()
    sha, launcher = site.sha["B"], lookup(site, "B")
    other = tmp_path / "state-other"  # driver A: the same configuration, its own state directory

    def by_a(*args: str):
        done = run_vq("quarantine", "recallx", "cluster", sha, *args, "--json", config=site.config, state=other)
        assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.json()

    def contact_b() -> None:
        done = site.vq("history", "cluster", "recallx")
        assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]

    quarantined = by_a("--reason", "wrong results on node type X")
    assert quarantined["host_record"] and quarantined["host_record_problem"] is None, quarantined
    assert quarantined["host_record"].endswith(".json") and "/record/recallx/" in quarantined["host_record"]
    assert lookup(site, "B") == launcher  # B has not been in contact with the host since
    contact_b()
    refused = site.vq("launcher", "recallx", "cluster", "--expected-sha", sha)
    assert (refused.exit_code, refused.stdout) == (77, ""), refused.stderr
    assert "quarantined: wrong results on node type X" in refused.stderr
    again = site.vq("update", "recallx", "cluster", "--expected-sha", sha)
    assert again.exit_code == 77 and f"vq admin quarantine recallx cluster {sha} --lift" in again.stderr
    lifted = by_a("--lift")
    assert lifted["action"] == "lift" and lifted["host_record"], lifted
    assert site.vq("launcher", "recallx", "cluster", "--expected-sha", sha).exit_code == 77  # until B's contact
    contact_b()
    assert lookup(site, "B") == launcher
