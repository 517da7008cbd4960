"""Exact execution bindings against real Slurm through the loopback sshd.

* A held job bound to generation A's verified launcher survives deployments
  of B and C: while queued, ``vq admin references`` names A for that job;
  site_example's ``prune`` (fed that census) removes an unreferenced old
  generation but not A; released, the job runs A (its output proves the SHA)
  and is not rebound.
* ``--check-on-host`` re-hashes a verified launcher over ssh and refuses it
  once its bytes changed on the host; site_example's launchers name their
  generation, so one swapped in from another generation is refused too.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from real_jobs import SELFTEST, job_state, release_and_wait, ssh, submit_held_selftest
from support import SITE_EXAMPLE, GitRepo, command_host, run_vq, site_example_host, write_config

pytestmark = pytest.mark.real


@pytest.fixture
def site(real_cluster, tmp_path):
    """A managed host ``cluster`` over ssh with the site_example provider, and commits D, A, B, C."""
    repo = GitRepo(tmp_path / "repo")
    shas = {label: repo.commit(label, {"vq_selftest.py": SELFTEST.format(label=label)}) for label in "DABC"}
    root, scratch = tmp_path / "apps" / "vibeqc", tmp_path / "scratch"
    scratch.mkdir()
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_cluster.ssh_config}"\n' + site_example_host(
        "cluster", root=root, repo=repo.path, scratch=scratch, transport="ssh", ssh="cluster"))
    return {"cluster": real_cluster, "sha": shas, "root": root, "config": config, "state": tmp_path / "state",
            "tmp": tmp_path}


def vq(site, *args: str):
    return run_vq(*args, config=site["config"], state=site["state"])


def deploy(site, label: str, *extra: str) -> None:
    done = vq(site, "update", "vibeqc", "cluster", "--expected-sha", site["sha"][label], "--json", *extra)
    assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]


def references(site) -> dict[str, list[str]]:
    done = vq(site, "references", "vibeqc", "cluster", "--json")
    assert done.exit_code == 0, done.stderr
    (site["tmp"] / "census.json").write_text(done.stdout)
    return {row["sha"]: row["reasons"] for row in done.json()["generations"]}


def test_held_job_keeps_its_generation_across_deployments(site):
    cluster, sha, root = site["cluster"], site["sha"], site["root"]
    deploy(site, "D", "--cluster-install")
    deploy(site, "A")
    bound = vq(site, "launcher", "vibeqc", "cluster", "--expected-sha", sha["A"], "--json")
    assert bound.exit_code == 0, bound.stderr
    launcher, pin = bound.json()["launcher"], bound.json()["pin"]
    assert launcher == f"{root}/releases/{sha['A']}/bin/vibeqc-{sha['A']}"
    job, output = submit_held_selftest(cluster, launcher, site["tmp"])
    try:
        assert job_state(cluster, job) == "PENDING"
        assert references(site)[sha["A"]] == ["last-ok", f"job {job} (PENDING)"]  # the words prune keeps them by
        deploy(site, "B")
        deploy(site, "C")
        census = references(site)
        assert census[sha["A"]] == [f"job {job} (PENDING)"]  # only the queued job keeps A now
        assert census[sha["B"]] == ["last-good"] and census[sha["C"]] == ["last-ok"] and census[sha["D"]] == []
        pruned = ssh(cluster, SITE_EXAMPLE, "prune", "--root", str(root), "--program", "vibeqc",
                     "--referenced-file", str(site["tmp"] / "census.json"))
        assert pruned.returncode == 0, pruned.stderr
        assert json.loads(pruned.stdout)["removed"] == [sha["D"]]
        assert sorted(p.name for p in (root / "releases").iterdir()) == sorted(sha[k] for k in "ABC")
        queued = ssh(cluster, "scontrol", "write", "batch_script", job, "-")
        assert launcher in queued.stdout and sha["C"] not in queued.stdout  # not rebound
        dispatch = vq(site, "launcher", "vibeqc", "cluster", "--pin", json.dumps(pin))  # the dispatch-time check
        assert (dispatch.exit_code, dispatch.stdout) == (0, launcher + "\n"), dispatch.stderr
        state = release_and_wait(cluster, job)
        shown = output.read_text() if output.exists() else "-"
        assert state == "COMPLETED", f"job {job} state {state}; output: {shown}"
        ran = output.read_text()
        assert ran.strip() == f"selftest of A {root}/releases/{sha['A']}/source/.venv", ran
    finally:
        ssh(cluster, "scancel", job)
    after = references(site)
    assert after[sha["A"]] == []  # the job is terminal: A may go now


def test_a_launcher_swapped_between_generations_is_refused(site):
    """The venv's python is one shared interpreter; site_example's launcher names its generation, so
    A's and B's attested SHA-256 differ and B's launcher copied over A's is caught (77)."""
    deploy(site, "A", "--cluster-install")
    deploy(site, "B")
    bound = {k: vq(site, "launcher", "vibeqc", "cluster", "--expected-sha", site["sha"][k], "--check-on-host",
                   "--json") for k in "AB"}
    assert [bound[k].exit_code for k in "AB"] == [0, 0], bound["A"].stderr + bound["B"].stderr
    assert bound["A"].json()["launcher_sha256"] != bound["B"].json()["launcher_sha256"]
    shutil.copyfile(bound["B"].json()["launcher"], bound["A"].json()["launcher"])
    refused = vq(site, "launcher", "vibeqc", "cluster", "--expected-sha", site["sha"]["A"], "--check-on-host")
    assert (refused.exit_code, refused.stdout) == (77, "")
    assert "refused (launcher-changed)" in refused.stderr and bound["A"].json()["launcher_sha256"] in refused.stderr


DEPLOY = '''#!{python}
"""A command provider: installs launcher ROOT/bin/tool-<sha> and marks it active."""
import argparse, os
p = argparse.ArgumentParser()
for o in ("--root", "--program", "--expected-sha", "--tag", "--source-archive"):
    p.add_argument(o)
ns = p.parse_args()
os.makedirs(ns.root + "/bin", exist_ok=True)
path = f"{{ns.root}}/bin/tool-{{ns.expected_sha}}"
if not os.path.exists(path):
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\\nexec {python} \\"$@\\"\\n")
    os.chmod(path, 0o755)
with open(ns.root + "/active.tmp", "w") as fh:
    fh.write(ns.expected_sha)
os.replace(ns.root + "/active.tmp", ns.root + "/active")
'''

VERIFY = '''#!{python}
"""Its verify: a receipt for the active launcher, hashed here."""
import argparse, hashlib, json, os
p = argparse.ArgumentParser()
for o in ("--root", "--program", "--expected-sha", "--tag"):
    p.add_argument(o)
ns = p.parse_args()
sha = open(ns.root + "/active").read().strip() if os.path.exists(ns.root + "/active") else ""
path = f"{{ns.root}}/bin/tool-{{sha}}" if sha else ""
digest = hashlib.sha256(open(path, "rb").read()).hexdigest() if sha else ""
print(json.dumps({{"program": ns.program, "source_sha": sha, "tag": None, "healthy": bool(sha), "activation": "atomic",
                  "quiescent": True, "updater_pid": None, "active_path": path, "active_path_sha256": digest,
                  "health_detail": "test provider"}}))
'''


def test_check_on_host_refuses_a_launcher_changed_after_verification(real_cluster, tmp_path):
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A")
    root, scratch, state = tmp_path / "tool", tmp_path / "scratch", tmp_path / "state"
    scratch.mkdir()
    scripts = {}
    for name, text in (("deploy", DEPLOY), ("verify", VERIFY)):
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(text.format(python=sys.executable))
        scripts[name].chmod(0o755)
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_cluster.ssh_config}"\n' + command_host(
        "tool", scratch=scratch, repo=repo.path, update=f"{scripts['deploy']} --root {root}",
        verify=f"{scripts['verify']} --root {root}", timeout_seconds=300, verify_timeout_seconds=None))
    done = run_vq("update", "tool", "cluster", "--expected-sha", sha, "--json", config=config, state=state)
    assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-2000:]
    launcher = f"{root}/bin/tool-{sha}"
    checked = run_vq("launcher", "tool", "cluster", "--check-on-host", "--json", config=config, state=state)
    assert checked.exit_code == 0, checked.stderr
    assert (checked.json()["launcher"], checked.json()["checked_on_host"]) == (launcher, True)
    with open(launcher, "a") as fh:
        fh.write("# changed after verification\n")
    refused = run_vq("launcher", "tool", "cluster", "--check-on-host", config=config, state=state)
    assert (refused.exit_code, refused.stdout) == (77, "")
    assert "refused (launcher-changed)" in refused.stderr and checked.json()["launcher_sha256"] in refused.stderr
