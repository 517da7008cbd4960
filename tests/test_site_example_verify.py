"""The example provider's verify, lean (issue 15): ``vq-site-example verify`` runs on the
login host for every update, the cron no-op included.

* one start of the launcher: the source's ``vq_selftest.py`` when it has one, else
  ``-c pass``; the health detail tells "could not start" (exec failed) from "exited N",
  a signal and the time bound;
* the health command spawned without ``subprocess`` (:mod:`vq_site_example.spawn`): its
  own process group, killed past the bound, no zombie, the caller's cwd unchanged;
* no ``re`` and no ``json`` on the path: the plain name checks equal the regular
  expressions and the plain JSON writer equals ``json.dumps`` (hypothesis);
* the modules the path loads, pinned in the tree and from a real non-editable install
  of the ``vq-site-example`` script (our own script, no generated wrapper).
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vq_admin_hookspecs import VerifyReceipt

SITE_DIR = Path(__file__).resolve().parents[1] / "site_example"
HOOKSPECS_DIR = Path(__file__).resolve().parents[1] / "hookspecs"
if str(SITE_DIR) not in sys.path:
    sys.path.insert(0, str(SITE_DIR))

from vq_site_example import namecheck, names, plainjson, spawn  # noqa: E402
from vq_site_example import verify as site_verify  # noqa: E402
from vq_site_example.layout import Layout  # noqa: E402

SHA = "c" * 40
#: What the verify path loads beyond a bare interpreter start (``_sha256`` is ``_sha2`` from 3.12).
VERIFY_MODULES = {
    "vq_site_example", "vq_site_example.cli", "vq_site_example.errors", "vq_site_example.verify",
    "vq_site_example.build", "vq_site_example.fsutil", "vq_site_example.layout", "vq_site_example.namecheck",
    "vq_site_example.plainjson", "vq_site_example.spawn", "__future__", "types", "errno", "fcntl", "select",
    "_sha256" if sys.version_info < (3, 12) else "_sha2",
}
#: Never on the verify path.
HEAVY = {"re", "json", "subprocess", "argparse", "typing", "dataclasses", "collections", "hashlib", "_hashlib",
         "signal", "enum", "selectors", "threading", "locale", "shutil", "tempfile", "vq_site_example.args"}


# -- a release made by hand: the launcher is a script that logs each start ------------------


def make_release(tmp: Path, launcher: str | None = None, selftest: str | None = "print('selftest ok')\n",
                 mode: int = 0o755) -> tuple[Path, Path]:
    """ROOT with ``current -> releases/SHA`` (VALIDATED, its own SHA); returns (ROOT, launcher log)."""
    root = tmp / "apps" / "vibeqc"
    release = root / "releases" / SHA
    source = release / "source"
    (source / ".venv" / "bin").mkdir(parents=True)
    for name, text in (("SOURCE-SHA", SHA), ("PROGRAM", "vibeqc"), ("TAG", ""), ("VALIDATED", "validated by hand")):
        (release / name).write_text(text + "\n")
    log = tmp / "launcher.log"
    path = source / ".venv" / "bin" / "python"
    path.write_text(launcher if launcher is not None else
                    f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\nexec {sys.executable} "$@"\n')
    path.chmod(mode)
    if selftest is not None:
        (source / "vq_selftest.py").write_text(selftest)
    os.symlink(f"releases/{SHA}", root / "current")
    return root, log


def run_verify(root: Path) -> tuple[dict[str, object], VerifyReceipt]:
    env = dict(os.environ, PYTHONPATH=str(SITE_DIR))
    done = subprocess.run([sys.executable, "-m", "vq_site_example.cli", "verify", "--root", str(root),
                           "--program", "vibeqc", "--expected-sha", SHA], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), VerifyReceipt.parse(done.stdout)


def starts(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# -- one launcher start --------------------------------------------------------------------


def test_a_source_with_a_selftest_starts_the_launcher_once(tmp_path):
    root, log = make_release(tmp_path)
    data, receipt = run_verify(root)
    assert receipt.healthy is True, receipt.health_detail
    assert starts(log) == [str(root / "releases" / SHA / "source" / "vq_selftest.py")]  # no -c pass before it
    assert "vq_selftest.py (run by the launcher) ok" in receipt.health_detail
    assert data["healthy"] is True


def test_a_source_without_a_selftest_runs_c_pass(tmp_path):
    root, log = make_release(tmp_path, selftest=None)
    _data, receipt = run_verify(root)
    assert receipt.healthy is True, receipt.health_detail
    assert starts(log) == ["-c pass"]
    assert "launcher -c pass ok" in receipt.health_detail


def test_a_failing_selftest_is_named_with_its_status_and_output(tmp_path):
    root, log = make_release(tmp_path, selftest="import sys\nprint('first')\nprint('broken import')\nsys.exit(3)\n")
    _data, receipt = run_verify(root)
    assert receipt.healthy is False
    assert "vq_selftest.py (run by the launcher) exited 3: first / broken import" in receipt.health_detail
    assert len(starts(log)) == 1


def test_a_failing_c_pass_is_named_with_its_status(tmp_path):
    root, _log = make_release(tmp_path, launcher="#!/bin/sh\necho 'no libpython' >&2\nexit 127\n", selftest=None)
    _data, receipt = run_verify(root)
    assert receipt.healthy is False
    assert "launcher -c pass exited 127: no libpython" in receipt.health_detail


@pytest.mark.parametrize("case", ["not executable", "bad interpreter line", "empty file"])
def test_a_launcher_that_cannot_start_is_told_from_one_that_exited(tmp_path, case):
    launcher = "#!/nonexistent/python3\n" if case == "bad interpreter line" else \
        "" if case == "empty file" else f"#!/bin/sh\nexec {sys.executable} \"$@\"\n"
    root, _log = make_release(tmp_path, launcher=launcher, mode=0o644 if case == "not executable" else 0o755)
    _data, receipt = run_verify(root)
    assert receipt.healthy is False
    expected = {"not executable": "launcher could not start: Permission denied",
                "bad interpreter line": "launcher could not start: No such file or directory",
                "empty file": "launcher could not start: Exec format error"}[case]
    assert expected in receipt.health_detail, receipt.health_detail
    assert "exited" not in receipt.health_detail


def test_a_selftest_killed_by_a_signal_says_so(tmp_path):
    root, _log = make_release(tmp_path, selftest="import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    _data, receipt = run_verify(root)
    assert receipt.healthy is False
    assert "vq_selftest.py (run by the launcher) was killed by signal 9" in receipt.health_detail


def test_a_selftest_past_the_bound_is_killed_with_its_group(tmp_path, monkeypatch):
    pidfile = tmp_path / "grandchild.pid"
    root, _log = make_release(tmp_path, selftest=(
        "import subprocess, time\n"
        f"p = subprocess.Popen(['sleep', '300'])\nopen({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)\n"))
    monkeypatch.setattr(site_verify, "HEALTH_TIMEOUT", 2)
    here = os.getcwd()
    started = time.monotonic()
    receipt = site_verify.inspect(Layout(str(root)))
    assert time.monotonic() - started < 30
    assert receipt["healthy"] is False
    assert "vq_selftest.py (run by the launcher) did not finish within 2 s; its process group was killed" \
        in str(receipt["health_detail"])
    assert os.getcwd() == here
    assert_gone(int(pidfile.read_text()))  # the selftest's own child too: the whole group was killed


def assert_gone(pid: int) -> None:
    """*pid* ends within 30 s (gone, or a zombie its new parent has not reaped yet)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
    pytest.fail(f"pid {pid} still runs")


