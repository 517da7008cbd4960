"""The helper lane, ``vq admin update HOST``.

Against the real loopback sshd: the stage and the helper command run on
``cluster-build`` (``helper_update_host``), the readback on ``cluster-login``,
with the real site updater installing out of place.  Authority, locking and
source refusals need no remote host and run with ``transport = "local"``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from filelock import FileLock

from helper_world import (FAST_REREADS, HELPER_UPDATE, PYTHON, bootstrap, helper_repo, helper_table,
                          live_identity, write_script)
from plan_match import slot_values
from support import SCRIPTS, run_vq, write_config

from vq_admin.core import protocol
from vq_admin.state.locks import lock_path


@pytest.fixture
def world(tmp_path):
    repo, sha_a = helper_repo(tmp_path / "repo")
    root = tmp_path / "helper"
    bootstrap(root, repo.path, sha_a, tmp_path)
    sha_b = repo.commit("helper B", {"HELPER-NOTE": "B\n"})
    (tmp_path / "scratch").mkdir()
    return {"tmp": tmp_path, "repo": repo, "root": root, "a": sha_a, "b": sha_b,
            "scratch": tmp_path / "scratch", "state": tmp_path / "state"}


def ssh_config(world, real_sshd, **table) -> Path:
    text = f'ssh_config = "{real_sshd.ssh_config}"\n\n' + helper_table(
        "cluster", root=world["root"], repo=world["repo"].path, scratch=world["scratch"], transport="ssh",
        ssh="cluster-login", update_host="cluster-build", **table)
    return write_config(world["tmp"] / "admin.toml", text)


def update(world, config, *args, env=None):
    return run_vq("update", "cluster", *args, "--json", config=config, state=world["state"],
                  env={**FAST_REREADS, **(env or {})})


def lane_file(world, name: str) -> Path:
    return world["state"] / "hosts" / "cluster" / "helper" / name


def steps(receipt, name_prefix: str) -> list[dict]:
    return [s for s in receipt["steps"] if s["name"].startswith(name_prefix) and s["status"] != "skipped"]


# -- against the real sshd -------------------------------------------------------------


@pytest.mark.real
def test_helper_update_installs_the_requested_commit(world, real_sshd):
    config = ssh_config(world, real_sshd)
    dry = update(world, config, "--expected-sha", world["b"], "--dry-run")
    assert dry.exit_code == 0, dry.stdout + dry.stderr
    done = update(world, config, "--expected-sha", world["b"])
    assert done.exit_code == 0, done.stdout + done.stderr
    receipt = done.json()
    assert (receipt["outcome"], receipt["lane"], receipt["program"]) == ("ok", "helper", None)
    tree = receipt["source"]["tree_sha256"]
    # the receipt's steps are the dry run's plan with its slots filled
    values = slot_values(dry.json()["steps"], receipt["steps"], names={
        "source", "stage-create", "stage-receive", "stage-verify", "helper", "readback", "stage-reclaim"})
    assert (values["stage"], values["tree_sha256"]) == (receipt["stage"]["dir"], tree)
    assert values["success|failed"] == "success"
    by_name = {s["name"]: s for s in receipt["steps"]}
    assert {by_name[n]["where"] for n in ("stage-create", "stage-receive", "stage-verify",
                                          "helper")} == {"cluster-build"}
    assert by_name["readback"]["where"] == "cluster-login"
    assert by_name["readback"]["argv"] == protocol.identity([str(world["root"] / "bin" / "vq-admin-agent")])
    env = by_name["helper"]["env"]
    assert env["VQ_HELPER_EXPECTED_SHA"] == world["b"] and env["VQ_HELPER_EXPECTED_TREE_SHA256"] == tree
    assert env["VQ_HELPER_STAGE"] == receipt["stage"]["dir"]
    read = receipt["verify"]["readback"]["attempts"][-1]["identity"]
    assert (read["source_sha"], read["tree_sha256"], read["record"]) == (world["b"], tree, "bound")
    live = live_identity(world["root"])
    assert (live["source_sha"], live["tree_sha256"]) == (world["b"], tree)
    activation = json.loads(lane_file(world, "activation.json").read_text())
    assert (activation["expected_sha"], activation["tree_sha256"]) == (world["b"], tree)
    assert activation["identity"]["source_sha"] == world["b"] and activation["receipt"] == receipt["id"]
    assert json.loads(lane_file(world, "last-ok.json").read_text())["sha"] == world["b"]
    assert not os.path.exists(receipt["stage"]["dir"])  # reclaimed after success
    status = run_vq("status", "--json", config=config, state=world["state"]).json()["hosts"]["cluster"]
    assert status["helper"]["last_ok"]["sha"] == world["b"] and status["runtimes"] == {}
    text = run_vq("status", config=config, state=world["state"]).stdout
    assert "helper: last ok" in text and world["b"] in text

    again = update(world, config)  # no --expected-sha: HEAD of helper_source_repo, already live
    assert again.exit_code == 0, again.stdout + again.stderr
    second = again.json()
    assert second["outcome"] == "already-current" and second["expected_sha"] == world["b"]
    assert {s["name"]: s["status"] for s in second["steps"]}["helper"] == "skipped"


@pytest.mark.real
def test_command_succeeds_but_old_helper_stays_live(world, real_sshd):
    config = ssh_config(world, real_sshd, command="/bin/true")
    done = update(world, config, "--expected-sha", world["b"])
    assert done.exit_code == 1, done.stdout + done.stderr
    receipt = done.json()
    assert receipt["outcome"] == "failed" and receipt["deploy"]["exit_code"] == 0
    assert len(steps(receipt, "readback")) == 1 + 3  # the first read and the bounded re-reads
    assert receipt["verify"]["readback"]["attempts"][-1]["identity"]["source_sha"] == world["a"]
    assert any("is not " + world["b"] in e for e in receipt["errors"])
    assert not lane_file(world, "last-ok.json").exists()
    assert not lane_file(world, "activation.json").exists()
    assert json.loads(lane_file(world, "last.json").read_text())["outcome"] == "failed"


@pytest.mark.real
def test_changed_tree_with_a_matching_sha_record_fails(world, real_sshd):
    tamper = write_script(world["tmp"] / "tamper-after-install", f"""#!{PYTHON}
