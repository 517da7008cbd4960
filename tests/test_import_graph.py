"""scripts/import_graph.py: the import graph of vq_admin and hookspecs, and its cycles.

The script is what anyone runs to see the cycles; these tests run it on the
real tree (no cycle) and on small synthetic packages (so a cycle is seen,
and the kinds are told apart).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "import_graph.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_cycle_through_a_function_import_is_found_and_exits_1(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def f():\n    from .sub import c\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "import pkg.a\n",
        "pkg/d.py": "from .a import thing\n",
    })
    done = run(pkg / "pkg")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "cycle 1: 3 modules: pkg.a, pkg.b, pkg.sub.c" in done.stdout
    assert "pkg.b -> pkg.sub.c  (function import, b.py:2)" in done.stdout
    assert "pkg.a -> pkg.b  (module import, a.py:1)" in done.stdout
    assert "pkg.d" not in done.stdout.split("\n")[0]  # d depends on the cycle but is not in it


def test_a_type_checking_import_counts_towards_a_cycle(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/lane.py": "from .step import run\nclass Lane: ...\n",
        "pkg/step.py": ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                        "if TYPE_CHECKING:\n    from .lane import Lane\n"
                        "def run(lane: Lane) -> None: ...\n"),
    })
    done = run(pkg / "pkg")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 under TYPE_CHECKING" in done.stdout
    assert "cycle 1: 2 modules: pkg.lane, pkg.step" in done.stdout
    assert "pkg.step -> pkg.lane  (type-checking import, step.py:4)" in done.stdout
    graph = load().scan([pkg / "pkg"])
    assert [(e.source, e.kind, e.names) for e in graph.importers("pkg.lane", "Lane")] == [
        ("pkg.step", "type-checking", ("Lane",))]
    edges = run(pkg / "pkg", "--edges")
    assert "pkg.step -> pkg.lane  type-checking  line 4  (Lane)" in edges.stdout


def test_dot_output_draws_each_kind(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import pkg.b\n",
        "pkg/b.py": "def f():\n    import pkg.a\n",
    })
    done = run(pkg / "pkg", "--dot")
    assert done.returncode == 1
    assert done.stdout.startswith("digraph imports {")
    assert '"pkg.a" -> "pkg.b" [style=solid];' in done.stdout
    assert '"pkg.b" -> "pkg.a" [style=dashed];' in done.stdout
    assert '"pkg.a", color="red";' in done.stdout


@pytest.mark.parametrize("level", ["pkg/sub/__init__.py", "pkg/sub/mod.py"])
def test_relative_imports_resolve_from_a_package_and_from_a_module(tmp_path: Path, level: str) -> None:
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "", "pkg/top.py": "", "pkg/sub/__init__.py": "", "pkg/sub/mod.py": "",
    })
    (pkg / level).write_text("from ..top import x\nfrom .. import top\n")
    graph = load().scan([pkg / "pkg"])
    source = "pkg.sub" if level.endswith("__init__.py") else "pkg.sub.mod"
    assert {(e.source, e.target) for e in graph.edges} == {(source, "pkg.top")}


def test_a_main_block_import_is_listed_apart_and_makes_no_cycle(tmp_path: Path) -> None:
    pkg = write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/entry.py": "def main():\n    from .cli import run\n",
        "pkg/cli.py": "def run(): ...\nif __name__ == '__main__':\n    from pkg.entry import main\n",
    })
    done = run(pkg / "pkg")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 in __main__ blocks (not counted)" in done.stdout
    (pkg / "pkg" / "cli.py").write_text("from pkg.entry import main\ndef run(): ...\n")  # the same, at import
    assert run(pkg / "pkg").returncode == 1


def test_vq_admin_and_hookspecs_have_no_import_cycle() -> None:
    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("no import cycle")


def test_only_the_lane_modules_import_runtime_update() -> None:
    """Steps are built from explicit inputs (``lanes/runtime_step.py``); the first call and the
    command-file check read the ``RuntimeLane`` protocol.  Only the runtime lane and the rollback
    that extends it name ``RuntimeUpdate``, in any kind of import (TYPE_CHECKING included)."""
    graph = load().scan()
    importers = {e.source for e in graph.importers("vq_admin.lanes.runtime", "RuntimeUpdate")}
    assert importers <= {"vq_admin.lanes.rollback"}, sorted(importers)
    steps = {"vq_admin.lanes.mirror_step", "vq_admin.lanes.allocation_step", "vq_admin.lanes.detached_step",
             "vq_admin.lanes.allocation_attempt", "vq_admin.lanes.first_call", "vq_admin.lanes.command_files"}
    assert not {e.source for e in graph.importers("vq_admin.lanes.runtime")} & steps