# -- spawn itself ----------------------------------------------------------------------------

#: Runs spawn.run in a fresh interpreter (so its only children are the command's) and prints the outcome
#: and whether any child process (running or zombie) is left.
SPAWN_PROBE = """
import json, os, sys
sys.path.insert(0, {site!r})
from vq_site_example import spawn
if {no_pidfd!r}:
    del os.pidfd_open
here = os.getcwd()
out = spawn.run({argv!r}, {cwd!r}, dict(os.environ), {timeout!r})
try:
    left = os.waitpid(-1, os.WNOHANG)
except ChildProcessError:
    left = None
print(json.dumps({{"code": out.code, "failure": out.failure, "output": out.output, "started": out.started,
                  "left": left, "cwd_kept": os.getcwd() == here}}))
"""


def probe(tmp_path: Path, argv: list[str], timeout: float = 60, no_pidfd: bool = False) -> dict[str, object]:
    code = SPAWN_PROBE.format(site=str(SITE_DIR), argv=argv, cwd=str(tmp_path), timeout=timeout, no_pidfd=no_pidfd)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    assert result["left"] is None, result  # no child left behind, not even a zombie
    assert result["cwd_kept"] is True
    return result


@pytest.mark.parametrize("no_pidfd", [False, True], ids=["pidfd", "waitpid"])
def test_spawn_runs_in_cwd_with_dev_null_stdin_and_merged_output(tmp_path, no_pidfd):
    out = probe(tmp_path, ["/bin/sh", "-c", "pwd; cat; echo to-stderr >&2; exit 4"], no_pidfd=no_pidfd)
    assert out["code"] == 4 and out["failure"] == "exited 4" and out["started"] is True
    assert out["output"] == f"{tmp_path}\nto-stderr\n"  # cat read /dev/null: nothing


