"""The plan executed everywhere: every step runs its planned argv, slots filled.

One test per caller of :func:`vq_admin.plan.execute` that used to pass an argv
it built at run time: the mirror feed and the preparer, the command-file
checks (:mod:`vq_admin.lanes.command_files`), the helper's identity reads and
re-reads (:mod:`vq_admin.lanes.helper_identity`), ``provider install`` and
its read-back, and the verify of a login host whose agent predates
``verify-readback``.  Each shows that what ran (the receipt's or the double's
argv) is the planned argv with its slots filled (:mod:`plan_match`), and that
an explicit argv or environment is refused, with no caller left passing one.
"""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_mirror_cli import Site
from test_provider_install import SCRIPT_ENV, SCRIPT_SH, install, reviewed, sha
from test_provider_install import world as install_world  # noqa: F401  (a fixture)

from plan_match import slot_values
from support import AGENT

from vq_admin.source.mirror_feed import LANE_LEFT
from vq_admin.core import protocol
from vq_admin.lanes import helper_identity as helper_readback, command_files as remote_paths
from vq_admin.plan import Plan, SlotError, execute
from vq_admin.source import GIT_ENV
from vq_admin.ssh.transport import RunResult

ROOT = Path(__file__).resolve().parents[1]


class Double:
    """A transport double: records what it was asked to run and answers from *answers* in turn."""

    def __init__(self, where: str = "login", answers: list[tuple[int, bytes]] | None = None) -> None:
        self.where = where
        self.ran: list[tuple[list[str], dict[str, str] | None]] = []
        self.answers = list(answers or [])

    def run(self, argv, *, timeout, env=None, stdin=None, watch=None):
        self.ran.append((list(argv), env))
        code, out = self.answers.pop(0) if self.answers else (0, b"{}")
        return RunResult(list(argv), self.where, code, out, b"", 0.01)


def planned_text(step) -> list[str]:
    return [str(w) for w in step.planned_argv]


# -- execute: the explicit argv ---------------------------------------------------------------


def test_an_explicit_argv_or_environment_is_refused_before_anything_runs():
    plan, double = Plan(), Double()
    step = plan.add("check-commands", "login", ["/agent", "check-paths", "--", "/bin/x"], "check", {"LC_ALL": "C"})
    with pytest.raises(SlotError, match="explicit argv or environment instead of the planned one"):
        execute(step, double, ["/agent", "check-paths", "--", "/bin/y"], timeout=5)
    with pytest.raises(SlotError, match="explicit argv or environment"):
        execute(step, double, timeout=5, env={"LC_ALL": "C", "EXTRA": "1"})
    assert double.ran == [] and step.status == "planned" and step.argv is None
    execute(step, double, timeout=5)
    assert double.ran == [(["/agent", "check-paths", "--", "/bin/x"], {"LC_ALL": "C"})]


