"""The helper lane's remote command-file check (vq_admin.lanes.command_files_stat) against the real
coreutils of this machine, run through a local transport: the facts it reads and the rule it
applies must give what the secure-path rule gives locally, and anything it cannot read back
refuses (fails closed)."""

from __future__ import annotations

import os

import pytest

from vq_admin.core import securepath
from vq_admin.lanes import command_files_stat as stat_paths
from vq_admin.report.outcome import Refused
from vq_admin.plan import Plan, SlotError
from vq_admin.ssh.transport import LocalTransport, RunResult, Transport


class Here(Transport):
    """This machine standing in for a remote host: its argv runs as given (no ``env``), and, unlike a
    ``transport = "local"`` host, the driver does not take the words it reads for commands to run."""

    where = "here"

    def wrap(self, argv, env):
        return list(argv)


def check(transport, words) -> Plan:
    """Plan one host's two steps for *words* and run them (what the helper lane does)."""
    places = [(transport, words)]
    plan = Plan()
    stat_paths.plan_places(plan, places)
    try:
        stat_paths.run_places(plan, places)
    finally:
        check.plan = plan  # type: ignore[attr-defined]
    return plan


def test_the_remote_facts_judge_as_the_local_rule_does(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (loose / "run.sh").write_text("x")
    (private / "run.sh").write_text("x")
    (private / "run.sh").chmod(0o775)
    (private / "ok.sh").write_text("x")
    (private / "ok.sh").chmod(0o755)
    (private / "link").symlink_to(loose / "run.sh")
    words = [str(loose / "run.sh"), str(private / "run.sh"), str(private / "ok.sh"), str(private / "link"),
             str(private / "missing"), str(sticky / "missing"), "/bin/sh", "/usr/bin/env"]
    reals = stat_paths.parse_realpaths(LocalTransport().run(stat_paths.realpath_argv(words), timeout=60), len(words))
    assert reals is not None and reals[3] == str(loose / "run.sh")
    asked = stat_paths.levels_to_read(words, reals)
    levels = stat_paths.parse_levels(LocalTransport().run(stat_paths.stat_argv(asked), timeout=60),
                                     [stat_paths.SELF, *asked])
    assert levels is not None and levels[stat_paths.SELF].st_uid == os.geteuid()
    found = dict(stat_paths.problems(words, reals, levels))
    for word in words:
        local = securepath.path_problem(word, what="command file", missing_ok=True)
        if local is None and not os.path.lexists(word):
            local = securepath.creatable_problem(word)
        assert found.get(word) == local, word
    assert set(found) == {words[0], words[1], words[3], words[5]}


def test_a_refusal_names_the_key_and_runs_nothing_further(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    with pytest.raises(Refused) as refused:
        check(Here(), [("hosts.h.helper_update_command", str(loose / "u.py"))])
    assert refused.value.message.startswith("refused on here: hosts.h.helper_update_command: command file")
    assert f"directory {loose} is group- and other-writable without the sticky bit" in refused.value.message
    resolve, levels = check.plan.steps  # type: ignore[attr-defined]
    assert resolve.name == "check-commands" and resolve.status == "ok" and resolve.argv[0] == stat_paths.REALPATH
    assert levels.name == "check-levels" and levels.status == "failed" and levels.argv[0] == stat_paths.STAT
    assert [str(w) for w in levels.planned_argv][-1] == "[<level>]...", "the plan keeps its list slot"
    assert str(loose) in levels.argv and levels.argv[:len(levels.planned_argv) - 1] == levels.planned_argv[:-1]


def test_the_levels_step_runs_exactly_its_planned_argv_with_the_levels_filled(tmp_path):
    """What stat reads is the planned argv, its list slot filled from realpath's answer; a step planned
    for other words than its place's is refused before anything runs."""
    ok = tmp_path / "ok.sh"
    ok.write_text("x")
    ok.chmod(0o755)
    plan = check(Here(), [("hosts.h.agent", str(ok))])
    resolve, levels = plan.steps
    assert resolve.argv == stat_paths.realpath_argv([str(ok), stat_paths.REALPATH, stat_paths.STAT])
    words = stat_paths.unique_words([("hosts.h.agent", str(ok))])
    asked = stat_paths.levels_to_read(words, [str(ok.resolve()), "/usr/bin/realpath", "/usr/bin/stat"])
    assert levels.argv == stat_paths.stat_argv(asked) and levels.status == "ok"
    other = Plan()
    stat_paths.plan_places(other, [(Here(), [("hosts.h.agent", "/bin/sh")])])
    with pytest.raises(SlotError, match="not the check of"):
        stat_paths.run_places(other, [(Here(), [("hosts.h.agent", str(ok))])])
    assert all(s.status == "planned" and s.argv is None for s in other.steps)


class Canned(LocalTransport):
    """Answers every command with the next canned result (a double for fail-closed cases)."""

    def __init__(self, *results: RunResult):
        self.results = list(results)

    def run(self, argv, **kw):  # type: ignore[override]
        return self.results.pop(0)


@pytest.mark.parametrize("answers, program", [
    ([RunResult([], "h", 127, b"", b"realpath: not found")], "/usr/bin/realpath"),
    ([RunResult([], "h", 0, b"/a\0", b"")], "/usr/bin/realpath"),  # fewer answers than words
    ([RunResult([], "h", 0, b"/usr/bin/python3\0/usr/bin/realpath\0/usr/bin/stat\0", b""),
      RunResult([], "h", 127, b"", b"stat: not found")], "/usr/bin/stat"),
    ([RunResult([], "h", 0, b"/usr/bin/python3\0/usr/bin/realpath\0/usr/bin/stat\0", b""),
      RunResult([], "h", 0, b"/elsewhere\x000\x0041ed\x00root\x00", b"")], "/usr/bin/stat"),  # not asked for
    ([RunResult([], "h", 0, b"/usr/bin/python3\0/usr/bin/realpath\0/usr/bin/stat\0", b""),
      RunResult([], "h", 0, b"/usr/bin\x000\x0041ed\x00root\x00", b"")], "/usr/bin/stat"),  # no /proc/self
])
def test_facts_that_cannot_be_read_back_refuse(answers, program):
    with pytest.raises(Refused) as refused:
        check(Canned(*answers), [("hosts.h.agent", "/usr/bin/python3")])
    message = refused.value.message
    assert f"could not be checked: {program}" in message and "no configured command was run" in message


def test_an_interrupted_read_is_a_failure_naming_the_step():
    from vq_admin.report.outcome import VqAdminError

    dropped = RunResult([], "h", 255, b"", b"Connection closed", interrupted="transport")
    with pytest.raises(VqAdminError) as failed:
        check(Canned(dropped), [("hosts.h.agent", "/usr/bin/python3")])
    assert not isinstance(failed.value, Refused) and failed.value.message.startswith("check-commands:")
