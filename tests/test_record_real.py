"""The host's record shared by two administrators (CONTRACT section 12): real sshd and git, two state
directories, one configuration, the site_example provider."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from realhosts import SshdServer, remote_path
from support import AGENT, GitRepo, run_vq, site_example_host, write_config

pytestmark = pytest.mark.real
ROOTS = "urn:vq-admin:record:roots:v1"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    """A private sshd for this module: its login account's record is this module's alone."""
    if not os.access("/usr/sbin/sshd", os.X_OK):
        pytest.skip("not installed: /usr/sbin/sshd")
    server = SshdServer(tmp_path_factory.mktemp("sshd-record"), env={"PATH": remote_path()})
    server.start()
    yield server
    server.stop()


def keygen(path: Path, comment: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path


class Site:
    """One configuration (with or without [signing]), two drivers (state directories A and B)."""

    def __init__(self, tmp: Path, sshd: SshdServer, program: str, *, signing: bool = True) -> None:
        self.tmp, self.sshd, self.program = tmp, sshd, program
        self.repo = GitRepo(tmp / "src")
        self.a = self.repo.commit("generation A")
        self.b = self.repo.commit("generation B")
        self.root = tmp / "apps"
        (tmp / "scratch").mkdir()
        self.key = keygen(tmp / "site_key", "site")
        self.allowed = tmp / "allowed_signers"
        self.allowed.write_text(f"admins@site {self.key.with_suffix('.pub').read_text()}")
        table = (f'[signing]\nkey = "{self.key}"\nallowed_signers = "{self.allowed}"\n' if signing else "")
        host = site_example_host("cluster", root=self.root, repo=self.repo.path, scratch=tmp / "scratch",
                                 transport="ssh", ssh="cluster", program=program)
        self.config = write_config(tmp / "admin.toml", f'ssh_config = "{sshd.ssh_config}"\n{table}' + host)
        self.state = {"A": tmp / "state-a", "B": tmp / "state-b"}

    def vq(self, driver: str, *args: str) -> dict:
        done = run_vq(*args, "--json", config=self.config, state=self.state[driver])
        document = done.json()
        document["exit_code"] = done.exit_code
        return document

    def update(self, driver: str, sha: str, *extra: str) -> dict:
        return self.vq(driver, "update", self.program, "cluster", "--expected-sha", sha, *extra)

    @property
    def record(self) -> Path:
        return self.sshd.agent_state("cluster") / "vq-admin-agent" / "record" / self.program

    def entries(self, kind: str = "https://slsa.dev/verification_summary/v1") -> list[Path]:
        """The host's entries of one predicate type (default: verification summaries), oldest first."""
        return sorted(p for p in self.record.iterdir()
                      if p.name.endswith(".json") and json.loads(p.read_text())["predicateType"] == kind)

    def forge(self, statement: bytes, sig: bytes | None, monkeypatch: pytest.MonkeyPatch) -> str:
        """An entry written on the host by the login account itself (as a build's setup script could)."""
        from vq_admin.agent import record

        with monkeypatch.context() as patch:
            patch.setenv("XDG_STATE_HOME", str(self.sshd.agent_state("cluster")))
            return str(record.append(self.program, statement, sig)["name"])


def ssh_keygen_verify(allowed: Path, statement: Path, sig: Path) -> subprocess.CompletedProcess[bytes]:
    with open(statement, "rb") as data:
        return subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", "admins@site", "-n",
                               "vq-admin-record", "-s", str(sig)], stdin=data, capture_output=True)


