"""The feed's push argv, as built by vq_admin.source.mirror: never a force, never a mirror-sync.

Pure unit tests over hypothesis-generated ref sets; nothing is run.
"""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vq_admin.source import mirror
from vq_admin.config import BRANCH_RE
from vq_admin.source.mirror import FeedRef, feed_refspecs, parse_ls_remote, parse_porcelain, push_argv
from vq_admin.source import TAG_RE

HEX = "0123456789abcdef"
shas = st.one_of(st.text(HEX, min_size=40, max_size=40), st.text(HEX, min_size=64, max_size=64))
NAME_CHARS = string.ascii_letters + string.digits + "._/+-"
tag_names = st.text(NAME_CHARS, min_size=1, max_size=30).filter(lambda t: bool(TAG_RE.match(t)))
lanes = st.text(NAME_CHARS, min_size=1, max_size=30).filter(lambda t: bool(BRANCH_RE.match(t)))
actions = st.sampled_from(["planned", "create", "unchanged", "fast-forward", "refuse", "left-drifted"])
urls = st.one_of(st.builds(lambda h, p: f"{h}:/{p}", st.sampled_from(["cluster", "user@login.example"]),
                           st.text(NAME_CHARS + " :", min_size=1, max_size=30)),
                 st.builds(lambda p: "/" + p, st.text(NAME_CHARS + " :", min_size=1, max_size=30)))

OPTIONS = ["--atomic", "--porcelain", "--no-follow-tags", "--no-recurse-submodules", "--no-verify",
           "--receive-pack=git -c core.hooksPath=/dev/null receive-pack"]


@st.composite
def ref_sets(draw):
    sha, lane = draw(shas), draw(lanes)
    refs = [FeedRef(mirror.PIN_PREFIX + sha, "pin", sha), FeedRef(f"refs/heads/{lane}", "branch", sha),
            FeedRef(f"refs/remotes/origin/{lane}", "branch", sha)]
    for tag in draw(st.lists(tag_names, unique=True, max_size=6)):
        refs.append(FeedRef(f"refs/tags/{tag}", "tag", draw(st.one_of(st.just(sha), shas))))
    for ref in refs:
        ref.action = draw(actions)
    refs[0].action = draw(st.sampled_from(["planned", "create", "unchanged"]))  # the pin is always fed
    return refs


def check_unforced(argv: list[str], url: str, expected_specs: list[str]) -> None:
    assert argv[:5] == ["git", "-C", "/srv/src/vibeqc", "push", *OPTIONS[:1]]
    cut = argv.index("--")
    assert argv[4:cut] == OPTIONS
    assert argv[cut + 1] == url
    assert argv[cut + 2:] == expected_specs
    for word in argv:
        assert word not in ("-f", "--force", "--mirror", "--prune", "--all", "--tags", "--delete", "-d")
        assert not word.startswith(("--force", "--mirror", "+"))
    for spec in argv[cut + 2:]:
        obj, ref = spec.split(":")
        assert not obj.startswith("+") and ref.startswith("refs/")


@settings(max_examples=300, deadline=None)
@given(ref_sets(), urls)
def test_push_argv_never_carries_a_force(refs, url):
    argv = push_argv("/srv/src/vibeqc", url, feed_refspecs(refs))
    fed = [r for r in refs if r.action in ("planned", "create", "unchanged", "fast-forward")]
    check_unforced(argv, url, [f"{r.requested}:{r.ref}" for r in fed])
    named = {spec.split(":")[1] for spec in argv[argv.index("--") + 2:]}
    assert not named & {r.ref for r in refs if r.action in ("refuse", "left-drifted")}


@settings(max_examples=300, deadline=None)
@given(st.one_of(shas, st.builds(lambda p, s: p + s, st.sampled_from(["+", ":", " ", "-"]), shas),
                 st.text(min_size=0, max_size=12)),
       st.sampled_from(["refs/heads/x", "refs/tags/t", "x", "refs/a:refs/b", "refs/heads/a b", "+refs/heads/x"]))
def test_push_argv_rejects_anything_but_a_plain_refspec(obj, ref):
    plain = re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", obj) and re.fullmatch(r"refs/[^\s:]+", ref)
    if plain:
        assert push_argv("/r", "/m", [(obj, ref)])[-1] == f"{obj}:{ref}"
    else:
        with pytest.raises(ValueError):
            push_argv("/r", "/m", [(obj, ref)])


def test_push_argv_needs_at_least_one_ref():
    with pytest.raises(ValueError):
        push_argv("/r", "/m", [])


def test_forbidden_options_are_all_absent_from_a_real_argv():
    argv = push_argv("/r", "cluster:/m.git", [("a" * 40, "refs/heads/main")])
    assert not set(argv) & set(mirror.FORBIDDEN_PUSH_OPTIONS)


@given(st.lists(st.sampled_from(["refs/heads/main", "refs/remotes/x/refs/heads/main", "refs/tags/v1",
                                  "refs/tags/v1^{}", "refs/vq/pins/abc"]), unique=True), shas)
def test_ls_remote_is_filtered_to_exact_names(listed, sha):
    text = "".join(f"{sha}\t{name}\n" for name in listed)
    held = parse_ls_remote(text, ["refs/heads/main", "refs/tags/v1"])
    assert held == {n: sha for n in listed if n in ("refs/heads/main", "refs/tags/v1")}


def test_porcelain_rejections_are_parsed_per_ref():
    text = ("To cluster:/m.git\n=\tabc:refs/vq/pins/abc\t[up to date]\n"
            "!\tabc:refs/heads/main\t[rejected] (non-fast-forward)\n"
            "!\tdef:refs/tags/v1\t[rejected] (atomic push failed)\nDone\n")
    assert parse_porcelain(text) == {
        "refs/vq/pins/abc": ("=", "[up to date]"),
        "refs/heads/main": ("!", "[rejected] (non-fast-forward)"),
        "refs/tags/v1": ("!", "[rejected] (atomic push failed)"),
    }


@settings(max_examples=300, deadline=None)
@given(ref_sets(), urls, st.data())
def test_the_planned_push_filled_is_the_push_of_the_refs_the_read_left_in(refs, url, data):
    """The plan holds the push with the lane's branch pair as a list slot; filled after the read, it
    is exactly push_argv of feed_refspecs (a push happens only when the pin and every tag are fed)."""
    from vq_admin.plan import fill

    for ref in refs:
        if ref.kind != "branch":
            ref.action = data.draw(st.sampled_from(["planned", "create", "unchanged"]))
        elif ref.action == "refuse":
            ref.action = "left-drifted"
    template = mirror.push_template("/srv/src/vibeqc", url, refs)
    assert mirror.LANE_PAIR in template and template.count(mirror.LANE_PAIR) == 1
    filled = fill(template, {"lane_refspecs": mirror.lane_pair_refspecs(refs)})
    assert filled == push_argv("/srv/src/vibeqc", url, feed_refspecs(refs))
    check_unforced(filled, url, [f"{r.requested}:{r.ref}" for r in refs if r.pushed or r.action == "planned"])
