"""The JSON envelope contract: every verb's ``--json`` output, on success and on failure.

Every ``--json`` document is exactly one JSON object on stdout whose keys open
with ``schema``, ``outcome``, ``exit_code`` and close with ``errors`` (a list
of strings); ``outcome`` is one of the documented set and ``exit_code`` is its
code and the process's exit status.

The verbs come from the argument parser itself (:func:`vq_admin.cli.build_parser`):
a verb that takes ``--json`` and has no case here fails
:func:`test_every_json_verb_has_cases`, and a verb without ``--json`` must be
named in :data:`NO_JSON` with the reason.  The verbs run in this process
(``vq_admin.entry.main``, stdout captured at the file descriptor, so provider
and agent children count too) against a configuration whose host is reached
through the ``local`` transport; ``check --connect`` and ``references`` also run
over the real sshd, where they reach a login host for real.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import GitRepo, run_vq, site_example_host, write_config

from vq_admin import cli, entry
from vq_admin.report import envelope
from vq_admin.report.outcome import EXIT_CODES, Outcome, UsageError
from vq_admin.report.receipt import SECTIONS, Receipt, UndeclaredSection
from vq_admin.report.sections import Rollback

OUTCOMES = {o.value: code for o, code in EXIT_CODES.items()}

#: Verbs that print no JSON document at all, and why.
NO_JSON = {("completion",): "prints a shell completion script"}


def leaf_verbs(parser: argparse.ArgumentParser,
               prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every verb path of the parser (``("update",)``, ``("provider", "install")``, ...) and its parser."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix: parser}
    for action in subs:
        for name, child in action.choices.items():
            found.update(leaf_verbs(child, prefix + (name,)))
    return found


def takes_json(parser: argparse.ArgumentParser) -> bool:
    return any("--json" in a.option_strings for a in parser._actions)


def check_envelope(stdout: str, status: int) -> dict[str, Any]:
    """The assertions of the contract, written out here (not borrowed from the code under test)."""
    decoder = json.JSONDecoder()
    text = stdout.lstrip()
    assert text, "nothing on stdout"
    doc, end = decoder.raw_decode(text)
    assert not text[end:].strip(), f"more than one document on stdout: {text[end:end + 200]!r}"
    assert isinstance(doc, dict), doc
    keys = list(doc)
    assert keys[:3] == ["schema", "outcome", "exit_code"], keys
    assert keys[-1] == "errors", keys
    assert isinstance(doc["schema"], str) and doc["schema"].startswith("vq-admin/") and doc["schema"][-2:] == "/1"
    assert doc["outcome"] in OUTCOMES, doc["outcome"]
    assert doc["exit_code"] == OUTCOMES[doc["outcome"]], (doc["outcome"], doc["exit_code"])
    assert doc["exit_code"] == status, f"exit_code {doc['exit_code']} but the process exited {status}"
    assert isinstance(doc["errors"], list) and all(isinstance(e, str) for e in doc["errors"]), doc["errors"]
    if doc["outcome"] in ("ok", "already-current"):
        assert doc["errors"] == [], doc["errors"]
    else:
        assert doc["errors"], "a failure must say why in errors"
    return doc


# -- the world the verbs run in ---------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def scripts_on_path() -> Iterator[None]:
    """This interpreter's scripts (the providers' console entries, e.g. vq-site-example) first on PATH,
    as an installed vq-admin has them; undone after this module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("envelope")
    repo = GitRepo(tmp / "src")
    sha = repo.commit("A")
    scratch = tmp / "scratch"
    scratch.mkdir(mode=0o755)
    site_bin = tmp / "site" / "bin"
    site_bin.mkdir(parents=True, mode=0o755)
    config = write_config(tmp / "admin.toml",
                          site_example_host("cluster", root=tmp / "apps", repo=repo.path, scratch=scratch)
                          + '\n[hosts.login2]\nfleet_role = "alias"\ncanonical_host = "cluster"\n')
    reviewed = tmp / "reviewed"
    reviewed.mkdir(mode=0o700)
    src = reviewed / "deploy"
    src.write_text("#!/bin/sh\nexit 0\n")
    state = tmp / "state"
    # One verified deployment first, so launcher, rollback, prune and history have something to read.
    done = run_vq("update", "vibeqc", "cluster", "--expected-sha", sha, "--cluster-install", "--json",
                  config=config, state=state)
    assert done.exit_code == 0, done.stdout + done.stderr
    return {"tmp": tmp, "config": config, "state": state, "sha": sha, "src": src, "dest": site_bin / "deploy"}