def test_a_signed_entry_per_verified_run_read_by_the_other_driver_and_forgeries_named(
        tmp_path: Path, sshd: SshdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    site = Site(tmp_path, sshd, "toysigned")
    first = site.update("A", site.a, "--cluster-install")
    assert first["exit_code"] == 0, first
    assert first["record"]["entry"] and first["record"]["signed"] is True and first["record"]["imported"] == 0
    [statement] = site.entries()
    assert statement.name == first["record"]["entry"] and statement.name.startswith("0000000001-")
    [roots] = site.entries(ROOTS)  # then A's roots: its LAST OK
    assert roots.name == first["record"]["roots"] and roots.name.startswith("0000000002-")
    assert [r["kind"] for r in json.loads(roots.read_text())["predicate"]["roots"]] == ["last-ok"]
    sig = statement.with_name(statement.name + ".sig")
    assert ssh_keygen_verify(site.allowed, statement, sig).returncode == 0  # checked with standard tools
    value = json.loads(statement.read_text())
    assert value["_type"] == "https://in-toto.io/Statement/v1"
    assert value["predicateType"] == "https://slsa.dev/verification_summary/v1"
    run = value["predicate"]["vqAdmin"]
    assert run["sha"] == site.a and run["outcome"] == "ok" and run["driver"].endswith(
        "/" + (site.state["A"] / "driver-id").read_text().strip())
    launcher = first["verify"]["final"]["receipt"]["active_path"]
    assert value["subject"] == [{"name": launcher, "digest": {"sha256": run["launcher_sha256"]}}]

    other = site.update("B", site.a)  # B reads A's entries in its first call; the identity is recorded already
    assert other["outcome"] == "already-current", other
    assert other["record"]["imported"] == 2 and "not_evidence" not in other["record"]
    assert other["record"]["entry"] is None and len(site.entries()) == 1
    assert len(site.entries(ROOTS)) == 2  # B's own roots are new: recorded

    # forgeries, written on the host by the login account: each is imported, and named with its reason
    body = statement.read_bytes()
    forged = json.loads(body)
    forged["subject"][0]["name"] = "/tmp/evil"
    unsigned = site.forge(json.dumps(forged).encode() + b"\n", None, monkeypatch)
    flipped = body.replace(site.a.encode(), site.b.encode(), 1)
    altered = site.forge(flipped, sig.read_bytes(), monkeypatch)
    stranger_key = keygen(tmp_path / "stranger", "stranger")
    stranger_sig = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(stranger_key), "-n", "vq-admin-record"],
                                  input=flipped, capture_output=True, check=True).stdout
    stranger = site.forge(flipped, stranger_sig, monkeypatch)
    again = site.update("B", site.a)
    assert again["outcome"] == "already-current", again
    assert again["record"]["imported"] == 4  # B's own roots entry, read back, and the three forgeries
    assert sorted(again["record"]["not_evidence"]) == sorted([
        f"{unsigned}: unsigned", f"{altered}: altered (its signature by admins@site does not verify)",
        f"{stranger}: signed by a key not in allowed_signers"])
    second = site.update("A", site.a)  # A reads its own two, B's roots and the same three forgeries
    assert second["record"]["imported"] == 6 and len(second["record"]["not_evidence"]) == 3


