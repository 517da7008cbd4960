"""Issue 11: every test-only switch is a failpoint declared in vq_admin/core/failpoints.py, read nowhere else.

* every declared point is reached by production code (an AST scan of every
  ``failpoint("NAME", ...)`` call) and every call names a declared point;
* every point is driven by at least one test elsewhere in the suite (its
  variables, and for ``VQ_ADMIN_FAULT`` its rule kind, appear in the tests);
* no other module of vq_admin spells a failpoint's variable;
* with ``VQ_ADMIN_TESTING`` unset or not exactly ``1`` nothing but that switch
  is read and every point is inert, in-process and in a fresh interpreter;
* each point, enabled, does what its docstring says.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vq_admin.core import failpoints
from vq_admin.core.failpoints import POINTS, failpoint

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vq_admin"
HOME = PACKAGE / "core" / "failpoints.py"
TESTS = Path(__file__).resolve().parent
#: How the suite enables each point beyond its variables (``VQ_ADMIN_FAULT``'s rule kinds).
RULE_KIND = {"call": '"call:', "step-before": '"sigkill"', "step-after": '"sigkill-after"'}


def calls_in_package() -> dict[str, list[str]]:
    """Every ``failpoint("NAME", ...)`` call in vq_admin: NAME -> ["file:line", ...]."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "failpoint":
                assert node.args and isinstance(node.args[0], ast.Constant), f"{path}:{node.lineno}: name not literal"
                found.setdefault(node.args[0].value, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_point_is_declared_once_with_a_docstring_and_reached_by_production_code():
    assert set(POINTS) == {"call", "step-before", "step-after", "mirror-before-push", "install-file-before-rename",
                           "record-before-statement",
                           "helper-rereads", "helper-reread-interval", "lease-wait"}
    for point in POINTS.values():
        assert len(point.doc) > 40, point.name
        assert point.variables and all(v.startswith("VQ_ADMIN_") for v in point.variables), point.name
    calls = calls_in_package()
    assert set(calls) - set(POINTS) == set(), f"undeclared failpoints: {calls}"
    assert set(POINTS) - set(calls) == set(), f"declared but never reached: {set(POINTS) - set(calls)}"
    with pytest.raises(KeyError):
        failpoint("no-such-point")


def test_every_point_is_driven_by_at_least_one_test():
    corpus = {p: p.read_text() for p in TESTS.rglob("*.py") if p.name != Path(__file__).name}
    for point in POINTS.values():
        for variable in point.variables:
            users = [p.name for p, text in corpus.items() if variable in text]
            assert users, f"no test sets {variable} (failpoint {point.name})"
        if point.name in RULE_KIND:
            users = [p.name for p, text in corpus.items() if RULE_KIND[point.name] in text and "VQ_ADMIN_FAULT" in text]
            assert users, f"no test writes a {RULE_KIND[point.name]} rule (failpoint {point.name})"


def test_no_other_module_names_a_failpoint_variable():
    names = set(failpoints.variables())
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in names:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert not offenders, offenders


class Recording(dict):  # type: ignore[type-arg]
    """An environment that remembers every key looked up."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: list[str] = []

    def get(self, key, default=None):
        self.read.append(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.append(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.append(key)
        return super().__contains__(key)


EVERYTHING = {"VQ_ADMIN_FAULT": "call:1:drop-before,step:deploy:sigkill", "VQ_ADMIN_FAULT_LOG": "/nonexistent/log",
              "VQ_ADMIN_TEST_HOOK_BEFORE_PUSH": "/bin/false", "VQ_ADMIN_AGENT_CRASH": "before-rename",
              "VQ_ADMIN_HELPER_REREADS": "0", "VQ_ADMIN_HELPER_REREAD_INTERVAL": "0", "VQ_ADMIN_LEASE_WAIT": "1"}


@pytest.mark.parametrize("switch", [None, "", "0", "true", "yes", " 1", "1 "])
def test_with_the_switch_off_nothing_else_is_read(switch):
    env = Recording(EVERYTHING)
    if switch is not None:
        env["VQ_ADMIN_TESTING"] = switch
    assert failpoints.load(env) is None
    assert env.read == ["VQ_ADMIN_TESTING"]


def test_with_the_switch_on_every_declared_variable_is_read():
    env = Recording(EVERYTHING, VQ_ADMIN_TESTING="1")
    settings = failpoints.load(env)
    assert settings is not None and settings.values == EVERYTHING
    assert set(env.read) == set(failpoints.variables())


def test_a_process_with_the_switch_off_is_inert(tmp_path):
    log = tmp_path / "log"
    code = ("import os, sys\n"
            "from vq_admin.core.failpoints import POINTS, enabled, failpoint\n"
            "assert not enabled()\n"
            "for name in POINTS:\n"
            "    assert failpoint(name, 'local', 'true') is None, name\n"
            "print('inert')\n")
    env = {**os.environ, **EVERYTHING, "VQ_ADMIN_FAULT_LOG": str(log), "VQ_ADMIN_TESTING": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert (done.returncode, done.stdout) == (0, "inert\n"), done.stderr
    assert not log.exists()


@pytest.fixture
def enable():
    """Configure the failpoints of this process; restore the real environment's afterwards."""
    def configure(**values: str) -> None:
        failpoints.configure({"VQ_ADMIN_TESTING": "1", **values})

    yield configure
    failpoints.configure()


def test_call_counts_logs_and_returns_the_mode(enable, tmp_path):
    log = tmp_path / "log"
    enable(VQ_ADMIN_FAULT="call:2:drop-after,call:3:kill", VQ_ADMIN_FAULT_LOG=str(log))
    modes = [failpoint("call", "cluster", "ssh", str(i)) for i in range(1, 5)]
    assert modes == [None, "drop-after", "kill", None]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["index"], e["where"], e["argv"], e["fault"]) for e in lines] == \
        [(i, "cluster", ["ssh", str(i)], m) for i, m in zip(range(1, 5), modes, strict=True)]


