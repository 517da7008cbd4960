"""The agent's fast paths do what the modules they avoid do (issue 15).

``session`` and ``verify-readback`` import neither ``json``, ``re``,
``subprocess``, ``threading`` nor ``hashlib``; each replacement is proven
here against the module it replaces:

* the protocol's codec (json's C accelerator) against ``json.dumps(...,
  sort_keys=True)`` and ``json.loads``: same text, same value, same error,
  also on its ``json`` fallback;
* :func:`vq_admin.agent.names.is_name` against ``identifiers.NAME_RE``;
* :func:`vq_admin.agent.spawn.run_captured` against ``subprocess.run`` (exit
  codes, signals, output on both pipes, PATH lookup and its errors, stdin,
  inherited descriptors, signal dispositions);
* the built-in SHA-256 of a small launcher against ``hashlib``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vq_admin.agent import protocol, spawn, verify_readback
from vq_admin.agent.identifiers import NAME_RE
from vq_admin.agent.names import is_name

# -- the codec ---------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10 ** 40), max_value=10 ** 40)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text())
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(), inner, max_size=5), max_leaves=25)
# what json.dumps also takes (keys that are not str, tuples) or refuses (bytes, sets, mixed keys)
odd_values = st.recursive(scalars | st.binary(max_size=4) | st.just({1, 2}),
                          lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                          | st.dictionaries(st.text(max_size=3) | st.integers() | st.booleans() | st.none()
                                            | st.floats(), inner, max_size=4), max_leaves=12)


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """``("ok", canonical text of the value)`` or ``("error", type and message)``."""
    try:
        value = fn(*args)
    except (ValueError, TypeError, RecursionError) as exc:
        return "error", (type(exc), str(exc))
    return "ok", json.dumps(value, sort_keys=True) if not isinstance(value, str) else value


@pytest.fixture(params=["accelerator", "json fallback"])
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "accelerator":
        assert protocol._fast() is not None  # CPython: the accelerator passed its proof
    else:
        monkeypatch.setattr(protocol, "_FAST", [None])
    return str(request.param)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
@example(value={"b": [1.5, float("nan"), float("-inf")], "a": "\u00e9\x00\ud800"})
@example(value="text alone")
def test_encode_is_json_dumps_sorted(codec: str, value: Any) -> None:
    assert protocol.encode(value) == json.dumps(value, sort_keys=True) + "\n"
    assert protocol.encode_request(value) == json.dumps(value, sort_keys=True).encode() + b"\n"


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=odd_values)
def test_encode_answers_or_refuses_as_json_dumps_does(codec: str, value: Any) -> None:
    assert outcome(protocol.encode, value) == outcome(lambda v: json.dumps(v, sort_keys=True) + "\n", value)


def test_encode_refuses_a_circular_value_as_json_does(codec: str) -> None:
    loop: list[Any] = []
    loop.append(loop)
    assert outcome(protocol.encode, {"a": loop}) == outcome(lambda v: json.dumps(v, sort_keys=True) + "\n",
                                                            {"a": loop})


whitespace = st.text(alphabet=" \t\n\r", max_size=3)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values, before=whitespace, after=whitespace, ascii_only=st.booleans(), compact=st.booleans())
def test_decode_is_json_loads_on_json_texts(codec: str, value: Any, before: str, after: str, ascii_only: bool,
                                            compact: bool) -> None:
    text = before + json.dumps(value, ensure_ascii=ascii_only,
                               separators=(",", ":") if compact else None) + after
    assert outcome(protocol.decode, text) == outcome(json.loads, text)


def mutations(text: str) -> st.SearchStrategy[str]:
    cut = st.integers(min_value=0, max_value=len(text))
    return (st.tuples(cut, cut).map(lambda ij: text[:min(ij)] + text[max(ij):])
            | st.tuples(cut, st.sampled_from(list('{}[]",:0-.eE+ \\tnul\ufeff\x00\u00e9') + ["\\u12", "NaN"])
                        ).map(lambda ip: text[:ip[0]] + ip[1] + text[ip[0]:]))


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=json_values)
@example(data=None, value=None)
def test_decode_answers_or_refuses_as_json_loads_does(codec: str, data: Any, value: Any) -> None:
    texts = ["", " ", "\ufeff{}", "{} {}", "[1,]", "01", "-", "1e", "NaN", "-Infinity", '"\\ud800"', '"\x01"',
             "[" * 100000, "1" * 5000, '{"a": 1, "a": 2}', "\u00a01"]
    if data is not None:
        texts = [data.draw(mutations(json.dumps(value))), data.draw(st.text(max_size=20))]
    for text in texts:
        assert outcome(protocol.decode, text) == outcome(json.loads, text), repr(text)


def test_the_accelerator_must_prove_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """An accelerator whose answer to the known document is not json's is not used."""
    import _json

    monkeypatch.setattr(protocol, "_FAST", [])
    monkeypatch.setattr(_json, "encode_basestring_ascii", lambda s: '"' + s + '"')  # no escaping
    assert protocol._fast() is None
    assert protocol.encode({"a": "\u00e9"}) == '{"a": "\\u00e9"}\n'  # json itself did it


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