def test_attest_verifies_with_ssh_keygen_and_fails_after_a_byte_change_and_history_lists_both_drivers(
        tmp_path: Path, sshd: SshdServer) -> None:
    site = Site(tmp_path, sshd, "toyattest")
    assert site.update("A", site.a, "--cluster-install")["exit_code"] == 0
    assert site.update("B", site.b)["exit_code"] == 0
    out = tmp_path / "attested"
    attest = site.vq("A", "attest", site.program, "cluster", "--sha", site.a, "--out", str(out))
    assert attest["exit_code"] == 0, attest
    assert attest["principal"] == "admins@site" and attest["statement"]["predicate"]["vqAdmin"]["sha"] == site.a
    statement, sig = out / "statement.json", out / "statement.json.sig"
    assert statement.read_bytes() == site.entries()[0].read_bytes()
    assert ssh_keygen_verify(site.allowed, statement, sig).returncode == 0
    assert "ssh-keygen -Y verify -f" in attest["verify_command"]
    data = bytearray(statement.read_bytes())
    data[10] ^= 1
    statement.write_bytes(bytes(data))
    assert ssh_keygen_verify(site.allowed, statement, sig).returncode != 0
    active = site.vq("A", "attest", site.program, "cluster")  # default: the newest verified generation, B's
    assert active["statement"]["predicate"]["vqAdmin"]["sha"] == site.b
    never = site.vq("A", "attest", site.program, "cluster", "--sha", "c" * 40)
    assert never["exit_code"] == 77 and "nothing to attest" in never["errors"][-1]

    every = site.vq("B", "history", "cluster", site.program)["runs"]
    assert sorted(r["verb"] for r in every if r["verb"] == "roots") == ["roots", "roots"]  # each driver's roots
    runs = [r for r in every if r["verb"] != "roots"]
    assert [(r["expected_sha"], r["evidence"], r["signer"]) for r in runs] == [
        (site.b, True, "admins@site"), (site.a, True, "admins@site")]
    assert runs[0]["who"].startswith("this driver") and not runs[1]["who"].startswith("this driver")
    assert runs[1]["driver"].endswith((site.state["A"] / "driver-id").read_text().strip())
    local = site.vq("B", "history", "cluster", site.program, "--local")["runs"]
    assert [r["expected_sha"] for r in local] == [site.b]


def test_signed_entries_are_evidence_across_drivers_and_forgeries_never_are(
        tmp_path: Path, sshd: SshdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    site = Site(tmp_path, sshd, "toyshared")
    c = site.repo.commit("generation C (never deployed)")
    assert site.update("A", site.a, "--cluster-install")["exit_code"] == 0
    b_run = site.update("B", site.b)
    assert b_run["exit_code"] == 0 and b_run["record"]["evidence"] == [site.entries()[0].name]
    b_launcher = b_run["verify"]["final"]["receipt"]["active_path"]

    # a driver whose profile has confirm_command takes neither (no passed confirmation), naming why
    confirming = write_config(tmp_path / "confirm.toml", site.config.read_text().replace(
        "verify_timeout_seconds = 120\n", 'verify_timeout_seconds = 120\nconfirm_command = "/bin/true"\n'))
    seen = run_vq("history", "cluster", site.program, "--json", config=confirming, state=tmp_path / "state-c")
    summaries = [r for r in seen.json()["runs"] if r["verb"] == "update"]
    assert seen.exit_code == 0 and len(summaries) == 2 and all(
        not r["evidence"] and r["reason"] == "unconfirmed: it carries no passed confirmation" for r in summaries)
    assert not (tmp_path / "state-c" / "hosts" / "cluster" / "runtime" / site.program / "last-ok.json").exists()

    # A's next verify reads B's entry: A's LAST OK, status and launcher follow B's verified generation
    verify = site.vq("A", "verify", site.program, "cluster")
    assert verify["exit_code"] == 0, json.dumps(verify["hosts"], indent=1)[:3000]
    last_ok = json.loads((site.state["A"] / "hosts" / "cluster" / "runtime" / site.program / "last-ok.json")
                         .read_text())
    assert last_ok["sha"] == site.b and last_ok["signer"] == "admins@site" and last_ok["receipt"].startswith("record:")
    launcher = run_vq("launcher", site.program, "cluster", config=site.config, state=site.state["A"])
    assert launcher.exit_code == 0 and launcher.stdout.strip() == b_launcher, launcher.stderr
    status = site.vq("A", "status", "cluster")
    assert site.b[:12] in json.dumps(status) and "admins@site" in json.dumps(status)

    # B returns to A's generation without a rebuild: A's signed entry is B's evidence
    back = site.vq("B", "rollback", site.program, "cluster", "--to", site.a)
    assert back["exit_code"] == 0 and back["rollback"]["via"] == "activate", back
    assert "deploy" not in [s["name"] for s in back["steps"] if s["status"] == "ok"]

    # forgeries naming C: written by the login account unsigned, altered, or signed by a stranger
    body = json.loads(site.entries()[0].read_text())
    body["predicate"]["vqAdmin"]["sha"] = c
    body["subject"][0]["name"] = str(site.root / "releases" / c / "bin" / f"vibeqc-{c}")
    forged = json.dumps(body).encode() + b"\n"
    stranger = keygen(tmp_path / "stranger", "stranger")
    stranger_sig = subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(stranger), "-n", "vq-admin-record"],
                                  input=forged, capture_output=True, check=True).stdout
    own_sig = site.entries()[0].with_name(site.entries()[0].name + ".sig").read_bytes()
    names = [site.forge(forged, None, monkeypatch), site.forge(forged, own_sig, monkeypatch),
             site.forge(forged, stranger_sig, monkeypatch)]
    runs = site.vq("B", "history", "cluster", site.program)["runs"]
    reasons = {r["entry"]: r["reason"] for r in runs}
    assert [reasons[n] for n in names] == ["unsigned", "altered (its signature by admins@site does not verify)",
                                           "signed by a key not in allowed_signers"]
    for driver in ("A", "B"):
        refused = run_vq("launcher", site.program, "cluster", "--expected-sha", c, config=site.config,
                         state=site.state[driver])
        assert refused.exit_code == 77 and c not in refused.stdout, refused.stdout
        rollback = site.vq(driver, "rollback", site.program, "cluster", "--to", c)
        assert rollback["exit_code"] == 77 and "never verified" in rollback["errors"][-1], rollback["errors"]


