"""The host's record on the login host (CONTRACT section 12): the agent's append and read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vq_admin.agent import record

LEASE = ["lease", "--lane", "runtime", "--host", "h", "--program", "toy", "--driver-host", "d", "--user", "u",
         "--pid", "1", "--since", "2026-01-01T00:00:00Z", "--run-id", "r"]


def agent(*argv: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "vq_admin.agent", *argv], input=stdin, capture_output=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def append_line(statement: str, sig: str | None) -> bytes:
    return (json.dumps({"append": {"statement": statement, "sig": sig}}) + "\n").encode()


def test_entries_are_numbered_in_order_signature_beside_and_read_after_a_cursor() -> None:
    first = record.append("toy", b'{"n":1}', b"SIG1")
    second = record.append("toy", b'{"n":2}', None)
    assert (first["seq"], second["seq"]) == (1, 2)
    where = Path(first["dir"])
    assert sorted(p.name for p in where.iterdir() if not p.name.startswith(".")) == [
        first["name"], first["name"] + ".sig", second["name"]]
    assert first["name"].startswith("0000000001-") and (where / (first["name"] + ".sig")).read_bytes() == b"SIG1"
    read = record.read_after("toy", 0)
    assert [(e["seq"], e["statement"], e["sig"]) for e in read["entries"]] == [(1, '{"n":1}', "SIG1"),
                                                                                 (2, '{"n":2}', None)]
    assert record.read_after("toy", 1)["entries"][0]["seq"] == 2 and record.read_after("toy", 2)["entries"] == []
    assert record.read_after(None, 0) == {"entries": [], "last": 0}  # the helper lane's record is its own


def test_the_lease_appends_a_line_under_the_lease_and_answers_the_record_after_a_cursor() -> None:
    record.append("toy", b'{"n":1}', None)
    done = agent(*LEASE, "--record-after", "0", stdin=append_line('{"n":2}', "S"))
    held, appended = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert held["held"] and [e["seq"] for e in held["record"]["entries"]] == [1]
    assert appended["appended"]["seq"] == 2
    assert [e["sig"] for e in record.read_after("toy", 0)["entries"]] == [None, "S"]


def test_sigkill_while_writing_an_entry_leaves_a_record_every_reader_accepts() -> None:
    record.append("toy", b'{"n":1}', b"S1")
    crashed = agent(*LEASE, stdin=append_line('{"n":2}', "S2"),
                    env={"VQ_ADMIN_TESTING": "1", "VQ_ADMIN_AGENT_CRASH": "record-before-statement"})
    assert crashed.returncode == -signal.SIGKILL
    where = Path(record.directory("toy"))
    assert any(p.name.startswith("0000000002-") and p.name.endswith(".sig") for p in where.iterdir())
    read = record.read_after("toy", 0)  # the signature without its statement is no entry
    assert [(e["seq"], e["sig"]) for e in read["entries"]] == [(1, "S1")] and "error" not in read
    after = agent(*LEASE, stdin=append_line('{"n":3}', "S3"))  # the next run is not refused because of it
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout.decode().splitlines()[1])["appended"]["seq"] == 3
    assert [(e["seq"], e["statement"]) for e in record.read_after("toy", 0)["entries"]] == [(1, '{"n":1}'),
                                                                                             (3, '{"n":3}')]
    assert agent("record-read", "toy=1").returncode == 0


def test_temporary_names_and_strangers_are_no_entries_and_an_unsafe_record_is_refused() -> None:
    record.append("toy", b'{"n":1}', None)
    where = Path(record.directory("toy"))
    (where / ".tmp.0000000002-0123456789abcdef.json.1.ab").write_bytes(b"{partial")
    (where / "notes.json").write_bytes(b"{}")
    assert [e["seq"] for e in record.read_after("toy", 0)["entries"]] == [1]
    where.chmod(0o777)
    refused = record.read_after("toy", 0)
    assert refused["entries"] == [] and "record directory" in refused["error"]
    with pytest.raises(Exception, match="record directory"):
        record.append("toy", b"{}", None)
    where.chmod(0o700)
    bad = record.serve_line(b'{"append": {"statement": 3}}\n', "toy")
    assert "bad append request" in bad["append_error"]


def test_signer_judges_its_paths_and_agrees_with_ssh_keygen_on_each_forgery(tmp_path: Path) -> None:
    from vq_admin.config import Signing
    from vq_admin.record.signing import Signer
    from vq_admin.report.outcome import Refused

    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    for name in ("site", "stranger"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(keys / name)], check=True)
    allowed = keys / "allowed_signers"
    allowed.write_text(f"admins@site {(keys / 'site.pub').read_text()}")
    signer = Signer(Signing(key=str(keys / "site"), allowed_signers=str(allowed)))
    data = b'{"n":1}\n'
    sig = signer.sign(data)
    assert signer.judge(data, sig).principal == "admins@site"
    assert signer.judge(b'{"n":2}\n', sig).reason == "altered (its signature by admins@site does not verify)"
    assert signer.judge(data, None).reason == "unsigned"
    stranger = Signer(Signing(key=str(keys / "stranger"), allowed_signers=str(allowed))).sign(data)
    assert signer.judge(data, stranger).reason == "signed by a key not in allowed_signers"
    assert not signer.judge(data, b"not a signature").accepted
    keys.chmod(0o777)  # another user could swap the key or allowed_signers: refused before anything runs
    with pytest.raises(Refused, match="writable"):
        Signer(Signing(key=str(keys / "site"), allowed_signers=str(allowed)))
    keys.chmod(0o700)
    sock = tmp_path / "open"
    sock.mkdir(mode=0o777)
    sock.chmod(0o777)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSH_AUTH_SOCK", str(sock / "agent.sock"))
        with pytest.raises(Refused, match="SSH_AUTH_SOCK"):
            Signer(Signing(key=str(keys / "site"), allowed_signers=str(allowed)))


def _summary_entry(sha: str, driver: str, confirm: object = None) -> tuple[str, object]:
    """An accepted verification summary of *sha* by another *driver*, carrying *confirm*."""
    from vq_admin.record.statement import SUMMARY, Policy, Run, Statement, Subject, Summary, Verifier
    from vq_admin.record.signing import Verdict
    from vq_admin.record.view import Imported

    launcher, digest = f"/apps/toy/bin/toy-{sha}", "d" * 64
    run = Run(run_id="r", lane="runtime", verb="update", outcome="ok", host="h", program="toy", sha=sha,
              started_at="2026-01-01T00:00:00Z", finished_at="2026-01-01T00:01:00Z", driver=driver, by="u@d",
              launcher=launcher, launcher_sha256=digest, confirm=confirm)  # type: ignore[arg-type]
    summary = Summary(verifier=Verifier(id="v", version={}), time_verified=run.finished_at, resource_uri="git+x",
                      policy=Policy(name="verify_command", digest={"sha256": "e" * 64}), vq_admin=run)
    text = Statement(subject=(Subject(name=launcher, digest={"sha256": digest}),), predicate_type=SUMMARY,
                     predicate=summary).to_text().decode()
    name = f"0000000001-{sha[:8]}.json"
    return name, Imported(seq=1, name=name, digest="f" * 64, statement=text, sig="S",
                          verdict=Verdict(accepted=True, principal="admins@site"))


def test_an_entry_carries_its_confirmation_and_only_a_passed_one_of_its_own_sha_confirms_it() -> None:
    from vq_admin.record.statement import Confirmed, Statement

    a, b = "a" * 40, "b" * 40
    passed = Confirmed(sha=a, status="passed", job_id="17", state="COMPLETED", exit_code=0, node="n1",
                       metrics={"seconds_per_step": "1.0"}, accepted_regression="new compiler")
    _, entry = _summary_entry(a, "u@d/0000abcd", passed)
    run = Statement.parse(entry.statement, "e").summary.vq_admin  # type: ignore[attr-defined, union-attr]
    value = json.loads(entry.statement)["predicate"]["vqAdmin"]["confirm"]  # type: ignore[attr-defined]
    assert value == {"sha": a, "status": "passed", "job_id": "17", "state": "COMPLETED", "exit_code": 0,
                     "node": "n1", "metrics": {"seconds_per_step": "1.0"}, "accepted_regression": "new compiler",
                     "reason": None}
    assert run.confirm == passed and run.unconfirmed(True) is None and run.unconfirmed(False) is None
    bare = run.replace(confirm=None)
    assert bare.unconfirmed(False) is None
    assert bare.unconfirmed(True) == "unconfirmed: it carries no passed confirmation"
    failed = run.replace(confirm=Confirmed(sha=a, status="unconfirmed", reason="job 18 ended FAILED"))
    assert failed.unconfirmed(False) == failed.unconfirmed(True) == (
        "unconfirmed: its confirmation failed (job 18 ended FAILED)")
    # a revert's entry: the generation gone back to, carrying the new SHA's failed confirmation
    revert = run.replace(confirm=Confirmed(sha=b, status="unconfirmed", reason="x"))
    assert revert.unconfirmed(False) is None and revert.unconfirmed(True) is not None


def test_a_driver_with_confirm_command_adopts_only_entries_with_a_passed_confirmation(tmp_path: Path) -> None:
    from vq_admin.record.statement import Confirmed
    from vq_admin.record.view import FROM_RECORD, adopt, confirm_of
    from vq_admin.state import confirmation
    from vq_admin.state.records import StateDir

    state, a, b = StateDir(str(tmp_path)), "a" * 40, "b" * 40
    _, bare = _summary_entry(a, "u@d/0000abcd")
    skipped: list[str] = []
    assert adopt(state, "h", "toy", [bare], True, skipped) == [] and state.verified("runtime", "h", "toy") is None
    assert skipped == [f"{bare.name}: unconfirmed: it carries no passed confirmation"]  # type: ignore[attr-defined]
    assert adopt(state, "h", "toy", [bare], False, []) == [bare.name]  # type: ignore[attr-defined]
    _, failed = _summary_entry(b, "u@d/0000abcd", Confirmed(sha=b, status="unconfirmed", reason="FAILED"))
    assert adopt(state, "h", "toy", [failed], False, skipped) == []  # never evidence, whatever the profile
    assert skipped[-1].endswith("unconfirmed: its confirmation failed (FAILED)")
    metrics = {"seconds_per_step": 1.5}
    name, good = _summary_entry(b, "u@d/0000abcd", Confirmed(sha=b, status="passed", job_id="9", metrics=metrics))
    assert adopt(state, "h", "toy", [good], True, []) == [name]
    assert state.verified("runtime", "h", "toy").sha == b  # type: ignore[union-attr]
    # the imported confirmation is this driver's baseline, but never re-signed as this driver's own
    assert confirmation.baseline(state, "h", "toy", b) == {"seconds_per_step": "1.5"}
    assert confirmation.read(state, "h", "toy")[b].receipt == FROM_RECORD + name
    assert confirm_of(state, "h", "toy", b) is None
    confirmation.record(state, "h", "toy", a, confirmation.ConfirmEntry(status="passed", job_id="3", state="COMPLETED",
                                                                       exit_code=0, metrics={"m": 2}))
    assert confirm_of(state, "h", "toy", a) == Confirmed(sha=a, status="passed", job_id="3", state="COMPLETED",
                                                          exit_code=0, metrics={"m": 2})
    confirmation.record(state, "h", "toy", a, confirmation.ConfirmEntry(status="pending", job_id="4"))
    assert confirm_of(state, "h", "toy", a) is None


def test_an_imported_quarantine_acts_unsigned_and_a_lift_under_signing_only_when_accepted(tmp_path: Path) -> None:
    from vq_admin.launcher import registry
    from vq_admin.record.view import apply_record
    from vq_admin.record.signing import Verdict
    from vq_admin.record.statement import QUARANTINE, Quarantine, Statement
    from vq_admin.record.view import Imported
    from vq_admin.state.records import StateDir

    from vq_admin.core import protocol

    assert protocol.QUARANTINE_PREDICATE == QUARANTINE  # what the agent's record-quarantine takes
    state, sha = StateDir(tmp_path / "state"), "c" * 40

    def entry(seq: int, action: str, accepted: bool) -> Imported:
        text = Statement(subject=(), predicate_type=QUARANTINE, predicate=Quarantine(
            driver="u@h/0123abcd", by="u@h", host="cluster", program="toy", at=f"2026-12-02T00:00:{seq:02d}Z", sha=sha,
            action=action, reason="bad" if action == "quarantine" else None)).to_text().decode()
        return Imported(seq=seq, name=f"{seq:010d}-{'0' * 16}.json", digest="0" * 64, statement=text, sig=None,
                        verdict=Verdict(accepted=accepted, reason=None if accepted else "unsigned"))

    def marked() -> str | None:
        found = registry.quarantined(state.root, "cluster", "toy", sha)
        return None if found is None else found.reason

    assert apply_record(state, "cluster", "toy", [entry(1, "quarantine", False)], True) == [
        f"quarantined {sha} (0000000001-{'0' * 16}.json, by u@h)"]
    assert marked() == "bad"  # unsigned, under [signing]: a quarantine only ever refuses more
    assert apply_record(state, "cluster", "toy", [entry(2, "lift", False)], True)[0].startswith("not lifted")
    assert marked() == "bad"  # an unsigned lift under [signing] does not count
    assert apply_record(state, "other", "toy", [entry(3, "lift", True)], True)[0].startswith("not lifted")
    assert marked() == "bad"  # a lift copied from another host's record does not count either
    apply_record(state, "cluster", "toy", [entry(4, "lift", True)], True)
    assert marked() is None  # signed by an accepted key: lifted
    apply_record(state, "cluster", "toy", [entry(5, "quarantine", False), entry(6, "lift", False)], False)
    assert marked() is None  # without [signing], oldest first: quarantined, then lifted unsigned
    assert apply_record(state, "cluster", "other", [entry(7, "quarantine", False)], False) == []
    # an older lift (replayed, or imported right after a newer local quarantine) never ends a newer quarantine
    registry.mark_quarantined(state.root, "cluster", "toy", sha, "new", "2026-12-02T00:00:30Z", "me@here")
    done = apply_record(state, "cluster", "toy", [entry(8, "quarantine", True), entry(9, "lift", True)], True)
    assert marked() == "new" and done[1].endswith("older than the quarantine it would end)"), done
    assert apply_record(state, "cluster", "toy", [entry(31, "lift", True)], True)[0].startswith("lifted")
    assert marked() is None


def _roots_entry(seq: int, at: str, shas: str, accepted: bool, driver: str = "u@d/0000abcd") -> object:
    from vq_admin.record.signing import Verdict
    from vq_admin.record.statement import ROOTS, Root, Roots, Statement
    from vq_admin.record.view import Imported

    text = Statement(subject=(), predicate_type=ROOTS, predicate=Roots(
        driver=driver, by="u@d", host="h", program="toy", at=at,
        roots=tuple(Root(kind="last-ok", sha=c * 40) for c in shas))).to_text().decode()
    return Imported(seq=seq, name=f"{seq:010d}-{'0' * 16}.json", digest="0" * 64, statement=text, sig=None,
                    verdict=Verdict(accepted=accepted, reason=None if accepted else "unsigned"))


def test_under_signing_unaccepted_roots_only_add_and_the_accepted_roots_with_the_latest_at_count() -> None:
    from vq_admin.record.view import newest_roots

    def kept(known: list[object], signing: bool) -> set[str]:
        return {r.sha[0] for r in newest_roots(known, signing)["u@d/0000abcd"].roots}  # type: ignore[arg-type]

    signed = _roots_entry(1, "2026-12-02T00:00:02Z", "ab", True)
    forged = _roots_entry(2, "2026-12-02T00:00:03Z", "c", False)
    assert kept([signed, forged], True) == {"a", "b", "c"}  # added to, never replaced
    assert kept([signed, forged], False) == {"c"}  # advisory without [signing]: the newest, signed or not
    replayed = _roots_entry(3, "2026-12-02T00:00:01Z", "d", True)  # an older signed entry appended again
    newer = _roots_entry(4, "2026-12-02T00:00:04Z", "e", True)
    assert kept([signed, replayed], True) == {"a", "b"}
    assert kept([signed, replayed, newer, forged], True) == {"e", "c"}  # a newer signed entry replaces


def test_a_rollback_target_from_the_record_is_judged_with_the_current_allowed_signers(tmp_path: Path) -> None:
    import hashlib

    from vq_admin.config import Signing
    from vq_admin.launcher.registry import Entry
    from vq_admin.record.view import FROM_RECORD, Imported, judge, record_problem, signer
    from vq_admin.state.records import StateDir

    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    for name in ("old", "new"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(keys / name)], check=True)
        (keys / f"allowed-{name}").write_text(f"admins@site {(keys / f'{name}.pub').read_text()}")
    before, after = (Signing(key=str(keys / k), allowed_signers=str(keys / f"allowed-{k}")) for k in ("old", "new"))
    _, summary = _summary_entry("a" * 40, "u@d/0000abcd")
    text = summary.statement.encode()  # type: ignore[attr-defined]
    name = f"0000000001-{hashlib.sha256(text).hexdigest()[:16]}.json"
    sig = signer(before).sign(text)  # type: ignore[union-attr]
    verdict = judge(signer(before), name, text, sig)
    assert verdict.accepted
    state = StateDir(str(tmp_path / "state"))
    kept = Imported(seq=1, name=name, digest="f" * 64, statement=text.decode(), sig=sig.decode(), verdict=verdict)
    state.tree.append(["record", "h"], "toy.jsonl", kept.to_json().encode() + b"\n")
    entry = Entry(host="h", program="toy", sha="a" * 40, tag=None, launcher=f"/apps/toy/bin/toy-{'a' * 40}",
                  launcher_sha256="d" * 64, receipt=FROM_RECORD + name, verified_at="2026-11-30T00:00:00Z")
    assert record_problem(state, "h", "toy", entry, before) is None
    for now in (after, None):  # the key left allowed_signers, or [signing] was removed: no longer evidence
        assert record_problem(state, "h", "toy", entry, now) == (
            f"the registry names the host's record entry {name}, which is not evidence here")


def test_an_import_after_a_torn_last_line_keeps_every_new_entry_and_the_cursor(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from vq_admin.record.view import cursor, entries, take
    from vq_admin.state.records import StateDir

    state = StateDir(str(tmp_path / "state"))
    config = SimpleNamespace(signing=None, hosts={})

    def answer(*seqs: int) -> dict[str, object]:
        return {"entries": [{"seq": n, "name": f"{n:010d}-{'0' * 16}.json", "statement": "x", "sig": None}
                            for n in seqs]}

    assert take(config, state, "h", None, answer(1)).imported == 1  # type: ignore[arg-type]
    path = state.tree.path("record", "h", "_helper.jsonl")
    with open(path, "ab") as f:
        f.write(b'{"seq": 2, "name": "00000')  # a crash cut the next import short
    assert cursor(state, "h", None) == 1  # the torn entry is asked for again
    assert take(config, state, "h", None, answer(2, 3)).imported == 2  # type: ignore[arg-type]
    assert [e.seq for e in entries(state, "h", None)] == [1, 2, 3] and cursor(state, "h", None) == 3
