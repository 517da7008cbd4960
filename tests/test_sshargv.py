"""The ssh words' rules without ``re`` (vq_admin.sshargv) are exactly the
anchored patterns and ``shlex.quote`` they stand for: checked with hypothesis."""

from __future__ import annotations

import re
import shlex

from hypothesis import given
from hypothesis import strategies as st

from vq_admin.sshargv import LITERAL_WORD_PATTERN, SHELL_PROBE, literal_word, literal_words, shell_quote

#: Characters near every rule's edges, and any text at all.
EDGES = "aZ09_./,+-~=@:%'\"$`!*?{}[]()\\ \t\n\r\0#^&;|<>\u00e9\u0661\u212a"
words = st.text(alphabet=st.sampled_from(EDGES), max_size=12) | st.text(max_size=12)


@given(words)
def test_literal_word_is_the_pattern(word):
    assert literal_word(word) == bool(re.match(LITERAL_WORD_PATTERN, word))


@given(st.lists(words, max_size=4))
def test_literal_words_is_every_word_literal(ws):
    assert literal_words(ws) == all(re.match(LITERAL_WORD_PATTERN, w) for w in ws)


@given(words)
def test_shell_quote_is_shlex_quote(word):
    assert shell_quote(word) == shlex.quote(word)


def test_the_probe_words_quote_as_shlex_quotes_them():
    assert [shell_quote(w) for w in SHELL_PROBE] == [shlex.quote(w) for w in SHELL_PROBE]
