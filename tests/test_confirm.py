"""The confirmation's rules that need no daemon (CONTRACT section 13): its profile keys, the metric
judgement, the confirmation record and the launcher's refusal of an unconfirmed SHA."""

from __future__ import annotations

import pytest

from test_config import with_profile
from vq_admin.agent.confirm import judge, metric_spec
from vq_admin.bindings import LauncherRefused, resolve_launcher
from vq_admin.config import ConfigError, parse_config
from vq_admin.launcher import registry
from vq_admin.state import confirmation
from vq_admin.state.records import StateDir, Verified

CONFIRM = {"confirm_command": "/site/bin/smoke", "activate_command": "/site/bin/activate"}
SHA = "b" * 40


def profile(**changes):
    return parse_config(with_profile(**{**CONFIRM, **changes})).hosts["cluster"].runtimes["vibeqc-release"]


def test_the_keys_parse_with_their_defaults():
    c = profile(confirm_metrics={"seconds_per_step": {"better": "lower", "tolerance": 0.1},
                                 "energy_digest": {"better": "equal"}}).confirm
    assert c is not None and c.command == ("/site/bin/smoke",) and c.sbatch_args == () and c.timeout_seconds == 900
    assert [m.word() for m in c.metrics] == ["seconds_per_step=lower:0.1", "energy_digest=equal:0"]


@pytest.mark.parametrize("changes, key, reason", [
    ({"activate_command": None}, "confirm_command", "needs activate_command"),
    ({"confirm_command": None}, "activate_command", None),
    ({"confirm_sbatch_args": ["--output=/tmp/x"]}, "confirm_sbatch_args", "set by vq-admin itself"),
    ({"confirm_sbatch_args": ["--time"]}, "confirm_sbatch_args", "needs its value attached"),
    ({"confirm_timeout_seconds": 0}, "confirm_timeout_seconds", "finite positive"),
    ({"confirm_metrics": {"x": {"better": "faster"}}}, "confirm_metrics.x", "better"),
    ({"confirm_metrics": {"x": {"better": "lower", "tolerance": 1.5}}}, "confirm_metrics.x.tolerance", "below 1"),
])
def test_every_rule_names_the_dotted_key(changes, key, reason):
    if reason is None:  # activate_command alone is fine; a confirm key without confirm_command is not
        assert profile(**changes).confirm is None
        with pytest.raises(ConfigError, match="confirm_timeout_seconds: needs confirm_command"):
            profile(confirm_command=None, confirm_timeout_seconds=5)
        return
    with pytest.raises(ConfigError) as caught:
        profile(**changes)
    assert caught.value.key.endswith(key) and reason in caught.value.reason


def test_confirm_command_needs_scratch_root():
    data = with_profile(**CONFIRM)
    del data["hosts"]["cluster"]["scratch_root"]
    with pytest.raises(ConfigError, match="scratch_root: is required"):
        parse_config(data)


@pytest.mark.parametrize("spec, found, baseline, problems", [
    ("t=lower:0.10", "1.31", "1.12", ["regressed: t 1.31 > 1.10 x 1.12"]),
    ("t=lower:0.10", "1.23", "1.12", []),
    ("t=higher:0.10", "0.8", "1.0", ["regressed: t 0.8 < 0.90 x 1.0"]),
    ("t=higher:0.10", "0.95", "1.0", []),
    ("t=equal:0", "abc", "abd", ["regressed: t abc != abd"]),
    ("t=equal:0.01", "1.005", "1.0", []),
    ("t=lower:0.1", "1.0", None, []),  # no baseline: passes (and is recorded)
    ("t=lower:0.1", None, "1.0", ["metric t was not reported by the job"]),
    ("t=lower:0.1", "fast", "1.0", ["metric t: 'fast' or its baseline '1.0' is not a number"]),
])
def test_the_metric_judgement_names_both_values(spec, found, baseline, problems):
    name = metric_spec(spec)[0]
    assert judge({name: found} if found else {}, [metric_spec(spec)], {name: baseline} if baseline else {}) == problems


