"""The README's first command works from a fresh clone, twice, installed as an operator installs it;
the operator guide's sample is what the demo prints."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HINT = "run the demo again: the second run reports already-current and builds nothing."

pytestmark = pytest.mark.real


def guide_sample(guide: Path) -> list[str]:
    """The sample demo output in the operator guide's "The demo" section."""
    text = guide.read_text().split("\n## The demo\n", 1)[1]
    block = text.split("```\n$ vq admin update ", 1)[1].split("\n```", 1)[0]
    return ("$ vq admin update " + block).splitlines()


#: What a sample line leaves out, and the pattern each stands for; the rest of a line is literal.
WILDCARDS = ((r"\.\.\.|~/\.local/state", ".*"), (r"\d{8}T\d{6}Z", r"\d{8}T\d{6}Z"), (r"\b[0-9a-f]{8,}\b", "[0-9a-f]+"))


def sample_pattern(line: str) -> re.Pattern[str]:
    """A sample line as a pattern: ``...`` (and ``~/.local/state``) stands for anything, a UTC stamp
    for any stamp, a hex word (a SHA, a digest, a random part) for any hex word."""
    out = []
    for part in re.split("(" + "|".join(w for w, _ in WILDCARDS) + ")", line):
        out.append(next((p for w, p in WILDCARDS if re.fullmatch(w, part)), None) or re.escape(part))
    return re.compile("".join(out))


def assert_sample_in(sample: list[str], output: str) -> None:
    lines = iter(output.splitlines())
    for wanted in sample:
        pattern = sample_pattern(wanted)
        assert any(pattern.fullmatch(line) for line in lines), f"the guide's line {wanted!r} is not in:\n{output}"


def test_demo_from_a_fresh_clone_deploys_then_reports_already_current(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    first = subprocess.run(["bash", "scripts/demo.sh"], cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=900)  # as a terminal shows it: narration and summary in order
    assert first.returncode == 0, first.stdout
    assert "runtime vibeqc on demo-cluster: ok (exit 0)" in first.stdout
    releases = list((clone / "demo-run" / "apps" / "releases").iterdir())
    assert len(releases) == 1 and len(releases[0].name) == 40
    assert (clone / "demo-run" / "apps" / "current").resolve() == releases[0]
    # installed as an operator installs it: not editable, the installed package runs
    listed = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pip", "list", "--editable"],
                            cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "vq-admin" not in listed and "vq-site-example" not in listed, listed
    # the guide's sample is what the demo printed; the hint comes on the first run only
    assert_sample_in(guide_sample(clone / "docs" / "operator-guide.md"), first.stdout)
    assert first.stdout.count(HINT) == 1

    second = subprocess.run(["bash", "scripts/demo.sh"], cwd=clone, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already-current (exit 0)" in second.stdout
    assert HINT not in second.stdout
    assert list((clone / "demo-run" / "apps" / "releases").iterdir()) == releases


def test_the_sample_pattern_matches_its_own_shape_only():
    pattern = sample_pattern("  receipt   .../receipts/20261130T064509Z-runtime-demo-cluster-vibeqc-84dd69c4.json")
    assert pattern.fullmatch("  receipt   /x/y/receipts/20270101T000000Z-runtime-demo-cluster-vibeqc-0badf00d.json")
    assert not pattern.fullmatch("  receipt   /x/receipts/20270101T000000Z-runtime-other-vibeqc-0badf00d.json")
    tag = sample_pattern("  tag       v1.0")
    assert tag.fullmatch("  tag       v1.0") and not tag.fullmatch("  tag       v2.0")
