"""vq-admin-agent under every Python from 3.8 up that the machine has.

Each interpreter runs the agent's own tests (tests/agent_selftest.py,
standard library only) in isolated mode (``-I``: no site-packages of its
own, no PYTHONPATH) twice: against the single-file ``vq-admin-agent.pyz``
built from this tree and against the tree itself.  Without ``xxhash`` (the
pyenv interpreters have none) the settle and the stream use ``blake2b``;
the driver's own interpreter (which has ``xxhash``) covers ``xxh3_64``.

An interpreter of a supported version that cannot be found FAILS the test
rather than skipping it: CI runs on a machine like this one, which has them.
Interpreters are found by version: ``$(pyenv root)/versions/X.Y.*``
(``PYENV_ROOT``, ``pyenv root`` or ``~/.pyenv``), then ``pythonX.Y`` on PATH.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from vq_admin.agent import pyz

REPO = Path(__file__).resolve().parent.parent
SELFTEST = Path(__file__).resolve().parent / "agent_selftest.py"
#: The supported range: every one of these must be present and pass.
REQUIRED = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]


def _pyenv_roots() -> list[str]:
    roots = []
    if os.environ.get("PYENV_ROOT"):
        roots.append(os.environ["PYENV_ROOT"])
    candidates = ("/root/.pyenv/bin/pyenv", os.path.expanduser("~/.pyenv/bin/pyenv"))
    exe = shutil.which("pyenv") or next((p for p in candidates if os.path.exists(p)), None)
    if exe:
        try:
            out = subprocess.run([exe, "root"], capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        if out:
            roots.append(out)
    roots += [os.path.expanduser("~/.pyenv"), "/root/.pyenv"]
    seen, unique = set(), []
    for r in roots:
        if r not in seen and os.path.isdir(os.path.join(r, "versions")):
            seen.add(r)
            unique.append(r)
    return unique


def _version_of(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=None)
def find_python(version: str) -> str | None:
    """An interpreter of *version* (``X.Y``), verified by running it."""
    candidates = []
    for root in _pyenv_roots():
        for d in sorted(glob.glob(os.path.join(root, "versions", f"{version}.*")), reverse=True):
            if re.fullmatch(re.escape(version) + r"\.\d+", os.path.basename(d)):
                candidates.append(os.path.join(d, "bin", "python"))
    if shutil.which(f"python{version}"):
        candidates.append(shutil.which(f"python{version}"))
    for python in candidates:
        if os.access(python, os.X_OK) and _version_of(python) == version:
            return python
    return None


def newer_found() -> list[str]:
    """Versions above the required range that happen to be installed (tested too)."""
    found = set()
    for root in _pyenv_roots():
        for d in glob.glob(os.path.join(root, "versions", "3.*.*")):
            m = re.fullmatch(r"(3\.(\d+))\.\d+", os.path.basename(d))
            if m and int(m.group(2)) > 13:
                found.add(m.group(1))
    return sorted(found, key=lambda v: int(v.split(".")[1]))


@pytest.fixture(scope="module")
def agent_pyz(tmp_path_factory) -> str:
    return pyz.build(str(tmp_path_factory.mktemp("pyz") / "vq-admin-agent.pyz"), str(REPO))


def _selftest(python: str, agent: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VQ_ADMIN")}
    return subprocess.run([python, "-I", str(SELFTEST), "--agent", agent], capture_output=True, text=True,
                          timeout=600, env=env, cwd="/")


@pytest.mark.parametrize("version", REQUIRED + newer_found())
@pytest.mark.parametrize("form", ["pyz", "tree"])
def test_agent_selftest_under(version, form, agent_pyz):
    python = find_python(version)
    if python is None:
        pytest.fail(f"no Python {version} found (looked in {_pyenv_roots() or 'no pyenv root'}/versions/{version}.* "
                    f"and python{version} on PATH); the agent must be tested on every supported version")
    done = _selftest(python, agent_pyz if form == "pyz" else str(REPO))
    assert done.returncode == 0, f"{python}:\n{done.stdout}\n{done.stderr}"
    assert re.search(r"^Ran (\d+) tests", done.stderr, re.M) and "OK" in done.stderr.splitlines()[-1]


def test_the_driver_interpreter_too(agent_pyz):
    """The driver's Python (with xxhash): the selftest covers the xxh3_64 path here."""
    done = _selftest(sys.executable, agent_pyz)
    assert done.returncode == 0, done.stderr
    assert '"checksum": "xxh3_64"' in subprocess.run([sys.executable, agent_pyz, "version"], capture_output=True,
                                                    text=True, timeout=60).stdout