import os, subprocess, sys
code = subprocess.call([{HELPER_UPDATE!r}, "--root", {str(world['root'])!r}])
release = os.path.realpath({str(world['root'] / 'current')!r})
with open(os.path.join(release, "vq_admin", "outcome.py"), "a") as fh:
    fh.write("# altered after the record was written\\n")
sys.exit(code)
""")
    done = update(world, ssh_config(world, real_sshd, command=tamper), "--expected-sha", world["b"])
    assert done.exit_code == 1, done.stdout + done.stderr
    final = done.json()["verify"]["readback"]["attempts"][-1]
    assert final["identity"]["source_sha"] == world["b"] and final["identity"]["record"] == "stale"
    assert any("files digest to" in m for m in final["mismatches"])
    assert not lane_file(world, "last-ok.json").exists()
    assert not lane_file(world, "activation.json").exists()


def lagging_agent(world, lag_file: Path) -> str:
    """The configured agent, seen through a lagging shared filesystem: while *lag_file*
    holds N > 0, an identity read shows the release that was live before the update."""
    real = world["root"] / "bin" / "vq-admin-agent"
    old = os.path.realpath(world["root"] / "current")
    return write_script(world["tmp"] / "lagging-agent", f"""#!{PYTHON}
import os, sys
lag = {str(lag_file)!r}
args = sys.argv[1:]
n = int(open(lag).read()) if os.path.exists(lag) else 0
if n > 0 and args[:1] == ["identity"]:
    with open(lag, "w") as fh:
        fh.write(str(n - 1))
    boot = ("import sys; sys.dont_write_bytecode = True; sys.path.insert(0, {old!r}); "
            "from vq_admin.agent.cli import main; sys.exit(main(sys.argv[1:]))")
    os.execv({PYTHON!r}, [{PYTHON!r}, "-I", "-c", boot, *args])
os.execv({str(real)!r}, [{str(real)!r}, *args])
""")


def install_then_lag(world, lag_file: Path, reads: int) -> str:
    return write_script(world["tmp"] / "install-then-lag", f"""#!{PYTHON}
import subprocess, sys
code = subprocess.call([{HELPER_UPDATE!r}, "--root", {str(world['root'])!r}])
with open({str(lag_file)!r}, "w") as fh:
    fh.write("{reads}")
