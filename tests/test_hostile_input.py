"""Hostile input, 2,000 examples each, in process: SHAs, program and host names,
tags, transcripts with binary bytes and terminal escapes, and receipts printed
with --json.  (Configurations and verify receipts: tests/test_config.py and
tests/test_evidence.py.)
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import random
import string
import subprocess
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vq_admin import bindings, cli, entry
from vq_admin.launcher import registry
from vq_admin.commands.arguments import SHA_RULE, check_name, full_sha
from vq_admin.state.locks import lock_path
from vq_admin.report.outcome import Outcome, UsageError
from vq_admin.report.output import CONTINUATION, print_json, receipt_summary
from vq_admin.report.receipt import Receipt, parse_metrics
from vq_admin.report.sections import CommandOutput, Deploy, Readback
from vq_admin.source import check_tag_name
from vq_admin.state.records import StateDir

HEX = "0123456789abcdefABCDEF"
NAME_CHARS = string.ascii_letters + string.digits + "._-"
MANY = settings(max_examples=2000, deadline=None)
#: What must never reach a terminal: C0 but tab and newline, DEL, C1, line separators, bidi controls.
FORBIDDEN = {chr(c) for c in [*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0)]} | set(
    "\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
NO_STATE = "/nonexistent/vq-admin-hostile-state"


def near(alphabet: str, lengths: tuple[int, ...]) -> st.SearchStrategy[str]:
    """Strings of *alphabet* at and around *lengths*, sometimes with one foreign character."""
    base = st.sampled_from(lengths).flatmap(lambda n: st.text(alphabet, min_size=max(0, n - 1), max_size=n + 1))
    foreign = st.sampled_from(["\n", "\x00", " ", "g", "０", "é", "-", "/", "..", "\x1b[2J", "^{}", "~1"])
    return st.one_of(base, st.tuples(base, foreign, st.integers(0, 70)).map(
        lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:]))


# -- SHAs -------------------------------------------------------------------------------


def is_full_sha(value: str) -> bool:
    return len(value) in (40, 64) and all(c in HEX for c in value)


_PARSER = functools.lru_cache(cli.build_parser)  # building the whole argument tree costs more than parsing


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(cli, "build_parser", _PARSER):
        code = entry.main(list(argv))
    return code, out.getvalue(), err.getvalue()


@MANY
@given(st.one_of(near(HEX, (40, 64)), st.text(), st.binary().map(lambda b: b.decode("latin-1"))))
def test_the_sha_rule_accepts_exactly_full_shas(value):
    if is_full_sha(value):
        assert full_sha(value) == value.lower()
    else:
        try:
            full_sha(value)
        except UsageError as exc:
            assert SHA_RULE in exc.message
        else:
            raise AssertionError(f"{value!r} was accepted")
    # the driver's per-job API decides the same, before reading any state
    try:
        bindings.resolve_launcher("vibeqc", "cluster", expected_sha=value, state_dir=NO_STATE)
    except bindings.BindingUsageError:
        assert not is_full_sha(value)
    except (bindings.LauncherRefused, UsageError):  # no evidence, and no configuration naming the host: exit 2
        assert is_full_sha(value)
    # the command line: exit 2 and one JSON document naming the rule; nothing on a terminal unescaped
    code, out, err = run_cli("update", "vibeqc", "cluster", f"--expected-sha={value}", "--json",
                             "--config", "/nonexistent/admin.toml", "--state-dir", NO_STATE)
    document = json.loads(out)
    assert code == 2 and document["outcome"] == "usage"
    assert (SHA_RULE in document["errors"][0]) is not is_full_sha(value)
    assert not FORBIDDEN.intersection(err) and err.count("\n") == 1 + document["errors"][0].count("\n")


# -- program and host names -------------------------------------------------------------


def is_name(value: str) -> bool:
    return 1 <= len(value) <= 64 and value[0] in NAME_CHARS[:62] and all(c in NAME_CHARS for c in value)


@MANY
@given(st.one_of(near(NAME_CHARS, (1, 2, 64)), st.text(max_size=80), st.sampled_from([".", "..", "-x", "a/b", "a\n"])))
def test_names_are_checked_the_same_everywhere_and_stay_below_the_state_directory(value):
    try:
        check_name(value, "HOST")
        accepted = True
    except UsageError as exc:
        accepted = False
        assert "must match" in exc.message
    assert accepted is is_name(value)
    try:
        bindings.resolve_launcher(value, value, state_dir=NO_STATE)
    except bindings.BindingUsageError:
        assert not accepted
    except (bindings.LauncherRefused, UsageError):  # no evidence, and no configuration naming the host: exit 2
        assert accepted
    if accepted:  # every path built from a name is a direct child, never a traversal
        root = os.path.normpath(NO_STATE)
        for path in (StateDir(root).lane_dir("runtime", value, value), registry.lane_dir(root, value, value),
                     lock_path(Path(root), "runtime", value, value)):
            normal = os.path.normpath(str(path))
            assert normal.startswith(root + "/") and str(path) == normal


# -- tags -------------------------------------------------------------------------------


def git_refname_ok(ref: str) -> bool:
    """git's check_refname_format for a full ref name (git-check-ref-format(1), rules 1-10)."""
    if ref.endswith("/") or ref.endswith(".") or "//" in ref or ".." in ref or "@{" in ref or ref == "@":
        return False
    if any(ord(c) < 0x20 or c in " ~^:?*[\\\x7f" for c in ref):
        return False
    return all(part and not part.startswith(".") and not part.endswith(".lock") for part in ref.split("/"))