@pytest.mark.parametrize("no_pidfd", [False, True], ids=["pidfd", "waitpid"])
def test_spawn_kills_the_group_past_the_bound_and_reaps(tmp_path, no_pidfd):
    started = time.monotonic()
    out = probe(tmp_path, ["/bin/sh", "-c", f"sleep 300 & echo $! > {tmp_path}/bg; echo waiting; wait"],
                timeout=1, no_pidfd=no_pidfd)
    assert time.monotonic() - started < 60
    assert out["code"] is None and out["failure"] == "did not finish within 1 s; its process group was killed"
    assert out["output"] == "waiting\n"
    assert_gone(int((tmp_path / "bg").read_text()))


def test_spawn_does_not_wait_for_a_grandchild_holding_the_pipe(tmp_path):
    started = time.monotonic()
    out = probe(tmp_path, ["/bin/sh", "-c", f"sleep 300 & echo $! > {tmp_path}/bg; echo done"], timeout=200)
    assert out["code"] == 0 and out["failure"] == "" and out["output"] == "done\n"
    assert time.monotonic() - started < 100  # ended with the command (pidfd), not with the sleep
    os.kill(int((tmp_path / "bg").read_text()), 9)


def test_spawn_keeps_the_last_bytes_of_a_long_output(tmp_path):
    out = probe(tmp_path, [sys.executable, "-c", "import sys; sys.stdout.write('x' * 300000 + 'END')"])
    text = str(out["output"])
    assert out["code"] == 0 and len(text) == spawn.OUTPUT_LIMIT and text.endswith("xEND")


def test_spawn_reports_a_command_that_cannot_start(tmp_path):
    out = probe(tmp_path, [str(tmp_path / "missing")])
    assert out["started"] is False and out["failure"] == "could not start: No such file or directory"
    assert out["code"] is None


# -- no re, no json: exact equivalents -------------------------------------------------------

NAME_CHARS = "aZz09AF._-/+ \n\x00é.."


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.text(alphabet=NAME_CHARS, max_size=140), st.text(max_size=70),
                 st.from_regex(names.PROGRAM_RE, fullmatch=True), st.from_regex(names.TAG_RE, fullmatch=True),
                 st.from_regex(names.FULL_SHA_RE, fullmatch=True),
                 st.from_regex(names.FULL_SHA_RE, fullmatch=True).map(lambda s: s + "\n")))
def test_the_plain_name_checks_equal_the_regular_expressions(value):
    assert namecheck.is_program(value) == bool(names.PROGRAM_RE.match(value))
    assert namecheck.is_tag(value) == bool(names.TAG_RE.match(value))
    assert namecheck.is_full_sha(value) == bool(names.FULL_SHA_RE.match(value))


@pytest.mark.parametrize("value", ["a" * 64, "a" * 65, "a" * 128, "a" * 129, "a..b", "a/.b", "v1.0+x", "-a",
                                   "a" * 40, "g" * 40, "A" * 64, "٣" * 40, "ａ"])
def test_the_plain_name_checks_at_their_edges(value):
    assert namecheck.is_program(value) == bool(names.PROGRAM_RE.match(value))
    assert namecheck.is_tag(value) == bool(names.TAG_RE.match(value))
    assert namecheck.is_full_sha(value) == bool(names.FULL_SHA_RE.match(value))


TEXTS = st.one_of(st.text(), st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F)),
                  st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),  # surrogateescape
                  st.text(alphabet=st.characters(min_codepoint=0x10000)))


@settings(max_examples=1000, deadline=None)
@given(st.dictionaries(TEXTS, st.one_of(st.none(), st.booleans(), st.integers(), TEXTS), max_size=12))
def test_the_plain_json_writer_equals_json_dumps(obj):
    text = plainjson.dumps(obj)
    assert text == json.dumps(obj)
    parsed = json.loads(text)  # valid JSON, whatever the text held
    if not any(0xD800 <= ord(c) <= 0xDFFF for item in obj.items() for v in item if isinstance(v, str) for c in v):
        assert parsed == obj  # (two lone surrogates side by side come back as one character, from json too)


