"""The README's first command works from a fresh clone, twice."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.real


def test_demo_from_a_fresh_clone_deploys_then_reports_already_current(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    first = subprocess.run(["bash", "scripts/demo.sh"], cwd=clone, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "runtime vibeqc on demo-cluster: ok (exit 0)" in first.stdout
    releases = list((clone / "demo-run" / "apps" / "releases").iterdir())
    assert len(releases) == 1 and len(releases[0].name) == 40
    assert (clone / "demo-run" / "apps" / "current").resolve() == releases[0]

    second = subprocess.run(["bash", "scripts/demo.sh"], cwd=clone, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already-current (exit 0)" in second.stdout
    assert list((clone / "demo-run" / "apps" / "releases").iterdir()) == releases
