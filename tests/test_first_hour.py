"""Issue 23: the first hour of a new site, over a real sshd (and Slurm) with real git.

The provider is the built-in ``command`` provider running the documented
scripts (``docs/examples/command-provider``), with the verifier a site writes
first: a small shell script that prints nulls when nothing is active.  Then
the same host with scripts that fail in each way a newcomer meets: a missing
program (127), exit 2 and exit 1 with a message, a verify that cannot start.
Each case asserts the exit code, the one-line message, and what was (not)
built or recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support import NOTHING_ACTIVE, SCRIPTS, VQ_ADMIN, GitRepo, command_host, run_vq, write_config
from vq_admin.report.outcome import READ_ONLY_RAN

pytestmark = pytest.mark.real

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "command-provider"
SELFTEST = {"vq_selftest.py": "print('selftest ok')\n"}


def script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


class Site:
    """One managed host ``cluster`` over the fixture's sshd; the documented deploy, a site's verify."""

    def __init__(self, tmp: Path, ssh_config: str, *, update: str | None = None, verify: str | None = None,
                 extra_profile: str = ""):
        self.tmp = tmp
        self.repo = GitRepo(tmp / "src")
        self.a = self.repo.commit("a", SELFTEST)
        self.root = tmp / "apps"
        self.scratch = tmp / "scratch"
        self.scratch.mkdir()
        self.state = tmp / "state"
        # The verifier as a site writes it: nothing active is said with nulls; else the documented verify.
        self.verify = script(tmp / "site-verify", f"""#!/bin/sh
root=$1; shift
if [ ! -L "$root/current" ]; then
    echo '{json.dumps(NOTHING_ACTIVE)}'
    exit 0