TAG_CHARS = string.ascii_letters + string.digits + "._/+-@{}~^:?*[\\ "


@MANY
@given(st.one_of(near(TAG_CHARS, (1, 5, 12)), st.text(max_size=40),
                 st.lists(st.sampled_from(["v1", ".", "..", "/", ".lock", "@", "{", "a", "-", "x.lock", "_"]),
                          min_size=1, max_size=8).map("".join)))
def test_an_accepted_tag_is_a_valid_git_tag_name_and_no_option(value):
    try:
        check_tag_name(value)
    except UsageError as exc:
        assert "is not a valid tag name" in exc.message
        return
    assert git_refname_ok("refs/tags/" + value), value
    assert not value.startswith("-") and not FORBIDDEN.intersection(value)


@pytest.mark.real
def test_the_refname_oracle_agrees_with_git():
    """The oracle above, checked against ``git check-ref-format`` itself on a fixed sample."""
    rng = random.Random(7)
    pieces = ["v1", ".", "..", "/", ".lock", "@", "{", "a", "-", "b.lock", "_", "~", " ", "x", "@{"]
    sample = ["v1", "a/.b", "a.lock/b", "a/b.lock", "@", "a@{b", "a//b", "a/", "a.", "-x"]
    sample += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(150)]
    for name in sample:
        done = subprocess.run(["git", "check-ref-format", f"refs/tags/{name}"], capture_output=True)
        assert (done.returncode == 0) is git_refname_ok(f"refs/tags/{name}"), name


# -- transcripts and receipts -----------------------------------------------------------

ESCAPES = ["\x1b[2J", "\x1b]0;owned\x07", "\x9b31m", "\r", "\x00", "\u202e", "\u2028", "\x1bP+q\x1b\\",
           "\n  next      rm -rf /", "\nVQ-DEPLOY-METRIC build_seconds=nan\n", "VQ-DEPLOY-METRIC x=1e999"]
hostile_bytes = st.one_of(st.binary(max_size=300), st.lists(st.sampled_from([e.encode() for e in ESCAPES] + [
    b"\xff\xfe", b"\xc3", b"ok\n", b"\xe2\x80\xae"]), max_size=8).map(b"".join))
hostile_text = st.one_of(st.text(max_size=120), st.lists(st.sampled_from(ESCAPES + ["x", "é", "\t"]), max_size=6)
                         .map("".join))


def strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


@MANY
@given(stdout=hostile_bytes, stderr=hostile_bytes, error=hostile_text, note=hostile_text, advice=hostile_text,
       outcome=st.sampled_from(list(Outcome)))
def test_transcripts_never_reach_a_terminal_raw_and_receipts_stay_json(stdout, stderr, error, note, advice, outcome):
    receipt = Receipt("runtime", "cluster", "vibeqc", "ab" * 20, "v1", "2026-11-30T00:00:00Z")
    out, err = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")  # as the lanes decode
    receipt.command_output = CommandOutput(complete=True, stdout=out, stderr=err)
    receipt.metrics = parse_metrics(out, err)
    receipt.deploy = Deploy(exit_code=1)
    receipt.errors = [f"deploy: the provider exited 1: {err[-300:]}", error]
    receipt.notes = [note]
    receipt.readback = Readback(read="nothing", advice=advice,
                                next_command="vq admin update vibeqc cluster --expected-sha " + "ab" * 20)
    receipt.id = "20261130T000000Z-runtime-cluster-vibeqc-00000000"
    document = receipt.finish(outcome, "2026-11-30T00:00:01Z").to_dict()
    printed = io.StringIO()
    print_json(document, printed)  # what --json prints
    text = printed.getvalue()
    assert strict_json(text) == document and text.isascii() and text.count("\n") == text.strip().count("\n") + 1
    lines = receipt_summary(document, "/state/receipts/x.json")  # what a terminal sees
    shown = "\n".join(lines)
    assert not FORBIDDEN.intersection(shown), repr(shown)
    fields = [line for line in shown.split("\n") if line.startswith("  ") and not line.startswith(CONTINUATION)]
    assert len(fields) == len(lines) - 1 - (1 if advice else 0), shown  # no line from a host poses as a field


def test_double_dash_option_values_survive_the_command_line():
    """Python 3.11's argparse turns ``--opt=--`` into ``[]``; vq-admin keeps ``--`` (and leaves ``--x=--`` alone)."""
    args = cli.parse(cli.build_parser("vq-admin"), ["update", "vibeqc", "cluster", "--update-script-arg=--",
                                                    "--update-script-arg=--jobs=--", "--tag=--"])
    assert (args.update_script_arg, args.tag) == (["--", "--jobs=--"], "--")
