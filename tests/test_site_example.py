"""The example site provider (site_example/): its CLI against disposable roots
built from real git archives, and its pluggy provider's argv.

The CLI runs as ``python -m vq_site_example.cli`` with ``site_example/`` on
PYTHONPATH, so these tests do not depend on how the package was installed.
"""

from __future__ import annotations

import ast
import configparser
import fcntl
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pluggy
import pytest

from vq_admin_hookspecs import ProviderCommand, RuntimeRequest, VerifyReceipt, specs

SITE_DIR = Path(__file__).resolve().parents[1] / "site_example"
if str(SITE_DIR) not in sys.path:
    sys.path.insert(0, str(SITE_DIR))

from vq_site_example import cli, plugin  # noqa: E402

SELFTEST_OK = "import vqmod\nprint('selftest {label} ok', vqmod.__version__)\n"
SELFTEST_FAIL = "import sys\nprint('selftest {label} failing')\nsys.exit(1)\n"


# -- helpers ----------------------------------------------------------------------


def _git_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(HOME=str(home), GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.org")
    return env


def _git(repo: Path, *argv: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *argv], env=_git_env(repo.parent),
                          capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def _commit(repo: Path, label: str, selftest: str) -> str:
    (repo / "vq_selftest.py").write_text(selftest.format(label=label))
    (repo / "vqmod").mkdir(exist_ok=True)
    (repo / "vqmod" / "__init__.py").write_text(f"__version__ = '{label}'\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"commit {label}")
    return _git(repo, "rev-parse", "HEAD")


def _write_stage(stage: Path, archive_bytes: bytes, source_sha: str, archive_sha256: str | None = None) -> Path:
    stage.mkdir(parents=True)
    (stage / "source.tar").write_bytes(archive_bytes)
    digest = archive_sha256 or hashlib.sha256(archive_bytes).hexdigest()
    (stage / "ARCHIVE-SHA256").write_text(digest + "\n")
    (stage / "SOURCE-SHA").write_text(source_sha + "\n")
    return stage / "source.tar"


@pytest.fixture(scope="module")
def commits(tmp_path_factory):
    """A real git repo with commits A, B (passing selftests) and C (failing
    selftest); ``archives[label]`` is ``git archive --format=tar <sha>``."""
    base = tmp_path_factory.mktemp("site-example-git")
    repo = base / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    shas, archives = {}, {}
    for label, text in (("A", SELFTEST_OK), ("B", SELFTEST_OK), ("C", SELFTEST_FAIL)):
        sha = _commit(repo, label, text)
        shas[label] = sha
        out = base / f"{label}.tar"
        _git(repo, "archive", "--format=tar", "-o", str(out), sha)
        archives[label] = out.read_bytes()
    return shas, archives


@pytest.fixture
def world(tmp_path, commits):
    """A fresh (not yet created) runtime root and a correct stage per commit."""
    shas, archives = commits
    stages = {label: _write_stage(tmp_path / f"stage-{label}", archives[label], shas[label])
              for label in shas}
    return {"root": tmp_path / "apps" / "vibeqc", "sha": shas, "stage": stages,
            "archive": archives, "tmp": tmp_path}


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "vq_site_example.cli", *argv],
                          capture_output=True, text=True, env=env, timeout=300)


def deploy(world, label: str, verb: str = "deploy", stage: Path | None = None,
           site: tuple[str, ...] = (), tag: str | None = None, sha: str | None = None):
    argv = [verb, "--root", str(world["root"]), *site, "--program", "vibeqc",
            "--expected-sha", sha or world["sha"][label]]
    if tag is not None:
        argv += ["--tag", tag]
    argv += ["--source-archive", str(stage or world["stage"][label])]
    return run_cli(*argv)


def verify(world, label: str = "A") -> tuple[subprocess.CompletedProcess[str], VerifyReceipt]:
    proc = run_cli("verify", "--root", str(world["root"]), "--program", "vibeqc",
                   "--expected-sha", world["sha"][label])
    assert proc.returncode == 0, proc.stderr
    return proc, VerifyReceipt.parse(proc.stdout)


