"""Trust, round two (issue 25; CONTRACT section 10, version 3): each attack run for real.

The administrator is this test process (root); the attacker is ``vqht<pid>``, an unprivileged user
the fixture creates (and removes) in a group of its own, acting through ``setpriv``.  Each attack
needs one path the administrator made writable by that group, as on a shared software tree.
Every test asserts the exit code, that the attacker's marker file does not exist, that nothing
under the state directory changed, and that no traceback reached the output.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from support import AGENT, NOTHING_ACTIVE, GitRepo, command_host, git, run_vq, tree_digest, write_config
from vq_admin import source
from vq_admin.core import securepath
from vq_admin.core.bounds import InputError, loads_json, loads_toml
from vq_admin.source.mirror_feed import Feed
from vq_admin.report.outcome import Refused
from vq_admin.ssh.transport import LocalTransport

#: Unique to these tests and to this process (other test files, and other xdist workers, run concurrently).
ATTACKER = f"vqht{os.getpid()}"
AS_ATTACKER = ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups", "--"]


@pytest.fixture(scope="module")
def attacker():
    """The user and group :data:`ATTACKER` (created here, removed at the end); its gid."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("useradd"):
        pytest.skip("needs root, setpriv and useradd to act as another local user")
    for undo in (["userdel", ATTACKER], ["groupdel", ATTACKER]):  # a run killed before its clean-up
        subprocess.run(undo, capture_output=True)
    subprocess.run(["groupadd", ATTACKER], check=True)
    subprocess.run(["useradd", "-g", ATTACKER, "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", ATTACKER],
                   check=True)
    try:
        yield grp.getgrnam(ATTACKER).gr_gid
    finally:
        subprocess.run(["userdel", ATTACKER], check=True)
        subprocess.run(["groupdel", ATTACKER], capture_output=True)


