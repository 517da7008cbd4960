"""A failed build's summary (what cron mails, without ``--json`` or ``--verbose``) says where the whole
transcript is (``log dir``, on the build host, and the driver's copy) and shows the provider's last stderr
lines, a Python traceback shortened to its exception, which keeps its end (``returned non-zero exit
status 1``) instead of being cut short.  A real fixed-host build over the loopback sshd.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from support import run_vq

pytestmark = pytest.mark.real

#: A site deploy script that runs a tool (here: a failing "pip") through subprocess.check_call, as
#: scripts written from docs/providers.md do; its stderr ends in a traceback.
FAILING_BUILD = """\
import subprocess, sys
tool = ["sh", "-c", "echo 'ERROR: No matching distribution found for vibeqc-deps==9.9' >&2; exit 1"]
subprocess.check_call(tool + ["--find-links", "/site/wheels/" + "x" * 150, "--no-index", "vibeqc-deps==9.9"])
"""


def test_a_failed_build_names_its_log_dir_and_the_providers_last_stderr_lines(tmp_path, real_sshd):
    from test_chaos import World

    world = World(tmp_path, str(real_sshd.ssh_config), "failed-summary")
    script = tmp_path / "build.py"
    script.write_text(FAILING_BUILD)
    world.set_deploy(f"{shlex.quote(sys.executable)} {script} || exit $?")
    done = run_vq("update", world.program, "cluster", "--expected-sha", world.sha, config=world.config,
                  state=world.state, timeout=300)
    assert done.exit_code == 1 and done.stdout == "", done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"vq-admin: runtime {world.program} on cluster: failed (exit 1)", done.stderr
    fields = {line[2:11].strip(): line[12:] for line in lines if line.startswith("  ") and line[2] != " "}
    receipt = run_vq("history", "--json", config=world.config, state=world.state).json()["runs"][0]
    stored = (world.state / "receipts" / f"{receipt['receipt']}.json").read_text()
    assert '"log_dir"' in stored
    # the whole transcript: the attempt directory on the build host, and the driver's copy
    log_dir = fields["log dir"].removesuffix(" on cluster-build")
    assert fields["log dir"].endswith(" on cluster-build") and (Path(log_dir) / "stderr").is_file(), fields
    assert "No matching distribution" in (Path(log_dir) / "stderr").read_text()
    assert (Path(fields["log copy"]) / "stderr").is_file(), fields
    # the provider's last stderr lines: what the tool said, then the exception (its end kept), no frames
    stderr = [fields["stderr"]] + [line.strip() for line in lines[lines.index("  stderr    " + fields["stderr"]) + 1:]
                                   if line.startswith(" " * 12)]
    assert stderr[0] == "ERROR: No matching distribution found for vibeqc-deps==9.9", stderr
    assert stderr[1].startswith("subprocess.CalledProcessError: Command '['sh', '-c',"), stderr
    assert stderr[1].endswith("returned non-zero exit status 1."), stderr
    assert not any(line.startswith(("Traceback", "File ")) for line in stderr), stderr
    assert fields["error"].startswith("deploy: the provider exited 1: subprocess.CalledProcessError: Command")
    assert fields["error"].endswith("returned non-zero exit status 1."), fields["error"]
    assert " ... " in fields["error"] and len(fields["error"]) < 260, fields["error"]