def explicit_argv_callers() -> dict[str, int]:
    """``{module path: calls}`` of ``execute(step, transport, ARGV, ...)`` (a third positional
    argument, ``argv=`` or ``env=``) anywhere in ``vq_admin``."""
    found: dict[str, int] = {}
    for path in sorted((ROOT / "vq_admin").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name == "execute" and (len(node.args) > 2 or any(k.arg in ("argv", "env") for k in node.keywords)):
                key = str(path.relative_to(ROOT))
                found[key] = found.get(key, 0) + 1
    return found


def test_no_caller_passes_an_explicit_argv():
    assert explicit_argv_callers() == {}


def streams_outside_a_step() -> list[str]:
    """Each call of ``stream_call`` in ``vq_admin/lanes`` that is not inside a function the enclosing
    function hands to ``execute_stream`` (``module:line``)."""
    found = []
    for path in sorted((ROOT / "vq_admin" / "lanes").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        calls = {node for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "stream_call"}
        inside_a_step = set()
        for outer in ast.walk(tree):
            if not isinstance(outer, ast.FunctionDef):
                continue
            handed = {arg.id for call in ast.walk(outer) if isinstance(call, ast.Call)
                      and getattr(call.func, "id", None) == "execute_stream" for arg in call.args
                      if isinstance(arg, ast.Name)}
            for inner in outer.body:
                if isinstance(inner, ast.FunctionDef) and inner.name in handed:
                    inside_a_step |= calls & set(ast.walk(inner))
        found += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in calls - inside_a_step]
    return sorted(found)


def test_every_streamed_call_runs_as_a_planned_step():
    """The allocation and detached deploys, their reconciles and previous-attempt stream their
    answer, and run their planned step all the same (``execute_stream``): through ``framed_step``, or
    ``allocation_attempt.read_only_call``'s own ``execute_stream``."""
    def callers(name: str) -> list[str]:
        return sorted(f"{p.relative_to(ROOT)}" for p in (ROOT / "vq_admin").rglob("*.py")
                      if f"{name}(" in p.read_text() and p.name != "allocation_stream.py")

    assert callers("stream_call") == ["vq_admin/lanes/allocation_attempt.py"]
    assert callers("framed_step") == ["vq_admin/lanes/allocation_step.py", "vq_admin/lanes/confirm_step.py"]
    stream = (ROOT / "vq_admin/lanes/allocation_stream.py").read_text()
    framed = stream[stream.index("def framed_step("):stream.index("def stream_call(")]
    assert "execute_stream(step," in framed
    attempt = (ROOT / "vq_admin/lanes/allocation_attempt.py").read_text()
    assert "execute_stream(step," in attempt[attempt.index("def read_only_call("):]
    assert streams_outside_a_step() == []


# -- the command-file checks ------------------------------------------------------------------


def test_the_command_file_check_runs_its_planned_argv():
    agent = ["/opt/vq/bin/vq-admin-agent"]
    login, build = Double("login"), Double("build")
    places = [(login, [("hosts.h.agent", agent[0]), ("hosts.h.verify_command", "/site/verify")]),
              (build, [("hosts.h.update_command", "/site/deploy"), ("hosts.h.agent", agent[0])])]
    plan = Plan()
    remote_paths.plan_places(plan, agent, places)
    remote_paths.run_places(plan, agent, "h", places)
    for transport, name in ((login, "check-commands"), (build, "check-commands-2")):
        step = plan.get(name)
        assert transport.ran == [(planned_text(step), None)]
        assert step.record().argv == planned_text(step) and step.status == "ok"
    assert plan.get("check-commands").argv == [*agent, "check-paths", "--", agent[0], "/site/verify"]


def test_a_check_planned_for_other_words_than_its_place_is_refused_before_it_runs():
    agent, login = ["/agent"], Double("login")
    plan = Plan()
    remote_paths.plan_places(plan, agent, [(login, [("hosts.h.agent", "/agent")])])
    with pytest.raises(SlotError, match="not the check of login's command files"):
        remote_paths.run_places(plan, agent, "h", [(login, [("hosts.h.verify_command", "/site/other")])])
    assert login.ran == []


# -- the helper's identity reads ----------------------------------------------------------------


def identity(source_sha: str, tree: str) -> bytes:
    return json.dumps({"version": "1", "source_sha": source_sha, "tree_sha256": tree, "record": "bound",
                       "path": "/opt/vq", "interpreter": "/usr/bin/python3"}).encode()


def test_the_identity_read_and_its_rereads_run_the_planned_argv():
    sha, tree, old = "b" * 40, "f" * 64, "a" * 40
    host = SimpleNamespace(name="h", agent=["/opt/vq/bin/vq-admin-agent"])
    login = Double("login", [(0, identity(old, tree)), (0, identity(sha, tree))])  # a shared filesystem lags once
    ctx = SimpleNamespace(login=lambda _host: login)
    plan = Plan()
    first = plan.add("readback", "login", protocol.identity(host.agent), "read the live identity")
    found = helper_readback.readback(ctx, host, plan, first, sha, tree, sleep=lambda _s: None)
    assert found.final.matched and len(found.attempts) == 2
    assert [s.name for s in plan.steps] == ["readback", "readback-reread-1"]
    planned = [*host.agent, "identity", "--json"]
    assert login.ran == [(planned, None), (planned, None)]
    assert [s.record().argv for s in plan.steps] == [planned, planned]
    assert [planned_text(s) for s in plan.steps] == [planned, planned]


# -- provider install ----------------------------------------------------------------------------


def test_provider_install_and_its_readback_run_their_planned_argv(install_world):  # noqa: F811
    w = install_world
    dest = w["bin"] / "deploy"
    src = reviewed(w, "deploy", SCRIPT_ENV.format(n=1))
    dry = install(w, src, dest, "cluster", "--dry-run")
    assert dry.exit_code == 0, dry.stdout + dry.stderr
    plan = dry.json()["steps"]
    assert [s["name"] for s in plan] == ["install-file", "install-readback"]
    assert plan[1]["argv"] == [AGENT, "hash-file", str(dest)] and plan[1]["status"] == "planned"
    done = install(w, src, dest)
    receipt = done.json()
    assert done.exit_code == 0 and receipt["outcome"] == "ok", done.stdout + done.stderr
    assert slot_values(plan, receipt["steps"], names={"install-file"}) == {}
    assert {s["name"]: s["status"] for s in receipt["steps"]} == {"install-file": "ok", "install-readback": "skipped"}
    # killed between the write and the rename: the read-back runs, as planned
    dest.write_text(SCRIPT_SH.format(n=1))
    dest.chmod(0o755)
    old = dest.read_bytes()
    src2 = reviewed(w, "deploy2", SCRIPT_ENV.format(n=2))
    crash = {"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_AGENT_CRASH": "before-rename"}
    dry2 = install(w, src2, dest, "cluster", "--dry-run").json()["steps"]
    failed = install(w, src2, dest, env=crash)
    receipt = failed.json()
    assert failed.exit_code == 1, failed.stdout + failed.stderr
    assert slot_values(dry2, receipt["steps"], names={"install-file", "install-readback"}) == {}
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["install-file"]["exit_code"] == -9 and steps["install-readback"]["status"] == "ok"
    assert receipt["readback"]["dest_sha256"] == sha(old)


# -- the mirror feed and the preparer, over the real sshd -----------------------------------------


MIRROR_STEPS = {"check-commands", "mirror-probe", "mirror-symrefs", "mirror-read", "mirror-feed", "mirror-confirm",
                "prepare"}


@pytest.mark.real
def test_the_mirror_feed_and_the_preparer_run_their_planned_argv_and_env(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd)
    b = site.driver.b
    dry, plan = site.update(b, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    by_name = {s["name"]: s for s in plan["steps"]}
    assert by_name["mirror-symrefs"]["argv"] == ["git", "-C", str(site.mirror), "symbolic-ref", "-q", "<ref>"]
    for name in ("mirror-read", "mirror-feed", "mirror-confirm"):  # git on the driver, over the run's ssh master
        env = by_name[name]["env"]
        assert set(env) == {"GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "LC_ALL", *GIT_ENV}  # GIT_ENV: how git is run
        assert "ControlPath=<ssh control dir>/%C" in shlex.split(env["GIT_SSH_COMMAND"]), env
    result, receipt = site.update(b)
    assert result.exit_code == 0, result.stderr
    values = slot_values(plan["steps"], receipt["steps"], names=MIRROR_STEPS)
    refs = [r["ref"] for r in receipt["mirror"]["refs"]]
    assert values["ref"] == refs[-1], "one mirror-symrefs step, run once per ref: the last one is recorded"
    control = values.pop("ssh control dir")
    assert values.pop("lane branch pair") == [f"{b}:refs/heads/release", f"{b}:refs/remotes/origin/release"]
    assert values == {"ref": refs[-1]} and Path(control).name.startswith("vqssh-")
    push = by_name["mirror-feed"]["argv"]
    assert push[push.index("--") + 2:push.index("--") + 4] == [f"{b}:refs/vq/pins/{b}", "[<lane branch pair>]..."]
    assert receipt["mirror"]["push"]["argv"] == {s["name"]: s for s in receipt["steps"]}["mirror-feed"]["argv"]
    ssh = shlex.split({s["name"]: s for s in receipt["steps"]}["mirror-feed"]["env"]["GIT_SSH_COMMAND"])
    assert f"ControlPath={control}/%C" in ssh and ssh[:3] == ["ssh", "-F", str(real_sshd.ssh_config)]
    shown = subprocess.run(["git", "-C", str(site.mirror), "for-each-ref", "--format=%(refname)"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert sorted(shown) == sorted(refs)


def test_the_mirror_symref_read_is_planned_once_with_a_ref_slot():
    from vq_admin.source import mirror

    argv = mirror.symref_argv("/srv/git/m.git")
    assert argv[-1] == "<ref>" and argv[-1] is mirror.REF
    assert mirror.symref_argv("/srv/git/m.git", "refs/heads/x")[-1] == "refs/heads/x"
    for bad in ("heads/x", "refs/heads/a b"):
        with pytest.raises(ValueError):
            mirror.symref_argv("/srv/git/m.git", bad)


@pytest.mark.real
def test_a_drifted_branch_pair_left_out_of_the_push_fills_its_list_slot_with_nothing(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd, preparer_reads="pin")
    d = site.driver
    d.seed(site.mirror, f"{d.c}:refs/heads/release", f"{d.c}:refs/remotes/origin/release")
    dry, plan = site.update(d.b, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    result, receipt = site.update(d.b)
    assert result.exit_code == 0, result.stderr
    values = slot_values(plan["steps"], receipt["steps"], names=MIRROR_STEPS)
    assert values["lane branch pair"] == [] and receipt["mirror"]["lane_branch"] == LANE_LEFT
    pushed = {s["name"]: s for s in receipt["steps"]}["mirror-feed"]["argv"]
    assert not any(w.endswith("/release") for w in pushed) and f"{d.b}:refs/vq/pins/{d.b}" in pushed