def test_the_record_is_the_one_seam_and_the_launcher_refuses_an_unconfirmed_sha(tmp_path):
    state = StateDir(str(tmp_path))
    assert confirmation.unconfirmed(state, "cluster", "prog", SHA) is None
    confirmation.record_verdict(state, "cluster", "prog", "a" * 40, {"passed": True, "metrics": {"t": 1.0}}, "r1",
                                None)
    assert confirmation.baseline(state, "cluster", "prog", "a" * 40) == {"t": "1.0"}
    assert confirmation.confirmed_entry(state, "cluster", "prog", "a" * 40).receipt == "r1"
    confirmation.record_verdict(state, "cluster", "prog", SHA, {
        "passed": False, "problems": ["regressed: t 1.3 > 1.10 x 1.0"], "regressed": ["regressed: t 1.3 > 1.10 x 1.0"],
        "metrics": {"t": 1.3}}, "r2", None)
    assert "regressed: t 1.3" in confirmation.unconfirmed(state, "cluster", "prog", SHA)
    assert confirmation.read(state, "cluster", "prog")[SHA].metric_only is True
    assert confirmation.skip_as_revert_target(state, "cluster", "prog", SHA)
    registry.record_verified(str(tmp_path), "cluster", "prog", Verified(**{  # the previous generation's evidence
        "sha": "a" * 40, "tag": None, "launcher": f"/apps/releases/{'a' * 40}/bin/prog-{'a' * 40}",
        "launcher_sha256": "e" * 64, "receipt": "r1", "at": "2026-12-01T00:00:00Z"}))
    with pytest.raises(LauncherRefused) as caught:
        resolve_launcher("prog", "cluster", expected_sha=SHA, state_dir=str(tmp_path))
    assert caught.value.code == "unconfirmed" and "--retry-confirmation" in caught.value.remedy


def _register(root, sha, receipt):
    registry.record_verified(root, "cluster", "prog", Verified(**{
        "sha": sha, "tag": None, "launcher": f"/apps/releases/{sha}/bin/prog-{sha}",
        "launcher_sha256": "e" * 64, "receipt": receipt, "at": "2026-12-01T00:00:00Z"}))


@pytest.mark.parametrize("pinned", [True, False])
def test_a_registered_sha_whose_confirmation_failed_is_refused_by_both_lookups(tmp_path, pinned):
    """X verified earlier (in the registry, latest), then re-deployed with --force: its confirmation failed and
    it was reverted; the registry still has X (latest.json too: a failed confirmation moves nothing there)."""
    from vq_admin.launcher.plain_lookup import plain_launcher

    root, w = str(tmp_path), "a" * 40
    _register(root, w, "r1")
    _register(root, SHA, "r2")
    want = SHA if pinned else None
    assert plain_launcher("prog", "cluster", want, root) is not None  # confirmed by nothing: handed out
    confirmation.record_verdict(StateDir(root), "cluster", "prog", SHA, {"passed": False, "problems": ["exit 3"]},
                                "r3", None)
    assert plain_launcher("prog", "cluster", want, root) is None  # the full lookup words the refusal
    with pytest.raises(LauncherRefused) as caught:
        resolve_launcher("prog", "cluster", expected_sha=want, state_dir=root)
    assert caught.value.code == "unconfirmed" and "exit 3" in caught.value.reason
    assert resolve_launcher("prog", "cluster", expected_sha=w, state_dir=root).sha == w  # the revert target


def test_an_unreadable_confirmation_record_fails_closed_and_an_absent_one_is_fine(tmp_path):
    from vq_admin.launcher.plain_lookup import plain_launcher

    root = str(tmp_path)
    _register(root, SHA, "r1")
    assert resolve_launcher("prog", "cluster", state_dir=root).sha == SHA  # no confirmation record at all
    doc = tmp_path / "hosts" / "cluster" / "runtime" / "prog" / "confirmation.json"
    doc.parent.mkdir(parents=True, mode=0o700)
    for p in (tmp_path / "hosts", tmp_path / "hosts" / "cluster", tmp_path / "hosts" / "cluster" / "runtime"):
        p.chmod(0o700)
    doc.write_bytes(b'{"generations": ')
    doc.chmod(0o600)
    assert plain_launcher("prog", "cluster", SHA, root) is None
    for want in (SHA, None):
        with pytest.raises(LauncherRefused) as caught:
            resolve_launcher("prog", "cluster", expected_sha=want, state_dir=root)
        assert caught.value.code == "unconfirmed" and "cannot be read" in caught.value.reason
