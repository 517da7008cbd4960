"""The conformance kit on the built-in ``command`` provider with a site's own
scripts, and the worked example in docs/examples/command-provider/: the kit
passes it, a broken copy fails on the rule it breaks, and a real update over
the real loopback sshd deploys, verifies and re-reads it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from support import AGENT, GitRepo, git, run_vq, write_config

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "command-provider"
DEPLOY, VERIFY = EXAMPLE / "deploy", EXAMPLE / "verify"


def test_the_example_scripts_pass_the_kit_through_the_cli():
    done = run_vq("provider", "test", "command", "--update-command", f"{DEPLOY} --root {{root}}",
                  "--verify-command", f"{VERIFY} --root {{root}}", "--script-arg=--jobs=2", "--json")
    assert done.exit_code == 0, done.stdout + done.stderr
    report = done.json()
    assert report["passed"] is True and report["provider"] == "command"
    names = {c["name"] for c in report["checks"]}
    assert {"argv-shape", "evidence-A", "current-unchanged-until-validated", "verify-truthful",
            "older-not-rewritten"} <= names


def test_the_install_command_is_exercised_when_given(tmp_path):
    from vq_admin.conformance import run_conformance

    log = tmp_path / "install.log"
    wrapper = tmp_path / "install"
    wrapper.write_text(f"#!/bin/sh\necho install >> {log}\nexec {DEPLOY} \"$@\"\n")
    wrapper.chmod(0o755)
    report = run_conformance("command", workdir=str(tmp_path), commands={
        "update_command": (str(DEPLOY), "--root", "{root}"),
        "install_command": (str(wrapper), "--root", "{root}"),
        "verify_command": (str(VERIFY), "--root", "{root}")})
    report.assert_ok()
    assert report.check("deploy-A").detail.startswith("runtime_install of A exited 0")
    assert log.read_text() == "install\n"  # only the first deploy is an install


def test_a_verify_that_echoes_the_request_fails_on_the_named_check(tmp_path):
    """A site verify that copies the request instead of reading what is active is caught."""
    liar = tmp_path / "verify-liar"
    liar.write_text(VERIFY.read_text().replace(
        'receipt.update(program=program, source_sha=read(os.path.join(release, "SOURCE-SHA")) or "",',
        'receipt.update(program=program, source_sha=args.expected_sha,'))
    liar.chmod(0o755)
    done = run_vq("provider", "test", "command", "--update-command", f"{DEPLOY} --root {{root}}",
                  "--verify-command", f"{liar} --root {{root}}")
    assert done.exit_code == 1
    assert "FAIL verify-truthful" in done.stderr and "conformance FAILED" in done.stderr


def test_a_deploy_that_switches_current_before_validating_fails(tmp_path):
    eager = tmp_path / "deploy-eager"
    text = DEPLOY.read_text()
    marker = "                selftest = os.path.join(partial, \"source\", \"vq_selftest.py\")\n"
    assert marker in text
    switch_early = ("                os.symlink(os.path.relpath(partial, root), root + '/.early'); "
                    "os.replace(root + '/.early', root + '/current')\n")
    eager.write_text(text.replace(marker, switch_early + marker))
    eager.chmod(0o755)
    done = run_vq("provider", "test", "command", "--update-command", f"{eager} --root {{root}}",
                  "--verify-command", f"{VERIFY} --root {{root}}", "--json")
    assert done.exit_code == 1
    failed = {c["name"] for c in done.json()["checks"] if not c["ok"]}
    assert "current-unchanged-until-validated" in failed


@pytest.mark.parametrize("argv, message", [
    (["provider", "test", "command", "--verify-command", "/bin/true"], "needs --update-command"),
    (["provider", "test", "command", "--update-command", "/bin/true"], "needs --verify-command"),
    (["provider", "test", "command", "--update-command", "'unclosed", "--verify-command", "/bin/true"],
     "cannot be split"),
    (["provider", "test", "command", "--update-command", "", "--verify-command", "/bin/true"], "must not be empty"),
    (["provider", "test", "site_example", "--update-command", "/bin/true"], "only for the built-in 'command'"),
])
def test_usage_errors(argv, message):
    done = run_vq(*argv)
    assert done.exit_code == 2 and message in done.stderr, done.stderr


@pytest.mark.real
def test_a_real_update_over_sshd_with_the_example_scripts(tmp_path, real_sshd):
    """The example as a site would configure it: update, re-run (already-current), launcher."""
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A", {"vq_selftest.py": "import mysim; print('selftest', mysim.VERSION)\n",
                            "mysim.py": "VERSION = 'A'\n"})
    site = tmp_path / "site"  # the scripts as a site installs them (vq admin provider install in production)
    site.mkdir()
    for script in (DEPLOY, VERIFY):
        shutil.copy2(script, site / script.name)
    root = tmp_path / "apps" / "mysim"
    config = write_config(tmp_path / "admin.toml", f"""
        ssh_config = "{real_sshd.ssh_config}"

        [hosts.cluster]
        fleet_role = "managed"
        ssh = "cluster"
        scratch_root = "{tmp_path / 'scratch'}"
        agent = "{AGENT}"

        [hosts.cluster.scheduler_runtime_deployments.mysim]
        update_command = "{site / 'deploy'} --root {root}"
        verify_command = "{site / 'verify'} --root {root}"
        source_repo = "{repo.path}"
        timeout_seconds = 600
    """)
    (tmp_path / "scratch").mkdir()
    state = tmp_path / "state"
    first = run_vq("update", "mysim", "cluster", "--expected-sha", sha, "--json", config=config, state=state)
    assert first.exit_code == 0, first.stdout + first.stderr
    receipt = first.json()
    assert receipt["outcome"] == "ok" and receipt["verify"]["final"]["receipt"]["source_sha"] == sha
    launcher = str(root / "releases" / sha / "bin" / f"mysim-{sha}")
    assert receipt["verify"]["final"]["receipt"]["active_path"] == launcher
    assert receipt["metrics"].get("files") == 2
    assert os.readlink(root / "current") == f"releases/{sha}"
    again = run_vq("update", "mysim", "cluster", "--expected-sha", sha, "--json", config=config, state=state)
    assert again.exit_code == 0 and again.json()["outcome"] == "already-current", again.stdout + again.stderr
    bound = run_vq("launcher", "mysim", "cluster", "--expected-sha", sha, config=config, state=state)
    assert bound.exit_code == 0 and bound.stdout.strip() == launcher


def test_the_docs_show_the_example_scripts_byte_for_byte():
    docs = (EXAMPLE.parent.parent / "providers.md").read_text()
    for script in (DEPLOY, VERIFY):
        assert f"```python\n{script.read_text()}```\n" in docs, \
            f"docs/providers.md does not show {script.name} as it is"


ACTIVATE, PRUNE = DEPLOY.parent / "activate", DEPLOY.parent / "prune"


def test_the_activate_and_prune_scripts_pass_the_generation_cases_through_the_cli():
    done = run_vq("provider", "test", "command", "--update-command", f"{DEPLOY} --root {{root}}",
                  "--verify-command", f"{VERIFY} --root {{root}}", "--activate-command", f"{ACTIVATE} --root {{root}}",
                  "--prune-command", f"{PRUNE} --root {{root}}", "--json")
    assert done.exit_code == 0, done.stdout + done.stderr
    checks = {c["name"]: c["ok"] for c in done.json()["checks"]}
    for case in ("activate-B", "activate-refuses-unbuilt", "activate-A", "prune-keeps-kept", "prune-report-truthful"):
        assert checks.get(case) is True, checks


def test_a_prune_script_that_deletes_a_kept_release_fails_the_kit(tmp_path):
    from vq_admin.conformance import run_conformance

    greedy = tmp_path / "prune-greedy"
    greedy.write_text(PRUNE.read_text().replace("if name in keep or name == active:", "if name == active:"))
    greedy.chmod(0o755)
    report = run_conformance("command", workdir=str(tmp_path), commands={
        "update_command": (str(DEPLOY), "--root", "{root}"), "verify_command": (str(VERIFY), "--root", "{root}"),
        "prune_command": (str(greedy), "--root", "{root}")})
    assert not report.passed
    assert not report.check("prune-keeps-kept").ok


def test_without_activate_and_prune_commands_the_generation_cases_are_not_run():
    done = run_vq("provider", "test", "command", "--update-command", f"{DEPLOY} --root {{root}}",
                  "--verify-command", f"{VERIFY} --root {{root}}", "--json")
    names = {c["name"] for c in done.json()["checks"]}
    assert not names & {"activate-B", "prune-keeps-kept"}, names


#: A site source that pip can install: its own in-tree PEP 517 backend (no build requirement to download).
PIP_SOURCE = {
    "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
    "backend.py": '''\
import base64, hashlib, os, zipfile

NAME, VERSION = "mysim", "1.0"
DIST = f"{NAME}-{VERSION}.dist-info"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {f"{NAME}.py": open(f"{NAME}.py", "rb").read(),
             f"{DIST}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n".encode(),
             f"{DIST}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: backend\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    record = [f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
              f"{len(data)}" for name, data in files.items()] + [f"{DIST}/RECORD,,"]
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for member, data in files.items():
            whl.writestr(member, data)
        whl.writestr(f"{DIST}/RECORD", "\\n".join(record) + "\\n")
    return name
''',
    "mysim.py": "VERSION = '1.0'\n",
    "vq_selftest.py": "import mysim; print('selftest', mysim.VERSION)\n",
}
#: A site build that really builds: pip installs the staged source (needing its packaging), then the example
#: deploy makes the release.
PIP_BUILD = f"""#!{sys.executable}
import os, subprocess, sys, tarfile, tempfile
archive = sys.argv[sys.argv.index("--source-archive") + 1]
with tempfile.TemporaryDirectory() as tmp:
    with tarfile.open(archive) as tar:
        tar.extractall(os.path.join(tmp, "src"))
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           "--disable-pip-version-check", "--target", os.path.join(tmp, "lib"),
                           os.path.join(tmp, "src")])