def test_prune_keeps_every_drivers_roots_and_forget_driver_drops_them(tmp_path: Path, real_cluster) -> None:
    """B prunes after deploying a newer SHA: A's LAST OK and LAST GOOD survive, kept as A's roots (here
    without [signing]: roots count signed or not); ``--forget-driver`` then drops them, recorded."""
    site = Site(tmp_path, real_cluster.sshd, "toyroots", signing=False)
    c = site.repo.commit("generation C")
    assert site.update("A", site.a, "--cluster-install")["exit_code"] == 0
    assert site.update("A", site.b)["exit_code"] == 0
    a_id = json.loads(site.entries(ROOTS)[-1].read_text())["predicate"]["driver"]  # A's roots
    assert site.update("B", c)["exit_code"] == 0
    pruned = site.vq("B", "prune", site.program, "cluster", "--keep", "1")
    assert pruned["exit_code"] == 0, pruned["errors"]
    keep = pruned["prune"]["keep"]
    assert keep[site.b] == [f"root of {a_id} (last-ok)"] and keep[site.a] == [f"root of {a_id} (last-good)"]
    assert sorted(p.name for p in (site.root / "releases").iterdir()) == sorted([site.a, site.b, c])
    proved = json.loads(site.entries()[-1].read_text())["predicate"]["vqAdmin"]  # the prune's own entry
    assert (proved["verb"], proved["sha"], pruned["record"]["entry"]) == ("prune", c, site.entries()[-1].name)
    launcher = run_vq("launcher", site.program, "cluster", "--json", config=site.config, state=site.state["A"])
    bound = launcher.json()
    assert launcher.exit_code == 0 and bound["sha"] == site.b, launcher.stdout
    assert hashlib.sha256(Path(bound["launcher"]).read_bytes()).hexdigest() == bound["launcher_sha256"]

    forgot = site.vq("B", "prune", site.program, "cluster", "--keep", "1", "--forget-driver", a_id)
    assert forgot["exit_code"] == 0, forgot["errors"]
    assert forgot["prune"]["forgot"]["driver"] == a_id and forgot["prune"]["forgot"]["entry"]
    assert not any(r.startswith("root of") for reasons in forgot["prune"]["keep"].values() for r in reasons)
    assert sorted(p.name for p in (site.root / "releases").iterdir()) == [c]
    entry = json.loads((site.record / forgot["prune"]["forgot"]["entry"]).read_text())
    b_id = (site.state["B"] / "driver-id").read_text().strip()
    assert entry["predicate"]["forgotten"] == a_id and entry["predicate"]["driver"].endswith("/" + b_id)