def test_pyz_is_reproducible_and_holds_only_the_agent(tmp_path):
    import zipfile

    a = pyz.build(str(tmp_path / "a.pyz"), str(REPO))
    b = pyz.build(str(tmp_path / "b.pyz"), str(REPO))
    assert Path(a).read_bytes() == Path(b).read_bytes()
    names = zipfile.ZipFile(a).namelist()
    assert "__main__.py" in names and "vq_admin/agent/cli.py" in names
    assert all(n == "__main__.py" or n == "vq_admin/__init__.py" or n.startswith(("vq_admin/agent/", "vq_admin/core/"))
               for n in names)
    assert not any(n.endswith(".pyc") for n in names)
    assert Path(a).read_bytes().startswith(b"#!/usr/bin/env python3\n")


def test_the_driver_reads_a_blake2b_stream_from_a_python38_agent(agent_pyz, tmp_path):
    """A 3.8 agent without xxhash streams blake2b digests; the driver checks them as named."""
    import agent_selftest
    from vq_admin.lanes.allocation_stream import TranscriptSink, stream_call
    from vq_admin.ssh.transport import LocalTransport

    python = find_python("3.8")
    assert python, "no Python 3.8 found"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(agent_selftest.FAKE_SBATCH.format(python=python))
    (bindir / "scontrol").write_text(agent_selftest.FAKE_SCONTROL)
    for f in bindir.iterdir():
        f.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o755)
    job = [python, "-c", "print('line one'); print('line two')"]
    argv = ["env", f"PATH={bindir}:/usr/bin:/bin", python, "-I", agent_pyz, "alloc-run", "--root", str(scratch),
            "--program", "prog", "--timeout", "60", "--", *job]
    sinks = {name: TranscriptSink(tmp_path / "copy", name) for name in ("stdout", "stderr")}
    call = stream_call(LocalTransport(), argv, timeout=120, sinks=sinks)
    assert call.complete, (call.exit_code, call.stderr)
    assert call.records["summary"]["settle"]["checksum"] == "blake2b"
    for name, sink in sinks.items():
        sink.commit()
        sent = call.records["end"]["sent"][name]
        assert sink.algorithm == "blake2b" and sent["checksum"] == "blake2b"
        assert sent["digest"] == sink.digest == sink.digest_as("blake2b")
    assert (tmp_path / "copy" / "stdout").read_bytes() == b"line one\nline two\n"
    # the driver can still re-check a committed copy in the other algorithm
    import xxhash
    assert sinks["stdout"].digest_as("xxh3_64") == xxhash.xxh3_64(b"line one\nline two\n").hexdigest()


# -- a login host whose python is too old, over the real sshd ----------------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("version", ["3.6", "3.7", "3.8", "3.9"])
def test_a_login_host_python_below_3_8_is_refused_in_one_line(version, agent_pyz, tmp_path, real_sshd):
    """``agent = "PYTHON vq-admin-agent.pyz"``: 3.6 and 3.7 refuse in the run's first call with the agent's
    one line (77, no traceback, nothing built or recorded as a deployment); 3.8 and 3.9 deploy."""
    from support import AGENT, SITE_EXAMPLE, GitRepo, command_host, run_vq, write_config

    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (looked in {_pyenv_roots()} and on PATH)")
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("one")
    root, built = tmp_path / "apps", tmp_path / "built"
    update = write_script_file(tmp_path / "update",
                               f'#!/bin/sh\n: > {built}\nexec {SITE_EXAMPLE} install --root {root} "$@"\n')
    text = command_host("vibeqc", scratch=tmp_path, repo=repo.path, update=update,
                        verify=f"{SITE_EXAMPLE} verify --root {root}")
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_sshd.ssh_config}"\n'
                          + text.replace(f'agent = "{AGENT}"', f'agent = "{python} {agent_pyz}"'))
    done = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, config=config, state=tmp_path / "state")
    if version in ("3.8", "3.9"):
        assert done.exit_code == 0, done.stderr
        assert built.exists() and (root / "current").is_symlink()
        return
    assert done.exit_code == 77, done.stderr
    full = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    [line] = [line for line in done.stderr.splitlines() if "needs Python" in line]
    assert line.split("error", 1)[1].strip().startswith(
        f"vq-admin-agent needs Python 3.8 or later; {os.uname().nodename} runs {python} {full}; "
        "set `agent` to a newer interpreter, e.g. "), line
    assert "Traceback" not in done.stderr and "lease" not in line, done.stderr
    assert not built.exists() and not root.exists()


def write_script_file(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("version", ["3.6", "3.7"])
def test_every_entry_of_the_agent_refuses_an_old_python_in_one_line(version, agent_pyz):
    """The single file, ``-m vq_admin.agent`` from a tree and the ``vq-admin-agent`` script: one line, 77."""
    from vq_admin.agent import TOO_OLD

    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} on this machine (looked in {_pyenv_roots()} and on PATH)")
    for argv in ([python, agent_pyz, "version"], [python, "-m", "vq_admin.agent", "version"],
                 [python, str(REPO / "bin" / "vq-admin-agent"), "version"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
        assert done.returncode == 77 and done.stdout == "", (argv, done.stdout, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith(f"{TOO_OLD}; {os.uname().nodename} runs {python} {version}."), line
