"""The plain-string twins of the identifier rules (vq_admin.core.names), the verify's answer, the
agent's prompt exit."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from vq_admin.agent import verify_readback
from vq_admin.core import filehash, protocol
from vq_admin.core.identifiers import NAME_RE, SHA256_RE, SHA_RE
from vq_admin.core.names import is_full_sha, is_name, is_sha256


def test_nan_survives_a_round_trip() -> None:
    value = protocol.decode(protocol.encode({"x": float("nan")}))
    assert math.isnan(value["x"])


# -- the name rule -------------------------------------------------------------------------

name_alphabet = st.sampled_from(list("aZ09._-") + ["\n", " ", "/", "\u00e9", "\u0661", "K", "\x00"])


@settings(max_examples=1000)
@given(value=st.text(alphabet=name_alphabet, max_size=70) | st.text(max_size=70) | st.from_regex(NAME_RE)
       | st.from_regex(NAME_RE).map(lambda s: s + "\n"))
@example(value="a" * 64)
@example(value="a" * 65)
@example(value="")
@example(value="-a")
@example(value=".a")
@example(value="a\n")
def test_is_name_is_name_re(value: str) -> None:
    assert is_name(value) is bool(NAME_RE.match(value))


hexish = st.text(alphabet=st.sampled_from("0123456789abcdefABg\n\u0661"), min_size=38, max_size=66)


@settings(max_examples=300)
@given(value=hexish | st.text(max_size=70) | st.from_regex(SHA_RE) | st.from_regex(SHA256_RE))
@example(value="a" * 64 + "\n")
def test_the_sha_twins_are_their_regexes(value: str) -> None:
    assert is_full_sha(value) is bool(SHA_RE.match(value))
    assert is_sha256(value) is bool(SHA256_RE.match(value))


@pytest.mark.parametrize("value", [5, b"abc", ["a"]])
def test_is_name_refuses_what_is_not_text_as_the_regex_does(value: object) -> None:
    with pytest.raises(TypeError) as regex:
        NAME_RE.match(value)  # type: ignore[call-overload]
    with pytest.raises(TypeError) as plain:
        is_name(value)
    assert str(plain.value) == str(regex.value)


# -- the verify ---------------------------------------------------------------------------

def test_the_verify_answer_carries_the_verify_and_the_launcher_s_digest(tmp_path: Path) -> None:
    launcher = tmp_path / "python"
    launcher.write_bytes(b"#!/bin/sh\n")
    receipt = json.dumps({"active_path": str(launcher)})
    argv = ["sh", "-c", f"printf '%s' '{receipt}'; printf 'w\\377' >&2; test \"$VQ_T\" = 1 && exit 4"]
    answer = verify_readback.verify_readback(argv, {"VQ_T": "1"})
    assert answer["verify"]["exit_code"] == 4 and answer["verify"]["stdout"] == receipt
    assert answer["verify"]["stderr"] == b"w\377".decode("utf-8", "surrogateescape")
    assert answer["readback"]["sha256"] == hashlib.sha256(b"#!/bin/sh\n").hexdigest()


@pytest.mark.parametrize("size", [0, 1, 3 << 20])
def test_file_sha256_at_every_size(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    assert filehash.file_sha256(str(path)) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert verify_readback.hash_answer(str(path))[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


# -- the prompt exit -------------------------------------------------------------------------

@pytest.mark.parametrize("verb, prompt", [(protocol.SESSION, True), (protocol.VERIFY_READBACK, True),
                                          (protocol.HASH_FILE, False), (protocol.LEASE, False)])
def test_a_fast_verb_ends_with_os_exit_once_answered(monkeypatch: pytest.MonkeyPatch, verb: str, prompt: bool) -> None:
    """entry.run: a fast verb has released what it held and written its answer when main returns, so the
    process ends at once (its output flushed first); every other verb exits the ordinary way."""
    from vq_admin.agent import entry

    events: list[tuple[str, int]] = []

    class Out:
        def __init__(self, name: str) -> None:
            self.name = name

        def flush(self) -> None:
            events.append((f"flush {self.name}", 0))

    def fake_exit(code: int) -> None:
        events.append(("os._exit", code))
        raise SystemExit(code)

    monkeypatch.setattr(sys, "argv", ["vq-admin-agent", verb, "x"])
    monkeypatch.setattr(entry, "main", lambda: 3)
    monkeypatch.setattr(sys, "stdout", Out("stdout"))
    monkeypatch.setattr(sys, "stderr", Out("stderr"))
    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(SystemExit) as ended:
        entry.run()
    assert ended.value.code == 3
    assert events == ([("flush stdout", 0), ("flush stderr", 0), ("os._exit", 3)] if prompt else [])
