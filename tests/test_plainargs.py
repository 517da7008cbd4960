"""vq_admin.core.plainargs: whatever the hand parser of ``launcher`` and ``update`` takes, the verb's
argparse reads the same way (checked with hypothesis against the real parser); anything it does
not take is left to argparse."""

from __future__ import annotations

import argparse
import contextlib
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from vq_admin.cli import build_parser
from vq_admin.entry import parse_launcher
from vq_admin.ssh.early_start import parse_update
from vq_admin.core.plainargs import plain_words

SHA = "a" * 40
PARSER = build_parser()

#: Words near every rule's edges: operands, the verbs' options (and abbreviations, unknown ones),
#: values, values that look like options, empty values, ``--`` and ``-``.
VOCABULARY = ["vibeqc", "cluster", "x", SHA, "--expected-sha", f"--expected-sha={SHA}", "--expected-sha=",
              "--path", "--path=--", "--path=/p", "--pin", "--pin=" + SHA, "--config", "--config=/c", "--state-dir",
              "--state-dir=/s", "--tag", "--tag=v1", "v1", "/c", "--json", "--json=1", "--check-on-host", "-v",
              "--verbose", "-vv", "--exp", "--help", "--", "-", "-x", "--all", "--force"]
#: Whole options, mixed with the edges, around a well-formed core (shuffled), so that most lines
#: are ones the entries take.
EXTRAS = [["--tag", "v1"], ["--config", "/c"], ["--path", "/p"], ["--pin", SHA], ["--state-dir", "/s"], ["--json"],
          ["-v"], ["--check-on-host"]]
extras = st.lists(st.sampled_from(EXTRAS) | st.sampled_from(VOCABULARY).map(lambda w: [w]), max_size=4)


def lines(core: list[list[str]]) -> st.SearchStrategy[list[str]]:
    return extras.flatmap(lambda more: st.permutations(core + more)).map(
        lambda chunks: [w for chunk in chunks for w in chunk])


launcher_lines = lines([["vibeqc"], ["cluster"]])
update_lines = lines([["vibeqc"], ["cluster"], ["--expected-sha", SHA]])


def argparse_reads(verb: str, words: list[str]) -> argparse.Namespace | None:
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return PARSER.parse_args([verb, *words])
    except SystemExit:
        return None


def read_by_both(verb: str, parse, words: list[str]):
    """(what the hand parser read, what argparse read) of a line the hand parser takes, else None;
    argparse must take every line the hand parser takes."""
    parsed = parse(words)
    if parsed is None:
        return None
    ns = argparse_reads(verb, words)
    assert ns is not None, words
    return parsed, ns


@settings(max_examples=300, deadline=None)
@given(launcher_lines)
def test_what_the_launcher_entry_takes_argparse_reads_the_same(words):
    both = read_by_both("launcher", parse_launcher, words)
    if both is None:
        return
    parsed, ns = both
    for key in ("program", "host", "expected_sha", "path", "pin", "config", "state_dir", "json", "check_on_host"):
        assert getattr(parsed, key) == getattr(ns, key), (key, words)


@settings(max_examples=300, deadline=None)
@given(update_lines)
def test_what_the_update_entry_takes_argparse_reads_the_same(words):
    both = read_by_both("update", parse_update, words)
    if both is None:
        return
    parsed, ns = both
    assert ns.targets == [parsed["program"], parsed["host"]], (words, ns)
    for key in ("expected_sha", "tag", "config", "state_dir"):
        assert parsed.get(key) == getattr(ns, key), (key, words)


def test_the_rules():
    valued, flags = {"--opt": "opt"}, {"--flag": "flag", "-f": "flag"}
    assert plain_words(["a", "--opt", "v", "--flag", "b", "-f"], valued, flags) == (["a", "b"], {"opt": "v"}, {"flag"})
    assert plain_words(["--opt=-v"], valued, flags) == ([], {"opt": "-v"}, set())  # argparse takes it verbatim
    assert plain_words(["a", "--flag", "b"], valued, flags, together=True) is None  # PROGRAM HOST cut in two
    assert plain_words(["--flag", "a", "b"], valued, flags, together=True) == (["a", "b"], {}, {"flag"})
    for words in (["--opt", "-v"], ["--opt="], ["--opt=--"], ["--opt"], ["--opt", "a", "--opt", "b"], ["--op", "a"],
                  ["--flag=1"], ["--"], ["-"], ["--help"]):
        assert plain_words(words, valued, flags) is None, words