fi
exec {EXAMPLES / "verify"} --root "$root" "$@"
""")
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{ssh_config}"\n\n' + command_host(
            "vibeqc", scratch=self.scratch, repo=self.repo.path, update=update or f"{EXAMPLES / 'deploy'} --root "
            f"{self.root}", verify=verify or f"{self.verify} {self.root}", extra_profile=extra_profile))

    def update(self, *extra: str, sha: str | None = None):
        return run_vq("update", "vibeqc", "cluster", "--expected-sha", sha or self.a, *extra, config=self.config,
                      state=self.state)

    def record(self, which: str) -> dict | None:
        path = self.state / "hosts" / "cluster" / "runtime" / "vibeqc" / f"{which}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def built(self) -> list[str]:
        releases = self.root / "releases"
        return sorted(p.name for p in releases.iterdir()) if releases.is_dir() else []

    def stages(self) -> list[Path]:
        return list((self.scratch / ".vq-admin" / "stage").glob("runtime/vibeqc/stage.*"))


def steps(receipt: dict) -> dict[str, dict]:
    return {s["name"]: s for s in receipt["steps"]}


def test_a_verifier_printing_nulls_deploys_the_first_time(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd.ssh_config)
    first = site.update("--json")
    receipt = first.json()
    assert first.exit_code == 0 and receipt["outcome"] == "ok", first.stdout + first.stderr
    pre = receipt["verify"]["pre"]
    assert not pre["proven"] and pre["error"] is None and "output" not in pre
    assert pre["receipt"]["source_sha"] == "" and pre["receipt"]["healthy"] is False
    assert site.built() == [site.a] and receipt["verify"]["final"]["proven"]
    again = site.update("--json")
    assert again.exit_code == 0 and again.json()["outcome"] == "already-current", again.stdout + again.stderr


def test_a_null_where_the_contract_allows_none_still_stops_the_run(tmp_path, real_sshd):
    """Only the three fields of a healthy-false receipt may be null: a null program is not a receipt."""
    bad = script(tmp_path / "bad-verify", "#!/bin/sh\necho '" + json.dumps(dict(NOTHING_ACTIVE, program=None))
                 + "'\n")
    site = Site(tmp_path, real_sshd.ssh_config, verify=str(bad))
    done = site.update("--json")
    assert done.exit_code == 1, done.stdout + done.stderr
    assert done.json()["errors"] == ["pre-verify: the verifier's output is not a receipt (verify receipt field "
                                     "'program' must be str, not NoneType); " + READ_ONLY_RAN + "; its output, "
                                     "escaped, is in verify.pre.output"]
    assert site.built() == [] and site.stages() == [] and site.record("last-ok") is None


def test_the_same_line_without_tag_after_a_tagged_run_is_already_current(tmp_path, real_sshd):
    site = Site(tmp_path, real_sshd.ssh_config)
    site.repo.tag("v1.0", site.a, annotated=True)
    tagged = site.update("--tag", "v1.0", "--json")
    assert tagged.exit_code == 0 and tagged.json()["outcome"] == "ok", tagged.stdout + tagged.stderr
    plain = site.update("--json")
    receipt = plain.json()
    assert plain.exit_code == 0 and receipt["outcome"] == "already-current", plain.stdout + plain.stderr
    assert receipt["tag"] == "v1.0" and steps(receipt)["deploy"]["status"] == "skipped"
    # a second tag at the active verified SHA (CONTRACT section 15): the label LAST OK recorded is expected
    site.repo.tag("v1.0-final", site.a)
    several = site.update("--json")
    assert several.exit_code == 0 and several.json()["outcome"] == "already-current", several.stdout + several.stderr
    assert several.json()["tag"] == "v1.0" and "the label LAST OK recorded for it is v1.0" in several.json()["notes"][0]
    chosen = site.update("--tag", "v1.0", "--json")
    assert chosen.exit_code == 0 and chosen.json()["outcome"] == "already-current", chosen.stdout + chosen.stderr
    # two tags at a commit never verified here: which one the runtime must report is the operator's to say
    b = site.repo.commit("b", SELFTEST)
    site.repo.tag("v2.0", b)
    site.repo.tag("v2.0-final", b)
    several = site.update("--json", sha=b)
    assert several.exit_code == 2, several.stdout + several.stderr
    assert several.json()["errors"] == [f"2 tags point at {b}: v2.0, v2.0-final; name the one the runtime "
                                        f"must report with --tag TAG; {READ_ONLY_RAN}"]
    assert site.record("last-ok")["tag"] == "v1.0" and site.built() == [site.a]
    assert site.record("last")["outcome"] == "already-current"  # a usage error never replaces the last run


def test_a_tag_added_after_the_deploy_is_a_label_not_a_failure(tmp_path, real_sshd):
    """Issue 31 item 1: deploy an untagged commit, then tag it: the unchanged line (and --force) keeps
    working, naming the tag found and the label the runtime reports; an explicit --tag still must match;
    a second driver without LAST OK finds the same from the runtime itself."""
    site = Site(tmp_path, real_sshd.ssh_config)
    assert site.update("--json").json()["outcome"] == "ok"
    site.repo.tag("v1.18.0", site.a, annotated=True)
    plain = site.update("--json")
    receipt = plain.json()
    assert plain.exit_code == 0 and receipt["outcome"] == "already-current", plain.stdout + plain.stderr
    assert receipt["tag"] is None and steps(receipt)["deploy"]["status"] == "skipped"
    assert receipt["notes"] == ["tag: source_repo tags it v1.18.0; the label LAST OK recorded for it is no tag: the "
                                "SHA is the identity, a tag a label, so without --tag that label is expected (an "
                                "explicit --tag must match what the runtime reports)"]
    forced = site.update("--force", "--json")
    assert forced.exit_code == 0 and forced.json()["outcome"] == "ok", forced.stdout + forced.stderr
    assert steps(forced.json())["deploy"]["status"] == "ok" and site.record("last-ok")["tag"] is None
    explicit = site.update("--tag", "v1.18.0", "--json")
    assert explicit.exit_code == 1 and explicit.json()["outcome"] == "failed", explicit.stdout + explicit.stderr
    assert "receipt tag None, requested 'v1.18.0'" in explicit.stdout
    # another driver (no LAST OK): the runtime's own receipt proves the SHA under its label
    other = run_vq("update", "vibeqc", "cluster", "--expected-sha", site.a, "--json", config=site.config,
                   state=tmp_path / "state-2")
    receipt = other.json()
    assert other.exit_code == 0 and receipt["outcome"] == "already-current", other.stdout + other.stderr
    assert receipt["tag"] == "v1.18.0" and "the label the runtime reports is no tag" in receipt["notes"][0]
    last_ok = json.loads((tmp_path / "state-2" / "hosts" / "cluster" / "runtime" / "vibeqc" / "last-ok.json")
                         .read_text())
    assert last_ok["tag"] is None  # what the runtime reports: the next run expects that label
    forced = run_vq("update", "vibeqc", "cluster", "--expected-sha", site.a, "--force", "--json", config=site.config,
                    state=tmp_path / "state-3")
    assert forced.exit_code == 0 and forced.json()["outcome"] == "ok", forced.stdout + forced.stderr
    assert "the label the runtime reports is no tag" in forced.json()["notes"][0]
    site.repo.tag("v1.18.0-final", site.a)  # two tags at the active verified SHA: LAST OK names the label
    both = site.update("--json")
    assert both.exit_code == 0 and both.json()["outcome"] == "already-current", both.stdout + both.stderr
    assert "source_repo tags it v1.18.0, v1.18.0-final; the label LAST OK recorded for it is no tag" in \
        both.json()["notes"][0]
    assert site.built() == [site.a]


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_an_interrupted_tagged_runs_next_line_run_as_printed_converges(tmp_path, real_sshd):
    """The run is typed with --config, --state-dir, --tag and a placement option (no environment), killed
    mid-build; its ``next`` line, run as printed by a shell, reports the build that completed."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    gated = script(tmp_path / "gated-deploy", f"""#!/bin/sh
