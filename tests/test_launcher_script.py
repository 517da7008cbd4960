"""``vq`` and ``vq-admin`` as pip installs them: our own scripts (setup.cfg ``scripts``), not
pip's generated console-script wrapper, which imports ``re`` before the entry runs.

A real wheel is built from the tree and installed into a temporary venv
(:mod:`installed_venv`), as an operator installs it; the scripts are then run by
their path, through the first line pip wrote.
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

from installed_venv import ROOT, clean_env, installed_prefix
from vq_admin.launcher import registry
from vq_admin.state.records import Verified

SHA = "a" * 40
LAUNCHER = f"/apps/vibeqc/releases/{SHA}/source/.venv/bin/python"
#: Imported by the plain ``vq admin launcher`` success beyond a bare interpreter's start.
PLAIN = {"vq_admin", "__future__", "vq_admin.entry", "vq_admin.core", "vq_admin.core.plainargs",
         "vq_admin.core.securepath", "vq_admin.launcher", "vq_admin.launcher.immutable",
         "vq_admin.launcher.plain_lookup", "vq_admin.core.default_paths", "vq_admin.core.names",
         "vq_admin.launcher.uses", "vq_admin.launcher.present", "vq_admin.core.stamps", "vq_admin.core.escape",
         "fcntl", "pwd",  # the use record and the visible-launcher check: two C modules of the standard library
         "atexit"}  # built in: the script's last exit handler, which ends the process (docs/performance.md)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    return installed_prefix(tmp_path_factory.getbasetemp())


@pytest.fixture()
def state(tmp_path) -> Path:
    registry.record_verified(tmp_path / "state", "cluster", "vibeqc", Verified(**{
        "sha": SHA, "tag": None, "launcher": LAUNCHER, "launcher_sha256": "e" * 64, "receipt": "r-1",
        "at": "2026-11-30T00:00:00Z"}))
    return tmp_path / "state"


def imports(prefix: Path, argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run *argv* with Python's import profiler on (``PYTHONPROFILEIMPORTTIME``, what ``-X importtime``
    does); the modules it imported beyond a bare ``python -c pass`` of the same venv."""
    def run(words: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(words, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              env=dict(env, PYTHONPROFILEIMPORTTIME="1"))

    def names(stderr: str) -> set[str]:
        return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")
                and not line.rstrip().endswith("imported package")}

    done = run(argv)
    return done, names(done.stderr) - names(run([str(prefix / "bin" / "python"), "-c", "pass"]).stderr)


def test_setup_cfg_ships_our_scripts_not_generated_wrappers():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options"]["scripts"].split() == ["bin/vq", "bin/vq-admin", "bin/vq-admin-agent"]
    scripts = cfg["options.entry_points"].get("console_scripts", "")
    # a generated wrapper would shadow ours
    assert "vq_admin.entry:main" not in scripts and "vq_admin.agent.entry:main" not in scripts
    for name, entry in (("vq", "vq_admin.entry import main"), ("vq-admin", "vq_admin.entry import main"),
                        ("vq-admin-agent", "vq_admin.agent.entry import run")):  # run: main, then a prompt exit
        text = (ROOT / "bin" / name).read_text()
        assert text.startswith("#!python\n")  # pip rewrites exactly this first line to the install's interpreter
        assert "import re" not in text and f"from {entry}" in text


@pytest.mark.parametrize("words", [["vq", "admin"], ["vq-admin"]], ids=["vq admin", "vq-admin"])
def test_the_installed_scripts_answer_the_launcher_without_re_json_or_enum(prefix, state, tmp_path, words):
    script = prefix / "bin" / words[0]
    assert script.read_text().splitlines()[0] == f"#!{prefix / 'bin' / 'python'}"
    env = dict(clean_env(prefix), VQ_ADMIN_STATE_DIR=str(state), VQ_ADMIN_CONFIG=str(tmp_path / "absent.toml"))
    done, extra = imports(prefix, [str(script), *words[1:], "launcher", "vibeqc", "cluster", "--expected-sha", SHA],
                          env)
    assert (done.returncode, done.stdout) == (0, LAUNCHER + "\n"), done.stderr[-2000:]
    assert extra == PLAIN, sorted(extra)


def test_the_installed_scripts_still_refuse_and_run_every_other_verb(prefix, state, tmp_path):
    env = dict(clean_env(prefix), VQ_ADMIN_STATE_DIR=str(state), VQ_ADMIN_CONFIG=str(tmp_path / "absent.toml"))
    refused = subprocess.run([str(prefix / "bin" / "vq"), "admin", "launcher", "vibeqc", "cluster", "--expected-sha",
                              "b" * 40], capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 77 and refused.stdout == "", refused.stderr
    assert "refused (sha-mismatch)" in refused.stderr and "remedy:" in refused.stderr
    usage = subprocess.run([str(prefix / "bin" / "vq-admin"), "launcher", "vibeqc"], capture_output=True, text=True,
                           timeout=120, env=env)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    helped = subprocess.run([str(prefix / "bin" / "vq"), "admin", "--help"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert helped.returncode == 0 and "launcher" in helped.stdout
    importable = subprocess.run([str(prefix / "bin" / "python"), "-c", "from vq_admin.entry import main; print(main)"],
                                capture_output=True, text=True, timeout=120, env=env, cwd=os.sep)
    assert importable.returncode == 0, importable.stderr


@pytest.mark.parametrize("name", ["vq", "vq-admin"])
def test_the_scripts_end_after_every_exit_handler_with_mains_status_and_output(tmp_path, name):
    """bin/vq ends the process from the interpreter's last exit handler (no teardown): a handler the
    run registered has run, buffered output is out, and the status is main()'s."""
    marker = tmp_path / "handler-ran"
    code = ("import atexit, runpy, sys\nimport vq_admin.entry as entry\n"
            "def main():\n"
            f"    atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
            "    sys.stdout.write('buffered, no newline')\n"
            "    return 3\n"
            f"entry.main = main\nsys.argv = [{name!r}]\n"
            f"runpy.run_path({str(ROOT / 'bin' / name)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONUNBUFFERED=""))
    assert (done.returncode, done.stdout, done.stderr) == (3, "buffered, no newline", "")
    assert marker.read_text() == "ran"
