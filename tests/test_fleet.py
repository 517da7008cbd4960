"""Fleet rollout: ``vq admin update PROGRAM --all`` over several login hosts.

Each managed host is an alias of one real loopback sshd with its own runtime
root and scratch; an alias host and an excluded host carry profiles too, so
the tests prove they are never touched.  Builds that must overlap or be
interrupted wait at a gate (see fleet_world), never on time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from fleet_world import Fleet, finish, wait_for
from realhosts import SshdServer, remote_path
from support import SITE_EXAMPLE, VQ_ADMIN, run_vq, tree_digest

pytestmark = pytest.mark.real

ALIASES = ("login-a", "login-b", "login-c", "login-d")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = SshdServer(tmp_path_factory.mktemp("fleet-sshd"), env={"PATH": remote_path()}, aliases=ALIASES,
                          separate_accounts=True)
    server.start()
    yield server
    server.stop()


def hosts(**overrides) -> dict[str, dict]:
    spec = {
        "alpha": {"ssh": "login-a"},
        "beta": {"ssh": "login-b"},
        "gamma": {"ssh": "login-c"},
        "beta-alias": {"role": "alias", "canonical": "beta", "ssh": "login-b"},
        "old": {"role": "excluded", "ssh": "login-d"},
    }
    for name, extra in overrides.items():
        spec[name] = dict(spec[name], **extra)
    return spec


def fleet_run(f: Fleet, state: Path, *extra: str):
    return run_vq("update", f.program, "--all", "--expected-sha", *extra, config=f.config, state=state)


def test_rollout_changes_only_managed_hosts_then_is_already_current(tmp_path, sshd):
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(), sshd=sshd)
    state = tmp_path / "state"
    done = fleet_run(f, state, f.a, "--json")
    assert done.exit_code == 0, done.stdout + done.stderr
    doc = done.json()
    assert doc["schema"] == "vq-admin/fleet/1" and doc["outcome"] == "ok" and doc["exit_code"] == 0
    assert doc["configuration_order"] == ["alpha", "beta", "gamma", "beta-alias", "old"]
    assert doc["order"] == ["alpha", "beta", "gamma"]
    for name in ("alpha", "beta", "gamma"):
        entry = doc["hosts"][name]
        assert entry["outcome"] == "ok" and entry["exit_code"] == 0
        receipt = json.loads((state / "receipts" / f"{entry['receipt']}.json").read_text())
        assert receipt["host"] == name and receipt["outcome"] == "ok" and receipt["lease"]["held"] is True
        assert (f.root(name) / "current").is_symlink()
    assert doc["hosts"]["beta-alias"] == {"outcome": "skipped", "exit_code": None, "receipt": None, "role": "alias",
                                          "reason": "fleet_role alias (of beta): never touched"}
    assert doc["hosts"]["old"]["outcome"] == "skipped" and doc["hosts"]["old"]["role"] == "excluded"
    for name in ("beta-alias", "old"):  # never touched: no root, no scratch entries, no receipt
        assert not f.root(name).exists() and not list(f.scratch(name).iterdir())
        assert not f.receipts(state, name)
    # one fleet receipt and one admin-log line naming it
    [stored] = list((state / "fleet").glob("*.json"))
    assert json.loads(stored.read_text())["hosts"] == doc["hosts"]
    log = [json.loads(line) for line in (state / "admin.log").read_text().splitlines()]
    fleet_lines = [entry for entry in log if entry["lane"] == "fleet"]
    assert len(fleet_lines) == 1 and fleet_lines[0]["receipt"] == str(stored)

    before = {name: tree_digest(f.root(name)) for name in ("alpha", "beta", "gamma")}
    again = fleet_run(f, state, f.a, "--json")
    assert again.exit_code == 0, again.stdout + again.stderr + f.explain(state)
    doc = again.json()
    assert doc["outcome"] == "already-current"
    assert {n: h["outcome"] for n, h in doc["hosts"].items()} == {
        "alpha": "already-current", "beta": "already-current", "gamma": "already-current",
        "beta-alias": "skipped", "old": "skipped"}
    assert {name: tree_digest(f.root(name)) for name in before} == before

    # quiet off a terminal on success; status --all shows every host's LAST OK side by side
    quiet = fleet_run(f, state, f.a)
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == "", quiet.stderr + f.explain(state)
    status = run_vq("status", "--all", config=f.config, state=state)
    assert status.exit_code == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines() if line.split()[:1] in (["alpha"], ["beta"], ["gamma"])]
    assert len(rows) == 3 and all(row[1] == f.a[:12] for row in rows), status.stdout


def test_a_failing_canary_starts_nothing_else(tmp_path, sshd):
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(beta={"update": "/bin/false"}), sshd=sshd)
    state = tmp_path / "state"
    done = fleet_run(f, state, f.a, "--canary", "beta", "--json")
    assert done.exit_code == 1, done.stdout + done.stderr
    doc = done.json()
    assert doc["outcome"] == "failed" and doc["hosts"]["beta"]["outcome"] == "failed"
    for name in ("alpha", "gamma"):
        assert doc["hosts"][name]["outcome"] == "skipped"
        assert doc["hosts"][name]["reason"] == "the canary beta ended failed"
        assert not f.root(name).exists() and not f.receipts(state, name)


def test_usage_errors_name_the_rule(tmp_path, sshd):
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(), sshd=sshd)
    state = tmp_path / "state"
    for extra, text in ((["--canary", "beta-alias"], "--canary beta-alias: the host is not in this rollout"),
                        (["--parallel", "0"], "--parallel 0: must be at least 1"),
                        (["--force"], "--force is not accepted with --all")):
        done = fleet_run(f, state, f.a, *extra)
        assert done.exit_code == 2 and text in done.stderr, done.stderr
    done = run_vq("update", f.program, "alpha", "--expected-sha", f.a, "--parallel", "2", config=f.config, state=state)
    assert done.exit_code == 2 and "--parallel belongs to a fleet rollout" in done.stderr
    assert not (state / "receipts").exists()


@pytest.mark.parametrize("max_failed,gamma", [(0, "skipped"), (1, "ok")])
def test_max_failed_with_parallel_1(tmp_path, sshd, max_failed, gamma):
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(beta={"update": "/bin/false"}), sshd=sshd)
    state = tmp_path / "state"
    done = fleet_run(f, state, f.a, "--parallel", "1", "--max-failed", str(max_failed), "--json")
    assert done.exit_code == 1, done.stdout + done.stderr
    outcomes = {n: h["outcome"] for n, h in done.json()["hosts"].items()}
    assert outcomes == {"alpha": "ok", "beta": "failed", "gamma": gamma, "beta-alias": "skipped", "old": "skipped"}
    assert f.root("gamma").exists() == (gamma == "ok")


def test_parallel_3_really_overlaps(tmp_path, sshd):
    gated = {"gated": True}
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(alpha=gated, beta=gated, gamma=gated), sshd=sshd)
    f.need(3)  # each build waits until all three have started: only a parallel rollout gets through
    state = tmp_path / "state"
    done = fleet_run(f, state, f.a, "--parallel", "3", "--json")
    assert done.exit_code == 0, done.stdout + done.stderr
    receipts = [r for r in f.receipts(state) if r["outcome"] == "ok"]
    assert len(receipts) == 3
    assert max(r["started_at"] for r in receipts) <= min(r["finished_at"] for r in receipts), \
        [(r["host"], r["started_at"], r["finished_at"]) for r in receipts]


def test_sigint_records_every_host_and_leaves_no_lease(tmp_path, sshd):
    gated = {"gated": True}
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(alpha=gated, beta=gated, gamma=gated), sshd=sshd)
    state = tmp_path / "state"
    proc = f.start("update", f.program, "--all", "--expected-sha", f.a, "--parallel", "2", "--json", state=state)
    wait_for(lambda: f.started() == 2 or proc.poll() is not None, "two builds to start")
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc, timeout=120)
    assert code == 3, out + err
    doc = json.loads(out)
    assert doc["interrupted"] == "SIGINT" and doc["outcome"] == "unknown"
    running = [n for n in ("alpha", "beta") if doc["hosts"][n]["outcome"] != "skipped"]
    assert running == ["alpha", "beta"]
    for name in running:
        entry = doc["hosts"][name]
        assert entry["outcome"] == "unknown" and entry["exit_code"] == 3
        receipt = json.loads((state / "receipts" / f"{entry['receipt']}.json").read_text())
        assert receipt["outcome"] == "unknown" and "SIGINT" in " ".join(receipt["errors"])
        assert receipt["readback"]["next_command"].startswith(f"vq admin update vibeqc {name} --expected-sha")
    assert doc["hosts"]["gamma"]["outcome"] == "skipped" and "SIGINT" in doc["hosts"]["gamma"]["reason"]
    assert not f.receipts(state, "gamma")
    for name in ("alpha", "beta", "gamma"):
        assert f.lease_free(name), f"the lease of {name} is still held"
    assert len(list((state / "fleet").glob("*.json"))) == 1
    f.open_gate()  # the interrupted builds keep running on their hosts; let them end
    wait_for(lambda: f.done() == 2, "the interrupted builds to end")


def test_dry_run_prints_hosts_in_order_with_their_plans(tmp_path, sshd):
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(), sshd=sshd)
    state = tmp_path / "state"
    done = fleet_run(f, state, f.a, "--canary", "gamma", "--dry-run")
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    order = [line.split()[1] for line in lines if line[:1].isdigit()]
    assert order == ["gamma", "alpha", "beta"]
    assert sum("dry run: runtime vibeqc on" in line for line in lines) == 3
    assert f"{SITE_EXAMPLE} install --root {f.root('alpha')}" in done.stdout
    assert "beta-alias: skipped (fleet_role alias (of beta)" in done.stdout
    assert not state.exists() or not list(state.rglob("*.json")), "a dry run stored something"
    doc = fleet_run(f, state, f.a, "--dry-run", "--json").json()
    assert doc["order"] == ["alpha", "beta", "gamma"] and doc["plans"]["alpha"]["lease"]["status"] == "planned"


def test_rollout_with_an_allocation_host_over_real_slurm(tmp_path, real_cluster):
    """One host builds in a real Slurm allocation, one on its login host; both roll out together."""
    f = Fleet(tmp_path, str(real_cluster.sshd.ssh_config), sshd=real_cluster.sshd, hosts={
        "alpha": {"ssh": "cluster", "allocation": ["--time=10"]},
        "beta": {"ssh": "cluster2"},
        "alpha-alias": {"role": "alias", "canonical": "alpha", "ssh": "cluster-login"},
    })
    state = tmp_path / "state"
    done = fleet_run(f, state, f.a, "--parallel", "2", "--json")
    assert done.exit_code == 0, done.stdout + done.stderr
    doc = done.json()
    assert {n: h["outcome"] for n, h in doc["hosts"].items()} == {"alpha": "ok", "beta": "ok",
                                                                  "alpha-alias": "skipped"}
    [alpha] = f.receipts(state, "alpha")
    assert alpha["deploy"]["job_id"] and alpha["deploy"]["exit_code"] == 0 and alpha["lease"]["held"] is True
    assert f.receipts(state, "beta")[0]["deploy"].get("job_id") is None
    assert not f.receipts(state, "alpha-alias")
    again = fleet_run(f, state, f.a, "--json")
    assert again.exit_code == 0 and again.json()["outcome"] == "already-current", again.stdout + again.stderr


def test_a_host_leased_by_another_administrator_is_locked_in_the_rollout(tmp_path, sshd):
    import subprocess

    from support import AGENT

    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(), sshd=sshd)
    state = tmp_path / "state"
    other = subprocess.Popen([AGENT, "lease", "--lane", "runtime", "--host", "beta-elsewhere",
                              "--program", f.program, "--driver-host", "admin2", "--user", "bob", "--pid", "4242",
                              "--since", "2026-11-30T00:00:00Z", "--run-id", "bobs-run"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=dict(os.environ, XDG_STATE_HOME=str(sshd.agent_state("login-b"))))
    try:
        assert json.loads(other.stdout.readline())["held"] is True
        done = fleet_run(f, state, f.a, "--max-failed", "1", "--json")
    finally:
        other.stdin.close()
        other.wait(timeout=30)
    assert done.exit_code == 75, done.stdout + done.stderr
    doc = done.json()
    assert doc["outcome"] == "locked"
    assert {n: doc["hosts"][n]["outcome"] for n in ("alpha", "beta", "gamma")} == {
        "alpha": "ok", "beta": "locked", "gamma": "ok"}
    assert "bob@admin2 pid 4242" in doc["hosts"]["beta"]["errors"][-1]
    assert not f.root("beta").exists(), "the leased host was touched"


def test_the_first_rollout_installs_on_every_managed_host(tmp_path, sshd):
    """New hosts (no root yet): the plain rollout fails on each ("use 'install'"); --cluster-install
    installs on every managed host, then the same line is already-current; a later plain rollout
    updates them all.  A host whose profile has no install operation stops the rollout before any
    host starts (2)."""
    with_install = {"install": True}
    f = Fleet(tmp_path, str(sshd.ssh_config), hosts(alpha=with_install, beta=with_install, gamma=with_install))
    state = tmp_path / "state"
    managed = ("alpha", "beta", "gamma")
    plain = fleet_run(f, state, f.a, "--parallel", "3", "--json")
    assert plain.exit_code == 1 and all(plain.json()["hosts"][n]["outcome"] == "failed" for n in managed)
    assert not any(f.root(n).exists() for n in managed)

    dry = fleet_run(f, state, f.a, "--cluster-install", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.count("provider command: install") == 3, dry.stdout
    assert f"{SITE_EXAMPLE} install --root {f.root('beta')}" in dry.stdout and not f.root("beta").exists()

    done = fleet_run(f, state, f.a, "--cluster-install", "--json")
    assert done.exit_code == 0, done.stdout + done.stderr
    doc = done.json()
    for name in managed:
        assert doc["hosts"][name]["outcome"] == "ok"
        receipt = json.loads((state / "receipts" / f"{doc['hosts'][name]['receipt']}.json").read_text())
        [deploy] = [s for s in receipt["steps"] if s["name"] == "deploy"]
        assert f"{SITE_EXAMPLE} install --root {f.root(name)}" in " ".join(deploy["argv"]), deploy["argv"]
        assert (f.root(name) / "current").is_symlink()
    for name in ("beta-alias", "old"):
        assert doc["hosts"][name]["outcome"] == "skipped" and not f.root(name).exists()
    again = fleet_run(f, state, f.a, "--cluster-install", "--json")
    assert again.exit_code == 0 and again.json()["outcome"] == "already-current", again.stdout + again.stderr
    later = fleet_run(f, state, f.b, "--json")
    assert later.exit_code == 0 and later.json()["outcome"] == "ok", later.stdout + later.stderr

    g = Fleet(tmp_path / "g", str(sshd.ssh_config), hosts(alpha=with_install, gamma=with_install))
    refused = fleet_run(g, tmp_path / "g-state", g.a, "--cluster-install")
    assert refused.exit_code == 2 and "has no install operation on beta (install_command" in refused.stderr
    assert not (tmp_path / "g-state" / "receipts").exists() and not g.root("alpha").exists()


SHARED = ("home-a", "home-b", "home-c")


@pytest.fixture(scope="module")
def shared_sshd(tmp_path_factory):
    """Three ssh aliases of one loopback account: one home, so one agent state and one lease."""
    server = SshdServer(tmp_path_factory.mktemp("fleet-shared-home"), env={"PATH": remote_path()}, aliases=SHARED)
    server.start()
    yield server
    server.stop()


def test_hosts_sharing_one_home_run_one_after_another_in_one_rollout(tmp_path, shared_sshd):
    """Issue 31 item 2: three login hosts whose accounts share one home share one host-side lease; a
    --parallel 4 rollout runs them one after another (never 75 on its own run) and says which waited."""
    gated = {"gated": True}
    spec = {name: dict(gated, ssh=alias) for name, alias in zip(("alpha", "beta", "gamma"), SHARED, strict=True)}
    f = Fleet(tmp_path, str(shared_sshd.ssh_config), spec, sshd=shared_sshd)
    assert len({f.lock_file(name) for name in ("alpha", "beta", "gamma")}) == 1  # one home: one lease
    state, calls = tmp_path / "state", tmp_path / "calls.jsonl"
    proc = subprocess.Popen([VQ_ADMIN, "update", f.program, "--all", "--expected-sha", f.a, "--parallel", "4",
                             "--json"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(f.env(state), VQ_ADMIN_TESTING="1", VQ_ADMIN_FAULT_LOG=str(calls)))

    def sessions() -> int:  # each run's first agent call takes the lease (the log of every call, no fault)
        lines = calls.read_text().splitlines() if calls.exists() else []
        return sum("session" in json.loads(line).get("argv", []) for line in lines)

    # all three runs asked for the one lease while the first one's build waits at the gate
    wait_for(lambda: proc.poll() is not None or (f.started() == 1 and sessions() == 3),
             "one build, and three runs asking for the shared lease")
    assert proc.poll() is None, proc.communicate()
    f.open_gate()
    code, out, err = finish(proc, timeout=300)
    doc = json.loads(out)
    assert code == 0 and doc["outcome"] == "ok", out + err
    assert {n: doc["hosts"][n]["outcome"] for n in ("alpha", "beta", "gamma")} == dict.fromkeys(
        ("alpha", "beta", "gamma"), "ok")
    waited = {n: doc["hosts"][n].get("shares_lease_with", []) for n in ("alpha", "beta", "gamma")}
    assert sum(bool(w) for w in waited.values()) == 2, waited  # the first ran at once, the other two waited
    receipts = sorted(f.receipts(state), key=lambda r: r["started_at"])
    assert all(r["outcome"] == "ok" for r in receipts) and len(receipts) == 3
    spans = sorted((r["lease"]["acquired_at"], r["finished_at"]) for r in receipts)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans  # one after another
    assert not any("another run" in " ".join(r["errors"]) for r in receipts)
    assert f.lease_free("alpha") and f.done() == 3