def run_in_process(argv: list[str], world: dict[str, Any], capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``vq_admin.entry.main(argv)`` in this process; stdout and stderr as the file descriptors saw them."""
    capfd.readouterr()
    code = entry.main([*argv, "--config", str(world["config"]), "--state-dir", str(world["state"])])
    out, err = capfd.readouterr()
    return code, out, err


Case = Callable[[dict[str, Any]], list[str]]

#: verb path -> {case id: argv builder}; each verb has at least one case, and the usage-error case
#: (an unknown option) is added to every verb by :func:`test_a_usage_error_is_an_envelope_too`.
CASES: dict[tuple[str, ...], dict[str, Case]] = {
    ("update",): {
        "runtime-already-current": lambda w: ["update", "vibeqc", "cluster", "--expected-sha", w["sha"], "--json"],
        "runtime-dry-run": lambda w: ["update", "vibeqc", "cluster", "--expected-sha", w["sha"], "--dry-run", "--json"],
        "runtime-abbreviated-sha": lambda w: ["update", "vibeqc", "cluster", "--expected-sha", w["sha"][:12], "--json"],
        "runtime-alias-refused": lambda w: ["update", "vibeqc", "login2", "--expected-sha", w["sha"], "--json"],
        "helper-lane": lambda w: ["update", "cluster", "--json"],
        "fleet": lambda w: ["update", "vibeqc", "--all", "--expected-sha", w["sha"], "--json"],
        "fleet-dry-run": lambda w: ["update", "vibeqc", "--all", "--expected-sha", w["sha"], "--dry-run", "--json"],
    },
    ("status",): {
        "all-hosts": lambda w: ["status", "--json"],
        "one-host": lambda w: ["status", "cluster", "--json"],
        "side-by-side": lambda w: ["status", "--all", "--json"],
        "json-and-prometheus": lambda w: ["status", "--prometheus", "--json"],
    },
    ("verify",): {
        "current": lambda w: ["verify", "vibeqc", "cluster", "--json"],
        "other-sha-drifted": lambda w: ["verify", "vibeqc", "cluster", "--expected-sha", "b" * 40, "--json"],
        "alias-refused": lambda w: ["verify", "vibeqc", "login2", "--json"],
    },
    ("providers",): {"list": lambda w: ["providers", "--json"]},
    ("check",): {
        "valid": lambda w: ["check", "--json"],
        "connect": lambda w: ["check", "--connect", "--json"],
        "timeout-without-connect": lambda w: ["check", "--timeout", "3", "--json"],
    },
    ("launcher",): {
        "verified": lambda w: ["launcher", "vibeqc", "cluster", "--json"],
        "other-sha-refused": lambda w: ["launcher", "vibeqc", "cluster", "--expected-sha", "b" * 40, "--json"],
    },
    ("references",): {
        "no-scheduler": lambda w: ["references", "vibeqc", "login2", "--json"],
        "bad-name": lambda w: ["references", "vibe/qc", "cluster", "--json"],
    },
    ("jobs",): {
        "no-scheduler": lambda w: ["jobs", "vibeqc", "cluster", "--json"],
        "bad-since": lambda w: ["jobs", "vibeqc", "cluster", "--since", "yesterday", "--json"],
    },
    ("quarantine",): {
        "no-reason": lambda w: ["quarantine", "vibeqc", "cluster", "c" * 40, "--json"],
        "no-scheduler": lambda w: ["quarantine", "vibeqc", "cluster", "c" * 40, "--reason", "bad", "--json"],
        "hold-without-scheduler": lambda w: ["quarantine", "vibeqc", "cluster", "c" * 40, "--reason", "bad",
                                             "--hold-jobs", "--json"],
    },
    ("rollback",): {
        "no-last-good-refused": lambda w: ["rollback", "vibeqc", "cluster", "--json"],
        "to-unverified-refused": lambda w: ["rollback", "vibeqc", "cluster", "--to", "c" * 40, "--json"],
    },
    ("prune",): {
        "dry-run-no-scheduler": lambda w: ["prune", "vibeqc", "cluster", "--dry-run", "--json"],
        "no-scheduler": lambda w: ["prune", "vibeqc", "cluster", "--keep", "1", "--json"],
    },
    ("history",): {
        "all": lambda w: ["history", "--json"],
        "one-host": lambda w: ["history", "cluster", "vibeqc", "--limit", "2", "--json"],
        "bad-limit": lambda w: ["history", "--limit", "0", "--json"],
    },
    ("attest",): {
        "never-recorded-refused": lambda w: ["attest", "vibeqc", "cluster", "--sha", "c" * 40, "--json"],
    },
    ("provider", "install"): {
        "install": lambda w: ["provider", "install", str(w["src"]), "--host", "cluster", "--dest", str(w["dest"]),
                              "--json"],
        "dry-run": lambda w: ["provider", "install", str(w["src"]), "--host", "cluster", "--dest", str(w["dest"]),
                              "--dry-run", "--json"],
        "setuid-refused": lambda w: ["provider", "install", str(w["src"]), "--host", "cluster", "--dest",
                                     str(w["dest"]), "--mode", "4755", "--json"],
    },
    ("provider", "test"): {
        "site-example": lambda w: ["provider", "test", "site_example", "--json"],
        "unknown-provider": lambda w: ["provider", "test", "no-such-provider", "--json"],
    },
}

#: What each case must print: (the envelope.SCHEMAS name, the outcome). Every case has one.
EXPECTED: dict[str, tuple[str, str]] = {
    "update|runtime-already-current": ("receipt", "already-current"),
    "update|runtime-dry-run": ("plan", "ok"),
    "update|runtime-abbreviated-sha": ("receipt", "usage"),
    "update|runtime-alias-refused": ("receipt", "refused"),
    "update|helper-lane": ("receipt", "usage"),
    "update|fleet": ("fleet", "already-current"),
    "update|fleet-dry-run": ("fleet", "ok"),
    "status|all-hosts": ("status", "ok"),
    "status|one-host": ("status", "ok"),
    "status|side-by-side": ("status-all", "ok"),
    "status|json-and-prometheus": ("error", "usage"),
    "verify|current": ("verify", "ok"),
    "verify|other-sha-drifted": ("verify", "failed"),
    "verify|alias-refused": ("error", "refused"),
    "providers|list": ("providers", "ok"),
    "check|valid": ("check", "ok"),
    "check|connect": ("check-connect", "ok"),  # the alias login2 is never contacted under its own name
    "check|timeout-without-connect": ("error", "usage"),
    "launcher|verified": ("launcher-binding", "ok"),
    "launcher|other-sha-refused": ("launcher-binding", "refused"),
    "references|no-scheduler": ("error", "failed"),
    "references|bad-name": ("error", "usage"),
    "jobs|no-scheduler": ("jobs", "failed"),  # the uses are printed; the scheduler's jobs are not known
    "jobs|bad-since": ("error", "usage"),
    "quarantine|no-reason": ("error", "usage"),
    "quarantine|no-scheduler": ("quarantine", "failed"),  # recorded; the jobs are not known (census_error)
    "quarantine|hold-without-scheduler": ("quarantine", "failed"),  # nothing could be held
    "rollback|no-last-good-refused": ("receipt", "refused"),
    "rollback|to-unverified-refused": ("receipt", "refused"),
    "prune|dry-run-no-scheduler": ("receipt", "refused"),
    "prune|no-scheduler": ("receipt", "refused"),
    "history|all": ("history", "ok"),
    "history|one-host": ("history", "ok"),
    "history|bad-limit": ("error", "usage"),
    "attest|never-recorded-refused": ("error", "refused"),
    "provider install|install": ("receipt", "ok"),
    "provider install|dry-run": ("plan", "ok"),
    "provider install|setuid-refused": ("error", "usage"),
    "provider test|site-example": ("conformance", "ok"),
    "provider test|unknown-provider": ("error", "usage"),
}

#: Verbs whose documents do not carry the envelope yet: they are owned by the per-job
#: ``vq admin launcher`` path (vq_admin/entry.py, vq_admin/commands/launcher.py), which prints
#: ``schema``/``outcome``/``exit_code`` in order but no ``errors`` list.  Strict: fixing them fails here.
NOT_YET: dict[tuple[str, ...], str] = {}

#: Cases run in a fresh interpreter: a fleet rollout forks one worker per host, whose stdout must be
#: the process's file descriptor 1 (in this process, pytest's capture replaces sys.stdout).
FRESH = {"fleet", "fleet-dry-run"}

PARSER_VERBS = leaf_verbs(cli.build_parser())
ALL_CASES = [(verb, name, build) for verb, cases in CASES.items() for name, build in cases.items()]


def test_every_case_has_its_expected_document() -> None:
    assert sorted(EXPECTED) == sorted(f"{' '.join(v)}|{n}" for v, n, _ in ALL_CASES)


def test_every_json_verb_has_cases() -> None:
    with_json = {verb for verb, parser in PARSER_VERBS.items() if takes_json(parser)}
    without = {verb for verb, parser in PARSER_VERBS.items() if not takes_json(parser)}
    assert without == set(NO_JSON), f"verbs without --json must be named in NO_JSON: {sorted(without - set(NO_JSON))}"
    missing = with_json - set(CASES)
    assert not missing, f"verbs with --json but no envelope case here: {sorted(missing)}"
    assert set(CASES) <= with_json, f"cases for verbs the parser does not have: {sorted(set(CASES) - with_json)}"


def _mark(verb: tuple[str, ...]) -> list[pytest.MarkDecorator]:
    return [pytest.mark.xfail(reason=NOT_YET[verb], strict=True)] if verb in NOT_YET else []


@pytest.mark.parametrize("verb,name,build",
                         [pytest.param(v, n, b, id=f"{' '.join(v)}:{n}", marks=_mark(v)) for v, n, b in ALL_CASES])
def test_every_verb_prints_one_envelope(verb: tuple[str, ...], name: str, build: Case, world: dict[str, Any],
                                        capfd: pytest.CaptureFixture[str]) -> None:
    if name in FRESH:
        done = run_vq(*build(world), config=world["config"], state=world["state"])
        code, out, err = done.exit_code, done.stdout, done.stderr
    else:
        code, out, err = run_in_process(build(world), world, capfd)
    doc = check_envelope(out, code)
    assert "Traceback" not in err, err
    schema, outcome = EXPECTED[f"{' '.join(verb)}|{name}"]
    assert (doc["schema"], doc["outcome"]) == (envelope.SCHEMAS[schema], outcome), doc["errors"]


@pytest.mark.parametrize("verb", [pytest.param(v, id=" ".join(v)) for v in sorted(CASES)])
def test_a_usage_error_is_an_envelope_too(verb: tuple[str, ...], world: dict[str, Any],
                                          capfd: pytest.CaptureFixture[str]) -> None:
    argv = CASES[verb][next(iter(CASES[verb]))](world)
    code, out, _ = run_in_process([*argv, "--no-such-option"], world, capfd)
    doc = check_envelope(out, code)
    assert (doc["outcome"], code) == ("usage", 2)
    assert "--no-such-option" in doc["errors"][0]


def test_a_parse_error_before_any_verb_is_an_envelope(world: dict[str, Any], capfd: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_in_process(["no-such-verb", "--json"], world, capfd)
    doc = check_envelope(out, code)
    assert doc["schema"] == "vq-admin/error/1" and code == 2


def test_the_fresh_interpreter_prints_the_same_envelope(world: dict[str, Any]) -> None:
    """The console entry (a new process, as cron runs it): the exit status is the document's."""
    done = run_vq("update", "vibeqc", "cluster", "--expected-sha", world["sha"], "--json",
                  config=world["config"], state=world["state"])
    doc = check_envelope(done.stdout, done.exit_code)
    assert doc["schema"] == "vq-admin/receipt/1" and doc["outcome"] == "already-current"
    stored = json.loads((world["state"] / "receipts" / f"{doc['id']}.json").read_text())
    assert stored == doc


def test_a_quarantine_the_hosts_record_does_not_hold_is_not_ok(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """CONTRACT section 14: exit 0 only once recorded on the host; 1 when it was not, 3 when not known."""
    from types import SimpleNamespace

    from vq_admin.commands import quarantine

    monkeypatch.setattr(quarantine, "scan", lambda *_: SimpleNamespace(
        jobs_naming=lambda shas: {s: [] for s in shas}, jobs_scanned=0))
    for answer, outcome in (((None, "no record-quarantine verb", False), "failed"),
                            ((None, "ssh: the connection was lost", True), "unknown"),
                            (("d/n.json", None, False), "ok")):
        monkeypatch.setattr(quarantine, "record_on_host", lambda *_, found=answer: found)
        code, out, _ = run_in_process(["quarantine", "vibeqc", "cluster", "e" * 40, "--reason", "bad", "--json"],
                                      world, capfd)
        doc = check_envelope(out, code)
        assert doc["outcome"] == outcome, doc
        if answer[1]:
            assert doc["errors"][0].startswith("the quarantine holds only in this state directory until rerun"), doc
        code, out, _ = run_in_process(["quarantine", "vibeqc", "cluster", "e" * 40, "--reason", "bad"], world, capfd)
        assert ("holds only in this state directory until rerun" in out) == bool(answer[1]), out
    run_in_process(["quarantine", "vibeqc", "cluster", "e" * 40, "--lift"], world, capfd)


# -- the envelope module and the declared receipt ------------------------------------------


def test_data_that_would_shadow_an_envelope_key_is_a_programming_error() -> None:
    for key in ("schema", "outcome", "exit_code", "errors"):
        with pytest.raises(envelope.EnvelopeError, match=key):
            envelope.document("vq-admin/status/1", Outcome.OK, {key: "x"})
    with pytest.raises(envelope.EnvelopeError):
        envelope.document("status", Outcome.OK, {})
    with pytest.raises(envelope.EnvelopeError):
        envelope.document("vq-admin/status/1", "fine", {})
    doc = envelope.document("vq-admin/status/1", Outcome.REFUSED, {"z": 1, "a": 2}, ["why"])
    assert list(doc) == ["schema", "outcome", "exit_code", "z", "a", "errors"] and doc["exit_code"] == 77


def test_write_refuses_a_document_that_is_not_an_envelope(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(envelope.EnvelopeError):
        envelope.write({"schema": "vq-admin/status/1", "outcome": "ok", "exit_code": 1, "errors": []})
    with pytest.raises(envelope.EnvelopeError):
        envelope.write({"schema": "vq-admin/status/1", "outcome": "ok", "exit_code": 0})
    assert capsys.readouterr().out == ""


def test_every_schema_is_documented() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "json.md").read_text()
    for name, schema in envelope.SCHEMAS.items():
        assert f"`{schema}`" in docs, f"{schema} ({name}) is not in docs/json.md"


def test_a_receipt_section_nobody_declared_raises() -> None:
    receipt = Receipt("runtime", "cluster", "vibeqc", "a" * 40, None, "2026-11-30T00:00:00Z")
    with pytest.raises(UndeclaredSection, match="lane"):
        receipt.set_section("lane", "helper")  # a core key is not a section: it cannot be overwritten
    with pytest.raises(UndeclaredSection):
        receipt.set_sections({"made_up": 1})
    receipt.set_sections({"rollback": Rollback(from_=None, to="a" * 40, via=None)})
    doc = receipt.finish(Outcome.OK, "2026-11-30T00:00:01Z").to_dict()
    assert doc["rollback"] == {"from": None, "to": "a" * 40, "via": None} and doc["lane"] == "runtime"
    assert "prune" not in doc and "stored" not in doc  # unset sections are not printed
    assert set(SECTIONS) <= {f.name for f in Receipt.__dataclass_fields__.values()}


def test_json_reaches_stdout_only_through_the_envelope_module() -> None:
    """No verb prints a JSON document by itself: ``print_json`` is left to the per-job launcher path
    (which cannot import more than it does), everything else calls ``vq_admin.report.envelope``."""
    root = Path(cli.__file__).parent
    launcher_path = {"report/output.py", "entry.py", "commands/launcher.py"}
    offenders = []
    for path in root.rglob("*.py"):
        rel = str(path.relative_to(root))
        if rel.startswith("agent/") or rel == "envelope.py":
            continue
        text = path.read_text()
        if rel not in launcher_path and "print_json(" in text:
            offenders.append(f"{rel}: print_json(")
        if "json.dump(" in text and "sys.stdout" in text:
            offenders.append(f"{rel}: json.dump to stdout")
    assert not offenders, offenders


def test_the_usage_error_class_is_the_usage_outcome() -> None:
    assert UsageError("x").outcome is Outcome.USAGE and OUTCOMES["usage"] == 2


# -- over the real sshd and Slurm: the verbs that reach a login host and its scheduler -----------


@pytest.mark.real
def test_host_verbs_over_the_real_sshd_and_slurm_print_one_envelope(real_cluster: Any, tmp_path: Path) -> None:
    """update, references, prune, rollback and check --connect as an operator runs them (a fresh
    interpreter each), over ssh to a login host whose Slurm answers: their success documents too."""
    repo = GitRepo(tmp_path / "repo")
    first, second = repo.commit("A"), repo.commit("B")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    config = write_config(tmp_path / "admin.toml", f'ssh_config = "{real_cluster.ssh_config}"\n' + site_example_host(
        "cluster", root=tmp_path / "apps" / "vibeqc", repo=repo.path, scratch=scratch, transport="ssh",
        ssh="cluster"))
    state = tmp_path / "state"
    runs = [
        (["update", "vibeqc", "cluster", "--expected-sha", first, "--cluster-install", "--json"], "receipt", "ok"),
        (["update", "vibeqc", "cluster", "--expected-sha", second, "--json"], "receipt", "ok"),
        (["update", "vibeqc", "cluster", "--expected-sha", second, "--json"], "receipt", "already-current"),
        (["references", "vibeqc", "cluster", "--json"], "references", "ok"),
        (["prune", "vibeqc", "cluster", "--keep", "2", "--dry-run", "--json"], "plan", "ok"),
        (["prune", "vibeqc", "cluster", "--keep", "2", "--json"], "receipt", "ok"),
        (["rollback", "vibeqc", "cluster", "--json"], "receipt", "ok"),
        (["check", "--connect", "--json"], "check-connect", "ok"),
        (["history", "cluster", "vibeqc", "--local", "--json"], "history", "ok"),
    ]
    for argv, schema, outcome in runs:
        done = run_vq(*argv, config=config, state=state)
        doc = check_envelope(done.stdout, done.exit_code)
        assert (doc["schema"], doc["outcome"]) == (envelope.SCHEMAS[schema], outcome), (argv, doc["errors"],
                                                                                        done.stderr[-2000:])
        assert "Traceback" not in done.stderr, done.stderr
    assert doc["runs"][0]["verb"] == "rollback" and doc["runs"][1]["verb"] == "prune"
