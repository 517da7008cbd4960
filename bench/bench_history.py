"""History: ``vq admin history --limit 20`` over 100,000 stored receipts vs reading one receipt,
measured in the same run.

* figure: :func:`vq_admin.state.history.runs` (what ``vq admin history HOST PROGRAM
  --limit 20`` calls) over a state directory of 100,000 receipts and their
  index, median per call;
* baseline: opening and parsing one stored receipt (``json.load``), median;
* target ratio <= 50: history reads the index from its end and stops at the
  runs it prints, so its cost does not grow with the number of receipts.

Runnable alone (``python3 bench/bench_history.py [--check]``) or from
``bench/run.py``.  The receipts are written directly in the state layout
(without fsync), then the index is built the way ``vq-admin`` builds it for
receipts stored before it existed (that one-time rebuild is timed and
printed).  With ``--quick`` only the 100,000 index lines and one receipt file
are written: history reads nothing else, so the figure is the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import exit_if_missed, median_seconds, print_rows, row  # noqa: E402

TARGET = 50.0


def build(root: Path, count: int, index_only: bool = False) -> Path:
    """*count* receipts of two hosts and three programs; returns the path of one of them.

    *index_only* (``--quick``): every receipt's index line is written, but only
    the last receipt file (history never opens the others)."""
    from vq_admin.state import history

    receipts = root / "receipts"
    receipts.mkdir(parents=True)
    lines = []
    steps = [{"name": n, "where": "cluster", "purpose": "bench", "status": "ok", "argv": ["/site/bin/x", "--y"] * 4,
              "exit_code": 0, "seconds": 0.5} for n in ("pre-verify", "stage-create", "deploy", "verify")]
    one = None
    for i in range(count):
        sha = f"{i:040x}"
        doc = {"schema": "vq-admin/receipt/1", "id": f"2026{i:010d}-runtime-cluster{i % 2}-p{i % 3}",
               "outcome": "ok", "exit_code": 0, "lane": "runtime", "host": f"cluster{i % 2}", "program": f"p{i % 3}",
               "expected_sha": sha, "tag": None, "started_at": "2026-11-30T10:00:00Z",
               "finished_at": "2026-11-30T10:00:09Z", "steps": steps, "errors": []}
        path = receipts / f"{doc['id']}.json"
        if index_only:
            lines.append(history.entry(doc).to_json() + "\n")
            if i == count - 1:
                path.write_text(json.dumps(doc, indent=2, sort_keys=True))
        else:
            path.write_text(json.dumps(doc, indent=2, sort_keys=True))
        one = path
    if index_only:
        history.index_path(root).write_text("".join(lines))
    assert one is not None
    return one


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=51)
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions; write the index lines, not every receipt file")
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed (standalone only)")
    args, _ = parser.parse_known_args(argv)
    repeat = 11 if args.quick else args.repeat
    from vq_admin.state import history

    with tempfile.TemporaryDirectory(prefix="vq-bench-history-") as tmp:
        root = Path(tmp) / "state"
        started = time.perf_counter()
        one = build(root, args.receipts, index_only=args.quick)
        built = time.perf_counter()
        history.ensure(root)  # full run: the one-time rebuild for receipts stored before the index existed
        print(f"{'wrote the index of' if args.quick else 'wrote'} {args.receipts} receipts in {built - started:.1f} s"
              + ("" if args.quick else f"; the one-time index rebuild took {time.perf_counter() - built:.1f} s"),
              flush=True)

        def read_one() -> None:
            with open(one, "rb") as fh:
                json.load(fh)

        def list_runs() -> None:
            assert len(history.runs(root, "cluster1", "p2", 20)) == 20

        read_one(), list_runs()  # warm
        figures, baselines = [], []
        for _ in range(repeat):
            baselines.append(median_seconds(read_one, 5))
            figures.append(median_seconds(list_runs, 5))
    rows = [row(f"history --limit 20, {args.receipts} receipts (median)", statistics.median(figures) * 1e6, "us",
                statistics.median(baselines) * 1e6, "reading one receipt", f"<= {TARGET:g}")]
    print_rows(rows)
    return rows


if __name__ == "__main__":
    result = main()
    exit_if_missed([r["name"] for r in result[:1] if r["ratio"] > TARGET])