def attack(script: str) -> None:
    """Run the shell *script* as the attacker; it must succeed (the attack is possible)."""
    done = subprocess.run([*AS_ATTACKER, "/bin/sh", "-ec", script], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"the attack itself failed: {done.stderr}"


@pytest.fixture
def arena(attacker):
    """A root-owned directory (0755) below /tmp the attacker can reach; ``shared(name)`` makes a
    directory there group-writable by the attacker's group (2775 root:ATTACKER)."""
    base = Path(tempfile.mkdtemp(prefix="vq-trust2-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def shared(path: Path, gid: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, 0, gid)
    path.chmod(0o2775)
    return path


def group_writable(path: Path, gid: int) -> None:
    os.chown(path, 0, gid)
    path.chmod(path.stat().st_mode | 0o060)


class Site:
    """A private source repository, scratch and state, and a command-provider host over the real sshd."""

    def __init__(self, tmp: Path, arena: Path, ssh_config: Path | str, *, repo: GitRepo | None = None,
                 scratch: Path | None = None, update: str | None = None, verify: str | None = None,
                 program: str = "trust2"):
        self.repo = repo or GitRepo(tmp / "repo")
        self.sha = self.repo.commit("A")
        self.state = tmp / "state"
        self.marker = arena / "pwned"
        self.deployed = arena / "deployed"
        self.program = program
        self.scratch = scratch or arena / "scratch"
        self.scratch.mkdir(exist_ok=True)
        if verify is None:  # nothing installed yet: the nothing-active receipt, which proves nothing
            verify_file = arena / "verify.sh"
            verify_file.write_text("#!/bin/sh\necho '" + json.dumps(dict(NOTHING_ACTIVE, program=program)) + "'\n")
            verify_file.chmod(0o755)
            verify = str(verify_file)
        if update is None:
            deploy = arena / "deploy.sh"
            deploy.write_text(f"#!/bin/sh\ntouch {self.deployed}\n")
            deploy.chmod(0o755)
            update = str(deploy)
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{ssh_config}"\n\n' + command_host(
            program, scratch=self.scratch, repo=self.repo.path, update=update, verify=verify, timeout_seconds=120))

    def vq(self, *args: str, env: dict[str, str] | None = None):
        result = run_vq(*args, config=self.config, state=self.state, env=env, timeout=300)
        assert "Traceback" not in result.stderr + result.stdout, result.stderr
        return result

    def update(self, *extra: str):
        return self.vq("update", self.program, "cluster", "--expected-sha", self.sha, *extra)


def state_of(state: Path) -> dict[str, str]:
    """Everything under the state directory (the early-start note aside: it is being removed)."""
    return {k: v for k, v in tree_digest(state).items() if not k.startswith("early-start")}


#: What a run refused inside its lane writes by contract: its receipt (and the history index), the
#: admin-log line and the lane's last-run record.  Never a registry entry, LAST OK or LAST GOOD.
REFUSAL_RECORDS = ("receipts", "admin.log", "hosts", "locks")


def assert_only_the_refusal_recorded(before: dict[str, str], state: Path) -> None:
    after = state_of(state)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert all(k.split("/")[0] in REFUSAL_RECORDS for k in changed), changed
    assert not any(k.endswith(("last-ok.json", "last-good.json")) for k in changed), changed
    assert all(before.get(k) == after.get(k) for k in before), "an existing record changed"


def assert_refused(result, *needles: str) -> str:
    assert result.exit_code == 77, (result.exit_code, result.stdout[-2000:], result.stderr[-2000:])
    text = result.stdout + result.stderr
    print(f"REFUSAL {result.exit_code}: {text.strip()}")  # shown with -s: the refusal texts, for the record
    for needle in needles:
        assert needle in text, text[-3000:]
    return text


# -- 1. source_repo ---------------------------------------------------------------------------


def test_group_writable_source_repo_with_a_planted_filter_is_refused(tmp_path, arena, attacker, real_sshd):
    repo = GitRepo(arena / "repo")
    site = Site(tmp_path, arena, real_sshd.ssh_config, repo=repo)
    gitdir = Path(repo.path) / ".git"
    group_writable(gitdir, attacker)
    group_writable(gitdir / "config", attacker)
    (gitdir / "info").mkdir(exist_ok=True)
    group_writable(gitdir / "info", attacker)
    evil = f"touch {site.marker}; cat"
    attack(f"printf '[filter \"evil\"]\\n\\tsmudge = {evil}\\n[core]\\n\\tfsmonitor = touch {site.marker}\\n' "
           f">> {gitdir}/config; echo '* filter=evil' > {gitdir}/info/attributes")
    before = state_of(site.state)
    for extra in (("--dry-run",), ()):
        done = site.update(*extra)
        assert_refused(done, f"directory {gitdir} is group-writable", "another user could make git run a program")
        assert not site.marker.exists() and not site.deployed.exists()
        if extra:
            assert state_of(site.state) == before  # a dry run records nothing
    assert_only_the_refusal_recorded(before, site.state)


def test_group_writable_helper_source_repo_is_refused_before_git_status(tmp_path, arena, attacker):
    """The helper lane's ``git status`` (``update HOST`` without ``--expected-sha``) ran core.fsmonitor."""
    repo = GitRepo(arena / "helper-repo")
    repo.commit("A")
    gitdir = Path(repo.path) / ".git"
    group_writable(gitdir / "config", attacker)
    marker = arena / "pwned"
    attack(f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> {gitdir}/config")
    with pytest.raises(Refused, match=f"helper source repository: file {gitdir}/config is group-writable"):
        source.head_commit(repo.path)
    assert not marker.exists()


# -- 2. git runs no repository-controlled program ---------------------------------------------


def test_git_runs_no_program_a_private_repository_names(tmp_path):
    """Even the administrator's own repository: hooks, fsmonitor, filter drivers, info/attributes."""
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A", {"data.txt": "plain\n"})
    marker = tmp_path / "ran"
    gitdir = Path(repo.path) / ".git"
    git(repo.path, "config", "filter.evil.smudge", f"touch {marker}; cat")
    git(repo.path, "config", "filter.evil.clean", f"touch {marker}; cat")
    git(repo.path, "config", "filter.evil.required", "true")
    git(repo.path, "config", "core.fsmonitor", f"touch {marker}")
    (gitdir / "info").mkdir(exist_ok=True)
    (gitdir / "info" / "attributes").write_text("* filter=evil\n* export-ignore\n")
    for hook in ("post-checkout", "pre-push", "reference-transaction", "post-index-change"):
        (gitdir / "hooks" / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (gitdir / "hooks" / hook).chmod(0o755)
    (Path(repo.path) / "data.txt").touch()  # racy stat: status would clean it through the filter
    ident = source.resolve(repo.path, sha, None)
    work = tmp_path / "work"
    work.mkdir()
    made = source.make_archive(ident, str(work))  # info/attributes' export-ignore would empty it: refused then
    assert made.git_tree == ident.git_tree and made.archive_bytes
    assert source.head_commit(repo.path) == sha
    assert not marker.exists()


def test_feed_push_runs_the_mirror_with_its_hooks_off(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    sha = repo.commit("A")
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    marker = tmp_path / "ran"
    for hook in ("pre-receive", "update", "post-receive", "reference-transaction"):
        (mirror / "hooks" / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (mirror / "hooks" / hook).chmod(0o755)
    feed = Feed(login=LocalTransport(), path=str(mirror), repo=repo.path, sha=sha, lane="release",
                preparer_reads="pin", program="trust2", host="cluster")
    feed.feed()
    assert git(mirror, "rev-parse", f"refs/vq/pins/{sha}").strip() == sha
    assert not marker.exists()


# -- 1. the push-fed mirror on the login host --------------------------------------------------


def test_group_writable_mirror_is_refused_by_the_agent_before_a_feed(tmp_path, arena, attacker, real_sshd):
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    mirror = arena / "git" / "trust2.git"
    shared(mirror.parent, attacker)
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    group_writable(mirror / "hooks", attacker)
    attack(f"printf '#!/bin/sh\\ntouch {site.marker}\\n' > {mirror}/hooks/pre-receive; "
           f"chmod 755 {mirror}/hooks/pre-receive")
    prepare = arena / "prepare.sh"
    prepare.write_text("#!/bin/sh\nexit 0\n")
    prepare.chmod(0o755)
    text = site.config.read_text() + (f'feed_source_mirror = "{mirror}"\nprepare_command = "{prepare}"\n'
                                      'lane = "release"\npreparer_reads = "pin"\n')
    write_config(site.config, text)
    before = state_of(site.state)
    done = site.update()
    assert_refused(done, "feed_source_mirror", f"directory {mirror.parent} is group-writable")
    assert not site.marker.exists() and not site.deployed.exists()
    assert git(mirror, "for-each-ref") == ""  # nothing was fed
    assert_only_the_refusal_recorded(before, site.state)


# -- 1. programs ssh_config names ----------------------------------------------------------------


def attacked_ssh_config(tmp_path: Path, arena: Path, real_sshd, gid: int, line: str) -> tuple[Path, Path]:
    """A private copy of the real sshd's ssh_config with *line* (``{program}``: a script in a
    group-writable directory that the attacker then rewrites) added at the top."""
    tools = shared(arena / "tools", gid)
    program = tools / "proxy.sh"
    program.write_text("#!/bin/sh\nexec nc \"$@\"\n")
    program.chmod(0o755)
    config = tmp_path / "ssh_config"
    config.write_text(line.format(program=program) + "\n" + Path(real_sshd.ssh_config).read_text())
    config.chmod(0o600)
    return config, program


@pytest.mark.parametrize("line", [
    "Match exec \"{program} %h\"\n",
    "Host cluster\n    ProxyCommand {program} %h %p\n",
    "Host cluster\n    LocalCommand {program}\n    PermitLocalCommand yes\n",
    "Host cluster\n    KnownHostsCommand {program} %H\n",
], ids=["match-exec", "proxycommand", "localcommand", "knownhostscommand"])
def test_ssh_config_program_another_user_can_replace_is_refused(tmp_path, arena, attacker, real_sshd, line):
    config, program = attacked_ssh_config(tmp_path, arena, real_sshd, attacker, line)
    site = Site(tmp_path, arena, config)
    attack(f"printf '#!/bin/sh\\ntouch {site.marker}\\nexit 1\\n' > {program}.new; mv -f {program}.new {program}; "
           f"chmod 755 {program}")
    before = state_of(site.state)
    for verb in (("check",), ("update", site.program, "cluster", "--expected-sha", site.sha)):
        done = site.vq(*verb)
        assert_refused(done, str(program), ATTACKER, "ssh would run it as you")
        assert not site.marker.exists() and not site.deployed.exists()
        assert state_of(site.state) == before  # refused while the configuration is read: nothing recorded


def test_ssh_config_include_of_a_writable_file_is_refused_not_unknown(tmp_path, arena, attacker, real_sshd):
    tools = shared(arena / "tools", attacker)
    extra = tools / "extra.conf"
    extra.write_text("# site additions\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Include {extra}\n" + Path(real_sshd.ssh_config).read_text())
    config.chmod(0o600)
    site = Site(tmp_path, arena, config)
    attack(f"printf 'Host *\\n    ProxyCommand /bin/sh -c \"touch {site.marker}\"\\n' > {extra}.new; "
           f"mv -f {extra}.new {extra}")
    before = state_of(site.state)
    done = site.update()
    assert_refused(done, f"Includes: file {extra} is owned by {ATTACKER}")
    assert not site.marker.exists() and not site.deployed.exists()
    assert state_of(site.state) == before


# -- 1. the runtime a verify receipt names --------------------------------------------------------


def test_launcher_under_a_group_writable_directory_is_never_verified(tmp_path, arena, attacker, real_sshd):
    apps = shared(arena / "apps", attacker)  # 2775 root:project, a normal shared software tree
    verify = arena / "verify.py"
    site = Site(tmp_path, arena, real_sshd.ssh_config, verify=str(verify))
    launcher = apps / "toyrt" / "releases" / site.sha / "bin" / f"toyrt-{site.sha}-python"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("#!/bin/sh\nexec python3 \"$@\"\n")
    launcher.chmod(0o755)
    digest = __import__("hashlib").sha256(launcher.read_bytes()).hexdigest()
    receipt = {"program": site.program, "source_sha": site.sha, "tag": None, "healthy": True,
               "health_detail": "ok", "activation": "atomic", "quiescent": True, "updater_pid": None,
               "active_path": str(launcher), "active_path_sha256": digest}
    verify.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({json.dumps(json.dumps(receipt))})\n")
    verify.chmod(0o755)
    before = state_of(site.state)
    done = site.update("--force")
    assert_refused(done, f"directory {apps} is group-writable", "pre-verify: launcher_trust",
                   "only read-only checks ran; nothing was changed")
    assert_only_the_refusal_recorded(before, site.state)  # never verified, never registered
    assert not site.marker.exists() and not site.deployed.exists()  # refused before the build
    hashed = subprocess.run([AGENT, "hash-file", str(launcher)], capture_output=True, text=True)
    assert hashed.returncode == 77 and "sha256" not in json.loads(hashed.stdout), hashed.stdout


def test_check_on_host_refuses_a_launcher_the_attacker_replaced(tmp_path, arena, attacker, real_sshd):
    """Verified while the tree was private; the administrator then loosens ``apps`` (2775 root:project)
    and the attacker renames the runtime away and plants their own launcher at the same path."""
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    apps = arena / "apps"
    launcher = apps / "toyrt" / "releases" / site.sha / "bin" / f"toyrt-{site.sha}-python"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("#!/bin/sh\nexec python3 \"$@\"\n")
    launcher.chmod(0o755)
    digest = __import__("hashlib").sha256(launcher.read_bytes()).hexdigest()
    from vq_admin.launcher import registry
    from vq_admin.state.records import Verified

    site.state.mkdir(mode=0o700)
    registry.record_verified(site.state, "cluster", site.program, Verified(**{
        "sha": site.sha, "tag": None, "launcher": str(launcher), "launcher_sha256": digest,
        "receipt": "20260101T000000Z-runtime-cluster-trust2-00000000", "at": "2026-01-01T00:00:00Z"}))
    checked = site.vq("launcher", site.program, "cluster", "--expected-sha", site.sha, "--check-on-host")
    assert (checked.exit_code, checked.stdout) == (0, f"{launcher}\n"), checked.stderr
    shared(apps, attacker)
    attack(f"mv {apps}/toyrt {apps}/toyrt.old; mkdir -p {launcher.parent}; "
           f"printf '#!/bin/sh\\ntouch {site.marker}\\n' > {launcher}; chmod 755 {launcher}")
    before = state_of(site.state)
    done = site.vq("launcher", site.program, "cluster", "--expected-sha", site.sha, "--check-on-host")
    text = assert_refused(done, "untrusted-launcher", f"file {launcher} is owned by {ATTACKER}")
    assert str(launcher) + "\n" != done.stdout and "fix:" in text
    assert state_of(site.state) == before and not site.marker.exists()


# -- 3. a sticky scratch_root --------------------------------------------------------------------


@pytest.mark.parametrize("level", [".vq-admin", ".vq-admin/runtime-deploy"])
def test_symlink_the_attacker_planted_in_a_sticky_scratch_is_never_followed(tmp_path, arena, attacker, real_sshd,
                                                                             level):
    scratch = arena / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)  # /scratch as the docs allow
    target = tmp_path / "admins-own"  # a private directory of the administrator's
    target.mkdir()
    site = Site(tmp_path, arena, real_sshd.ssh_config, scratch=scratch)
    if "/" in level:
        (scratch / ".vq-admin").mkdir(mode=0o700)
        (scratch / ".vq-admin").chmod(0o1777)  # as if left loose: the attacker can plant below it
    attack(f"ln -s {target} {scratch / level}")
    before = state_of(site.state)
    done = site.update()
    assert_refused(done, f"{scratch / level}", ATTACKER, "symlink")
    assert list(target.iterdir()) == []  # nothing created through the link
    assert not site.deployed.exists()
    assert_only_the_refusal_recorded(before, site.state)


def test_symlink_owner_is_part_of_the_rule(tmp_path, arena, attacker):
    sticky = arena / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    attack(f"ln -s {tmp_path} {sticky}/link")
    problem = securepath.path_problem(str(sticky / "link"), what="state directory")
    assert problem and f"symlink {sticky}/link is owned by {ATTACKER}" in problem and "rm " in problem


# -- 5. bounds ----------------------------------------------------------------------------------


def test_verify_output_nested_too_deep_is_failed_in_one_line(tmp_path, arena, attacker, real_sshd):
    verify = arena / "deep.py"
    verify.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write('[' * 100000 + ']' * 100000)\n")
    verify.chmod(0o755)
    site = Site(tmp_path, arena, real_sshd.ssh_config, verify=str(verify))
    done = site.update()
    assert done.exit_code == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert "nested" in done.stdout + done.stderr
    assert not site.marker.exists()


def test_configuration_through_an_attacker_symlink_in_a_sticky_directory_is_refused(tmp_path, arena, attacker,
                                                                                    real_sshd):
    sticky = arena / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    attack(f"ln -s {site.config} {sticky}/admin.toml")  # points at the real, private file
    done = run_vq("update", site.program, "cluster", "--expected-sha", site.sha, config=sticky / "admin.toml",
                  state=site.state)
    assert done.exit_code == 2 and f"symlink {sticky}/admin.toml is owned by {ATTACKER}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not site.deployed.exists() and not site.state.exists()


def test_dotted_keys_count_toward_the_depth_bound():
    with pytest.raises(InputError, match="nested more than 64 levels"):
        loads_toml(("a" + ".a" * 100_000 + " = 1").encode(), "configuration file", limit=1 << 20)
    assert loads_toml(b'a.b.c = 1.5\nx = [1.5, 2.5]\n[t.u]\nk = "a.b.c.d"\n', "c", limit=1000)["a"] == {"b": {"c": 1.5}}


def test_registry_entry_with_a_duplicate_key_is_refused_by_every_lookup(tmp_path):
    from vq_admin.launcher import plain_lookup as fastlookup, registry

    sha = "c" * 40
    path = Path(registry.entry_path(tmp_path, "cluster", "toy", sha))
    path.parent.mkdir(parents=True, mode=0o700)
    for level in (tmp_path, tmp_path / "registry", tmp_path / "registry" / "cluster"):
        level.chmod(0o700)
    entry = {"schema": "vq-admin/registry-entry/1", "host": "cluster", "program": "toy", "sha": sha,
             "launcher": f"/apps/toy/releases/{sha}/bin/toy-{sha}-python", "launcher_sha256": "d" * 64}
    text = json.dumps(entry)[:-1] + ', "launcher": "/tmp/evil-' + sha + '"}'
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(registry.RegistryError, match="'launcher' more than once"):
        registry.lookup(tmp_path, "cluster", "toy", sha)  # the full lookup
    assert fastlookup.plain_launcher("toy", "cluster", sha, str(tmp_path)) is None  # the fast one: not an answer
    with pytest.raises(InputError, match="more than once"):
        loads_json('{"launcher": "/a", "launcher": "/b"}', "registry entry", limit=1000)


def test_loose_receipts_directory_refuses_before_the_lock_is_written(tmp_path, arena, attacker, real_sshd):
    site = Site(tmp_path, arena, real_sshd.ssh_config)
    (site.state / "receipts").mkdir(parents=True)
    site.state.chmod(0o700)
    os.chown(site.state / "receipts", pwd.getpwnam(ATTACKER).pw_uid, attacker)
    before = state_of(site.state)
    done = site.update()
    assert_refused(done, f"{site.state}/receipts")
    assert state_of(site.state) == before  # no lock, no holder, nothing
    assert not site.deployed.exists()


def test_deploy_output_kept_in_the_receipt_is_bounded(tmp_path, arena, real_sshd):
    deploy = arena / "loud.py"
    deploy.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write('x' * (12 << 20))\n")
    deploy.chmod(0o755)
    site = Site(tmp_path, arena, real_sshd.ssh_config, update=str(deploy))
    done = site.vq("update", site.program, "cluster", "--expected-sha", site.sha, "--json")
    assert done.exit_code == 1  # the verify proves nothing
    receipts = list((site.state / "receipts").glob("*.json"))
    assert len(receipts) == 1 and receipts[0].stat().st_size < 4 << 20
    output = json.loads(receipts[0].read_text())["command_output"]
    assert output["truncated"] is True and "the whole transcript is in" in output["kept"]
    assert len(output["stdout"]) <= (2 << 20) + 100 and "bytes left out: see the transcript" in output["stdout"]
    assert (Path(output["transcript"]) / "stdout").stat().st_size == 12 << 20


def test_refusal_is_refused_error(tmp_path):
    """The repository check refuses (77) through the one rule: the outcome class is Refused."""
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(Refused, match="is group- and other-writable"):
        source.check_repository(str(loose), "source repository")