def tree_digest(path: Path) -> str:
    """Digest of every entry below *path*: names, types, modes, contents, link targets."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            info = os.lstat(full)
            digest.update(f"{os.path.relpath(full, path)}\0{info.st_mode:o}\0".encode())
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(full).encode())
            elif stat.S_ISREG(info.st_mode):
                digest.update(Path(full).read_bytes())
    return digest.hexdigest()


def listing(root: Path) -> list[str]:
    releases = root / "releases"
    return sorted(os.listdir(releases)) if releases.exists() else []


def current(root: Path) -> str | None:
    link = root / "current"
    return os.readlink(link) if os.path.lexists(link) else None


def metrics(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^VQ-DEPLOY-METRIC (\w+)=(\S+)$", stdout, re.M))


# -- deploy, install, verify --------------------------------------------------------


def test_install_builds_release_and_switches_current(world):
    root, sha = world["root"], world["sha"]["A"]
    proc = deploy(world, "A", verb="install", site=("--jobs", "4", "--note", "first install"))
    assert proc.returncode == 0, proc.stderr
    release = root / "releases" / sha
    launcher = release / "bin" / f"vibeqc-{sha}"
    assert os.access(launcher, os.X_OK) and f"VQ_SOURCE_SHA={sha}\n" in launcher.read_text()
    assert current(root) == f"releases/{sha}"
    assert (release / "SOURCE-SHA").read_text() == sha + "\n"
    assert (release / "PROGRAM").read_text() == "vibeqc\n"
    assert (release / "TAG").read_text() == ""
    assert (release / "VALIDATED").is_file()
    log = (release / "BUILD-LOG").read_text()
    assert "selftest A ok A" in log and "note: first install" in log and "jobs: 4" in log
    found = metrics(proc.stdout)
    assert float(found["build_seconds"]) >= 0
    assert int(found["release_bytes"]) > 0
    assert not (root / ".updater.pid").exists()
    assert [n for n in listing(root) if n.startswith(".partial")] == []
    # the .pth makes the source importable from any cwd, with PYTHON* cleaned
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([str(launcher), "-c", "import os, sys, vqmod; print(vqmod.__version__, sys.prefix, "
                          "os.environ['VQ_SOURCE_SHA'])"], cwd=world["tmp"], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["A", str(release / "source" / ".venv"), sha]  # the generation's interpreter
    # venv activate scripts name the published place, not the partial build dir
    assert ".partial." not in (release / "source" / ".venv" / "bin" / "activate").read_text()


def test_each_generation_has_a_launcher_of_its_own(world):
    """The venv's python is the shared base interpreter for every release; the launcher names its
    generation, so the attested SHA-256 tells generations apart."""
    root, sha = world["root"], world["sha"]
    assert deploy(world, "A", verb="install").returncode == 0
    _proc, first = verify(world, "A")
    assert deploy(world, "B").returncode == 0
    _proc, second = verify(world, "B")
    assert first.healthy and second.healthy
    assert (first.active_path, second.active_path) == (f"{root}/releases/{sha['A']}/bin/vibeqc-{sha['A']}",
                                                        f"{root}/releases/{sha['B']}/bin/vibeqc-{sha['B']}")
    assert first.active_path_sha256 != second.active_path_sha256
    venv_pythons = {hashlib.sha256(Path(root / "releases" / sha[k] / "source/.venv/bin/python").read_bytes())
                    .hexdigest() for k in "AB"}
    assert len(venv_pythons) == 1 and not venv_pythons & {first.active_path_sha256, second.active_path_sha256}


def test_deploy_requires_existing_root(world):
    proc = deploy(world, "A")
    assert proc.returncode == 2
    assert "install" in proc.stderr
    assert not world["root"].exists()


def test_verify_reports_the_active_release(world):
    root, sha = world["root"], world["sha"]["A"]
    assert deploy(world, "A", verb="install", tag="v1.0").returncode == 0
    before = tree_digest(root / "releases" / sha)
    proc, receipt = verify(world)
    assert receipt.program == "vibeqc"
    assert receipt.source_sha == sha
    assert receipt.tag == "v1.0"
    assert receipt.healthy is True
    assert receipt.activation == "atomic"
    assert receipt.quiescent is True and receipt.updater_pid is None
    expected_path = f"{root}/releases/{sha}/bin/vibeqc-{sha}"
    assert receipt.active_path == expected_path and "current" not in receipt.active_path
    assert receipt.active_path_sha256 == hashlib.sha256(Path(expected_path).read_bytes()).hexdigest()
    assert json.loads(proc.stdout) == receipt.to_dict()  # exactly one object on stdout
    assert tree_digest(root / "releases" / sha) == before  # verify wrote nothing into the release
    # neither the build-time selftest nor verify's health run wrote bytecode into it
    assert list((root / "releases" / sha).rglob("__pycache__")) == []


def test_verify_without_anything_active(world):
    _proc, receipt = verify(world)
    assert receipt.healthy is False
    assert receipt.activation == "none"
    assert receipt.source_sha == "" and receipt.active_path == ""
    assert not world["root"].exists()


@pytest.mark.parametrize("target", ["/usr", "releases/not-a-sha", "releases/" + "f" * 40])
def test_verify_with_current_pointing_elsewhere(world, target):
    assert deploy(world, "A", verb="install").returncode == 0
    os.replace(world["root"] / "current", world["tmp"] / "saved-link")
    os.symlink(target, world["root"] / "current")
    _proc, receipt = verify(world)
    assert receipt.activation == "unknown"
    assert receipt.healthy is False and receipt.source_sha == "" and receipt.active_path == ""


def test_second_deploy_keeps_first_release_and_moves_current(world):
    root, sha = world["root"], world["sha"]
    assert deploy(world, "A", verb="install").returncode == 0
    first = tree_digest(root / "releases" / sha["A"])
    proc = deploy(world, "B")
    assert proc.returncode == 0, proc.stderr
    assert tree_digest(root / "releases" / sha["A"]) == first
    assert current(root) == f"releases/{sha['B']}"
    assert listing(root) == sorted([sha["A"], sha["B"]])
    _proc, receipt = verify(world, "B")
    assert receipt.source_sha == sha["B"] and receipt.healthy


def test_redeploy_reuses_validated_release_unchanged(world):
    root, sha = world["root"], world["sha"]["A"]
    assert deploy(world, "A", verb="install").returncode == 0
    before = tree_digest(root / "releases" / sha)
    proc = deploy(world, "A")
    assert proc.returncode == 0, proc.stderr
    assert metrics(proc.stdout)["release_reused"] == "1"
    assert tree_digest(root / "releases" / sha) == before
    assert current(root) == f"releases/{sha}"


def test_a_reused_release_failing_validation_now_leaves_current_unchanged(world):
    """"existing release ... fails validation now (...); current unchanged": true, and byte for byte."""
    root, sha_a, sha_b = world["root"], world["sha"]["A"], world["sha"]["B"]
    assert deploy(world, "A", verb="install").returncode == 0
    assert deploy(world, "B").returncode == 0
    selftest = root / "releases" / sha_a / "source" / "vq_selftest.py"
    selftest.chmod(0o644)
    selftest.write_text(SELFTEST_FAIL.format(label="A"))
    before = {label: tree_digest(root / "releases" / sha) for label, sha in (("A", sha_a), ("B", sha_b))}
    state = (listing(root), current(root))
    proc = deploy(world, "A")
    assert proc.returncode == 1 and "fails validation now" in proc.stderr and "current unchanged" in proc.stderr, \
        proc.stderr
    _assert_untouched(world, *state)
    assert state[1] == f"releases/{sha_b}"
    assert {label: tree_digest(root / "releases" / sha) for label, sha in (("A", sha_a), ("B", sha_b))} == before

def test_sigterm_during_the_build_leaves_current_unchanged(world, tmp_path):
    """"terminated by signal 15; current unchanged unless the switch had completed": a SIGTERM while the
    build's selftest runs (before the switch) leaves current, the releases and no pid file behind."""
    import signal
    import time

    root = world["root"]
    assert deploy(world, "A", verb="install").returncode == 0
    repo, started = tmp_path / "slow-repo", tmp_path / "selftest-started"
    repo.mkdir()
    _git(repo, "init", "-q")
    slow = (f"import os, pathlib, time\npathlib.Path({str(started)!r}).write_text(str(os.getpid()))\n"
            "time.sleep(30)\n")
    sha = _commit(repo, "D", slow.replace("{", "{{").replace("}", "}}"))
    _git(repo, "archive", "--format=tar", "-o", str(tmp_path / "D.tar"), sha)
    stage = _write_stage(tmp_path / "stage-D", (tmp_path / "D.tar").read_bytes(), sha)
    state = (listing(root), current(root))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SITE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "vq_site_example.cli", "deploy", "--root", str(root), "--program",
                             "vibeqc", "--expected-sha", sha, "--source-archive", str(stage)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (started.exists() and started.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the build's selftest never started"
        proc.send_signal(signal.SIGTERM)  # as a time limit sends it, to the whole job: the selftest too
        os.kill(int(started.read_text()), signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if started.exists():
            try:
                os.kill(int(started.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    assert proc.returncode == 1 and "terminated by signal 15; current unchanged" in err, err
    _assert_untouched(world, *state)

def test_redeploy_with_other_tag_refuses_to_rewrite(world):
    root, sha = world["root"], world["sha"]
    assert deploy(world, "A", verb="install").returncode == 0
    assert deploy(world, "B").returncode == 0
    before = tree_digest(root / "releases" / sha["A"])
    proc = deploy(world, "A", tag="v2")
    assert proc.returncode == 1
    assert "TAG" in proc.stderr
    assert tree_digest(root / "releases" / sha["A"]) == before
    assert current(root) == f"releases/{sha['B']}"


# -- identity -------------------------------------------------------------------------


def _assert_untouched(world, before_listing, before_current):
    assert listing(world["root"]) == before_listing
    assert current(world["root"]) == before_current
    assert not (world["root"] / ".updater.pid").exists()


def test_tampered_archive_is_refused(world):
    assert deploy(world, "A", verb="install").returncode == 0
    state = (listing(world["root"]), current(world["root"]))
    data = bytearray(world["archive"]["B"])
    at = data.index(b"selftest B ok")
    data[at] ^= 0x01  # one byte; ARCHIVE-SHA256 still names the original
    stage = _write_stage(world["tmp"] / "tampered", bytes(data), world["sha"]["B"],
                         archive_sha256=hashlib.sha256(world["archive"]["B"]).hexdigest())
    proc = deploy(world, "B", stage=stage)
    assert proc.returncode == 3
    assert "ARCHIVE-SHA256" in proc.stderr
    _assert_untouched(world, *state)


def test_source_sha_mismatch_is_refused(world):
    assert deploy(world, "A", verb="install").returncode == 0
    state = (listing(world["root"]), current(world["root"]))
    stage = _write_stage(world["tmp"] / "wrong-source", world["archive"]["B"], world["sha"]["A"])
    proc = deploy(world, "B", stage=stage)
    assert proc.returncode == 3
    assert "SOURCE-SHA" in proc.stderr
    _assert_untouched(world, *state)


def test_archive_of_another_commit_is_refused(world):
    """Checksum and SOURCE-SHA agree with the request, but the archive's pax
    comment (the commit git archive was run on) does not."""
    assert deploy(world, "A", verb="install").returncode == 0
    state = (listing(world["root"]), current(world["root"]))
    stage = _write_stage(world["tmp"] / "other-commit", world["archive"]["A"], world["sha"]["B"])
    proc = deploy(world, "B", stage=stage)
    assert proc.returncode == 3
    assert "pax global comment" in proc.stderr and world["sha"]["A"] in proc.stderr
    _assert_untouched(world, *state)


def _crafted_tar(sha: str, member: tarfile.TarInfo) -> bytes:
    import io
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": sha}) as tar:
        ok = tarfile.TarInfo("vq_selftest.py")
        body = b"print('ok')\n"
        ok.size = len(body)
        tar.addfile(ok, io.BytesIO(body))
        tar.addfile(member, io.BytesIO(b"x") if member.isfile() else None)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "link-outside", "device"])
def test_unsafe_archive_members_are_refused(world, kind):
    member = tarfile.TarInfo({"dotdot": "../evil", "absolute": "/tmp/evil-abs"}.get(kind, "evil"))
    if kind in ("dotdot", "absolute"):
        member.size = 1
    elif kind == "link-outside":
        member.type, member.linkname = tarfile.SYMTYPE, "../../../outside"
    else:
        member.type = tarfile.CHRTYPE
    sha = world["sha"]["B"]
    stage = _write_stage(world["tmp"] / f"unsafe-{kind}", _crafted_tar(sha, member), sha)
    assert deploy(world, "A", verb="install").returncode == 0
    state = (listing(world["root"]), current(world["root"]))
    proc = deploy(world, "B", stage=stage)
    assert proc.returncode == 1
    assert "evil" in proc.stderr
    _assert_untouched(world, *state)
    assert not (world["root"] / "releases" / "evil").exists()


# -- failures, locking, symlinks ------------------------------------------------------


def test_failing_selftest_leaves_current_on_old_release(world):
    root, sha = world["root"], world["sha"]
    assert deploy(world, "A", verb="install").returncode == 0
    state = (listing(root), current(root))
    proc = deploy(world, "C")
    assert proc.returncode == 1
    assert "selftest C failing" in proc.stderr and "validation failed" in proc.stderr
    _assert_untouched(world, *state)
    _proc, receipt = verify(world)
    assert receipt.source_sha == sha["A"] and receipt.healthy


def test_held_lock_exits_75_and_verify_reports_it(world):
    root = world["root"]
    assert deploy(world, "A", verb="install").returncode == 0
    fd = os.open(root / ".deploy.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (root / ".updater.pid").write_text("4242\n")
        proc = deploy(world, "B")
        assert proc.returncode == 75
        assert "4242" in proc.stderr
        _proc, receipt = verify(world)
        assert receipt.quiescent is False and receipt.updater_pid == 4242
    finally:
        os.close(fd)
    (root / ".updater.pid").unlink()
    assert current(root) == f"releases/{world['sha']['A']}"
    _proc, receipt = verify(world)
    assert receipt.quiescent is True and receipt.updater_pid is None


def test_planted_pid_symlink_is_replaced_not_followed(world):
    root = world["root"]
    root.mkdir(parents=True)
    victim = world["tmp"] / "victim"
    victim.write_text("keep\n")
    os.symlink(victim, root / ".updater.pid")
    assert deploy(world, "A", verb="install").returncode == 0
    assert victim.read_text() == "keep\n"
    assert not os.path.lexists(root / ".updater.pid")


def test_symlinked_releases_dir_is_refused(world):
    root = world["root"]
    root.mkdir(parents=True)
    elsewhere = world["tmp"] / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "releases")
    proc = deploy(world, "A", verb="install")
    assert proc.returncode == 2
    assert os.listdir(elsewhere) == []


# -- command line -------------------------------------------------------------------


@pytest.mark.parametrize("extra, needle", [
    (("--frobnicate", "1"), "unrecognized"),
    (("--jobs", "0"), "--jobs"),
    (("--note", "two\nlines"), "--note"),
    (("--program", "other"), "more than once"),
    (("--prog", "other"), "unrecognized"),
])
def test_bad_site_args_are_usage_errors(world, extra, needle):
    world["root"].mkdir(parents=True)
    proc = deploy(world, "A", site=extra)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert listing(world["root"]) == [] and proc.stdout == ""


@pytest.mark.parametrize("sha", ["abc1234", "HEAD", "g" * 40, "a" * 41])
def test_sha_must_be_full(world, sha):
    world["root"].mkdir(parents=True)
    proc = deploy(world, "A", sha=sha)
    assert proc.returncode == 2
    assert "40 or 64 hex" in proc.stderr


def test_upper_case_sha_is_stored_lower(world):
    sha = world["sha"]["A"]
    proc = deploy(world, "A", verb="install", sha=sha.upper())
    assert proc.returncode == 0, proc.stderr
    assert current(world["root"]) == f"releases/{sha}"


def test_missing_source_archive_is_usage_error(world):
    proc = run_cli("install", "--root", str(world["root"]), "--program", "vibeqc",
                   "--expected-sha", world["sha"]["A"])
    assert proc.returncode == 2 and "--source-archive" in proc.stderr
    assert not world["root"].exists()


# -- the provider plugin ----------------------------------------------------------------

SHA40 = "0123456789abcdef0123456789abcdef01234567"


def _request(**overrides) -> RuntimeRequest:
    fields = dict(program="vibeqc-release", host="cluster", expected_sha=SHA40.upper(), tag="v1.2.3",
                  update_script_args=("--jobs", "8", "--note", "hi"),
                  source_archive="/scratch/stage/source.tar", where="build-host",
                  settings={"provider_options": {"root": "/apps/vibeqc"}})
    fields.update(overrides)
    return RuntimeRequest(**fields)


def test_plugin_update_and_install_argv():
    for hook, verb in ((plugin.vq_admin_runtime_update, "deploy"), (plugin.vq_admin_runtime_install, "install")):
        command = hook(request=_request())
        assert isinstance(command, ProviderCommand)
        assert command.argv == ("vq-site-example", verb, "--root", "/apps/vibeqc", "--jobs", "8",
                                "--note", "hi", "--program", "vibeqc-release", "--expected-sha", SHA40,
                                "--tag", "v1.2.3", "--source-archive", "/scratch/stage/source.tar")
        cli.build_parser().parse_args(command.argv[1:])  # the CLI accepts exactly what the plugin emits


def test_plugin_verify_argv_and_options():
    settings = {"provider_options": {"root": "/apps/vibeqc", "command": "/site/bin/vq-site-example"}}
    command = plugin.vq_admin_runtime_verify(request=_request(tag=None, source_archive=None, settings=settings))
    assert command.argv == ("/site/bin/vq-site-example", "verify", "--root", "/apps/vibeqc",
                            "--program", "vibeqc-release", "--expected-sha", SHA40)
    cli.build_parser().parse_args(command.argv[1:])
    update = plugin.vq_admin_runtime_update(request=_request(tag=None, source_archive=None,
                                                             update_script_args=()))
    assert update.argv == ("vq-site-example", "deploy", "--root", "/apps/vibeqc",
                           "--program", "vibeqc-release", "--expected-sha", SHA40)


_VERIFY_WORDS = ["verify", "--root", "/apps/x/", "--program", "vibeqc", "--expected-sha", SHA40.upper()]


@pytest.mark.parametrize("words, plain", [
    (_VERIFY_WORDS, True),
    (_VERIFY_WORDS + ["--tag", "v1.2"], True),
    (["verify", "--expected-sha", SHA40, "--tag", "v1", "--program", "p", "--root", "/r"], True),
    (_VERIFY_WORDS[:5], False),  # --expected-sha missing: the full parser's usage error
    (_VERIFY_WORDS + ["--program", "other"], False),  # twice
    (_VERIFY_WORDS + ["--tag"], False),
    (_VERIFY_WORDS[:6] + [SHA40[:12]], False),  # an abbreviated SHA
    (_VERIFY_WORDS[:2] + ["apps/x"] + _VERIFY_WORDS[3:], False),  # a relative root
    (_VERIFY_WORDS + ["--tag", "a..b"], False),
    (_VERIFY_WORDS[:3] + ["--prog", "vibeqc"] + _VERIFY_WORDS[5:], False),  # abbreviations: the parser refuses
    (["deploy"] + _VERIFY_WORDS[1:], False),
    (_VERIFY_WORDS + ["--help"], False),
])
def test_verify_words_read_without_the_parser_as_the_parser_reads_them(words, plain):
    """verify, on every update, skips building the grammar for the words vq-admin builds: the same namespace,
    and anything else is the full parser's to read or refuse."""
    got = cli.plain_verify(words)
    assert (got is not None) is plain
    if plain:
        full = vars(cli.build_parser().parse_args(words))
        assert vars(got) == {k: v for k, v in full.items() if not k.startswith("_seen_")}


@pytest.mark.parametrize("options", [{"root": "apps/vibeqc"}, {}, {"root": ""}, None])
def test_plugin_rejects_missing_or_relative_root(options):
    settings = {} if options is None else {"provider_options": options}
    for hook in (plugin.vq_admin_runtime_update, plugin.vq_admin_runtime_install, plugin.vq_admin_runtime_verify):
        with pytest.raises(ValueError, match=r"provider_options\.root"):
            hook(request=_request(settings=settings))


def test_plugin_registers_with_pluggy():
    pm = pluggy.PluginManager("vq_admin")
    pm.add_hookspecs(specs)
    pm.register(plugin, name="site_example")
    command = pm.hook.vq_admin_runtime_update(request=_request())
    assert command.argv[:2] == ("vq-site-example", "deploy")
    assert pm.hook.vq_admin_helper_update.get_hookimpls() == []


def test_distribution_metadata_and_dependencies():
    cfg = configparser.ConfigParser()
    cfg.read(SITE_DIR / "setup.cfg")
    assert cfg["metadata"]["name"] == "vq-site-example"
    assert cfg["options"]["install_requires"].split() == ["vq-admin-hookspecs>=1.2"]
    entry = cfg["options.entry_points"]
    assert "site_example = vq_site_example.plugin" in entry["vq_admin.providers"]
    assert "vq-site-example = vq_site_example.cli:main" in entry["console_scripts"]
    for path in (SITE_DIR / "vq_site_example").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                assert top != "vq_admin", f"{path.name} imports {name}"
                assert top in sys.stdlib_module_names or top in ("vq_admin_hookspecs", "vq_admin_identifiers"), \
                    f"{path.name} imports {name}"
                assert top == "__future__" or not top.startswith("_"), f"{path.name} imports the private {name}"


def test_confirm_computes_through_the_launcher_and_prints_its_metrics(world):
    """``confirm`` (run inside the confirmation job): the real launcher runs the computation; a launcher
    of another generation is refused."""
    root, sha = world["root"], world["sha"]["A"]
    assert deploy(world, "A", verb="install").returncode == 0
    launcher = f"{root}/releases/{sha}/bin/vibeqc-{sha}"
    done = run_cli("confirm", "--program", "vibeqc", "--expected-sha", sha, "--launcher", launcher)
    assert done.returncode == 0, done.stderr
    assert f"computed 1332.221259 through {launcher}" in done.stdout
    assert re.search(r"^VQ-DEPLOY-METRIC seconds_per_step=\d+\.\d{6}$", done.stdout, re.M)
    assert re.search(r"^VQ-DEPLOY-METRIC energy_digest=[0-9a-f]{16}$", done.stdout, re.M)
    other = run_cli("confirm", "--program", "vibeqc", "--expected-sha", world["sha"]["B"], "--launcher", launcher)
    assert other.returncode == 1 and "is not the launcher of vibeqc" in other.stderr


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, link
    return member


@pytest.mark.parametrize("member, refusal", [
    (_member("a/../../x"), "absolute or '..' names are refused"),
    (_member("/etc/x"), "absolute or '..' names are refused"),
    (_member("./.venv/bin/python"), "the source must not carry its own .venv"),
    (_member("dev", tarfile.CHRTYPE), "special files (devices, FIFOs) are refused"),
    (_member("fifo", tarfile.FIFOTYPE), "special files (devices, FIFOs) are refused"),
    (_member("l", tarfile.SYMTYPE, "/etc/passwd"), "link target '/etc/passwd' is absolute"),
    (_member("a/l", tarfile.SYMTYPE, "../../x"), "link target '../../x' points outside the source tree"),
    (_member("h", tarfile.LNKTYPE, "../x"), "link target '../x' points outside the source tree"),
    (_member("a/ok", tarfile.SYMTYPE, "../x"), None),
    (_member("a/b/file"), None),
])
def test_each_unsafe_member_is_refused_naming_why(member, refusal):
    from vq_site_example.errors import SiteError
    from vq_site_example.unpack import screen_member

    if refusal is None:
        screen_member(member)
        return
    with pytest.raises(SiteError) as raised:
        screen_member(member)
    assert str(raised.value) == f"archive member {member.name!r}: {refusal}"
