"""What a new operator trips over first: a closed pipe, usage messages, a host typo,
installation instructions, and docs that must stand alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import SCRIPTS, GitRepo, run_vq, run_vq_inprocess, site_example_host, write_config
from vq_admin.cli import build_parser
from vq_admin.entry import EXIT_CLOSED_PIPE
from vq_admin.state.records import LastRun, StateDir, Verified

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHA = "a" * 40


def _verbs(parser=None, path=()):
    parser = parser or build_parser()
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, child in action.choices.items():
                yield (*path, name)
                yield from _verbs(child, (*path, name))


#: The console scripts' own entry (vq_admin.entry: the per-job launcher path before argparse).
CONSOLE_ENTRY = [sys.executable, "-c", "import sys; from vq_admin.entry import main; sys.argv[0] = 'vq-admin'; "
                 "sys.exit(main())"]


def run_closed(argv: list[str], env: dict[str, str], entry: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run the CLI with stdout a pipe whose reader has already gone (``| head -0``)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*(entry or [sys.executable, "-m", "vq_admin.cli"]), *argv], stdout=write_end,
                              stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, text=True, timeout=120)
    finally:
        os.close(write_end)


@pytest.fixture
def site(tmp_path):
    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("one")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    config = write_config(tmp_path / "admin.toml",
                          site_example_host("cluster", root=tmp_path / "apps", repo=repo.path, scratch=scratch)
                          + '\n[hosts.login2]\nfleet_role = "alias"\ncanonical_host = "cluster"\n')
    state = tmp_path / "state"
    StateDir(state).record_run("runtime", "cluster", "vibeqc",
                               LastRun(outcome="ok", exit_code=0, expected_sha=sha, at="2026-11-30T10:00:00Z"),
                               Verified(sha=sha, tag=None, at="2026-11-30T10:00:00Z"))
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(config), VQ_ADMIN_STATE_DIR=str(state))
    return tmp_path, config, state, sha, env


# -- a closed pipe ---------------------------------------------------------------------


def _assert_quiet(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr


@pytest.mark.parametrize("verb", [" ".join(v) for v in _verbs()] + ["", "--version"])
def test_help_of_every_verb_ends_quietly_on_a_closed_pipe(verb):
    argv = verb.split() + ([] if verb == "--version" else ["--help"])
    done = run_closed(argv, dict(os.environ))
    _assert_quiet(done)
    # argparse itself ignores a failed write of --help / --version and exits 0; either is quiet.
    assert done.returncode in (0, EXIT_CLOSED_PIPE), (argv, done.returncode, done.stderr)


@pytest.mark.parametrize("argv", [["status"], ["status", "--json"], ["status", "cluster"], ["check"],
                                  ["check", "--json"], ["providers"], ["providers", "--json"], ["history"],
                                  ["update", "vibeqc", "cluster", "--expected-sha", "SHA", "--dry-run"],
                                  ["update", "vibeqc", "cluster", "--expected-sha", "SHA", "--dry-run", "--json"],
                                  ["launcher", "vibeqc", "cluster", "--json"], ["update", "--bogus", "--json"],
                                  ["completion", "bash"], ["status", "--prometheus"]],
                         ids=" ".join)
def test_every_verb_ends_quietly_on_a_closed_pipe(site, argv):
    tmp, config, state, sha, env = site
    argv = [sha if a == "SHA" else a for a in argv]
    if argv[0] not in {v[0] for v in _verbs()}:
        pytest.skip(f"no verb {argv[0]!r} in this tree")
    open_pipe = subprocess.run([sys.executable, "-m", "vq_admin.cli", *argv], capture_output=True, text=True,
                               env=env, stdin=subprocess.DEVNULL, timeout=120)
    done = run_closed(argv, env)
    _assert_quiet(done)
    if open_pipe.stdout:
        # The control: the same command with a reader exits with its own status; only the closed pipe gives 141.
        assert open_pipe.returncode != EXIT_CLOSED_PIPE
        assert done.returncode == EXIT_CLOSED_PIPE, (done.returncode, done.stderr)
    else:
        assert done.returncode == open_pipe.returncode


def test_the_console_entry_ends_the_launcher_quietly_on_a_closed_pipe(site):
    tmp, config, state, sha, env = site
    argv = ["launcher", "vibeqc", "cluster", "--json"]
    open_pipe = subprocess.run([*CONSOLE_ENTRY, *argv], capture_output=True, text=True, env=env,
                               stdin=subprocess.DEVNULL, timeout=120)
    assert open_pipe.stdout and open_pipe.returncode != EXIT_CLOSED_PIPE  # the control: one JSON document
    done = run_closed(argv, env, CONSOLE_ENTRY)
    _assert_quiet(done)
    assert done.returncode == EXIT_CLOSED_PIPE, (done.returncode, done.stderr)


def test_a_closed_pipe_after_an_update_leaves_the_receipt_on_record(site):
    tmp, config, state, sha, env = site
    done = run_closed(["update", "vibeqc", "cluster", "--expected-sha", sha, "--json"], env)
    _assert_quiet(done)
    assert done.returncode == EXIT_CLOSED_PIPE
    log = [json.loads(line) for line in (state / "admin.log").read_text().splitlines()]
    assert log[-1]["host"] == "cluster" and Path(log[-1]["receipt"]).is_file()


# -- usage messages --------------------------------------------------------------------


def test_usage_errors_name_the_program_once():
    result = run_vq_inprocess("status", "--bogus")
    assert result.exit_code == 2
    assert result.stderr == "vq-admin: usage: unrecognized arguments: --bogus\n"
    result = run_vq_inprocess("update", "--bogus")
    assert result.exit_code == 2
    assert result.stderr.count("vq-admin") == 1 and "usage: update: " in result.stderr, result.stderr


def test_usage_errors_through_the_vq_entry_point():
    done = subprocess.run([os.path.join(SCRIPTS, "vq"), "admin", "check", "--bogus"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert done.stderr == "vq admin: usage: unrecognized arguments: --bogus\n"


def test_update_usage_shows_one_or_two_words():
    result = run_vq_inprocess("update", "--help")
    assert result.exit_code == 0
    usage = " ".join(result.stdout.split("\n\n")[0].split())
    assert usage.endswith("[PROGRAM] HOST"), usage
    assert "..." not in usage and "[[PROGRAM]" not in usage, usage


def test_configuration_doc_shows_what_the_tool_prints(tmp_path):
    """The example in docs/configuration.md, "How errors are reported", is the real output."""
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ vq admin check\n(.*?)\n\$ echo \$\?\n(\d+)\n```", text, re.S)
    assert block, "docs/configuration.md lost its '$ vq admin check' example"
    config = write_config(tmp_path / "admin.toml", """
        [hosts.cluster]
        fleet_role = "managed"
        [hosts.cluster.scheduler_runtime_deployments.vibeqc-release]
        update_command = "/site/bin/deploy-vibeqc-release"
        verify_command = "/site/bin/verify-vibeqc-release"
        source_repo = "/srv/src/vibeqc"
        timeout_seconds = -1
        """)
    done = subprocess.run([os.path.join(SCRIPTS, "vq"), "admin", "check"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env=dict(os.environ, VQ_ADMIN_CONFIG=str(config)))
    assert done.stderr.strip() == block.group(1).strip()
    assert done.returncode == int(block.group(2))


def test_the_authority_example_of_the_configuration_doc_is_the_real_output(tmp_path):
    """docs/configuration.md, "Authority": the refusal of an update against an alias, as printed."""
    text = (DOCS / "configuration.md").read_text(encoding="utf-8").split("\n## Authority\n", 1)[1]
    block = re.search(r"```\n\$ (vq admin update .*?)\n(.*?)\n```", text, re.S)
    assert block, "docs/configuration.md lost its authority example"
    config = write_config(tmp_path / "admin.toml", """
        [hosts.cluster]
        fleet_role = "managed"
        transport = "local"
        [hosts.cluster.scheduler_runtime_deployments.vibeqc-release]
        update_command = "/site/bin/deploy-vibeqc-release"
        verify_command = "/site/bin/verify-vibeqc-release"
        source_repo = "/srv/src/vibeqc"
        [hosts.login2]
        fleet_role = "alias"
        canonical_host = "cluster"
        """)
    done = run_vq(*block.group(1).split()[2:], config=config, state=tmp_path / "state")
    receipt = re.compile(r"(receipt   ).*/receipts/\d{8}T\d{6}Z-(.*)-[0-9a-f]{8}\.json")
    assert receipt.sub(r"\1\2", done.stderr.strip()) == receipt.sub(r"\1\2", block.group(2).strip())
    assert done.exit_code == 77


def test_the_complete_example_of_the_configuration_doc_passes_check(tmp_path):
    """docs/configuration.md, "A complete example": ``check`` takes it as printed there (its
    ``ssh_config`` pointed at a file that exists here)."""
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    example = re.search(r"## A complete example\n+```toml\n(.*?)```.*?\$ vq admin check\n(\S+): (.*?)\n", text, re.S)
    assert example, "docs/configuration.md lost its complete example or the check line after it"
    ssh_config = write_config(tmp_path / "ssh_config", "")
    assert '"/etc/vq/ssh_config"' in example.group(1)
    config = write_config(tmp_path / "admin.toml", example.group(1).replace("/etc/vq/ssh_config", str(ssh_config)))
    done = run_vq_inprocess("check", config=config)
    assert (done.exit_code, done.stdout) == (0, f"{config}: {example.group(3)}\n"), done.stderr


# -- a host typo -----------------------------------------------------------------------


@pytest.mark.parametrize("targets", [["vibeqc", "clustr"], ["clustr"]], ids=["runtime", "helper"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_host_typo_records_nothing(site, targets, as_json):
    tmp, config, state, sha, env = site
    before = sorted(p.relative_to(state) for p in state.rglob("*"))
    log_before = (state / "admin.log").read_bytes() if (state / "admin.log").exists() else b""
    result = run_vq_inprocess("update", *targets, "--expected-sha", sha, *(["--json"] if as_json else []),
                              config=config, state=state)
    assert result.exit_code == 2
    assert "'clustr' is not in the configuration" in result.stderr and "cluster" in result.stderr
    if as_json:
        assert result.json()["outcome"] == "usage"
    assert sorted(p.relative_to(state) for p in state.rglob("*")) == before
    assert not (state / "hosts" / "clustr").exists()
    assert ((state / "admin.log").read_bytes() if (state / "admin.log").exists() else b"") == log_before


def state_files(state: Path) -> tuple[list[Path], bytes]:
    return (sorted(p.relative_to(state) for p in state.rglob("*")),
            (state / "admin.log").read_bytes() if (state / "admin.log").exists() else b"")


@pytest.mark.parametrize("verb", ["update", "rollback", "prune", "verify", "references"])
def test_program_and_host_swapped_get_a_hint_about_the_order_and_record_nothing(site, verb):
    tmp, config, state, sha, env = site
    before = state_files(state)
    extra = ["--expected-sha", sha] if verb == "update" else []
    result = run_vq_inprocess(verb, "cluster", "vibeqc", *extra, config=config, state=state)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert "'vibeqc' is a program and 'cluster' a host: the order is PROGRAM HOST (cluster last)" in result.stderr
    assert state_files(state) == before


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_program_typo_records_nothing_and_names_the_nearest_profile(site, as_json):
    tmp, config, state, sha, env = site
    before = state_files(state)
    result = run_vq_inprocess("update", "vibeqx", "cluster", "--expected-sha", sha,
                              *(["--json"] if as_json else []), config=config, state=state)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert ("host cluster has no scheduler_runtime_deployments.vibeqx profile (profiles: vibeqc); did you mean "
            "'vibeqc'?") in result.stderr
    assert state_files(state) == before and not (state / "receipts").exists()
    assert run_vq_inprocess("update", "vibeqc", "clustre", "--expected-sha", sha, config=config,
                            state=state).stderr.rstrip().endswith("(hosts: cluster, login2); did you mean 'cluster'?")


def test_a_mistyped_configuration_key_names_the_key_it_resembles(tmp_path):
    config = write_config(tmp_path / "admin.toml", """
        [hosts.cluster]
        fleet_role = "managed"
        scratch_rot = "/scratch"
        """)
    done = run_vq_inprocess("check", config=config)
    assert done.exit_code == 2 and "hosts.cluster.scratch_rot: unknown key; did you mean 'scratch_root'?" \
        in done.stderr, done.stderr


def test_a_configured_host_without_authority_is_still_recorded(site):
    """The control: a refusal of a configured host keeps its receipt and log line."""
    tmp, config, state, sha, env = site
    result = run_vq("update", "vibeqc", "login2", "--expected-sha", sha, config=config, state=state)
    assert result.exit_code == 77
    log = [json.loads(line) for line in (state / "admin.log").read_text().splitlines()]
    assert log[-1]["host"] == "login2" and log[-1]["outcome"] == "refused"


# -- installation and docs -------------------------------------------------------------

INSTALL = "pip install ./hookspecs ./site_example ."


def test_readme_and_operator_guide_give_the_same_installation():
    for doc in (ROOT / "README.md", DOCS / "operator-guide.md"):
        text = doc.read_text(encoding="utf-8")
        assert INSTALL in text, f"{doc.name} does not give '{INSTALL}'"
        for line in text.splitlines():
            if re.search(r"\bpip install\b", line) and "-e " in line.split("#")[0]:
                pytest.fail(f"{doc.name} gives an editable install to operators: {line.strip()}")
        for part in ("./hookspecs", "./site_example"):
            assert re.search(re.escape(f"`{part}`") + r"[^\n]*[:,-]", text), f"{doc.name} does not say why {part}"


def test_the_readme_says_what_the_fast_lane_installs_and_how_long_it_takes():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    fast = text.split('bash scripts/test.sh -m "not real"\n', 1)[1].split("\n\n", 1)[0]
    assert "apt-get" in fast and "pip" in fast and "as root" in fast, fast
    assert re.search(r"`\.ci/run`, \d+ workers\), took \d+ s in the last\s+CI run", fast), fast  # a measured figure


def test_build_output_of_the_sub_distributions_is_ignored():
    done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "hookspecs/build/lib/x.py",
                           "site_example/build/lib/x.py"], capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["hookspecs/build/lib/x.py", "site_example/build/lib/x.py"], done.stderr


def test_the_first_configuration_puts_agent_and_scratch_root_where_it_names_them():
    """operator-guide's "First configuration": the paths its sample names on the hosts (``agent``,
    ``scratch_root``), which vq-admin never creates, are put there by a step of the same section."""
    import tomllib

    section = (DOCS / "operator-guide.md").read_text(encoding="utf-8").split("## First configuration\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    sample = tomllib.loads(re.search(r"```toml\n(.*?)```", section, re.S).group(1))["hosts"]["cluster"]
    steps = "\n".join(re.findall(r"```sh\n(.*?)```", section, re.S))
    agent = sample["agent"].split()[-1]
    assert re.search(rf"scp .*:{re.escape(agent)}\n", steps), f"no step puts the agent at {agent}:\n{steps}"
    assert f"mkdir -p {os.path.dirname(agent)} {sample['scratch_root']}" in steps, steps
    assert f"chmod 700 {sample['scratch_root']}" in steps, steps


def test_an_indented_sample_never_runs_into_the_next_paragraph():
    """A paragraph line right after an indented (4-space) sample block, without a blank line between, is
    rendered as part of the sample (operator-guide's "Reclaiming space" once did)."""
    for doc in sorted(DOCS.glob("*.md")):
        lines = doc.read_text(encoding="utf-8").splitlines()
        fenced = False
        for before, line in zip(lines, lines[1:], strict=False):
            fenced ^= before.lstrip().startswith("```")
            if fenced or not before.startswith("    ") or not line.strip() or line.startswith("    "):
                continue
            if not re.match(r"\s*([-*|]|\d+\.)", before):  # a list item's or table's continuation is text
                pytest.fail(f"docs/{doc.name}: {line.strip()[:60]!r} runs on from the sample above it")


def test_docs_stand_alone():
    """An operator has the docs, not the specification or the contract they came from."""
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text(encoding="utf-8")
        for outside in ("outside this tree", "spec/scheduler_runtime_deployment.md", "CONTRACT.md", "CONTRACT section"):
            assert outside not in text, f"docs/{doc.name} sends the reader to {outside!r}"
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            resolved = (doc.parent / target).resolve()
            assert resolved.exists() and ROOT in resolved.parents, f"docs/{doc.name} links {target} outside the tree"
