"""Trust boundaries on the login host, attacked for real.

The operator (root here) runs vq-admin against the real loopback sshd and
the real single-node Slurm; the attacker is the unprivileged local user
``nobody`` (``setpriv``), acting on the same filesystem.  Each attack asserts
the exact exit code, that the attacker's marker file does not exist, that no
verified state was recorded, and that nothing ends in a traceback.

Files the attacker must reach live in an *arena* below /tmp (pytest's own
directories are private to root).  Every wait is on a condition, with a bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from realhosts import SshdServer, remote_path
from realhosts.procs import wait_until
from support import AGENT, GitRepo, command_host, git, in_thread, run_vq, write_config

pytestmark = pytest.mark.real

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
DEPLOY = """\
import pathlib, sys
pathlib.Path(sys.argv[1]).write_text(" ".join(sys.argv[2:]))
sys.exit(0)
"""
VERIFY = """\
import json, sys
with open(sys.argv[1], "a") as fh:
    fh.write(" ".join(sys.argv[2:]) + "\\n")
program = sys.argv[sys.argv.index("--program") + 1]
print(json.dumps({"program": program, "source_sha": None, "tag": None, "healthy": False, "activation": "none",
                  "quiescent": True, "updater_pid": None, "active_path": None, "active_path_sha256": None}))
"""  # nothing proven: the receipt of nothing active (CONTRACT section 4), as before the first install


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"the attacker's {argv} failed: {done.stderr}"
    return done


@pytest.fixture
def arena():
    """A directory below /tmp the attacker can traverse (0755, owned by root)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as the unprivileged user nobody")
    path = Path(tempfile.mkdtemp(prefix="vq-trust-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Site:
    """A source repository, site scripts, a scratch root and a configuration."""

    def __init__(self, tmp: Path, arena: Path, ssh_config: Path, program: str, *,
                 scratch: Path | None = None, allocation: str | None = None, update_words: str | None = None):
        self.tmp, self.arena, self.program = tmp, arena, program
        self.repo = GitRepo(tmp / "repo")
        self.sha = self.repo.commit("A")
        self.state = tmp / "state"
        self.scratch = scratch or arena / "scratch"
        self.scratch.mkdir(exist_ok=True)
        site = arena / "site"
        site.mkdir(exist_ok=True)
        self.deployed = arena / "deployed"          # written only if the provider's update runs
        self.verify_log = arena / "verify.log"      # one line per verify run
        self.marker = arena / "pwned"               # written only if the attacker's command runs
        deploy, verify = site / "deploy.py", site / "verify.py"
        deploy.write_text(DEPLOY)
        verify.write_text(f"#!{sys.executable}\n{VERIFY}")
        verify.chmod(0o755)
        words = update_words or f"{sys.executable} {deploy} {self.deployed}"
        profile = f"update_allocation = {{ sbatch_args = {allocation} }}\n" if allocation else ""
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{ssh_config}"\n\n' + command_host(
            program, scratch=self.scratch, repo=self.repo.path, update=words, verify=f"{verify} {self.verify_log}",
            timeout_seconds=300, extra_profile=profile))

    @property
    def program_dir(self) -> Path:
        return self.scratch / ".vq-admin" / "runtime-deploy" / self.program

    def update(self, *extra: str, env: dict[str, str] | None = None):
        result = run_vq("update", self.program, "cluster", "--expected-sha", self.sha, "--json", *extra,
                        config=self.config, state=self.state, env=env, timeout=400)
        assert "Traceback" not in result.stderr + result.stdout, result.stderr
        return result

    def assert_no_verified_state(self) -> None:
        registry = self.state / "registry"
        assert not registry.exists() or not any(registry.rglob("*.json")), list(registry.rglob("*"))
        for path in self.state.rglob("*"):
            if path.is_file() and path.name in ("last_ok.json", "last-ok.json"):
                raise AssertionError(f"a verified identity was recorded: {path}")


# -- the scratch root ------------------------------------------------------------------


def test_group_writable_scratch_root_is_refused_and_nothing_is_created_below_it(tmp_path, arena, real_sshd):
    proj = arena / "proj"
    proj.mkdir()
    os.chown(proj, 0, pwd.getpwnam("nobody").pw_gid)
    proj.chmod(0o775)  # a normal project directory: group-writable, not sticky
    site = Site(tmp_path, arena, real_sshd.ssh_config, "trust-scratch", scratch=proj)
    # the attacker, a member of the group, can write there
    as_nobody("touch", str(proj / "attacker-was-here"))
    result = site.update()
    assert result.exit_code == 77, result.stderr
    receipt = result.json()
    assert receipt["outcome"] == "refused"
    message = " ".join(receipt["errors"])
    assert f"directory {proj} is group-writable without the sticky bit" in message
    assert "mode 0775" in message and "owner root (uid 0)" in message and "private directory" in message
    assert sorted(p.name for p in proj.iterdir()) == ["attacker-was-here"]  # nothing created below it
    assert not site.deployed.exists()
    site.assert_no_verified_state()


