"""``vq admin provider install``: one private site command, reviewed and recorded.

Runs with ``transport = "local"`` and the installed ``vq-admin-agent`` (the
agent's install-file verb is the same over ssh).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from helper_world import HERE, bootstrap, helper_repo, stage_archive
from support import AGENT, GitRepo, run_vq, write_config

SCRIPT_ENV = "#!/usr/bin/env python3\nprint('deploy v{n}')\n"
SCRIPT_SH = "#!/bin/sh\necho deploy v{n}\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def world(tmp_path):
    source_repo = GitRepo(tmp_path / "vibeqc-src")
    source_repo.commit("one")
    text = (f'[hosts.cluster]\nfleet_role = "managed"\ntransport = "local"\nagent = "{AGENT}"\n'
            f'helper_update_command = "/site/bin/update-vq-helper --root /opt/vq --flag"\n'
            f'[hosts.cluster.scheduler_runtime_deployments.vibeqc]\nupdate_command = "/site/bin/deploy --jobs 8"\n'
            f'verify_command = "/site/bin/verify"\nsource_repo = "{source_repo.path}"\n'
            f'[hosts.login2]\nfleet_role = "alias"\ncanonical_host = "cluster"\ntransport = "local"\n')
    bindir = tmp_path / "site" / "bin"
    bindir.mkdir(parents=True)
    reviewed = tmp_path / "reviewed"
    reviewed.mkdir()
    return {"tmp": tmp_path, "config": write_config(tmp_path / "admin.toml", text), "state": tmp_path / "state",
            "bin": bindir, "reviewed": reviewed, "source_repo": source_repo.path}


def install(world, src, dest, *extra, env=None):
    return run_vq("provider", "install", str(src), "--host", extra[0] if extra else "cluster", "--dest", str(dest),
                  "--json", *extra[1:], config=world["config"], state=world["state"], env=env)


def reviewed(world, name: str, text: str) -> Path:
    path = world["reviewed"] / name
    path.write_text(text)
    return path


def test_first_install_records_hashes_interpreter_who_and_when(world):
    src = reviewed(world, "deploy", SCRIPT_ENV.format(n=1))
    dest = world["bin"] / "deploy"
    done = install(world, src, dest)
    assert done.exit_code == 0, done.stdout + done.stderr
    receipt = done.json()
    assert receipt["schema"] == "vq-admin/receipt/1" and receipt["lane"] == "provider"
    assert receipt["steps"][0]["name"] == "install-file" and receipt["steps"][0]["exit_code"] == 0
    inst = receipt["install"]
    assert inst["old_sha256"] is None and inst["new_sha256"] == sha(src.read_bytes())
    assert dest.read_bytes() == src.read_bytes() and dest.stat().st_mode & 0o777 == 0o755
    interp = inst["interpreter"]
    assert interp["shebang"] == "#!/usr/bin/env python3" and interp["command"] == "python3"
    assert interp["command_resolved"] == os.path.realpath(shutil.which("python3"))
    assert inst["by"]["user"] and inst["installed_by"]["uid"] == os.geteuid() and inst["at"]
    stored = json.loads((world["state"] / "receipts" / f"{receipt['id']}.json").read_text())
    assert stored == receipt
    log = [json.loads(line) for line in (world["state"] / "admin.log").read_text().splitlines()]
    assert log[-1]["lane"] == "provider" and log[-1]["new_sha256"] == inst["new_sha256"]
    assert log[-1]["old_sha256"] is None and log[-1]["interpreter"]["command"] == "python3"


def test_replacement_records_old_and_new_and_keeps_the_configuration(world):
    dest = world["bin"] / "deploy"
    dest.write_text(SCRIPT_SH.format(n=1))
    dest.chmod(0o755)
    old = dest.read_bytes()
    config_before = world["config"].read_bytes()
    src = reviewed(world, "deploy", SCRIPT_ENV.format(n=2))
    done = install(world, src, dest)
    assert done.exit_code == 0, done.stdout + done.stderr
    inst = done.json()["install"]
    assert (inst["old_sha256"], inst["new_sha256"]) == (sha(old), sha(src.read_bytes()))
    assert inst["old_interpreter"]["program_resolved"] == os.path.realpath("/bin/sh")
    assert inst["interpreter"]["command"] == "python3"
    assert world["config"].read_bytes() == config_before
    assert inst["config_edited"] is False
    assert dest.read_bytes() == src.read_bytes()


def test_source_inside_this_repository_is_refused(world):
    dest = world["bin"] / "update-vq-helper"
    src = HERE / "site_example" / "vq_site_example" / "helper_update.py"
    done = install(world, src, dest)
    assert done.exit_code == 77
    assert "vq-admin checkout" in done.json()["errors"][0]
    assert not dest.exists()


def test_source_inside_a_configured_source_repo_is_refused(world):
    src = world["source_repo"] / "deploy"
    src.write_text(SCRIPT_SH.format(n=1))
    done = install(world, src, world["bin"] / "deploy")
    assert done.exit_code == 77
    assert "source_repo" in done.json()["errors"][0]


def test_source_inside_a_stage_or_helper_release_is_refused(world):
    repo, helper_sha = helper_repo(world["tmp"] / "helper-repo")
    stage, _ = stage_archive(repo.path, helper_sha, world["tmp"] / "scratch", world["tmp"] / "work")
    in_stage = Path(stage) / "deploy"
    in_stage.write_text(SCRIPT_SH.format(n=1))
    done = install(world, in_stage, world["bin"] / "deploy")
    assert done.exit_code == 77 and "stage" in done.json()["errors"][0]
    root = world["tmp"] / "helper"
    bootstrap(root, repo.path, helper_sha, world["tmp"])
    extracted = root / "releases" / helper_sha / "vq_admin" / "agent" / "cli.py"
    done = install(world, extracted, world["bin"] / "deploy")
    assert done.exit_code == 77
    assert not (world["bin"] / "deploy").exists()


def test_crash_between_write_and_rename_leaves_the_old_file(world):
    dest = world["bin"] / "deploy"
    dest.write_text(SCRIPT_SH.format(n=1))
    dest.chmod(0o755)
    old = dest.read_bytes()
    src = reviewed(world, "deploy", SCRIPT_ENV.format(n=2))
    crash = {"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_AGENT_CRASH": "before-rename"}
    done = install(world, src, dest, env=crash)
    assert done.exit_code == 1, done.stdout + done.stderr
    receipt = done.json()
    assert receipt["steps"][0]["exit_code"] == -9  # SIGKILL, between the write and the rename
    assert receipt["readback"]["dest_sha256"] == sha(old)
    assert dest.read_bytes() == old and dest.stat().st_mode & 0o777 == 0o755
    leftovers = [p for p in world["bin"].iterdir() if p.name.startswith(".tmp.deploy.")]
    assert len(leftovers) == 1 and leftovers[0].read_bytes() == src.read_bytes()  # the write had completed
    # the hook is inert outside tests
    done = install(world, src, dest, env={"VQ_ADMIN_AGENT_CRASH": "before-rename"})
    assert done.exit_code == 0, done.stdout + done.stderr
    assert dest.read_bytes() == src.read_bytes()


def test_alias_host_is_refused(world):
    src = reviewed(world, "deploy", SCRIPT_SH.format(n=1))
    done = install(world, src, world["bin"] / "deploy", "login2")
    assert done.exit_code == 77 and "alias of cluster" in done.json()["errors"][0]


def test_symlinked_destination_and_product_destination_are_refused(world):
    real = world["bin"] / "deploy-real"
    real.write_text(SCRIPT_SH.format(n=1))
    os.symlink(real, world["bin"] / "deploy")
    src = reviewed(world, "deploy", SCRIPT_SH.format(n=2))
    done = install(world, src, world["bin"] / "deploy")
    assert done.exit_code == 77 and "symlink" in done.json()["errors"][0]
    release = world["tmp"] / "apps" / "releases" / ("a" * 40)
    release.mkdir(parents=True)
    (release / "SOURCE-SHA").write_text("a" * 40 + "\n")
    done = install(world, src, release / "deploy")
    assert done.exit_code == 77 and not (release / "deploy").exists()
    assert real.read_text() == SCRIPT_SH.format(n=1)


def test_dry_run_changes_nothing(world):
    src = reviewed(world, "deploy", SCRIPT_SH.format(n=1))
    done = install(world, src, world["bin"] / "deploy", "cluster", "--dry-run")
    assert done.exit_code == 0, done.stdout + done.stderr
    plan = done.json()
    assert plan["schema"] == "vq-admin/plan/1" and plan["dry_run"] is True
    assert plan["install"]["dest"] == str(world["bin"] / "deploy")
    assert plan["steps"][0]["argv"][-4:] == ["--dest", str(world["bin"] / "deploy"), "--mode", "0755"]
    assert not (world["bin"] / "deploy").exists() and not world["state"].exists()