def test_a_signed_quarantine_reaches_the_other_driver_and_only_a_signed_lift_ends_it(
        tmp_path: Path, real_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under [signing]: A's quarantine (appended with no lease, signed) makes B refuse the SHA after B's next
    contact; a lift written unsigned on the host does not end it; A's signed lift does."""
    site = Site(tmp_path, real_cluster.sshd, "toyrecall")
    assert site.update("B", site.a, "--cluster-install")["exit_code"] == 0

    def b_answers() -> int:
        assert site.vq("B", "history", "cluster", site.program)["exit_code"] == 0  # B's contact with the host
        return run_vq("launcher", site.program, "cluster", "--expected-sha", site.a, config=site.config,
                      state=site.state["B"]).exit_code

    quarantined = site.vq("A", "quarantine", site.program, "cluster", site.a, "--reason", "bad integrals")
    assert quarantined["exit_code"] == 0 and quarantined["host_record"], quarantined
    [entry] = site.entries("urn:vq-admin:record:quarantine:v1")
    assert entry.with_name(entry.name + ".sig").exists() and quarantined["host_record"].endswith(entry.name)
    assert b_answers() == 77
    lift = json.loads(entry.read_text())
    lift["predicate"].update(action="lift", reason=None)
    site.forge(json.dumps(lift).encode() + b"\n", None, monkeypatch)  # unsigned: not a lift under [signing]
    assert b_answers() == 77
    lifted = site.vq("A", "quarantine", site.program, "cluster", site.a, "--lift")
    assert lifted["exit_code"] == 0 and lifted["host_record"], lifted
    assert b_answers() == 0


def test_sigkill_of_the_agent_while_it_writes_the_entry_leaves_a_record_every_reader_accepts(
        tmp_path: Path, sshd: SshdServer) -> None:
    site = Site(tmp_path, sshd, "toycrash")
    crashing = tmp_path / "crashing-agent"  # the real agent, SIGKILLed between the signature and the statement
    crashing.write_text(f"#!{sys.executable}\nimport os, sys\n"
                        "os.environ.update(VQ_ADMIN_TESTING='1', VQ_ADMIN_AGENT_CRASH='record-before-statement')\n"
                        f"os.execv({AGENT!r}, [{AGENT!r}] + sys.argv[1:])\n")
    crashing.chmod(0o755)
    normal = site.config.read_text()
    site.config.write_text(normal.replace(f'agent = "{AGENT}"', f'agent = "{crashing}"'))
    crashed = site.update("A", site.a, "--cluster-install")
    assert crashed["outcome"] == "ok", crashed  # the host was changed and verified: the entry's loss says so
    assert crashed["record"]["entry"] is None and crashed["record"]["error"]
    orphans = [p.name for p in site.record.iterdir() if p.name.endswith(".sig")]
    assert len(orphans) == 1 and site.entries() == []  # a signature without its statement is no entry
    site.config.write_text(normal)
    again = site.update("A", site.a)  # the next run is not refused, and records what the crash lost
    assert again["outcome"] == "already-current" and again["record"]["entry"], again
    assert not again["record"].get("not_evidence")
    [entry] = site.entries()
    assert entry.name.startswith("0000000002-")  # numbered past the orphaned signature
    assert ssh_keygen_verify(site.allowed, entry, entry.with_name(entry.name + ".sig")).returncode == 0
    runs = site.vq("B", "history", "cluster", site.program)["runs"]
    assert [r["reason"] for r in runs] == [None, None] and {r["verb"] for r in runs} == {"update", "roots"}
