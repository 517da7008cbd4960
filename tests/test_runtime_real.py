"""The runtime lane against a real OpenSSH server on 127.0.0.1.

Login host ``cluster`` and build host ``cluster-build`` are aliases (through
``ssh -F``) of the fixture's sshd; the provider is site_example.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from plan_match import slot_values
from support import AGENT, SITE_EXAMPLE, GitRepo, run_vq, site_example_host, tree_digest, write_config

pytestmark = pytest.mark.real


class Cluster:
    def __init__(self, tmp: Path, ssh_config: str, *, agent: str = AGENT, profile: str | None = None):
        self.tmp = tmp
        self.repo = GitRepo(tmp / "src")
        self.a = self.repo.commit("generation A")
        self.repo.tag("v1.0", self.a, annotated=True)
        self.b = self.repo.commit("generation B")
        self.root = tmp / "apps"
        self.scratch = tmp / "scratch"
        self.scratch.mkdir()
        self.state = tmp / "state"
        host = site_example_host("cluster", root=self.root, repo=self.repo.path, scratch=self.scratch,
                                 transport="ssh", ssh="cluster", extra_profile='update_host = "cluster-build"')
        host = host.replace(f'agent = "{AGENT}"', f'agent = "{agent}"')
        if profile is not None:
            head, _, _ = host.partition("[hosts.cluster.scheduler_runtime_deployments.vibeqc]")
            host = head + profile
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{ssh_config}"\n' + host)

    def update(self, sha: str, *extra: str):
        return run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--json", *extra,
                      config=self.config, state=self.state)


def steps_by_name(receipt: dict) -> dict:
    return {s["name"]: s for s in receipt["steps"]}


def test_full_update_over_ssh_then_already_current(tmp_path, real_sshd):
    c = Cluster(tmp_path, real_sshd.ssh_config)
    first = c.update(c.a, "--cluster-install")
    assert first.exit_code == 0, first.stdout + first.stderr
    a_release = tree_digest(c.root / "releases" / c.a)
    assert a_release

    dry = c.update(c.b, "--dry-run")
    assert dry.exit_code == 0, dry.stdout + dry.stderr
    second = c.update(c.b)
    receipt = second.json()
    assert second.exit_code == 0, second.stderr
    assert receipt["outcome"] == "ok" and receipt["lane"] == "runtime"
    # the receipt's steps are the dry run's plan with its slots filled
    values = slot_values(dry.json()["steps"], receipt["steps"], names={
        "source", "stage-create", "stage-receive", "stage-verify", "deploy", "verify", "verify-readback",
        "stage-reclaim"})
    assert values["stage"] == receipt["stage"]["dir"] and values["attempt"] == receipt["deploy"]["attempt"]
    assert values["tree_sha256"] == receipt["source"]["tree_sha256"]
    # the detached deploy's detach-run argv: its archive digest and (off a terminal) no progress words
    assert values["archive_sha256"] == receipt["source"]["archive_sha256"] and values["progress"] == []
    assert values["active_path"] == receipt["verify"]["final"]["receipt"]["active_path"]
    steps = steps_by_name(receipt)
    assert steps["deploy"]["where"] == "cluster-build"
    assert steps["verify"]["where"] == "cluster" and steps["verify-readback"]["where"] == "cluster"
    # the full SHA from staging to the activation receipt
    assert receipt["source"]["sha"] == c.b and len(receipt["source"]["git_tree"]) == 40
    assert c.b in steps["stage-verify"]["argv"] and c.b in steps["deploy"]["argv"]
    final = receipt["verify"]["final"]
    assert final["proven"] and final["receipt"]["source_sha"] == c.b
    assert final["receipt"]["active_path"] == f"{c.root}/releases/{c.b}/bin/vibeqc-{c.b}"
    assert os.readlink(c.root / "current") == f"releases/{c.b}"
    assert tree_digest(c.root / "releases" / c.a) == a_release, "the older release changed"
    # the run's own stage was reclaimed
    assert not list((c.scratch / ".vq-admin" / "stage" / "runtime" / "vibeqc").glob("stage.*"))

    before = tree_digest(c.root)
    again = c.update(c.b)
    receipt = again.json()
    assert again.exit_code == 0 and receipt["outcome"] == "already-current"
    steps = steps_by_name(receipt)
    assert steps["deploy"]["status"] == "skipped" and steps["stage-create"]["status"] == "skipped"
    assert tree_digest(c.root) == before


def test_a_staged_archive_altered_on_the_build_host_is_refused(tmp_path, real_sshd):
    # An agent wrapper that corrupts the staged archive just before it is verified.
    wrapper = tmp_path / "tampering-agent"
    wrapper.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import os, sys
        args = sys.argv[1:]
        if args[:1] == ["stage-verify"]:
            stage = args[args.index("--stage") + 1]
            with open(os.path.join(stage, "source.tar"), "r+b") as fh:
                fh.seek(600)
                byte = fh.read(1)
                fh.seek(600)
                fh.write(bytes([byte[0] ^ 0xFF]))
        os.execv({AGENT!r}, [{AGENT!r}] + args)
        """))
    wrapper.chmod(0o755)
    marker = tmp_path / "provider-ran"
    profile = textwrap.dedent(f"""\
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "/usr/bin/touch {marker}"
        verify_command = "{SITE_EXAMPLE} verify --root {tmp_path / 'apps'}"
        source_repo = "{tmp_path / 'src'}"
        update_host = "cluster-build"
        """)
    c = Cluster(tmp_path, real_sshd.ssh_config, agent=str(wrapper), profile=profile)
    result = c.update(c.a)
    receipt = result.json()
    assert result.exit_code == 77, result.stderr
    assert receipt["outcome"] == "refused"
    assert "does not match" in receipt["errors"][-1] and "ARCHIVE-SHA256" in receipt["errors"][-1]
    assert steps_by_name(receipt)["deploy"]["status"] == "skipped"
    assert not marker.exists(), "the provider ran on a tampered archive"
    # the failed stage is kept for forensics, marked FAILED
    stages = list((c.scratch / ".vq-admin" / "stage" / "runtime" / "vibeqc").glob("stage.*"))
    assert len(stages) == 1 and (stages[0] / "FAILED").exists()