def test_the_plain_json_writer_refuses_what_it_does_not_write():
    for value in (1.5, [1], {"a": 1}, b"x"):
        with pytest.raises(TypeError):
            plainjson.dumps({"k": value})  # type: ignore[dict-item]


def test_the_receipt_with_odd_paths_is_valid_json(tmp_path):
    odd = tmp_path / "ro\"ot\\ é\tx"
    root, _log = make_release(odd)
    data, receipt = run_verify(root)
    assert data["active_path"] == str(root / "releases" / SHA / "source" / ".venv" / "bin" / "python")
    assert receipt.healthy is True, receipt.health_detail


# -- the modules the verify path loads -----------------------------------------------------


def imported(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run *argv* with the import profiler on; the modules it imported beyond a bare ``-c pass``
    of the same interpreter and environment."""
    def names_of(words: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
        done = subprocess.run(words, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              env=dict(env, PYTHONPROFILEIMPORTTIME="1"))
        return done, {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
                      if line.startswith("import time:") and not line.rstrip().endswith("imported package")}

    done, loaded = names_of(argv)
    python = argv[0] if "python" in Path(argv[0]).name else Path(argv[0]).read_text().splitlines()[0][2:]
    return done, loaded - names_of([python, "-c", "pass"])[1]


@pytest.mark.parametrize("active", [True, False], ids=["healthy release", "nothing active"])
def test_the_verify_path_loads_only_what_it_needs(tmp_path, active):
    root = make_release(tmp_path)[0] if active else tmp_path / "absent"
    env = dict(os.environ, PYTHONPATH=str(SITE_DIR))
    done, extra = imported([sys.executable, "-c", "import sys\nfrom vq_site_example.cli import main\n"
                            "sys.exit(main(sys.argv[1:]))", "verify", "--root", str(root), "--program", "vibeqc",
                            "--expected-sha", SHA], env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["healthy"] is active
    assert not extra & HEAVY, sorted(extra & HEAVY)
    # in this (editable) test venv, site may have loaded some of them already
    assert {m for m in VERIFY_MODULES if m.startswith("vq_site_example")} <= extra <= VERIFY_MODULES, sorted(extra)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv holding NON-editable installs of hookspecs and site_example, built from wheels, as an operator
    installs them (pip writes the script's first line)."""
    base = tmp_path_factory.mktemp("site-example-installed")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for src in (HOOKSPECS_DIR, SITE_DIR):  # build from copies: pip wheel builds in the source tree
        subprocess.run(["cp", "-r", str(src), str(base / src.name)], check=True)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "wheels"),
                               str(base / src.name)], capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    prefix = base / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(prefix)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install", "-q",
                           "--find-links", str(base / "wheels"), "vq-site-example"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return prefix


def test_the_installed_script_is_ours_and_loads_only_what_verify_needs(installed, tmp_path):
    script = installed / "bin" / "vq-site-example"
    text = script.read_text()
    assert text.splitlines()[0] == f"#!{installed / 'bin' / 'python'}" and "import re" not in text
    assert script.stat().st_mode & stat.S_IXUSR
    root, log = make_release(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{installed / 'bin'}:/usr/bin:/bin"
    done, extra = imported([str(script), "verify", "--root", str(root), "--program", "vibeqc",
                            "--expected-sha", SHA], env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["healthy"] is True
    assert extra == VERIFY_MODULES, sorted(extra ^ VERIFY_MODULES)
    assert len(starts(log)) == 1
    # the same name on PATH, and the whole grammar still behind it
    usage = subprocess.run(["vq-site-example", "verify", "--root", "relative"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert usage.returncode == 2 and usage.stdout == "" and "vq-site-example" in usage.stderr


def test_the_layout_without_namedtuple_keeps_its_shape():
    lyt = Layout("/apps/vibeqc")
    assert lyt.root == "/apps/vibeqc" and lyt == Layout("/apps/vibeqc") and hash(lyt) == hash(Layout("/apps/vibeqc"))
    assert lyt != Layout("/apps/other") and repr(lyt) == "Layout(root='/apps/vibeqc')"
    assert lyt.launcher(SHA) == f"/apps/vibeqc/releases/{SHA}/source/.venv/bin/python"
    with pytest.raises(AttributeError):
        lyt.root = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        lyt.other = 1  # type: ignore[attr-defined]  # no __dict__: slots only