def test_scratch_root_below_a_world_writable_directory_is_refused_by_the_agent(arena):
    loose = arena / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    scratch = loose / "scratch"
    scratch.mkdir(mode=0o700)
    done = subprocess.run([AGENT, "alloc-run", "--root", str(scratch), "--program", "p", "--timeout", "10",
                           "--", "/bin/true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    assert f"directory {loose} is group- and other-writable without the sticky bit" in done.stderr
    assert "Traceback" not in done.stderr and list(scratch.iterdir()) == []


# -- configured commands on the remote host ----------------------------------------------


def test_interpreter_prefixed_world_writable_script_is_refused_on_the_remote_host(tmp_path, arena, real_sshd):
    shared = arena / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    script = shared / "deploy.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    site = Site(tmp_path, arena, real_sshd.ssh_config, "trust-cmd", update_words=f"/bin/bash {script}")
    # the attacker replaces the script the administrator's command names
    as_nobody("sh", "-c", f"rm -f {script} && printf '#!/bin/sh\\ntouch {site.marker}\\n' > {script}")
    result = site.update()
    assert result.exit_code == 77, result.stderr
    receipt = result.json()
    message = " ".join(receipt["errors"])
    assert "scheduler_runtime_deployments.trust-cmd.update_command" in message
    assert f"file {script} is owned by nobody (uid" in message and "mode 0" in message
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["check-commands"]["argv"][-2:] == ["/bin/bash", str(script)]
    assert steps["pre-verify"]["status"] == "skipped" and steps["deploy"]["status"] == "skipped"
    assert not site.marker.exists() and not site.verify_log.exists() and not site.deployed.exists()
    site.assert_no_verified_state()


# -- the tag rule ----------------------------------------------------------------------------


def test_an_inferred_tag_that_looks_like_an_option_never_reaches_the_provider(tmp_path, arena, real_sshd):
    site = Site(tmp_path, arena, real_sshd.ssh_config, "trust-tag")
    git(site.repo.path, "update-ref", "refs/tags/--help", site.sha)  # git tag refuses the name; a ref does not
    result = site.update()
    assert result.exit_code == 77, result.stderr
    message = " ".join(result.json()["errors"])
    assert "tag '--help' points at" in message and "not a valid tag name" in message
    assert not site.verify_log.exists() and not site.deployed.exists()
    site.assert_no_verified_state()


# -- the batch job is bound to content ------------------------------------------------------


def _held_job(site: Site, cluster, join) -> tuple[str, Path]:
    """Wait (bounded) until the run's job is submitted and PENDING (held); its id and attempt directory."""
    def found():
        files = [p for p in site.program_dir.glob("deploy.*/job") if p.read_text().strip()]
        return files[0] if files else None

    job_file = wait_until(found, 120.0, interval=0.05)
    if job_file is None:
        ended = join(5)  # the run ended (or hangs) without a job: say what it said
        raise AssertionError(f"the agent never recorded a job id; the run: {ended.stderr[-2000:]} "
                             f"{ended.json().get('errors')}")
    job_id = job_file.read_text().strip()

    def pending():
        done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                              env={**os.environ, **cluster.slurm.env}, timeout=30)
        return "JobState=PENDING" in done.stdout

    assert wait_until(pending, 60.0, interval=0.2), f"job {job_id} never showed as PENDING"
    return job_id, job_file.parent


def _release(cluster, job_id: str) -> None:
    subprocess.run(["scontrol", "release", job_id], check=True, env={**os.environ, **cluster.slurm.env}, timeout=30)


#: Every name below an attempt directory that the job, Slurm or the agent ever writes.
WRITTEN_NAMES = ("stdout", "stderr", "job", "job.py", ".live", "deploy.out", "deploy.err")


def test_attempt_swapped_while_the_job_is_pending_is_not_run(tmp_path, arena, real_cluster):
    site = Site(tmp_path, arena, real_cluster.sshd.ssh_config, "trust-swap", allocation='["--time=5", "--hold"]')
    join = in_thread(lambda: site.update())
    job_id, attempt = _held_job(site, real_cluster, join)
    # while the job waits, the scratch root is opened up (say, a project directory made group-writable) ...
    site.scratch.chmod(0o777)
    # ... and the attacker renames .vq-admin away and plants their own attempt with their own argv
    top = site.scratch / ".vq-admin"
    as_nobody("mv", str(top), str(site.scratch / "moved-away"))
    planted = site.scratch / ".vq-admin" / "runtime-deploy" / site.program / attempt.name
    spec = json.dumps({"argv": ["/usr/bin/touch", str(site.marker)], "env": {}})
    as_nobody("sh", "-c", f"mkdir -p {planted} && chmod 0777 {planted} && printf '%s' '{spec}' > {planted}/argv.json")
    # ... and a symlink at every name the job (or Slurm for it) might write there, pointing at a victim file
    victim = site.arena / "victim"
    victim.write_text("the administrator's file\n")
    victim.chmod(0o644)
    for name in WRITTEN_NAMES:
        as_nobody("ln", "-s", str(victim), str(planted / name))
    planted_before = sorted(p.name for p in planted.iterdir())
    _release(real_cluster, job_id)
    result = join(300)
    receipt = result.json()
    steps = [(s["name"], s["status"], s.get("detail")) for s in receipt["steps"]]
    assert result.exit_code == 1, json.dumps([receipt["errors"], receipt["deploy"], steps])[:6000]
    assert receipt["outcome"] == "failed" and receipt["deploy"]["exit_code"] == 86
    assert receipt["deploy"]["job_id"] == job_id and receipt["deploy"]["tampered"]
    assert any("tamper" in e for e in receipt["errors"]), receipt["errors"]
    assert not site.marker.exists() and not site.deployed.exists()
    # nothing was written through the planted links, and nothing appeared in the attacker's directory: Slurm's
    # own output goes to /dev/null, and the job opens its transcripts only in an attempt directory it trusts
    assert victim.read_text() == "the administrator's file\n"
    assert sorted(p.name for p in planted.iterdir()) == planted_before
    assert all((planted / name).is_symlink() for name in WRITTEN_NAMES)
    assert receipt["deploy"]["tampered"].startswith("suspected"), receipt["deploy"]["tampered"]
    site.assert_no_verified_state()


@pytest.mark.parametrize("who", ["nobody", "owner"])
def test_archive_appended_to_while_the_job_is_pending_is_not_deployed(who, tmp_path, arena, real_cluster):
    site = Site(tmp_path, arena, real_cluster.sshd.ssh_config, f"trust-tar-{who}",
                allocation='["--time=5", "--hold"]')
    join = in_thread(lambda: site.update())
    job_id, _attempt = _held_job(site, real_cluster, join)
    (archive,) = (site.scratch / ".vq-admin" / "stage" / "runtime" / site.program).glob("stage.*/source.tar")
    before = hashlib.sha256(archive.read_bytes()).hexdigest()
    if who == "nobody":  # loosened modes (traversable directories, a world-writable file) let another user write it
        for directory in [archive.parents[i] for i in range(5)]:
            directory.chmod(0o711)
        archive.chmod(0o666)
        as_nobody("sh", "-c", f"printf 'evil' >> {archive}")
    else:  # the same bytes appended by a process of the operator's own
        with open(archive, "ab") as fh:
            fh.write(b"evil")
    assert hashlib.sha256(archive.read_bytes()).hexdigest() != before
    _release(real_cluster, job_id)
    result = join(300)
    receipt = result.json()
    steps = [(s["name"], s["status"], s.get("detail")) for s in receipt["steps"]]
    assert result.exit_code == 1, json.dumps([receipt["errors"], receipt["deploy"], steps])[:6000]
    assert receipt["outcome"] == "failed" and receipt["deploy"]["exit_code"] == 86
    tampered = receipt["deploy"]["tampered"]
    assert tampered.startswith("vq-admin job: refused:") and str(archive) in tampered
    if who == "owner":
        assert "changed after the run prepared it (sha256 " in tampered and f"expected {before}" in tampered
    else:
        assert "writable by nobody else (mode 0666)" in tampered
    assert any("tampering" in e for e in receipt["errors"]), receipt["errors"]
    assert not site.deployed.exists()
    site.assert_no_verified_state()


# -- the mirror --------------------------------------------------------------------------------


def _ref_bytes(mirror: Path) -> dict[str, bytes]:
    """Every ref file and packed-refs of the mirror, byte for byte."""
    found = {str(p.relative_to(mirror)): p.read_bytes() for p in (mirror / "refs").rglob("*") if p.is_file()}
    packed = mirror / "packed-refs"
    if packed.exists():
        found["packed-refs"] = packed.read_bytes()
    return found


@pytest.mark.parametrize("symref", ["refs/heads/release -> refs/tags/stable",
                                    "refs/remotes/origin/release -> refs/tags/nothere"])
def test_a_symbolic_ref_in_the_set_refuses_the_feed(symref, tmp_path, real_sshd):
    from test_mirror_cli import Site as MirrorSite

    site = MirrorSite(tmp_path, real_sshd)
    site.driver.seed(site.mirror, f"{site.driver.a}:refs/tags/stable")
    name, target = symref.split(" -> ")
    git(site.mirror, "symbolic-ref", name, target)
    before = _ref_bytes(site.mirror)
    result, receipt = site.update(site.driver.b)
    assert "Traceback" not in result.stderr
    assert result.exit_code == 77, (receipt["errors"],
                                    [(s["name"], s["status"], s.get("detail")) for s in receipt["steps"]])
    message = " ".join(receipt["errors"])
    assert f"{name} is a symbolic ref to {target}" in message and "nothing was pushed" in message
    assert _ref_bytes(site.mirror) == before  # the tag did not move; nothing was created through the link
    assert not (site.mirror / "refs" / "tags" / "nothere").exists()
    steps = {s["name"]: s for s in receipt["steps"]}
    assert steps["mirror-feed"]["status"] == "skipped" and steps["deploy"]["status"] == "skipped"
    assert site.prepared() is None


@pytest.mark.parametrize("lane", ["HEAD", "a/.hidden", "x.lock/y"])
def test_a_lane_that_is_not_a_branch_name_is_a_configuration_error(lane, tmp_path, real_sshd):
    from test_mirror_cli import Site as MirrorSite

    site = MirrorSite(tmp_path, real_sshd)
    site.config.write_text(site.config.read_text().replace('lane = "release"', f'lane = "{lane}"'))
    result = run_vq("check", config=site.config, state=tmp_path / "state")
    assert result.exit_code == 2, result.stdout + result.stderr
    assert "hosts.cluster.scheduler_runtime_deployments.vibeqc.lane" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


# -- the login shell ---------------------------------------------------------------------------

TCSH_USER = "vqtcsh"


@pytest.fixture
def tcsh_account(arena):
    """A user whose login shell is tcsh, reachable over a real sshd as host ``cluster``.

    sshd reads a user's authorized keys as that user, so this sshd keeps its
    files in the arena, which the user can traverse.
    """
    tcsh = shutil.which("tcsh")
    if tcsh is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set and tcsh is missing (scripts/test.sh installs it)", pytrace=False)
        pytest.skip("tcsh is not installed (scripts/test.sh installs it)")
    if os.geteuid() != 0:
        pytest.skip("needs root to create a user")
    created = False
    try:
        pwd.getpwnam(TCSH_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-d", "/", "-s", tcsh, TCSH_USER], check=True, timeout=60)
        subprocess.run(["usermod", "-p", "*", TCSH_USER], check=True, timeout=60)
        created = True
    assert pwd.getpwnam(TCSH_USER).pw_shell == tcsh
    server = SshdServer(arena / "sshd", env={"PATH": remote_path()})
    try:
        server.start()
        (server.authorized_dir / TCSH_USER).write_text((server.authorized_dir / "root").read_text())
        config = arena / "ssh_config_tcsh"
        config.write_text(server.ssh_config.read_text().replace("User root", f"User {TCSH_USER}"))
        yield config
    finally:
        server.stop()
        if created:
            subprocess.run(["userdel", TCSH_USER], timeout=60)


def test_a_non_posix_login_shell_is_refused_on_first_contact(tmp_path, arena, tcsh_account):
    # first: that shell really does read vq-admin's quoting differently
    login = subprocess.run(["ssh", "-F", str(tcsh_account), "cluster", "--", "echo $shell"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert login.returncode == 0 and login.stdout.strip().endswith("tcsh"), login
    probe = subprocess.run(["ssh", "-F", str(tcsh_account), "cluster", "--", "printf '%s|' '!x'"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert probe.stdout != "!x|" and "Event not found" in probe.stderr, probe
    site = Site(tmp_path, arena, tcsh_account, "trust-shell")
    result = site.update()
    assert result.exit_code == 77, result.stdout
    receipt = result.json()
    message = " ".join(receipt["errors"])
    assert "the login shell on cluster does not parse commands as a POSIX shell does" in message
    assert "chsh -s /bin/bash" in message and "only read-only checks ran; nothing was changed" in message
    assert all(s["status"] in ("skipped", "failed", "planned") for s in receipt["steps"]), receipt["steps"]
    assert not site.verify_log.exists() and not site.deployed.exists() and not site.marker.exists()
    assert not (site.scratch / ".vq-admin").exists()
    site.assert_no_verified_state()
