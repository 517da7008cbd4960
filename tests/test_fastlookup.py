"""The per-job launcher lookup's plain case (vq_admin.launcher.plain_lookup) can make an answer slower, never different.

* its flat-object reader returns exactly what ``json.loads`` returns, or nothing (hypothesis);
* its hand-written name and SHA rules are the registry's regular expressions (hypothesis);
* in every world where the full lookup refuses or finds nothing (a prune mark, a conflict, a
  loose or foreign level, a loose directory above the state directory, a symlink, a FIFO, an
  oversized or malformed entry, no pointer) it answers nothing, and where it answers, the
  answer is the full lookup's;
* what it declines that the full lookup accepts (a state directory named through a symlink, an
  entry with JSON escapes) still resolves, through the full lookup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vq_admin.launcher import plain_lookup as fastlookup, registry
from vq_admin.bindings import LauncherRefused, resolve_launcher
from vq_admin.entry import EXIT_CLOSED_PIPE
from vq_admin.state.records import Verified

SHA = "a" * 40
OTHER = "b" * 40
LAUNCHER = f"/apps/vibeqc/releases/{SHA}/source/.venv/bin/python"

PLAIN_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"\\'), max_size=30)
ANY_TEXT = st.text(max_size=30)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(PLAIN_TEXT, st.none() | PLAIN_TEXT, max_size=8))
def test_what_the_registry_writes_is_read_back_exactly(document):
    data = registry.encode(document)
    assert fastlookup.flat_object(data) == document == json.loads(data)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(ANY_TEXT, st.none() | ANY_TEXT | st.integers() | st.booleans() | st.lists(st.integers()),
                       max_size=6),
       st.sampled_from([None, 0, 2]), st.booleans(), st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
def test_the_reader_returns_what_json_returns_or_nothing(document, indent, ascii_only, separators):
    text = json.dumps(document, indent=indent, ensure_ascii=ascii_only, separators=separators)
    found = fastlookup.flat_object(text.encode("utf-8"))
    assert found is None or found == json.loads(text)
    def plain(text: object) -> bool:
        return isinstance(text, str) and text.isascii() and text.isprintable() and '"' not in text and "\\" not in text

    if all(plain(k) for k in document) and all(v is None or plain(v) for v in document.values()):
        assert found == document  # never declines what the registry itself would write


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet='{}[]":,\\ \t\n\rnulxtrefa0129.-\x00\x7f\u00e9', max_size=40))
def test_the_reader_never_accepts_what_json_reads_otherwise(text):
    found = fastlookup.flat_object(text.encode("utf-8"))
    if found is not None:
        assert json.loads(text) == found


def test_the_reader_declines_what_is_not_the_registry_shape():
    for data in (b'{"a": "b", "a": "c"}', b'{"a": "\\u0041"}', b'{"a": 1}', b'{"a": "b"} x', b'{"a": "b",}',
                 b'\xef\xbb\xbf{"a": "b"}', b'{"a": "caf\xc3\xa9"}', b'{"a": "\x01"}', b'[]', b'', b'{"a" "b"}',
                 b'{"a": nul}', b'{"a": "b"', b'{"a": "b"}}'):
        assert fastlookup.flat_object(data) is None, data
    assert fastlookup.flat_object(b' \t{ }\r\n') == {}
    assert fastlookup.flat_object(b'{"a":null,"b":"c"}') == {"a": None, "b": "c"}


NAMEISH = st.text(alphabet="aZ09._-/ \n\u00e9\x7f\x00", max_size=70)
HEXISH = st.text(alphabet="0123456789abcdefABg\n", min_size=38, max_size=66) | st.text(max_size=5)


@settings(max_examples=1000, deadline=None)
@given(NAMEISH)
def test_the_one_control_rule_covers_c0_and_del(name):
    assert fastlookup.has_control(name) == any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in name)


# -- worlds: the plain case answers only where the full lookup answers the same --------


def register(state: Path, sha: str = SHA, receipt: str = "r-1") -> None:
    registry.record_verified(state, "cluster", "vibeqc", Verified(**{
        "sha": sha, "tag": None, "launcher": f"/apps/vibeqc/releases/{sha}/source/.venv/bin/python",
        "launcher_sha256": "e" * 64, "receipt": receipt, "at": "2026-11-30T00:00:00Z"}))


def full(state: Path, sha: str | None) -> object:
    """What the full lookup returns, its entry as the registry wrote it."""
    try:
        latest, entry = registry.resolve(str(state), "cluster", "vibeqc", sha)
    except registry.RegistryError as exc:
        return f"refused: {exc}"
    return latest, None if entry is None else entry.to_value()


def lane(state: Path) -> Path:
    return state / "registry" / "cluster" / "vibeqc"


def w_plain(state: Path) -> None:
    pass


def w_pruned(state: Path) -> None:
    registry.mark_pruned(state, "cluster", "vibeqc", SHA, "r-prune", "2026-11-30T01:00:00Z")


def w_conflict(state: Path) -> None:
    registry.record_verified(state, "cluster", "vibeqc", Verified(**{
        "sha": SHA, "tag": None, "launcher": f"/other/vibeqc-{SHA}", "launcher_sha256": "f" * 64,
        "receipt": "r-2", "at": "2026-11-30T02:00:00Z"}))


def w_loose_lane(state: Path) -> None:
    lane(state).chmod(0o770)


def w_loose_state(state: Path) -> None:
    state.chmod(0o777)


def w_loose_entry(state: Path) -> None:
    (lane(state) / f"{SHA}.json").chmod(0o666)


def w_loose_ancestor(state: Path) -> None:
    state.parent.chmod(0o777)  # above the state directory: other-writable, no sticky bit


def w_foreign_entry(state: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    os.chown(lane(state) / f"{SHA}.json", 65534, 65534)


def w_symlinked_host(state: Path) -> None:
    real = state / "registry" / "real-cluster"
    (state / "registry" / "cluster").rename(real)
    (state / "registry" / "cluster").symlink_to(real)


def w_symlinked_entry(state: Path) -> None:
    entry = lane(state) / f"{SHA}.json"
    entry.rename(lane(state) / "elsewhere")
    entry.symlink_to(lane(state) / "elsewhere")


def w_fifo_latest(state: Path) -> None:
    (lane(state) / "latest.json").unlink()
    os.mkfifo(lane(state) / "latest.json", 0o600)


def w_directory_entry(state: Path) -> None:
    (lane(state) / f"{SHA}.json").unlink()
    (lane(state) / f"{SHA}.json").mkdir(0o700)


def w_oversized_entry(state: Path) -> None:
    entry = lane(state) / f"{SHA}.json"
    entry.write_bytes(entry.read_bytes() + b" " * registry.MAX_ENTRY_BYTES)


def w_wrong_schema(state: Path) -> None:
    entry = lane(state) / f"{SHA}.json"
    entry.write_text(entry.read_text().replace(registry.SCHEMA, "vq-admin/launcher/0"))


def w_latest_names_nothing(state: Path) -> None:
    (lane(state) / "latest.json").write_text(f'{{"schema": "{registry.POINTER_SCHEMA}", "sha": "HEAD"}}')


def w_no_latest(state: Path) -> None:
    (lane(state) / "latest.json").unlink()


def w_stable_launcher(state: Path) -> None:
    entry = lane(state) / f"{SHA}.json"
    entry.write_text(entry.read_text().replace(f"releases/{SHA}", "current"))


def w_other_host_named(state: Path) -> None:
    entry = lane(state) / f"{SHA}.json"
    entry.write_text(entry.read_text().replace('"cluster"', '"login2"'))


WORLDS = [w_plain, w_pruned, w_conflict, w_loose_lane, w_loose_state, w_loose_entry, w_loose_ancestor,
          w_foreign_entry, w_symlinked_host,
          w_symlinked_entry, w_fifo_latest, w_directory_entry, w_oversized_entry, w_wrong_schema,
          w_latest_names_nothing, w_no_latest, w_stable_launcher, w_other_host_named]


@pytest.mark.parametrize("world", WORLDS, ids=[w.__name__[2:] for w in WORLDS])
@pytest.mark.parametrize("sha", [SHA, None], ids=["expected-sha", "latest"])
def test_the_plain_case_answers_only_what_the_full_lookup_answers(tmp_path, world, sha):
    state = tmp_path / "state"
    register(state)
    world(state)
    answer: list[object] = []
    reader = threading.Thread(target=lambda: answer.append(fastlookup.plain_resolve(str(state), "cluster",
                                                                                    "vibeqc", sha)), daemon=True)
    reader.start()
    reader.join(30)
    assert answer, "the plain lookup blocked"  # a FIFO never blocks
    expected = full(state, sha)
    if world is w_plain:
        assert answer[0] == expected and answer[0] is not None
    else:
        assert answer[0] is None, (answer[0], expected)
        # the world refuses, or has no pointer (resolve_launcher then asks the configuration for an alias)
        assert isinstance(expected, str) or expected[0] is None, expected


def test_a_state_directory_named_through_a_symlink_still_resolves_through_the_full_lookup(tmp_path):
    state = tmp_path / "state"
    register(state)
    (tmp_path / "named").symlink_to(state)
    assert fastlookup.plain_resolve(str(tmp_path / "named"), "cluster", "vibeqc", SHA) is None
    binding = resolve_launcher("vibeqc", "cluster", expected_sha=SHA, state_dir=tmp_path / "named")
    assert binding == resolve_launcher("vibeqc", "cluster", expected_sha=SHA, state_dir=state)
    assert binding.launcher == LAUNCHER


def test_an_entry_with_json_escapes_still_resolves_through_the_full_lookup(tmp_path):
    state = tmp_path / "state"
    register(state)
    entry = lane(state) / f"{SHA}.json"
    entry.write_text(entry.read_text().replace('"r-1"', '"r-\\u0031"'))
    assert fastlookup.plain_resolve(str(state), "cluster", "vibeqc", SHA) is None
    assert resolve_launcher("vibeqc", "cluster", expected_sha=SHA, state_dir=state).receipt == "r-1"


def test_the_plain_case_gives_the_full_lookups_binding(tmp_path):
    state = tmp_path / "state"
    register(state, OTHER, "r-0")
    register(state)
    for sha, latest in ((SHA, True), (OTHER, False), (None, True)):
        binding = resolve_launcher("vibeqc", "cluster", expected_sha=sha, state_dir=state)
        slow = resolve_launcher("vibeqc", "cluster", expected_sha=sha, state_dir=state, path=binding.launcher)
        assert binding == slow and binding.latest is latest  # --path takes the full lookup
    with pytest.raises(LauncherRefused) as refused:
        resolve_launcher("vibeqc", "cluster", expected_sha="c" * 40, state_dir=state)
    assert refused.value.code == "sha-mismatch"


def test_a_sha_in_capitals_takes_the_plain_case_and_other_scripts_do_not(tmp_path):
    state = tmp_path / "state"
    register(state)
    assert fastlookup.plain_resolve(str(state), "cluster", "vibeqc", SHA.upper()) == full(state, SHA)
    # U+0130 lower-cases to two characters, none of them hex; the full lookup calls it a usage error
    assert fastlookup.plain_resolve(str(state), "cluster", "vibeqc", "\u0130" * 40) is None


# -- the console entry: the plain success, its output and a closed pipe -----------------

ENTRY = [sys.executable, "-c", "import sys; from vq_admin.entry import main; sys.argv[0] = 'vq'; sys.exit(main())"]


def test_the_plain_success_prints_what_the_full_command_prints(tmp_path):
    state = tmp_path / "state"
    register(state, OTHER, "r-0")
    register(state)
    env = dict(os.environ, VQ_ADMIN_STATE_DIR=str(state), VQ_ADMIN_CONFIG=str(tmp_path / "absent.toml"))
    for words in (["--expected-sha", SHA], ["--expected-sha", OTHER], []):
        plain = subprocess.run([*ENTRY, "admin", "launcher", "vibeqc", "cluster", *words], capture_output=True,
                               text=True, env=env, timeout=120)
        # the full command: the same verb through argparse and vq_admin.commands.launcher
        slow = subprocess.run([sys.executable, "-m", "vq_admin.cli", "launcher", "vibeqc", "cluster", *words,
                               "--config", str(tmp_path / "absent.toml")], capture_output=True, text=True, env=env,
                              timeout=120)
        assert (plain.returncode, plain.stdout, plain.stderr) == (0, slow.stdout, "") and slow.returncode == 0


def test_the_plain_success_ends_quietly_on_a_closed_pipe(tmp_path):
    state = tmp_path / "state"
    register(state)
    env = dict(os.environ, VQ_ADMIN_STATE_DIR=str(state), VQ_ADMIN_CONFIG=str(tmp_path / "absent.toml"))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([*ENTRY, "admin", "launcher", "vibeqc", "cluster"], stdout=write_end,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == EXIT_CLOSED_PIPE and done.stderr == "", (done.returncode, done.stderr)
