"""A crash in the middle of writing driver state: the old file stays, the temporary
file may remain, and nothing ever reads a temporary file as state.

The rule (docs/reliability.md, "Crash consistency"): state files are written
to ``.tmp.<name>.<random>`` in the same directory, fsynced, then renamed (or,
for immutable receipts and registry entries, linked) into place.  A SIGKILL
before the rename leaves the previous file intact and a complete but unused
temporary file; readers only open the final names (``status``, the registry
and ``vq admin launcher`` never list ``.tmp.*``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from support import run_vq, write_config
from vq_admin import bindings
from vq_admin.launcher import registry
from vq_admin.state.records import LastRun, StateDir, Verified

A, B = "a" * 40, "b" * 40


def verified(sha: str) -> dict:
    return {"sha": sha, "tag": None, "launcher": f"/apps/releases/{sha}/source/.venv/bin/python",
            "launcher_sha256": "f" * 64, "receipt": f"r-{sha[:4]}", "at": "2026-11-30T00:00:00Z"}


def crash_while(state, code: str) -> None:
    """Run *code* in a fresh interpreter whose ``os.replace`` and ``os.link`` SIGKILL it."""
    script = textwrap.dedent(f"""\
        import os, signal
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace = os.link = die
        from vq_admin.launcher import registry
        from vq_admin.state.records import LastRun, StateDir, Verified
        state = StateDir({str(state)!r})
        """) + code
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr


def cluster_config(tmp_path):
    return write_config(tmp_path / "admin.toml", '[hosts.cluster]\nfleet_role = "managed"\n')


def temporaries(root) -> list[str]:
    return sorted(p.name.split(".")[2] for p in root.rglob(".tmp.*"))


def test_a_crash_before_the_rename_keeps_the_old_record_and_nothing_reads_the_temporary(tmp_path):
    state = StateDir(tmp_path / "state")
    state.record_run("runtime", "cluster", "vibeqc", LastRun(outcome="ok", expected_sha=A), Verified(**verified(A)))
    registry.record_verified(state.root, "cluster", "vibeqc", Verified(**verified(A)))
    before = {p: p.read_bytes() for p in state.root.rglob("*") if p.is_file()}

    crash_while(state.root, "state.record_run('runtime', 'cluster', 'vibeqc', LastRun(outcome='ok'), "
                            f"Verified(**{verified(B)!r}))")
    crash_while(state.root, f"registry.record_verified(state.root, 'cluster', 'vibeqc', Verified(**{verified(B)!r}))")
    crash_while(state.root, "state.store_receipt('r-bbbb', {'outcome': 'ok'})")

    assert temporaries(state.root) == [B, "last-good", "r-bbbb"]  # one per interrupted write
    assert {p: p.read_bytes() for p in state.root.rglob("*") if p.is_file() and ".tmp." not in p.name} == before
    for tmp in state.root.rglob(".tmp.*"):  # complete (fsynced before the rename), just never renamed
        assert json.loads(tmp.read_text())
    status = run_vq("status", "--json", state=state.root, config=cluster_config(tmp_path)).json()
    status = status["hosts"]["cluster"]["runtimes"]["vibeqc"]
    assert status["last_ok"]["sha"] == A and status["last_good"] is None
    assert bindings.resolve_launcher("vibeqc", "cluster", state_dir=state.root).sha == A
    assert [e.sha for e in registry.entries(state.root, "cluster", "vibeqc")] == [A]
    refused = None
    try:
        bindings.resolve_launcher("vibeqc", "cluster", expected_sha=B, state_dir=state.root)
    except bindings.LauncherRefused as exc:
        refused = exc.code
    assert refused == "sha-mismatch"  # B has no evidence; A is the latest


def test_half_written_temporaries_next_to_every_record_are_ignored(tmp_path):
    state = StateDir(tmp_path / "state")
    state.record_run("runtime", "cluster", "vibeqc", LastRun(outcome="ok", expected_sha=A), Verified(**verified(A)))
    registry.record_verified(state.root, "cluster", "vibeqc", Verified(**verified(A)))
    lane = state.lane_dir("runtime", "cluster", "vibeqc")
    reg = tmp_path / "state" / "registry" / "cluster" / "vibeqc"
    torn = '{"sha": "' + B + '", "launcher": "/apps/rel'
    for directory, name in ((lane, "last-ok.json"), (lane, "last-good.json"), (reg, f"{B}.json"),
                            (reg, "latest.json"), (state.root / "receipts", "x.json")):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f".tmp.{name}.1234.abcdef").write_text(torn)
    status = run_vq("status", "--json", state=state.root, config=cluster_config(tmp_path))
    assert status.exit_code == 0, status.stderr
    runtime = status.json()["hosts"]["cluster"]["runtimes"]["vibeqc"]
    assert runtime["last_ok"]["sha"] == A and runtime["last_good"] is None
    binding = bindings.resolve_launcher("vibeqc", "cluster", state_dir=state.root)
    assert (binding.sha, binding.latest) == (A, True)
    launcher = run_vq("launcher", "vibeqc", "cluster", "--expected-sha", B, state=state.root,
                      config=cluster_config(tmp_path))
    assert launcher.exit_code == 77 and "(sha-mismatch)" in launcher.stderr
