"""The example provider's verify: one start of the generation's launcher (the source's
``vq_selftest.py`` when it has one, else ``-c pass``), and a ``health_detail`` that tells
"could not start" from "exited N", a signal and the time bound (the whole process group is
killed past it).  Releases are made by hand here: the launcher is a script that logs each start.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vq_admin_hookspecs import VerifyReceipt

SITE_DIR = Path(__file__).resolve().parents[1] / "site_example"
if str(SITE_DIR) not in sys.path:
    sys.path.insert(0, str(SITE_DIR))

from vq_site_example import verify as site_verify  # noqa: E402
from vq_site_example.layout import Layout  # noqa: E402

SHA = "c" * 40


# -- a release made by hand: the launcher is a script that logs each start ------------------


def make_release(tmp: Path, launcher: str | None = None, selftest: str | None = "print('selftest ok')\n",
                 mode: int = 0o755) -> tuple[Path, Path]:
    """ROOT with ``current -> releases/SHA`` (VALIDATED, its own SHA); returns (ROOT, launcher log)."""
    root = tmp / "apps" / "vibeqc"
    release = root / "releases" / SHA
    (release / "source").mkdir(parents=True)
    (release / "bin").mkdir()
    for name, text in (("SOURCE-SHA", SHA), ("PROGRAM", "vibeqc"), ("TAG", ""), ("VALIDATED", "validated by hand")):
        (release / name).write_text(text + "\n")
    log = tmp / "launcher.log"
    path = release / "bin" / f"vibeqc-{SHA}"
    path.write_text(launcher if launcher is not None else
                    f'#!/bin/sh\necho "$*" >> {shlex.quote(str(log))}\nexec {sys.executable} "$@"\n')
    path.chmod(mode)
    if selftest is not None:
        (release / "source" / "vq_selftest.py").write_text(selftest)
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


def test_the_receipt_with_odd_paths_is_valid_json(tmp_path):
    odd = tmp_path / "ro\"ot\\ é\tx"
    root, _log = make_release(odd)
    data, receipt = run_verify(root)
    assert data["active_path"] == str(root / "releases" / SHA / "bin" / f"vibeqc-{SHA}")
    assert receipt.healthy is True, receipt.health_detail


def test_a_missing_launcher_is_named(tmp_path):
    root, _log = make_release(tmp_path)
    (root / "releases" / SHA / "bin" / f"vibeqc-{SHA}").unlink()
    data, receipt = run_verify(root)
    assert receipt.healthy is False and data["active_path_sha256"] == ""
    assert f"cannot hash the launcher {receipt.active_path}: No such file or directory" in receipt.health_detail


def test_verify_takes_the_identifier_rules_without_loading_pluggy(tmp_path):
    """The host command imports the rules from vq_admin_identifiers (vq-admin-hookspecs), not through the
    plugin package, which loads pluggy."""
    root, _log = make_release(tmp_path)
    code = ("import sys\nfrom vq_site_example.cli import main\n"
            f"code = main(['verify', '--root', {str(root)!r}, '--program', 'vibeqc', '--expected-sha', {SHA!r}])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pluggy', 'vq_admin_hookspecs')), "
            "file=sys.stderr)\nsys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(SITE_DIR)))
    assert done.returncode == 0 and json.loads(done.stdout)["healthy"] is True, done.stderr
    assert done.stderr.strip() == "[]"
