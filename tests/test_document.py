"""The one way a document is read and written (vq_admin.document)."""

from __future__ import annotations

import pytest

from vq_admin.core.bounds import InputError
from vq_admin.document import Count, Document, DocumentError, FullSha, Sha256


class Inner(Document, frozen=True, kw_only=True):
    size: Count
    note: str | None = None


class Sample(Document, frozen=True, kw_only=True):
    sha: FullSha
    digest: Sha256
    inner: Inner
    words: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.inner.size == 0 and self.words:
            raise ValueError("words need a size")


GOOD = {"sha": "a" * 40, "digest": "b" * 64, "inner": {"size": 3}}


def test_a_document_round_trips_with_every_declared_member_written() -> None:
    doc = Sample.from_json('{"sha": "' + "a" * 40 + '", "digest": "' + "b" * 64 + '", "inner": {"size": 3}}', "t")
    assert doc.inner.size == 3 and doc.words == ()
    assert doc.to_value() == {"sha": "a" * 40, "digest": "b" * 64, "inner": {"size": 3, "note": None}, "words": ()}
    assert Sample.from_json(doc.to_json(), "again") == doc
    assert doc.replace(words=("x",)).words == ("x",)


@pytest.mark.parametrize(("change", "named"), [
    ({"sha": "A" * 40}, "$.sha"),
    ({"sha": "a" * 39}, "$.sha"),
    ({"digest": "b" * 40}, "$.digest"),
    ({"inner": {"size": -1}}, "$.inner.size"),
    ({"inner": {"size": "3"}}, "$.inner.size"),
    ({"inner": {"size": True}}, "$.inner.size"),
    ({"inner": {"size": 0}, "words": ["x"]}, "words need a size"),
])
def test_a_wrong_member_is_refused_naming_it(change: dict[str, object], named: str) -> None:
    with pytest.raises(DocumentError) as caught:
        Sample.from_value({**GOOD, **change}, "the sample")
    assert str(caught.value).startswith("the sample: ") and named in str(caught.value)


def test_the_bounded_parser_comes_first() -> None:
    with pytest.raises(InputError) as caught:  # the parser's refusal, before any type check
        Sample.from_json("[" * 5000, "the sample")
    assert "nested" in str(caught.value)
    with pytest.raises(InputError):
        Sample.from_json('{"sha": 1, "sha": 2}', "the sample")



@pytest.mark.parametrize("body, deepest", [
    ("a = [[1]]\n", 2),
    ('a = "[[[["\nb = [1]\n', 1),  # brackets in a string do not nest
    ("a = '''\n[[[[\n'''\nb = {c = [1]}\n", 2),  # nor in a multi-line literal string
    ('a = "x\\"[[[["\nb = 1\n', 0),  # an escaped quote does not end a basic string
    ('a = "[[\nb = [1]\n', 1),  # an unclosed single-line string ends at its line
    ("# [[[[\na = [1]\n", 1),  # nor in a comment
])
def test_toml_depth_reads_strings_and_comments_as_text(body, deepest):
    from vq_admin.core.bounds import toml_depth

    padded = "# " + "." * 80 + "\n" + body  # past the fast path's count: the text is read
    assert toml_depth(padded, limit=64) == deepest
    assert toml_depth("a.b.c.d = 1\n", limit=2) == 3  # a dotted key counts toward the limit
