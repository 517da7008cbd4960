"""Run every benchmark of the project: ``python3 bench/run.py [--quick]``.

Each ``bench/bench_*.py`` module has ``main(argv) -> rows``; every row is a
figure, a baseline measured in the same run, and their ratio.  The summary
table at the end repeats every row.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import print_rows  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rows: list[dict] = []
    failures = []
    for path in sorted(HERE.glob("bench_*.py")):
        print(f"== {path.name}", flush=True)
        module = importlib.import_module(path.stem)
        try:
            rows.extend(module.main(argv))
        except Exception as exc:  # report and continue: one broken bench must not hide the others
            failures.append(f"{path.name}: {type(exc).__name__}: {exc}")
            print(f"FAILED {failures[-1]}", flush=True)
    print("== summary (figure, baseline measured in the same run, ratio)")
    print_rows(rows)
    for failure in failures:
        print(f"FAILED {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