def test_step_boundaries_are_logged(enable, tmp_path):
    log = tmp_path / "log"
    enable(VQ_ADMIN_FAULT_LOG=str(log))
    assert failpoint("step-before", "deploy") is None and failpoint("step-after", "deploy") is None
    assert [json.loads(line) for line in log.read_text().splitlines()] == \
        [{"step": "deploy", "when": "before"}, {"step": "deploy", "when": "after"}]


@pytest.mark.parametrize("bad", ["call:x:kill", "call:1:explode", "step::sigkill", "other:1:kill", "call:1"])
def test_a_malformed_rule_is_named(bad):
    with pytest.raises(ValueError, match=f"bad rule '{bad}'"):
        failpoints.load({"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_FAULT": f"call:1:kill,{bad}"})


def test_value_points_return_what_the_test_set(enable):
    enable(VQ_ADMIN_TEST_HOOK_BEFORE_PUSH="/x/hook", VQ_ADMIN_HELPER_REREADS="3",
           VQ_ADMIN_HELPER_REREAD_INTERVAL="0.05")
    assert failpoint("mirror-before-push") == "/x/hook"
    from vq_admin.lanes.helper_identity import reread_policy

    assert reread_policy() == (3, 0.05)
    enable(VQ_ADMIN_HELPER_REREADS="999", VQ_ADMIN_HELPER_REREAD_INTERVAL="-1")
    assert reread_policy() == (50, 0.0)
    enable()
    assert failpoint("mirror-before-push") is None and reread_policy() == (5, 2.0)


@pytest.mark.parametrize("point, env", [
    ("step-before", {"VQ_ADMIN_FAULT": "step:deploy:sigkill"}),
    ("step-after", {"VQ_ADMIN_FAULT": "step:deploy:sigkill-after"}),
    ("install-file-before-rename", {"VQ_ADMIN_AGENT_CRASH": "before-rename"}),
])
def test_kill_points_sigkill_their_process_only_when_enabled(point, env):
    code = ("from vq_admin.core.failpoints import failpoint\n"
            "print('reached', flush=True)\n"
            f"failpoint({point!r}, 'deploy')\nprint('survived')\n")
    for testing, expected in (("1", -signal.SIGKILL), ("0", 0)):
        done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env, VQ_ADMIN_TESTING=testing),
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == expected, (testing, done.stderr)
        assert done.stdout == ("reached\n" if expected else "reached\nsurvived\n")


def test_a_step_rule_kills_at_its_own_step_only(enable):
    enable(VQ_ADMIN_FAULT="step:deploy:sigkill,step:verify:sigkill-after")
    # reaching other steps, or the named steps at the other boundary, returns (this process is still alive)
    assert failpoint("step-before", "stage") is None
    assert failpoint("step-after", "deploy") is None
    assert failpoint("step-before", "verify") is None