touch {started}
i=0
while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
exec {EXAMPLES / "deploy"} "$@"
""")
    site = Site(tmp_path, real_sshd.ssh_config, update=f"{gated} --root {tmp_path / 'apps'}")
    site.repo.tag("v1.0", site.a)
    env = {k: v for k, v in os.environ.items() if k not in ("VQ_ADMIN_CONFIG", "VQ_ADMIN_STATE_DIR")}
    line = [VQ_ADMIN, "update", "vibeqc", "cluster", "--expected-sha", site.a, "--tag", "v1.0",
            "--update-script-arg=--opt=2", "--config", str(site.config), "--state-dir", str(site.state), "--json"]
    shell_env = dict(env, PATH=f"{SCRIPTS}:{env['PATH']}")

    def as_printed(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["/bin/sh", "-c", command], env=shell_env, capture_output=True, text=True, timeout=300)

    run = subprocess.Popen(line, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: started.exists() or run.poll() is not None, "the build to start")
        assert run.poll() is None, run.communicate()
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 3, out + err
        printed = json.loads(out)["readback"]["next_command"]
        assert printed == (f"vq admin update vibeqc cluster --expected-sha {site.a} --tag v1.0 "
                           f"--update-script-arg=--opt=2 --config {site.config} --state-dir {site.state}")
        held = as_printed(printed)  # the build keeps running: locked, and its next line is the same
        assert held.returncode == 75 and f"  next      {printed}" in held.stderr.splitlines(), held.stderr
    finally:
        gate.touch()
    wait_for(lambda: list(site.scratch.glob(".vq-admin/runtime-deploy/vibeqc/deploy.*/exit")), "the build's end")
    again = as_printed(printed)
    assert again.returncode == 0, again.stdout + again.stderr
    last = site.record("last")
    assert last["outcome"] in ("already-current", "ok") and last["tag"] == "v1.0"
    assert (site.root / "releases" / site.a / "BUILD-ARGS").read_text().split() == ["--opt=2"]


def test_the_hint_after_ctrl_c_mid_build_says_what_the_rerun_does_now(tmp_path, real_sshd):
    """Issue 31 item 3: after an interrupt mid-build the hint's short first line says what the rerun does
    now (75 until the build, named by its pid, ends; or, with --wait-lock, waits), the details after it;
    the rerun's own 75 says who holds the lease in one short line; with --wait-lock it waits and converges."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    gated = script(tmp_path / "gated-deploy", f"""#!/bin/sh