sys.exit(code)
""")


@pytest.mark.real
def test_lagging_filesystem_is_accepted_after_two_rereads(world, real_sshd):
    lag = world["tmp"] / "lag"
    config = ssh_config(world, real_sshd, agent=lagging_agent(world, lag), command=install_then_lag(world, lag, 3))
    done = update(world, config, "--expected-sha", world["b"])
    assert done.exit_code == 0, done.stdout + done.stderr
    receipt = done.json()
    attempts = receipt["verify"]["readback"]["attempts"]
    assert [a["identity"]["source_sha"] for a in attempts] == [world["a"]] * 3 + [world["b"]]
    assert json.loads(lane_file(world, "activation.json").read_text())["reads"] == 4


@pytest.mark.real
def test_lag_beyond_the_bound_fails(world, real_sshd):
    lag = world["tmp"] / "lag"
    config = ssh_config(world, real_sshd, agent=lagging_agent(world, lag), command=install_then_lag(world, lag, 10))
    done = update(world, config, "--expected-sha", world["b"])
    assert done.exit_code == 1, done.stdout + done.stderr
    assert len(done.json()["verify"]["readback"]["attempts"]) == 4
    assert not lane_file(world, "last-ok.json").exists()


def identity_after_install(world, name: str, action: str) -> tuple[str, str]:
    """``(agent, command)``: a helper command that installs and then leaves a flag, and an agent
    (the installed one behind a wrapper named *name*) whose ``identity``, once the flag is there,
    runs the Python line *action* (with ``os``, ``signal`` and ``sys`` imported) and exits 0."""
    flag = world["tmp"] / "installed"
    agent = write_script(world["tmp"] / name, f"""#!{PYTHON}
import os, signal, sys
if os.path.exists({str(flag)!r}) and sys.argv[1:2] == ["identity"]:
    {action}
    sys.exit(0)