@pytest.mark.parametrize("value", [5, b"abc", ["a"]])
def test_is_name_refuses_what_is_not_text_as_the_regex_does(value: object) -> None:
    with pytest.raises(TypeError) as regex:
        NAME_RE.match(value)  # type: ignore[call-overload]
    with pytest.raises(TypeError) as plain:
        is_name(value)
    assert str(plain.value) == str(regex.value)


# -- the verify's process -----------------------------------------------------------------

def by_subprocess(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, bytes, bytes]:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    return done.returncode, done.stdout, done.stderr


def both(argv: list[str], env: dict[str, str] | None = None) -> tuple[Any, Any]:
    results = []
    for fn in (spawn.run_captured, by_subprocess):
        try:
            results.append(fn(argv, env))
        except OSError as exc:
            results.append((type(exc), exc.errno, exc.strerror))
    return results[0], results[1]


@pytest.mark.parametrize("script", [
    "echo out; echo err >&2; exit 3",
    "exit 0",
    "kill -TERM $$",
    "kill -KILL $$",
    "head -c 300000 /dev/zero; head -c 300000 /dev/zero >&2; head -c 70000 /dev/zero",  # both pipes full
    "cat; echo read-stdin:$?",  # stdin is /dev/null
    "yes | head -n 2",  # a pipeline that needs SIGPIPE's default
    "ls /proc/self/fd",  # no descriptor but 0, 1, 2 (and ls's own)
    "echo \"$VQ_T\" \"$PWD\"",
], ids=lambda s: s[:30])
def test_run_captured_is_subprocess_run(script: str) -> None:
    spawned, ran = both(["sh", "-c", script])
    assert spawned == ran


def test_the_command_s_signal_dispositions_are_subprocess_s_but_glibc_s_own_two():
    """SIGPIPE and SIGXFSZ (which Python ignores) are the default again, nothing is blocked; the one
    difference: glibc's posix_spawn leaves its two internal signals (32 and 33, which only a program's own
    C library uses, and installs its handlers for) ignored, as in subprocess's own posix_spawn path."""
    def masks(result: tuple[int, bytes, bytes]) -> dict[str, int]:
        lines = [ln.split(":") for ln in result[1].decode().splitlines()]
        return {name: int(value, 16) for name, value in lines}

    spawned, ran = both(["grep", "-E", "^(SigIgn|SigBlk)", "/proc/self/status"])
    glibc_internal = (1 << 31) | (1 << 32)
    assert masks(spawned)["SigBlk"] == masks(ran)["SigBlk"] == 0
    assert masks(spawned)["SigIgn"] & ~glibc_internal == masks(ran)["SigIgn"] & ~glibc_internal
    assert not masks(spawned)["SigIgn"] & ((1 << 12) | (1 << 24))  # SIGPIPE (13), SIGXFSZ (25): default