DROPPER = """\
#!/bin/sh
# Deploy (or not), then kill this command's own sshd session: a dropped transport.  The echo keeps
# the transcript from being empty (an empty one never settles: ten observations, 9 s, not three).
mode="$1"; shift
echo "dropper: $mode"
if [ "$mode" = after ]; then
    {site} deploy "$@" >/dev/null 2>&1 || exit 9
fi
kill -9 $PPID
sleep 5
"""


@pytest.mark.parametrize("mode,outcome,code", [("after", "ok", 0), ("before", "unknown", 3)])
def test_a_killed_ssh_session_is_unknown_until_readback(tmp_path, real_sshd, mode, outcome, code):
    dropper = tmp_path / "dropper"
    dropper.write_text(DROPPER.format(site=SITE_EXAMPLE))
    dropper.chmod(dropper.stat().st_mode | stat.S_IXUSR)
    root = tmp_path / "apps"
    profile = textwrap.dedent(f"""\
        [hosts.cluster.scheduler_runtime_deployments.vibeqc]
        update_command = "{dropper} {mode}"
        install_command = "{SITE_EXAMPLE} install"
        verify_command = "{SITE_EXAMPLE} verify --root {root}"
        source_repo = "{tmp_path / 'src'}"
        update_host = "cluster-build"
        update_script_args_note = "x"
        """).replace('update_script_args_note = "x"\n', "")
    c = Cluster(tmp_path, real_sshd.ssh_config, profile=profile)
    # generation A installed normally (install_command gets --root through --update-script-arg)
    first = c.update(c.a, "--cluster-install", f"--update-script-arg=--root={root}")
    assert first.exit_code == 0, first.stdout + first.stderr
    result = c.update(c.b, "--update-script-arg=--root", f"--update-script-arg={root}")
    receipt = result.json()
    assert result.exit_code == code, result.stdout + result.stderr
    assert receipt["outcome"] == outcome
    deploy = steps_by_name(receipt)["deploy"]
    assert deploy["status"] == "interrupted"
    assert any("interrupted" in e for e in receipt["errors"])
    assert receipt["outcome"] != "failed"
    if outcome == "ok":
        assert receipt["readback"]["proven"] is True
        assert os.readlink(root / "current") == f"releases/{c.b}"
    else:
        readback = receipt["readback"]
        assert readback["proven"] is False
        assert readback["next_command"].startswith("vq admin update vibeqc cluster --expected-sha " + c.b)
        assert os.readlink(root / "current") == f"releases/{c.a}"
        last_ok = (c.state / "hosts" / "cluster" / "runtime" / "vibeqc" / "last-ok.json").read_text()
        assert c.a in last_ok and c.b not in last_ok
