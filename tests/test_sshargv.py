"""The literal-word rule (vq_admin.ssh.argv): the words any login shell reads as themselves."""

from __future__ import annotations

import pytest

from vq_admin.ssh.argv import literal_word, literal_words


@pytest.mark.parametrize("word", ["/opt/vq/bin/vq-admin-agent", "session", "a,b+c.d_e", "x-y"])
def test_plain_words_are_literal(word):
    assert literal_word(word)


@pytest.mark.parametrize("word", ["", "-x", "~x", "=x", "a b", "a*", "$HOME", "a'b", "`x`", "a\n", "\u00e9", "{a,b}"])
def test_words_a_shell_would_change_are_not(word):
    assert not literal_word(word)
    assert not literal_words(["session", word])