def test_an_inherited_descriptor_does_not_reach_the_command(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "inherited", os.O_WRONLY | os.O_CREAT, 0o600)
    os.set_inheritable(fd, True)
    try:
        spawned, ran = both(["sh", "-c", f"ls /proc/self/fd; echo x >&{fd} && echo leaked"])
    finally:
        os.close(fd)
    assert spawned == ran and b"leaked" not in spawned[1]


def test_the_environment_and_its_path_are_the_command_s(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "only-here").write_text("#!/bin/sh\necho \"found $VQ_T\"\n")
    (tmp_path / "bin" / "only-here").chmod(0o755)
    (tmp_path / "noexec").mkdir()
    (tmp_path / "noexec" / "only-here").write_text("#!/bin/sh\necho wrong\n")  # not executable: EACCES first
    (tmp_path / "notdir").write_text("")
    env = dict(os.environ, VQ_T="1", PATH=f"{tmp_path / 'notdir'}:{tmp_path / 'missing'}:{tmp_path / 'bin'}")
    spawned, ran = both(["only-here"], env)
    assert spawned == ran == (0, b"found 1\n", b"")
    for path in (f"{tmp_path / 'noexec'}:{tmp_path / 'bin'}", f"{tmp_path / 'noexec'}", f"{tmp_path / 'missing'}",
                 f"{tmp_path / 'missing'}:{tmp_path / 'notdir'}", f"{tmp_path / 'notdir'}:{tmp_path / 'missing'}"):
        spawned, ran = both(["only-here"], dict(env, PATH=path))
        assert spawned == ran, path
    for argv in ([str(tmp_path / "noexec" / "only-here")], [str(tmp_path / "missing" / "x")], [str(tmp_path)],
                 [str(tmp_path / "notdir" / "x")], ["./relative-missing"]):
        spawned, ran = both(argv)
        assert spawned == ran, argv


def test_the_verify_answer_is_the_same_as_before(tmp_path: Path) -> None:
    """verify_readback's answer (the JSON the driver reads) for a verify run through spawn and through
    subprocess, timings aside."""
    launcher = tmp_path / "python"
    launcher.write_bytes(b"#!/bin/sh\n")
    receipt = json.dumps({"active_path": str(launcher)})
    argv = ["sh", "-c", f"printf '%s' '{receipt}'; printf 'w\\377' >&2; exit 4"]

    def without_times(answer: dict[str, Any]) -> dict[str, Any]:
        answer["verify"].pop("seconds")
        answer.pop("readback_seconds")
        return answer

    fast = without_times(verify_readback.verify_readback(argv, {"VQ_T": "1"}))
    original = spawn.run_captured
    try:
        spawn.run_captured = spawn._subprocess_run  # type: ignore[assignment]
        slow = without_times(verify_readback.verify_readback(argv, {"VQ_T": "1"}))
    finally:
        spawn.run_captured = original  # type: ignore[assignment]
    assert fast == slow and fast["readback"]["sha256"] == hashlib.sha256(b"#!/bin/sh\n").hexdigest()


# -- the launcher's digest -----------------------------------------------------------------

@settings(max_examples=200)
@given(data=st.binary(max_size=5000))
def test_the_built_in_sha256_is_sha256(data: bytes) -> None:
    h = verify_readback.sha256(len(data))
    h.update(data)
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert type(h).__module__ == ("_sha2" if sys.version_info >= (3, 12) else "_sha256")  # not OpenSSL's


@pytest.mark.parametrize("size", [0, 1, verify_readback.SMALL_FILE, verify_readback.SMALL_FILE + 1, 3 << 20])
def test_file_sha256_at_every_size(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    assert verify_readback.file_sha256(str(path), size) == hashlib.sha256(path.read_bytes()).hexdigest()
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
