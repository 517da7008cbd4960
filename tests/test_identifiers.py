"""Issue 11: one definition of every identifier (vq_admin/core/identifiers.py).

* no other module of vq_admin compiles an anchored SHA, digest or name pattern
  of its own (an AST scan of every ``re.compile`` call);
* ``vq_admin_hookspecs`` installs alone and keeps its own copies of the five
  patterns it exports: they are the same patterns, and agree with the one
  home on a hypothesis-generated set of strings;
* the patterns accept and refuse what the contract says (a few pinned cases).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vq_admin_identifiers as vq_admin_hookspecs  # where its copies live (vq-admin-hookspecs)

from vq_admin.core import identifiers

PACKAGE = Path(identifiers.__file__).resolve().parent.parent
SHARED = ("FULL_SHA_RE", "SHA256_RE", "NAME_RE", "ENV_NAME_RE", "TAG_RE")
#: Characters that make the interesting cases: hex in both cases, name and ref punctuation, a newline.
ALPHABET = "0123456789abcdefABCDEFgzZ_.-/+@:%{}\n "


def test_hookspecs_keeps_the_same_patterns():
    for name in SHARED:
        theirs, ours = getattr(vq_admin_hookspecs, name), getattr(identifiers, name)
        assert (theirs.pattern, theirs.flags) == (ours.pattern, ours.flags), name


def strings():
    hexes = st.text("0123456789abcdefABCDEF", min_size=38, max_size=66)
    return st.one_of(hexes, st.text(ALPHABET, max_size=70), st.text(max_size=20),
                     hexes.map(lambda s: s + "\n"), hexes.map(lambda s: "-" + s))


@settings(max_examples=2000, deadline=None)
@given(strings())
def test_hookspecs_and_the_one_home_agree(value):
    for name in SHARED:
        assert bool(getattr(vq_admin_hookspecs, name).match(value)) == bool(getattr(identifiers, name).match(value)), \
            (name, value)


@settings(max_examples=1000, deadline=None)
@given(strings())
def test_a_recorded_sha_is_a_lower_case_full_sha(value):
    full = bool(identifiers.FULL_SHA_RE.match(value))
    assert bool(identifiers.SHA_RE.match(value)) == (full and value == value.lower())


@pytest.mark.parametrize("pattern, good, bad", [
    ("SHA_RE", ["a" * 40, "0" * 64], ["A" * 40, "a" * 39, "a" * 41, "a" * 63, "a" * 40 + "\n", "g" * 40]),
    ("FULL_SHA_RE", ["A" * 40, "aB" * 32], ["a" * 50, " " + "a" * 40, "a" * 64 + "\n"]),
    ("SHA256_RE", ["f" * 64], ["F" * 64, "f" * 40, "f" * 64 + "\n"]),
    ("NAME_RE", ["vibeqc", "a", "host-1.example_2", "x" * 64], ["", "-x", ".x", "x" * 65, "a/b", "a b", "a\n"]),
    ("ENV_NAME_RE", ["PATH", "_x1"], ["1X", "A-B", "", "A\n"]),
    ("TAG_RE", ["v1.0", "release/2026-11", "_x"], ["", "-v", "a..b", "a//b", "a@{b", "a/.b", "a.lock", "a.lock/b",
                                                     "a/", "a.", "x" * 201, "v1\n"]),
    ("BRANCH_RE", ["main", "release/1.x"], ["HEAD", "_x", "a..b", "a.lock", "a/", "-x", "main\n"]),
    ("DESTINATION_RE", ["cluster", "user@host:22", "_h"], ["-oProxyCommand=x", "", "a b", "h\n", "x" * 256]),
])
def test_pinned_cases(pattern, good, bad):
    compiled = getattr(identifiers, pattern)
    assert [g for g in good if not compiled.match(g)] == []
    assert [b for b in bad if compiled.match(b)] == []


def anchored_patterns(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "compile"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args):
            try:
                value = ast.literal_eval(node.args[0])
            except ValueError:
                continue
            found.append((node.lineno, value))
    return found


def test_no_other_module_defines_an_identifier_pattern():
    ours = {getattr(identifiers, n).pattern for n in dir(identifiers) if n.endswith("_RE")}
    home = Path(identifiers.__file__).resolve()
    copies = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py")) if path != home
              for line, pattern in anchored_patterns(path) if pattern in ours]
    assert copies == []
    # and the patterns vq_admin still compiles elsewhere are not identifiers of these kinds
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == home:
            continue
        for line, pattern in anchored_patterns(path):
            assert not re.search(r"\{40\}|\{64\}|\{0,63\}|\{0,254\}", pattern) or not pattern.startswith(r"\A"), \
                f"{path}:{line} defines {pattern!r}; use vq_admin.core.identifiers"