real = {str(world['root'] / 'bin' / 'vq-admin-agent')!r}
os.execv(real, [real, *sys.argv[1:]])
""")
    command = write_script(world["tmp"] / "install-and-flag", f"""#!/bin/sh
{HELPER_UPDATE} --root {world['root']} && : > {flag}
""")
    return agent, command


@pytest.mark.real
def test_malformed_identity_is_final(world, real_sshd):
    agent, command = identity_after_install(world, "garbling-agent", 'print("helper says hello")')
    done = update(world, ssh_config(world, real_sshd, agent=agent, command=command), "--expected-sha", world["b"])
    assert done.exit_code == 1, done.stdout + done.stderr
    receipt = done.json()
    assert len(receipt["verify"]["readback"]["attempts"]) == 1
    assert "not a helper identity" in receipt["errors"][-1]
    assert not lane_file(world, "activation.json").exists()


@pytest.mark.real
def test_transport_failure_during_readback_is_unknown(world, real_sshd):
    agent, command = identity_after_install(
        world, "dropping-agent", "os.kill(os.getppid(), signal.SIGKILL)  # the sshd session: the client sees exit 255")
    done = update(world, ssh_config(world, real_sshd, agent=agent, command=command), "--expected-sha", world["b"])
    assert done.exit_code == 3, done.stdout + done.stderr
    receipt = done.json()
    assert receipt["outcome"] == "unknown"
    assert receipt["readback"]["next_command"] == f"vq admin update cluster --expected-sha {world['b']}"
    assert len(receipt["verify"]["readback"]["attempts"]) == 1
    assert not lane_file(world, "last-ok.json").exists()
    assert not lane_file(world, "activation.json").exists()


@pytest.mark.real
def test_a_first_installation_says_what_to_run_and_then_works_as_printed(tmp_path, real_sshd):
    """A host with no helper: ``update HOST`` refuses (77) with the exact commands (the single-file
    agent put where ``agent`` names, then ``--cluster-install``); run as printed they install it (the
    helper command replaces that file with the entry point it installs), and the rerun is
    already-current.  A plain update through an agent without an install record refuses too, naming
    the install; nothing is staged or installed by a refusal."""
    repo, sha = helper_repo(tmp_path / "repo")
    root, scratch, state = tmp_path / "helper", tmp_path / "scratch", tmp_path / "state"
    scratch.mkdir()
    world = {"tmp": tmp_path, "root": root, "repo": repo, "scratch": scratch, "state": state}
    config = ssh_config(world, real_sshd)
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(state), **FAST_REREADS,
               PATH=f"{SCRIPTS}:{os.environ['PATH']}")  # vq-admin's bin on PATH, as the install guide says

    def shell(command: str) -> subprocess.CompletedProcess[str]:  # as the operator types it
        return subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)

    def refused(*args: str) -> str:
        done = update(world, config, "--expected-sha", sha, *args)
        assert done.exit_code == 77, done.stdout + done.stderr
        assert not (root / "releases").exists() and not list(scratch.glob(".vq-admin/stage/*/*/stage.*"))
        [error] = done.json()["errors"]
        return error

    install = f"vq admin update cluster --cluster-install --expected-sha {sha}"
    for args in ((), ("--cluster-install",)):
        error = refused(*args)
        assert error.startswith("no helper is installed on cluster: the agent ") and "exit 127" in error, error
        assert error.endswith(f", then {install}; only read-only checks ran; nothing was changed"), error
    commands = error.split("install the helper through it: ", 1)[1].split(f", then {install}", 1)[0]
    # each destination after "--", where ssh and scp read no option
    assert " -- cluster-login mkdir -p " in commands and ' -- "$d/vq-admin-agent.pyz" cluster-login:' in commands
    placed = shell(commands)
    assert placed.returncode == 0, placed.stderr
    assert live_identity(root)["record"] == "missing"  # the single-file agent, at the path `agent` names

    error = refused()  # a plain update through it: nothing this lane installed is there yet
    assert "which has no install record" in error and f"a first installation is {install}," in error, error
    done = shell(install + " --json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["outcome"] == "ok"
    live = live_identity(root)
    assert (live["source_sha"], live["record"]) == (sha, "bound")
    again = shell(f"vq admin update cluster --expected-sha {sha} --verbose")
    assert again.returncode == 0, again.stderr
    assert "vq-admin: helper on cluster: already-current (exit 0)" in again.stdout + again.stderr


# -- local: authority, lock, source ----------------------------------------------------


def local_config(world, role: str = "managed", extra: str = "") -> Path:
    text = helper_table("cluster", root=world["root"], repo=world["repo"].path, scratch=world["scratch"], role=role)
    text += helper_table("login2", root=world["root"], repo=world["repo"].path, scratch=world["scratch"],
                         role="alias", extra='canonical_host = "cluster"')
    text += helper_table("old", root=world["root"], repo=world["repo"].path, scratch=world["scratch"], role="excluded")
    return write_config(world["tmp"] / "local.toml", text + extra)


@pytest.mark.parametrize("host, words", [("login2", ["'alias'", "run the update against cluster"]),
                                         ("old", ["'excluded'"])])
def test_alias_and_excluded_hosts_are_refused(world, host, words):
    done = run_vq("update", host, "--expected-sha", world["b"], "--json", config=local_config(world),
                  state=world["state"])
    assert done.exit_code == 77
    receipt = done.json()
    message = receipt["errors"][0]
    assert all(w in message for w in words), message
    assert receipt["outcome"] == "refused" and receipt["lane"] == "helper"
    assert all(s["status"] != "ok" for s in receipt["steps"])
    assert not (world["state"] / "hosts" / host).exists()  # no lane record moved
    assert live_identity(world["root"])["source_sha"] == world["a"]


def test_helper_only_host_may_update_its_helper_but_not_runtimes(world):
    profile = (f'[hosts.cluster.scheduler_runtime_deployments.vibeqc]\nupdate_command = "/bin/false"\n'
               f'verify_command = "/bin/false"\nsource_repo = "{world["repo"].path}"\n')
    config = local_config(world, role="helper-only", extra=profile)
    done = run_vq("update", "cluster", "--expected-sha", world["b"], "--json", config=config, state=world["state"],
                  env=FAST_REREADS)
    assert done.exit_code == 0, done.stdout + done.stderr
    assert live_identity(world["root"])["source_sha"] == world["b"]
    runtime = run_vq("update", "vibeqc", "cluster", "--expected-sha", world["b"], "--json", config=config,
                     state=world["state"])
    assert runtime.exit_code == 77
    assert "'helper-only'" in runtime.json()["errors"][0]


def test_a_second_helper_update_of_the_host_is_locked_out(world):
    path = lock_path(world["state"], "helper", "cluster", None)
    path.parent.mkdir(parents=True)
    with FileLock(str(path), timeout=0):
        done = run_vq("update", "cluster", "--expected-sha", world["b"], "--json", config=local_config(world),
                      state=world["state"])
    assert done.exit_code == 75
    assert all(s["status"] in ("planned", "skipped") for s in done.json()["steps"])
    assert live_identity(world["root"])["source_sha"] == world["a"]


def test_dirty_helper_source_is_refused_without_expected_sha(world):
    (world["repo"].path / "HELPER-NOTE").write_text("uncommitted\n")
    done = run_vq("update", "cluster", "--json", config=local_config(world), state=world["state"])
    assert done.exit_code == 77
    assert "uncommitted changes" in done.json()["errors"][0]
    assert live_identity(world["root"])["source_sha"] == world["a"]


def test_dry_run_prints_the_plan_and_changes_nothing(world):
    done = run_vq("update", "cluster", "--dry-run", "--json", "--update-script-arg=--python=/usr/bin/python3",
                  config=local_config(world), state=world["state"])
    assert done.exit_code == 0, done.stdout + done.stderr
    plan = done.json()
    helper = [s for s in plan["steps"] if s["name"] == "helper"][0]
    assert helper["argv"] == [HELPER_UPDATE, "--root", str(world["root"]), "--python=/usr/bin/python3"]
    assert helper["env"] == {"VQ_HELPER_STAGE": "<stage>", "VQ_HELPER_EXPECTED_SHA": world["b"],
                             "VQ_HELPER_EXPECTED_TREE_SHA256": "<tree_sha256>"}
    assert [s["name"] for s in plan["steps"]] == ["source", "pre-identity", "stage-create", "stage-receive",
                                                  "stage-verify", "helper", "readback", "stage-reclaim"]
    assert plan["expected_sha"] == world["b"]
    assert not world["state"].exists() and list(world["scratch"].iterdir()) == []


@pytest.mark.real
def test_an_already_current_helper_update_is_one_ssh_process_and_one_agent_start(world, real_sshd):
    """Issues 10 and 15 for the helper lane: the lease and the pre-identity read are one
    ``vq-admin-agent session``, the only agent start; before it, the agent and the helper commands
    are judged from ``realpath``/``stat`` facts on each host (the agent is what this lane replaces,
    so it is never asked to judge itself), all over one shared connection per host.  The exact set
    of ssh processes is pinned so it cannot creep."""
    config = ssh_config(world, real_sshd)
    first = update(world, config, "--expected-sha", world["b"])
    assert first.exit_code == 0 and first.json()["outcome"] == "ok", first.stdout + first.stderr
    wrap, log = world["tmp"] / "wrap", world["tmp"] / "ssh.log"
    wrap.mkdir()
    # one line per ssh process (the login-shell probe's words hold a newline)
    (wrap / "ssh").write_text(f'#!/bin/sh\nprintf "%s" "ssh $*" | tr "\\n" " " >> {log}\necho >> {log}\n'
                              'exec /usr/bin/ssh "$@"\n')
    (wrap / "ssh").chmod(0o755)
    again = update(world, config, "--expected-sha", world["b"], env={"PATH": f"{wrap}:{os.environ['PATH']}"})
    receipt = again.json()
    assert again.exit_code == 0 and receipt["outcome"] == "already-current", again.stdout + again.stderr
    calls = log.read_text().splitlines()
    agent = str(world["root"] / "bin" / "vq-admin-agent")

    def what(call: str) -> tuple[str, str]:
        words = call.split()
        cut = words.index("--")
        if "-O" in words[:cut]:
            return words[cut + 1], "-O " + words[words.index("-O") + 1]
        if "-G" in words[:cut]:  # what ssh will load for the destination, judged before it connects
            return words[cut + 1], "-G"
        rest = words[cut + 2:]
        rest = rest[rest.index(agent):] if rest[0] == "/usr/bin/python3" else rest  # the agent behind its judge
        return words[cut + 1], f"{agent} {rest[1]}" if rest[0] == agent else rest[0]

    login, build = "cluster-login", "cluster-build"
    assert sorted(map(what, calls)) == sorted([
        (login, "printf"), (login, "/usr/bin/realpath"), (login, "/usr/bin/stat"),  # the agent, before the lease
        (login, "/usr/bin/realpath"), (login, "/usr/bin/stat"),  # check-commands on the login host
        (login, f"{agent} session"), (login, "-O exit"), (login, "-G"), (build, "-G"),
        (build, "printf"), (build, "/usr/bin/realpath"), (build, "/usr/bin/stat"), (build, "-O exit")]), calls
    assert all("ControlPath=" in call for call in calls if " -G " not in call)  # one shared connection per host
    pre = {s["name"]: s for s in receipt["steps"]}["pre-identity"]
    assert pre["status"] == "ok" and "vq-admin-agent session" in pre["purpose"]
    assert receipt["lease"]["held"] is True and receipt["lease"]["argv"] == protocol.session([agent])
    assert receipt["verify"]["pre"]["identity"]["source_sha"] == world["b"]