touch {started}
i=0
while [ ! -e {gate} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
exec {EXAMPLES / "deploy"} "$@"
""")
    site = Site(tmp_path, real_sshd.ssh_config, update=f"{gated} --root {tmp_path / 'apps'}")
    run = subprocess.Popen([VQ_ADMIN, "update", "vibeqc", "cluster", "--expected-sha", site.a, "--json"],
                           env=dict(os.environ, VQ_ADMIN_CONFIG=str(site.config), VQ_ADMIN_STATE_DIR=str(site.state)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: started.exists() or run.poll() is not None, "the build to start")
        assert run.poll() is None, run.communicate()
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 3, out + err
        readback = json.loads(out)["readback"]
        first, details = readback["advice"].split("\n")
        assert first == (f"a rerun is 75 (locked) until the build pid {readback['pid']} on cluster ends; with "
                         "--wait-lock SECONDS it waits for it"), first
        assert details.startswith("then it reconciles that build's end from its attempt record"), details
        held = site.update()
        assert held.exit_code == 75, held.stdout + held.stderr
        error = next(line for line in held.stderr.splitlines() if line.startswith("  error"))
        assert error.endswith(f"held by the build pid {readback['pid']} an earlier run left running; "
                              f"{READ_ONLY_RAN}") and len(error) < 220, error
        assert "whose driver has ended" in held.stderr and "a rerun is 75 until the build ends" in held.stderr
        assert "another run" not in held.stderr
        narration = tmp_path / "waiting.err"
        with narration.open("w") as stderr:
            waiting = subprocess.Popen([VQ_ADMIN, "update", "vibeqc", "cluster", "--expected-sha", site.a, "--json",
                                        "--wait-lock", "300", "-v"], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                       env=dict(os.environ, VQ_ADMIN_CONFIG=str(site.config),
                                                VQ_ADMIN_STATE_DIR=str(site.state)))
        wait_for(lambda: waiting.poll() is not None or "waiting up to 300 s (--wait-lock)" in narration.read_text(),
                 "the rerun to wait for the build")
    finally:
        gate.touch()
    out, err = waiting.communicate(timeout=300)
    err = narration.read_text()
    receipt = json.loads(out)
    assert waiting.returncode == 0 and receipt["outcome"] in ("ok", "already-current"), out + err
    assert receipt["lease"]["waited"]["seconds"] > 0


MISSING = "missing-program"
REFUSES = "exit-2"
FAILS = "exit-1"
LONG = "x" * 300


def failing_deploy(tmp: Path, how: str) -> tuple[Path, str]:
    """A deploy script failing *how*, and the one line its failure must end with."""
    if how == MISSING:  # a typo in the site's own script: the shell cannot find the program
        missing = tmp / "no" / "such" / "build"
        return script(tmp / "deploy-typo", f'#!/bin/sh\nexec {missing} "$@"\n'), f"{missing}: not found"
    if how == REFUSES:
        return script(tmp / "deploy-refuses", """#!/bin/sh
echo "building" >&2
echo "vq-minimal: /apps/vibeqc does not exist; use 'install' for a first-time installation" >&2
echo >&2
exit 2
"""), "vq-minimal: /apps/vibeqc does not exist; use 'install' for a first-time installation"
    return script(tmp / "deploy-fails", f"""#!/bin/sh
printf 'step 1\\n\\033[31mcompiler error: {LONG}\\n   \\n' >&2
exit 1
"""), "compiler error: "


@pytest.mark.parametrize("how, code", [(MISSING, 127), (REFUSES, 2), (FAILS, 1)])
def test_a_failing_provider_names_its_cause_on_the_one_line(tmp_path, real_sshd, how, code):
    deploy, tail = failing_deploy(tmp_path, how)
    site = Site(tmp_path, real_sshd.ssh_config, update=str(deploy))
    done = site.update("--json")
    receipt = done.json()
    assert done.exit_code == 1 and receipt["outcome"] == "failed", done.stdout + done.stderr
    error = receipt["errors"][-1]
    assert error.startswith(f"deploy: the provider exited {code}: ") and "\n" not in error, error
    if how == FAILS:  # escaped, and bounded: its start and its end kept around " ... " (200 characters)
        line = f"\\x1b[31mcompiler error: {LONG}"
        assert error == f"deploy: the provider exited 1: {line[:97]} ... {line[-97:]}", error
    else:
        assert error.endswith(tail), error
    assert receipt["deploy"]["exit_code"] == code
    assert site.built() == [] and site.record("last-ok") is None and site.record("last")["outcome"] == "failed"
    # the line an operator or cron mail sees
    human = site.update()
    assert human.exit_code == 1 and f"  error     {error}" in human.stderr.splitlines(), human.stderr


def test_the_fleet_tables_reason_column_names_the_cause(tmp_path, real_sshd):
    deploy, tail = failing_deploy(tmp_path, REFUSES)
    site = Site(tmp_path, real_sshd.ssh_config, update=str(deploy))
    done = run_vq("update", "vibeqc", "--all", "--expected-sha", site.a, config=site.config, state=site.state)
    assert done.exit_code == 1, done.stdout + done.stderr
    row = next(line for line in done.stderr.splitlines() if line.startswith("cluster "))
    assert row.endswith(f"deploy: the provider exited 2: {tail}"), row


def test_a_verify_that_cannot_start_stops_the_run_before_any_mutation(tmp_path, real_sshd):
    python = tmp_path / "no" / "such" / "python3"
    broken = script(tmp_path / "verify-typo", f"#!{python}\nprint('never')\n")
    marker = tmp_path / "deploy-ran"
    site = Site(tmp_path, real_sshd.ssh_config, update=f"/usr/bin/touch {marker}", verify=str(broken))
    done = site.update("--json")
    receipt = done.json()
    assert done.exit_code == 1 and receipt["outcome"] == "failed", done.stdout + done.stderr
    assert receipt["errors"] == [f"pre-verify: verify command {broken} exited 127: {broken}: No such file or "
                                 "directory; only read-only checks ran; nothing was changed"]
    assert steps(receipt)["deploy"]["status"] == "skipped" and steps(receipt)["stage-create"]["status"] == "skipped"
    assert not marker.exists() and site.stages() == [] and site.record("last-ok") is None


def test_a_failing_build_in_a_slurm_allocation_names_its_cause(tmp_path, real_cluster):
    deploy, tail = failing_deploy(tmp_path, REFUSES)
    site = Site(tmp_path, real_cluster.sshd.ssh_config, update=str(deploy),
                extra_profile='update_allocation = { sbatch_args = ["--time=5"] }')
    done = site.update("--json")
    receipt = done.json()
    assert done.exit_code == 1 and receipt["outcome"] == "failed", done.stdout + done.stderr
    assert receipt["errors"][-1] == f"deploy: the provider exited 2: {tail}"
    assert receipt["deploy"]["job_id"] and site.built() == [] and site.record("last-ok") is None
