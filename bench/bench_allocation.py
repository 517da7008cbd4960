"""Allocation transcripts: settle latency, memory while settling, retention speed.

``python3 bench/bench_allocation.py [--quick]``; ``main(argv)`` returns rows
(figure, baseline measured in the same run, ratio):

* settle time of already-stable output, with the rule's real 1 s interval,
  against the same loop with observations that cost nothing (the rule's
  floor is 2.0 s: three observations, one second apart);
* peak RSS of a fresh process settling two 1 GiB transcripts (xxh3-64,
  streamed), against the peak RSS of the same process idle;
* peak RSS of the driver receiving those two transcripts through the
  framed stream into its transcript copy, against the same idle baseline;
* time to prune 10,000 attempt directories (all but the newest ~100 over
  the 100 MiB cap), against one ``os.scandir`` walk that stats the same tree,
  and against ``rm -rf`` of an identical tree (the filesystem's own price
  for removing that many files and directories; target ratio <= 1.1):
  medians of 3 rounds on fresh trees, ``os.sync()`` before each timing.

``--quick`` shrinks the transcripts to 64 MiB; the prune is always of 10,000 attempts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import exit_if_missed, installed_venv, print_rows, row, run_quiet  # noqa: E402

MiB = 1 << 20
#: The prune against rm -rf of an identical tree (ratio).
PRUNE_TARGET = 1.1
BLOCK = bytes(range(256)) * 4096  # 1 MiB, not all zeros

CHILD_IDLE = """
import resource, sys
from vq_admin.agent import settle
from vq_admin.core import frames
import xxhash
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
CHILD_IDLE_DRIVER = """
import resource, sys
from vq_admin.core import frames
from vq_admin.lanes.allocation_stream import TranscriptSink
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
CHILD_SETTLE = """
import os, resource, sys
from vq_admin.agent import settle
from vq_admin.core import frames
import xxhash
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
result = settle.settle(settle.DirectoryObserver(fd), sleep=lambda s: None)
assert result.settled, result
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
CHILD_RECEIVE = """
import os, resource, sys, threading
from pathlib import Path
from vq_admin.core import checksum, frames
from vq_admin.lanes.allocation_stream import TranscriptSink
src = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
r, w = os.pipe()
writer = frames.FrameWriter(w)
def send():
    for kind, name in (("out", "stdout"), ("err", "stderr")):
        writer.stream_file(kind, src, name, None, checksum.default_algorithm())
    writer.record("end", {"sent": {}})
    os.close(w)
threading.Thread(target=send, daemon=True).start()
sinks = {n: TranscriptSink(Path(sys.argv[2]), n) for n in ("stdout", "stderr")}
with os.fdopen(r, "rb") as stream:
    assert frames.read_frames(stream, lambda k, v: None, lambda n, c: sinks[n].write(c))
for s in sinks.values():
    s.commit()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _child_kib(code: str, *args: str) -> int:
    """The peak RSS (KiB) of *code* run by the non-editable install's interpreter, which has what
    vq-admin depends on (xxhash), whatever the interpreter running the bench has."""
    python = str(installed_venv() / "bin" / "python")
    done = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, check=True,
                          cwd=tempfile.gettempdir())
    return int(done.stdout.strip().splitlines()[-1])


def _write_transcript(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        for _ in range(size // MiB):
            fh.write(BLOCK)


def bench_settle_latency() -> dict:
    from vq_admin.agent import settle

    with tempfile.TemporaryDirectory(prefix="vq-bench-settle-") as tmp:
        (Path(tmp) / "stdout").write_bytes(b"VQ-DEPLOY-METRIC built=1\n" * 1000)
        (Path(tmp) / "stderr").write_bytes(b"warning\n" * 100)
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            started = time.monotonic()
            result = settle.settle(settle.DirectoryObserver(fd))
            figure = time.monotonic() - started
        finally:
            os.close(fd)
        assert result.settled and result.observations == 3
        fixed = (settle.FileState(1, "a"), settle.FileState(1, "b"))
        started = time.monotonic()
        settle.settle(lambda: fixed)
        baseline = time.monotonic() - started
    return row("settle, already-stable output (1 s interval)", figure, "s", baseline,
               "same loop, free observations", target="floor 2.0 s")


def bench_memory(size: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="vq-bench-mem-") as tmp:
        attempt = Path(tmp) / "attempt"
        attempt.mkdir()
        _write_transcript(attempt / "stdout", size)
        _write_transcript(attempt / "stderr", size)
        idle = _child_kib(CHILD_IDLE)
        settling = _child_kib(CHILD_SETTLE, str(attempt))
        idle_driver = _child_kib(CHILD_IDLE_DRIVER)
        receiving = _child_kib(CHILD_RECEIVE, str(attempt), str(Path(tmp) / "copy"))
        assert (Path(tmp) / "copy" / "stdout").stat().st_size == size
    label = f"{size // MiB} MiB" if size < 1 << 30 else f"{size >> 30} GiB"
    return [
        row(f"agent: peak RSS settling two {label} transcripts", settling / 1024, "MiB", idle / 1024,
            "same process idle"),
        row(f"driver: peak RSS receiving two {label} transcripts", receiving / 1024, "MiB", idle_driver / 1024,
            "same process idle", target="+2 x 16 MiB receipt tails"),
    ]


def _make_tree(parent: Path, attempts: int) -> str:
    names = []
    for i in range(attempts):
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(1_700_000_000 + i))
        name = f"deploy.{stamp}.{i:08x}"
        d = parent / name
        d.mkdir()
        with open(d / "stdout", "wb") as fh:
            os.truncate(fh.fileno(), MiB)  # 1 MiB each (sparse): ~100 fit under the cap
        (d / "stderr").write_bytes(b"")
        (d / "job").write_text(f"{i}\n")
        names.append(name)
    return names[-1]


def _walk(parent: Path) -> int:
    total = 0
    with os.scandir(parent) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                with os.scandir(entry.path) as inner:
                    for f in inner:
                        total += f.stat(follow_symlinks=False).st_size
    return total


def _timed(fn, *args) -> tuple[float, object]:
    """Seconds of ``fn(*args)`` (``os.sync()`` first: no figure pays for writing back what came before), its result."""
    os.sync()
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def _prune_round(attempts: int) -> tuple[float, float, float, int]:
    """(scandir walk, prune, rm -rf of an identical tree) in seconds, and how many the prune removed."""
    from vq_admin.agent import retention

    with tempfile.TemporaryDirectory(prefix="vq-bench-prune-") as tmp:
        parent, other = Path(tmp) / "prog", Path(tmp) / "other"
        parent.mkdir()
        other.mkdir()
        current = _make_tree(parent, attempts)
        _make_tree(other, attempts)
        _walk(parent)  # warm the dentry cache for every measurement alike
        _walk(other)
        walk, _ = _timed(_walk, parent)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            prune, result = _timed(retention.prune, fd, current)
        finally:
            os.close(fd)
        removed = len(result["removed"])
        kept = len(os.listdir(parent))
        assert removed == attempts - kept and kept < 110, (kept, removed)
        # what the filesystem itself charges for removing that many files and directories
        rm_rf, _ = _timed(run_quiet, ["rm", "-rf", "--", str(other)])
    return walk, prune, rm_rf, removed


def bench_prune(attempts: int, rounds: int = 3) -> list[dict]:
    """Medians of *rounds* rounds, each on two fresh identical trees: one pruned, one removed by rm -rf."""
    samples = [_prune_round(attempts) for _ in range(rounds)]
    print("prune rounds (prune/rm -rf, s): " + ", ".join(f"{s[1]:.3f}/{s[2]:.3f}" for s in samples), flush=True)
    walk, figure, rm_rf = (statistics.median(s[i] for s in samples) for i in range(3))
    name = f"prune {attempts:,} attempt directories ({samples[-1][3]:,} removed; median of {rounds})"
    return [row(name, figure, "s", walk, "os.scandir walk of the same tree"),
            row(name, figure, "s", rm_rf, "rm -rf of an identical tree", target=f"<= {PRUNE_TARGET}")]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB transcripts (the prune stays at 10,000 attempts)")
    args, _unknown = parser.parse_known_args(argv)
    size = 64 * MiB if args.quick else 1 << 30
    attempts = 10_000
    rows = [bench_settle_latency(), *bench_memory(size), *bench_prune(attempts)]
    print_rows(rows)
    return rows


if __name__ == "__main__":
    result = main()
    exit_if_missed([r["name"] for r in result if r["target"] == f"<= {PRUNE_TARGET}" and r["ratio"] > PRUNE_TARGET])
