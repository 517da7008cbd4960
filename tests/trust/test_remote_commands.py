"""Configured command files on the remote host, attacked for real: the helper lane's
helper command and agent, rollback's ``activate_command``, prune's ``prune_command``.

The operator (root) runs vq-admin against the real loopback sshd; the attacker
is the unprivileged local user ``nobody`` (``setpriv``), who owns (or can
replace) a script an interpreter-prefixed command names.  Each attack asserts
exit 77 from the ``check-commands`` step, that the attacker's marker file does
not exist, that no record under the state directory changed (receipts and the
admin log aside: a refusal is recorded), and that nothing ends in a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helper_world import FAST_REREADS, bootstrap, helper_repo, helper_table, live_identity, write_script
from support import AGENT, run_vq, tree_digest, write_config
import test_host_trust
from test_rollback import World

pytestmark = pytest.mark.real

arena = test_host_trust.arena  # the fixture: a directory below /tmp the attacker can traverse
as_nobody = test_host_trust.as_nobody

#: What a refused run may add under the state directory: its receipt and admin-log line, the lane's
#: last-run record, the lock files, and this driver's view of the host's record (every run that reaches
#: the host reads it first, CONTRACT section 12).  Everything else (LAST OK, LAST GOOD, the registry,
#: activation records) must stay byte-identical.
RECORDED_ANYWAY = ("receipts", "admin.log", "locks", "leases", "record")


def records(state: Path) -> dict[str, str]:
    return {rel: digest for rel, digest in tree_digest(state).items()
            if rel.split("/")[0] not in RECORDED_ANYWAY and not rel.endswith("last.json") and digest != "dir"}


def attacker_script(arena: Path, name: str, marker: Path) -> Path:
    """A world-writable directory holding *name*, which the attacker (nobody) writes: it would touch *marker*."""
    shared = arena / "shared"
    shared.mkdir(exist_ok=True)
    shared.chmod(0o777)
    script = shared / name
    as_nobody("sh", "-c", f"printf 'import pathlib\\npathlib.Path(\"{marker}\").touch()\\n' > {script}")
    return script


def refusal(result) -> tuple[dict, str, dict]:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.exit_code == 77, result.stdout[-3000:] + result.stderr[-3000:]
    receipt = result.json()
    assert receipt["outcome"] == "refused"
    return receipt, " ".join(receipt["errors"]), {s["name"]: s for s in receipt["steps"]}


# -- the helper lane ------------------------------------------------------------------------


@pytest.fixture
def helper(tmp_path, real_sshd):
    repo, sha_a = helper_repo(tmp_path / "repo")
    root = tmp_path / "helper"
    bootstrap(root, repo.path, sha_a, tmp_path)
    sha_b = repo.commit("helper B", {"HELPER-NOTE": "B\n"})
    (tmp_path / "scratch").mkdir()

    def configure(**table: str) -> Path:
        text = f'ssh_config = "{real_sshd.ssh_config}"\n\n' + helper_table(
            "cluster", root=root, repo=repo.path, scratch=tmp_path / "scratch", transport="ssh",
            ssh="cluster-login", update_host="cluster-build", **table)
        return write_config(tmp_path / "admin.toml", text)

    def update(config: Path):
        return run_vq("update", "cluster", "--expected-sha", sha_b, "--json", config=config,
                      state=tmp_path / "state", env=FAST_REREADS)

    return {"root": root, "a": sha_a, "b": sha_b, "state": tmp_path / "state", "configure": configure,
            "update": update, "tmp": tmp_path}


def test_helper_command_with_an_attacker_script_is_refused_on_the_stage_host(helper, arena):
    marker = arena / "pwned"
    script = attacker_script(arena, "update.py", marker)
    config = helper["configure"](command=f"{sys.executable} {script} --root {helper['root']}")
    installed, before = tree_digest(helper["root"]), records(helper["state"])
    receipt, message, steps = refusal(helper["update"](config))
    assert "refused on cluster-build: hosts.cluster.helper_update_command: command file" in message
    assert f"file {script} is owned by nobody (uid 65534), not by you or root (mode 0" in message
    assert "fix: make it owned by you or root" in message and "no configured command was run there" in message
    assert steps["check-commands"]["where"] == "cluster-login" and steps["check-commands"]["status"] == "ok"
    assert steps["check-levels"]["where"] == "cluster-login" and steps["check-levels"]["status"] == "ok"
    assert steps["check-commands-2"]["where"] == "cluster-build" and steps["check-commands-2"]["status"] == "ok"
    assert steps["check-commands-2"]["argv"][0] == "/usr/bin/realpath"
    assert steps["check-levels-2"]["where"] == "cluster-build" and steps["check-levels-2"]["status"] == "failed"
    assert steps["check-levels-2"]["argv"][0] == "/usr/bin/stat" and str(script) in steps["check-levels-2"]["argv"]
    for name in ("pre-identity", "stage-create", "helper", "readback"):
        assert steps[name]["status"] == "skipped", (name, steps[name])
    assert not marker.exists()
    assert tree_digest(helper["root"]) == installed and live_identity(helper["root"])["source_sha"] == helper["a"]
    assert not (helper["state"] / "hosts" / "cluster" / "helper" / "last-ok.json").exists()
    assert not (helper["state"] / "hosts" / "cluster" / "helper" / "activation.json").exists()
    assert records(helper["state"]) == before


def test_an_agent_another_user_can_replace_is_refused_before_it_runs(helper, arena):
    """The agent is what the helper lane replaces, so it is never asked to vouch for itself."""
    marker = arena / "pwned"
    loose = arena / "loose-bin"
    loose.mkdir()
    loose.chmod(0o777)
    agent = loose / "vq-admin-agent"
    agent.write_text(f"#!/bin/sh\ntouch {marker}\nexec {helper['root']}/bin/vq-admin-agent \"$@\"\n")
    agent.chmod(0o755)
    config = helper["configure"](agent=str(agent))
    before = records(helper["state"])
    receipt, message, steps = refusal(helper["update"](config))
    assert "refused on cluster-login: hosts.cluster.agent: command file" in message
    assert f"directory {loose} is group- and other-writable without the sticky bit" in message
    # judged before the host-side lease would run it on the login host, from stat, not by asking it
    checked = receipt["lease"]["agent_checked"]
    assert checked["status"] == "failed" and checked["argv"][0] == "/usr/bin/stat", checked
    assert [(s["name"], s["status"]) for s in checked["steps"]] == [("lease-check-commands", "ok"),
                                                                     ("lease-check-levels", "failed")]
    assert receipt["lease"]["held"] is False
    assert all(s["status"] in ("planned", "skipped") for s in steps.values()), steps
    assert not marker.exists()  # the agent never ran: not for the lease, the check or anything else
    assert records(helper["state"]) == before


def test_a_helper_that_predates_check_paths_is_still_updated(helper, tmp_path):
    """The check needs nothing of the agent, so an old agent (no check-paths verb) can be replaced."""
    calls = tmp_path / "agent-calls"
    # a Python script (the agent judge's rule: the agent's first word is a Python interpreter or script)
    old = write_script(tmp_path / "old-agent" / "vq-admin-agent",
                       f"#!{sys.executable}\nimport os, sys\n"
                       f"with open({str(calls)!r}, 'a') as log:\n    log.write(sys.argv[1] + '\\n')\n"
                       "if sys.argv[1] == 'check-paths':\n"
                       "    sys.stderr.write('invalid choice: check-paths\\n')\n    sys.exit(2)\n"
                       f"agent = {str(helper['root']) + '/bin/vq-admin-agent'!r}\n"
                       "os.execv(agent, [agent] + sys.argv[1:])\n")
    config = helper["configure"](agent=old)
    done = helper["update"](config)
    assert done.exit_code == 0, done.stdout[-3000:] + done.stderr[-3000:]
    receipt = done.json()
    assert receipt["outcome"] == "ok"
    checks = [(s["name"], s["argv"][0]) for s in receipt["steps"] if s["name"].startswith("check-")]
    assert checks == [("check-commands", "/usr/bin/realpath"), ("check-levels", "/usr/bin/stat"),
                      ("check-commands-2", "/usr/bin/realpath"), ("check-levels-2", "/usr/bin/stat")]
    assert "check-paths" not in calls.read_text().split()
    assert live_identity(helper["root"])["source_sha"] == helper["b"]


# -- rollback's activate_command and prune's prune_command ---------------------------------


@pytest.fixture
def generations(tmp_path, real_sshd):
    """Generations A and B deployed and verified over ssh (LAST OK B, LAST GOOD A)."""
    w = World(tmp_path, real_sshd.ssh_config)
    w.update(w.a, "--cluster-install")
    w.update(w.b)
    return w


def test_rollback_activate_command_with_an_attacker_script_is_refused(generations, arena):
    w = generations
    marker = arena / "pwned"
    script = attacker_script(arena, "activate.py", marker)
    w.configure(f"{sys.executable} {script} --root {w.root}")
    before, releases = records(w.state), tree_digest(w.root)
    receipt, message, steps = refusal(w.rollback())
    key = f"hosts.cluster.scheduler_runtime_deployments.{w.program}.activate_command"
    assert f"refused on cluster: {key}: command file" in message
    assert f"file {script} is owned by nobody (uid 65534)" in message
    assert "no configured command was run there" in message
    assert steps["check-commands"]["status"] == "failed"
    assert steps["check-commands"]["argv"][:2] == [AGENT, "check-paths"]
    assert steps["check-commands"]["argv"][-2:] == [sys.executable, str(script)]
    assert all(steps[n]["status"] == "skipped" for n in ("pre-verify", "activate", "verify")), steps
    assert not marker.exists()
    assert w.current() == f"releases/{w.b}" and tree_digest(w.root) == releases
    assert records(w.state) == before


def test_prune_command_with_an_attacker_script_is_refused(generations, arena):
    w = generations
    marker = arena / "pwned"
    script = attacker_script(arena, "prune.py", marker)
    w.extra_profile = f'prune_command = "{sys.executable} {script} --root {w.root}"\n'
    w.configure()
    before, releases = records(w.state), tree_digest(w.root)
    for extra in ((), ("--dry-run",)):  # a dry run runs the verify: it is checked just the same
        receipt, message, steps = refusal(w.vq("prune", w.program, "cluster", "--json", *extra))
        key = f"hosts.cluster.scheduler_runtime_deployments.{w.program}.prune_command"
        assert f"refused on cluster: {key}: command file" in message, message
        assert f"file {script} is owned by nobody (uid 65534)" in message
        assert steps["check-commands"]["status"] == "failed"
        assert all(steps[n]["status"] in ("planned", "skipped") for n in ("verify-active", "census", "prune")), \
            {n: s["status"] for n, s in steps.items()}
        assert not marker.exists()
        assert tree_digest(w.root) == releases and records(w.state) == before
    last_ok = w.state / "hosts" / "cluster" / "runtime" / w.program / "last-ok.json"
    assert json.loads(last_ok.read_text())["sha"] == w.b