os.execv({str(DEPLOY)!r}, [{str(DEPLOY)!r}] + sys.argv[1:])
"""


def test_provider_test_deploys_the_sites_own_source_with_source_repo_and_sha(tmp_path):
    """A provider whose build pip-installs the source fails the kit on its fixture (not installable), and
    passes it on the site's own source (``--source-repo PATH --sha SHA``), activation and prune included;
    the checks that need a commit failing validation on purpose are named as not run."""
    build = tmp_path / "pip-build"
    build.write_text(PIP_BUILD)
    build.chmod(0o755)
    words = ["provider", "test", "command", "--update-command", f"{build} --root {{root}}",
             "--verify-command", f"{VERIFY} --root {{root}}", "--activate-command", f"{ACTIVATE} --root {{root}}",
             "--prune-command", f"{PRUNE} --root {{root}}"]
    fixture = run_vq(*words, "--json", timeout=600)
    report = fixture.json()
    assert fixture.exit_code == 1 and report["source"] is None, fixture.stdout
    assert [c["name"] for c in report["checks"] if not c["ok"]] == ["deploy-A"], report["checks"]

    repo = GitRepo(tmp_path / "site-src")
    sha = repo.commit("mysim 1.0", PIP_SOURCE)
    before = git(repo.path, "for-each-ref"), git(repo.path, "count-objects", "-v")
    done = run_vq(*words, "--source-repo", str(repo.path), "--sha", sha, "--json", timeout=900)
    report = done.json()
    assert done.exit_code == 0 and report["passed"] is True, done.stdout + done.stderr
    checks = [c["name"] for c in report["checks"]]
    assert checks[:6] == ["hooks", "argv-shape", "deploy-A", "evidence-A", "deploy-B", "evidence-B"], checks
    assert {"redeploy-A", "older-not-rewritten", "activate-B", "activate-refuses-unbuilt", "activate-A",
            "prune-keeps-kept", "prune-report-truthful"} <= set(checks)
    source = report["source"]
    assert (source["repo"], source["sha"], source["commits"]["A"]) == (str(repo.path), sha, sha)
    assert len({source["commits"]["B"], source["commits"]["C"], sha}) == 3
    assert source["not_run"] == ["failed-validation-exits-nonzero", "current-unchanged-until-validated",
                                 "verify-truthful", "releases-kept-after-failure"]
    assert not set(source["not_run"]) & set(checks)
    assert (git(repo.path, "for-each-ref"), git(repo.path, "count-objects", "-v")) == before  # only read
    text = run_vq(*words[:3], "--update-command", f"{build} --root {{root}}", "--verify-command",
                  f"{VERIFY} --root {{root}}", "--source-repo", str(repo.path), "--sha", sha, timeout=900)
    assert text.exit_code == 0 and f"  source {repo.path} at {sha} (A;" in text.stdout, text.stdout
    assert "  not run: failed-validation-exits-nonzero, " in text.stdout


def test_the_provider_guide_names_the_activation_and_prune_checks_the_kit_runs():
    from vq_admin.conformance import run_conformance

    names = {c.name for c in run_conformance("command", commands={
        "update_command": (str(DEPLOY), "--root", "{root}"), "verify_command": (str(VERIFY), "--root", "{root}"),
        "activate_command": (str(ACTIVATE), "--root", "{root}"),
        "prune_command": (str(PRUNE), "--root", "{root}")}).checks if c.name.startswith(("activate", "prune"))}
    guide = (EXAMPLE.parent.parent / "providers.md").read_text()
    assert len(names) == 5 and all(f"`{name}`" in guide for name in names), names
    assert "not exercised by the kit" not in guide


@pytest.mark.parametrize(("extra", "message"), [
    (["--sha", "a" * 40], "--source-repo and --sha go together"),
    (["--source-repo", "/nonexistent"], "--source-repo and --sha go together"),
    (["--source-repo", "/nonexistent", "--sha", "abc"], "--sha: 'abc' is not a full commit SHA"),
    (["--source-repo", "/nonexistent", "--sha", "a" * 40], "--source-repo /nonexistent: not a directory"),
])
def test_source_repo_usage_errors(extra, message):
    done = run_vq("provider", "test", "command", "--update-command", f"{DEPLOY} --root {{root}}",
                  "--verify-command", f"{VERIFY} --root {{root}}", *extra)
    assert done.exit_code == 2 and message in done.stderr, done.stderr


@pytest.mark.parametrize("loose", ["repo", "git-config"])
def test_a_source_repo_another_user_could_change_is_refused_as_source_repo_is(tmp_path, loose):
    """``--source-repo`` is judged by the trusted-path rule, as a profile's ``source_repo`` is: git reads
    it, its git directory and its configuration as you (77, nothing deployed)."""
    repo = GitRepo(tmp_path / "site-src")
    sha = repo.commit("mysim 1.0")
    (repo.path if loose == "repo" else repo.path / ".git" / "config").chmod(0o777 if loose == "repo" else 0o666)
    done = run_vq("provider", "test", "command", "--update-command", f"{DEPLOY} --root {{root}}",
                  "--verify-command", f"{VERIFY} --root {{root}}", "--source-repo", str(repo.path), "--sha", sha,
                  "--json")
    assert done.exit_code == 77 and done.json()["outcome"] == "refused", done.stdout + done.stderr
    assert "--source-repo" in done.stderr and "other-writable" in done.stderr, done.stderr
    assert "deploy-A" not in done.stdout
