"""The example provider's read-only verify (``vq-site-example verify``, run on the
login host by every ``update``, the cron no-op included), from a NON-editable
install in a temporary venv (bench/common.py), on a healthy release whose source
has a ``vq_selftest.py`` (as the tests' and the bench's sources do):

* ``vq-site-example verify`` vs two interpreter starts (``python -c pass`` of the
  same venv, run twice): the floor is one start for verify and one for the
  launcher it runs, interleaved, medians;
* with ``--against REF``: the same verify from a second non-editable install of
  the tree at git REF (e.g. ``main``), interleaved with this tree's, so the
  before/after figures come from the same run.

    python3 bench/bench_site_verify.py [--repeat N] [--against REF]
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from common import ROOT, installed_venv, interleaved_medians, print_rows, row  # noqa: E402

SELFTEST = "import vqmod\nprint('selftest ok', vqmod.__version__)\n"


def venv_at(ref: str) -> Path:
    """A non-editable install of ``hookspecs`` and ``site_example`` as they are at git *ref*."""
    base = Path(tempfile.mkdtemp(prefix="vq-bench-ref-"))
    atexit.register(shutil.rmtree, base, True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", ref, "hookspecs", "site_example"],
                             check=True, capture_output=True).stdout
    src = base / "src"
    src.mkdir()
    archive_path = base / "src.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(src, filter="data")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(src / "hookspecs"), str(src / "site_example")], check=True, capture_output=True,
                   env=dict(os.environ, PIP_NO_INPUT="1"))
    return venv


def healthy_release(tmp: Path, tool: Path) -> tuple[Path, str]:
    """A runtime root with one validated, active release (its source has a vq_selftest.py)."""
    repo = tmp / "repo"
    (repo / "vqmod").mkdir(parents=True)
    (repo / "vq_selftest.py").write_text(SELFTEST)
    (repo / "vqmod" / "__init__.py").write_text("__version__ = 'bench'\n")
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="b",
               GIT_AUTHOR_EMAIL="b@example.org", GIT_COMMITTER_NAME="b", GIT_COMMITTER_EMAIL="b@example.org")
    for words in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "bench"]):
        subprocess.run(["git", "-C", str(repo), *words], check=True, env=env)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env, capture_output=True,
                         text=True).stdout.strip()
    stage = tmp / "stage"
    stage.mkdir()
    subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", "-o", str(stage / "source.tar"), sha],
                   check=True, env=env)
    (stage / "ARCHIVE-SHA256").write_text(hashlib.sha256((stage / "source.tar").read_bytes()).hexdigest() + "\n")
    (stage / "SOURCE-SHA").write_text(sha + "\n")
    root = tmp / "apps" / "vibeqc"
    subprocess.run([str(tool), "install", "--root", str(root), "--program", "vibeqc", "--expected-sha", sha,
                    "--source-archive", str(stage / "source.tar")], check=True, capture_output=True)
    return root, sha


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (7)")
    parser.add_argument("--against", metavar="REF", help="also time the verify of the tree at git REF")
    args, _unknown = parser.parse_known_args(argv)  # bench/run.py passes every module the same options
    repeat = 7 if args.quick else args.repeat
    venv = installed_venv()
    tool = venv / "bin" / "vq-site-example"
    before = venv_at(args.against) if args.against else None
    with tempfile.TemporaryDirectory(prefix="vq-bench-verify-") as tmp:
        root, sha = healthy_release(Path(tmp), tool)
        words = ["verify", "--root", str(root), "--program", "vibeqc", "--expected-sha", sha]

        def verify(script: Path) -> None:
            done = subprocess.run([str(script), *words], capture_output=True, text=True, check=True)
            receipt = json.loads(done.stdout)
            assert receipt["healthy"] is True, receipt["health_detail"]

        def two_starts() -> None:
            for _ in range(2):
                subprocess.run([str(venv / "bin" / "python"), "-c", "pass"], check=True)

        commands = {"verify": lambda: verify(tool), "two starts": two_starts}
        if before is not None:
            commands["verify at ref"] = lambda: verify(before / "bin" / "vq-site-example")
        for fn in commands.values():  # warm the page cache once, outside the figures
            fn()
        medians = interleaved_medians(commands, repeat)
    rows = [row("site verify, healthy release with selftest", medians["verify"], "s", medians["two starts"],
                "python -c pass, twice")]
    if before is not None:
        rows.append(row(f"site verify, this tree vs {args.against}", medians["verify"], "s",
                        medians["verify at ref"], f"the same verify at {args.against}, same run"))
    print(f"{repeat} interleaved rounds, medians", flush=True)
    print_rows(rows)
    return rows


if __name__ == "__main__":
    main()
