"""The two lanes never cross, asserted from what actually ran.

* A runtime update runs no helper command, calls no helper hook, leaves the
  helper's installed files byte-identical and writes no helper state.
* A helper update runs no runtime provider command, calls no runtime hook,
  and leaves the runtime root and the runtime lane's state byte-identical.

What ran is read three ways: every site command is a logging stand-in (what a
site installed), the receipt's executed steps, and (in process) a recording
provider that sees every hook call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vq_admin_hookspecs import hookimpl

from helper_world import FAST_REREADS, HELPER_UPDATE, PYTHON, helper_table, two_lanes, write_script
from provider_doubles import SiteLikeRuntime
from support import SITE_EXAMPLE, run_vq, tree_digest, write_config

from vq_admin.config import load_config
from vq_admin.context import RunContext
from vq_admin.lanes.helper import HelperUpdate
from vq_admin.lanes.runtime import RuntimeUpdate
from vq_admin.plugins import Providers
from vq_admin.providers import command as command_provider
from vq_admin.state.records import StateDir
from vq_admin.ssh.transport import Session

LOGGER = """#!{python}
import json, os, sys
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"cmd": {name!r}, "argv": sys.argv[1:]}}) + "\\n")
os.execv({target!r}, [{target!r}, *{words!r}, *sys.argv[1:]])
"""


@pytest.fixture
def world(tmp_path):
    lanes = two_lanes(tmp_path)
    repo, sha_a, sha_b, helper_root = lanes.repo, lanes.a, lanes.b, lanes.helper_root
    program, runtime_sha, runtime_root = lanes.program, lanes.runtime_sha, lanes.runtime_root
    log = tmp_path / "calls.jsonl"
    bins = tmp_path / "site-bin"

    def logger(name: str, target: str, *words: str) -> str:
        return write_script(bins / name, LOGGER.format(python=PYTHON, log=str(log), name=name, target=target,
                                                       words=list(words)))

    helper_cmd = logger("update-vq-helper", HELPER_UPDATE, "--root", str(helper_root))
    deploy_cmd = logger("deploy-vibeqc", SITE_EXAMPLE, "install", "--root", str(runtime_root))
    verify_cmd = logger("verify-vibeqc", SITE_EXAMPLE, "verify", "--root", str(runtime_root))
    text = helper_table("cluster", root=helper_root, repo=repo.path, scratch=tmp_path / "scratch", command=helper_cmd)
    text += (f"[hosts.cluster.scheduler_runtime_deployments.vibeqc]\nupdate_command = \"{deploy_cmd}\"\n"
             f"verify_command = \"{verify_cmd}\"\nsource_repo = \"{program.path}\"\ntimeout_seconds = 600\n")
    return {"tmp": tmp_path, "helper_root": helper_root, "runtime_root": runtime_root, "log": log,
            "helper_cmd": helper_cmd, "runtime_cmds": {deploy_cmd, verify_cmd}, "a": sha_a, "b": sha_b,
            "runtime_sha": runtime_sha, "program": program, "repo": repo, "state": tmp_path / "state",
            "config": write_config(tmp_path / "admin.toml", text)}


def calls(world) -> list[dict]:
    if not world["log"].exists():
        return []
    return [json.loads(line) for line in world["log"].read_text().splitlines()]


def executed(receipt: dict) -> list[dict]:
    return [s for s in receipt["steps"] if s["status"] not in ("planned", "skipped")]


def test_runtime_update_leaves_the_helper_alone(world):
    helper_before = tree_digest(world["helper_root"])
    done = run_vq("update", "vibeqc", "cluster", "--expected-sha", world["runtime_sha"], "--json",
                  config=world["config"], state=world["state"])
    assert done.exit_code == 0, done.stdout + done.stderr
    ran = calls(world)
    assert {c["cmd"] for c in ran} == {"deploy-vibeqc", "verify-vibeqc"}
    steps = executed(done.json())
    assert steps, "the receipt records the executed steps"
    assert not [s for s in steps if s["argv"][0] == world["helper_cmd"] or HELPER_UPDATE in s["argv"]]
    assert not [s for s in steps if any(k.startswith("VQ_HELPER_") for k in s.get("env", {}))]
    assert not [s for s in steps if "identity" in s["argv"]]
    assert tree_digest(world["helper_root"]) == helper_before
    assert not (world["state"] / "hosts" / "cluster" / "helper").exists()


def test_helper_update_runs_no_runtime_provider(world):
    deployed = run_vq("update", "vibeqc", "cluster", "--expected-sha", world["runtime_sha"], "--json",
                      config=world["config"], state=world["state"])
    assert deployed.exit_code == 0, deployed.stdout + deployed.stderr
    runtime_before = tree_digest(world["runtime_root"])
    runtime_state = world["state"] / "hosts" / "cluster" / "runtime"
    state_before = tree_digest(runtime_state)
    already = len(calls(world))
    done = run_vq("update", "cluster", "--expected-sha", world["b"], "--json", config=world["config"],
                  state=world["state"], env=FAST_REREADS)
    assert done.exit_code == 0, done.stdout + done.stderr
    ran = calls(world)[already:]
    assert [c["cmd"] for c in ran] == ["update-vq-helper"]
    steps = executed(done.json())
    assert not [s for s in steps if s["argv"][0] in world["runtime_cmds"] or SITE_EXAMPLE in s["argv"]]
    assert tree_digest(world["runtime_root"]) == runtime_before
    assert tree_digest(runtime_state) == state_before


class Recorder(SiteLikeRuntime):
    """A provider that records every hook call: runtime hooks answer like
    site_example, helper hooks like the built-in command provider."""

    def __init__(self, runtime_root: Path):
        self.calls: list[str] = []
        self.runtime_root = runtime_root

    def note(self, hook: str, request: object) -> None:
        self.calls.append(hook)

    @hookimpl
    def vq_admin_helper_update(self, request):
        self.calls.append("helper_update")
        return command_provider.vq_admin_helper_update(request)

    @hookimpl
    def vq_admin_helper_install(self, request):
        self.calls.append("helper_install")
        return command_provider.vq_admin_helper_install(request)


def test_each_lane_calls_only_its_own_hooks(world):
    text = helper_table("cluster", root=world["helper_root"], repo=world["repo"].path,
                        scratch=world["tmp"] / "scratch", extra='helper_provider = "recorder"')
    text += (f"[hosts.cluster.scheduler_runtime_deployments.vibeqc]\nprovider = \"recorder\"\n"
             f"provider_options = {{ root = \"{world['runtime_root']}\", command = \"{SITE_EXAMPLE}\" }}\n"
             f"source_repo = \"{world['program'].path}\"\n")
    config = load_config(write_config(world["tmp"] / "recorder.toml", text))
    (world["runtime_root"] / "releases").mkdir(parents=True)
    recorder = Recorder(world["runtime_root"])
    providers = Providers.from_plugins({"recorder": recorder})
    state = StateDir(world["state"])
    with Session(None) as session:
        ctx = RunContext(config, state, session, providers)
        receipt = RuntimeUpdate(ctx, "cluster", "vibeqc", world["runtime_sha"], None).run()
        assert receipt.outcome.value == "ok", receipt.errors
        runtime_calls, recorder.calls = recorder.calls, []
        receipt = HelperUpdate(ctx, "cluster", world["b"]).run()
        assert receipt.outcome.value == "ok", receipt.errors
        helper_calls = recorder.calls
    assert sorted(runtime_calls) == ["runtime_update", "runtime_verify"]  # each asked once, at plan time
    assert helper_calls == ["helper_update"]  # asked once, at plan time
