"""``vq admin history``: stored receipts newest first, ``--limit``, filters, the
index file (appended per receipt, read from its end, rebuilt once for
receipts stored before it existed)."""

from __future__ import annotations

import os

import pytest

from support import run_vq_inprocess, write_config
from vq_admin.state import history
from vq_admin.state.records import StateDir, dump_json, write_atomic

SHA = {k: k.lower() * 40 for k in "ABCDEF"}


def receipt(n: int, host: str, program: str | None, sha: str, outcome: str = "ok", **extra) -> dict:
    doc = {"schema": "vq-admin/receipt/1", "id": f"r{n:04d}", "outcome": outcome,
           "exit_code": {"ok": 0, "failed": 1, "refused": 77}[outcome], "lane": "runtime" if program else "helper",
           "host": host, "program": program, "expected_sha": sha, "tag": "v1" if n % 2 else None,
           "started_at": f"2026-11-30T10:{n:02d}:00Z", "finished_at": f"2026-11-30T10:{n:02d}:07Z"}
    doc.update(extra)
    return doc


RUNS = [
    receipt(1, "cluster", "vibeqc", SHA["A"]),
    receipt(2, "cluster", None, SHA["F"]),
    receipt(3, "cluster", "vibeqc", SHA["B"], "failed"),
    receipt(4, "other", "vibeqc", SHA["C"]),
    receipt(5, "cluster", "vibeqc", SHA["A"], rollback={"from": SHA["B"], "to": SHA["A"]}),
    receipt(6, "cluster", "vibeqc", SHA["A"], prune={"keep": {SHA["A"]: ["active"]}, "removed": [SHA["B"]]}),
]


@pytest.fixture
def state(tmp_path):
    st = StateDir(tmp_path / "state")
    for doc in RUNS:
        st.store_receipt(doc["id"], doc)
    return st


def vq_history(state: StateDir, *args: str):
    config = write_config(state.root.parent / "admin.toml", "".join(
        f'[hosts.{host}]\nfleet_role = "managed"\n[hosts.{host}.scheduler_runtime_deployments.vibeqc]\n'
        'update_command = "/bin/true"\nverify_command = "/bin/true"\nsource_repo = "/srv/src/vibeqc"\n'
        for host in ("cluster", "other")))
    return run_vq_inprocess("history", *args, state=state.root, config=config)


def test_newest_first_with_filters_and_limit(state):
    every = vq_history(state, "--json")
    assert every.exit_code == 0, every.stderr
    doc = every.json()
    assert doc["schema"] == "vq-admin/history/1"
    assert [r["receipt"] for r in doc["runs"]] == ["r0006", "r0005", "r0004", "r0003", "r0002", "r0001"]
    first = doc["runs"][0]
    for key in ("receipt", "lane", "host", "program", "outcome", "exit_code", "expected_sha", "tag", "started_at",
                "finished_at"):
        assert key in first
    assert [r["verb"] for r in doc["runs"][:3]] == ["prune", "rollback", "update"]
    assert [r["receipt"] for r in vq_history(state, "cluster", "--local", "--json").json()["runs"]] == \
        ["r0006", "r0005", "r0003", "r0002", "r0001"]
    two = vq_history(state, "cluster", "vibeqc", "--local", "--limit", "2", "--json").json()["runs"]
    assert [r["receipt"] for r in two] == ["r0006", "r0005"]
    unknown = vq_history(state, "nohost", "--json")  # a host the configuration does not name: a usage error
    assert unknown.exit_code == 2 and "(hosts: cluster, other)" in unknown.json()["errors"][0]
    typo = vq_history(state, "cluster", "vibeqx", "--json")  # and a PROGRAM the host has no profile for
    assert typo.exit_code == 2 and "no scheduler_runtime_deployments.vibeqx profile (profiles: vibeqc)" \
        in typo.json()["errors"][0]


def test_the_table(state):
    done = vq_history(state, "cluster", "--local", "--limit", "3")
    lines = done.stdout.splitlines()
    assert done.exit_code == 0 and len(lines) == 4
    assert lines[0].split() == ["TIME", "LANE", "HOST", "PROGRAM", "OUTCOME", "SHA", "DURATION"]
    assert lines[1].split() == ["2026-11-30T10:06:07Z", "runtime/prune", "cluster", "vibeqc", "ok", "aaaaaaaaaaaa",
                                "7s"]
    assert lines[3].split() == ["2026-11-30T10:03:07Z", "runtime", "cluster", "vibeqc", "failed", "bbbbbbbbbbbb",
                                "(v1)", "7s"]


@pytest.mark.parametrize("args", [["--limit", "0"], ["bad/host"], ["cluster", "-x"]])
def test_usage_errors(state, args):
    assert vq_history(state, *args).exit_code == 2


def test_receipts_stored_before_the_index_existed_are_covered(tmp_path):
    st = StateDir(tmp_path / "state")
    for doc in RUNS[:3]:  # as an older vq-admin stored them: no index
        write_atomic(st.receipt_path(doc["id"]), dump_json(doc), exclusive=True)
    assert not history.index_path(st.root).exists()
    assert [r.receipt for r in history.runs(st.root)] == ["r0003", "r0002", "r0001"]
    st.store_receipt(RUNS[3]["id"], RUNS[3])  # then one appended line per receipt
    assert [r.receipt for r in history.runs(st.root, limit=2)] == ["r0004", "r0003"]
    assert len(history.index_path(st.root).read_text().splitlines()) == 4
    # the index removed: the next stored receipt rebuilds it with everything
    history.index_path(st.root).unlink()
    st.store_receipt(RUNS[4]["id"], RUNS[4])
    assert [r.receipt for r in history.runs(st.root, limit=None)] == ["r0005", "r0004", "r0003", "r0002", "r0001"]


def test_a_torn_last_line_is_skipped(state):
    with open(history.index_path(state.root), "ab") as fh:
        fh.write(b'{"receipt": "r9999", "host": "clu')
    assert [r.receipt for r in history.runs(state.root, limit=2)] == ["r0006", "r0005"]


def test_reads_only_what_it_prints(tmp_path, monkeypatch):
    root = tmp_path / "state"
    path = history.index_path(root)
    path.parent.mkdir(parents=True)
    line = history.entry(RUNS[0]).to_json()
    path.write_text("".join(line.replace("r0001", f"r{i:06d}") + "\n" for i in range(50_000)))  # about 14 MB
    read = []
    real_pread = os.pread
    monkeypatch.setattr(history.os, "pread", lambda fd, n, off: read.append(n) or real_pread(fd, n, off))
    assert len(history.runs(root, limit=20)) == 20
    assert sum(read) <= history.BLOCK, f"read {sum(read)} bytes for 20 runs"
