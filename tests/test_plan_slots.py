"""The executable plan: named slots in a step's planned argv, filled when it runs.

* ``Slot`` markers print exactly as the old placeholders (``<stage>``), survive
  copies, and are found again where a provider placed one inside a word;
* ``execute(step, transport, **values)`` runs exactly the planned argv with its
  slots filled, and refuses an unfilled slot, a value for a slot the step does
  not hold, or slot values next to an explicit argv -- before anything runs;
* a provider double counts its hook calls: each lane asks its update hook
  once per run, at plan time, with the slots, and the receipt's steps are the
  dry-run plan's steps with those slots filled;
* a list slot (``Slot(name, many=True)``, the prune's keep set) stands for zero
  or more whole words: it prints as ``[--keep <kept sha>]...``, is never
  iterated or placed inside a word, and ``execute`` fills it with a list only.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
from vq_admin_hookspecs import (EvidenceError, HelperRequest, ProviderCommand, PruneRequest, Slot, hookimpl,
                                is_list_slot, is_slot)
from vq_admin_hookspecs.slots import find_slot, place

from helper_world import helper_table, two_lanes
from plan_match import slot_values
from provider_doubles import SiteLikeRuntime
from support import SITE_EXAMPLE, write_config

from vq_admin.config import load_config
from vq_admin.context import RunContext, RunOptions
from vq_admin.lanes.helper import HelperUpdate
from vq_admin.lanes.prune import KEEP, RuntimePrune
from vq_admin.lanes.runtime import RuntimeUpdate
from vq_admin.report.outcome import UsageError
from vq_admin.plan import Plan, SlotError, execute, fill_command, filled
from vq_admin.plugins import Providers
from vq_admin.providers import command as command_provider
from vq_admin.state.records import StateDir
from vq_admin.ssh.transport import RunResult, Session

# -- Slot -------------------------------------------------------------------------------------


def test_a_slot_prints_as_its_marker_and_fills_in_place():
    archive = Slot("stage", suffix="/source.tar")
    assert archive == "<stage>/source.tar" and isinstance(archive, str) and is_slot(archive)
    assert archive.fill("/scratch/stage.1") == "/scratch/stage.1/source.tar"
    outcome = Slot("outcome", label="success|failed")
    assert outcome == "<success|failed>" and outcome.name == "outcome"
    assert json.dumps([archive]) == '["<stage>/source.tar"]'
    for twin in (copy.deepcopy(archive), copy.copy(archive)):
        assert is_slot(twin) and twin.name == "stage" and twin.fill("/s") == "/s/source.tar"
    assert not is_slot("<stage>")
    for bad in ("Stage", "stage dir", "", "x" * 40):
        with pytest.raises(ValueError):
            Slot(bad)


def test_a_slot_placed_inside_a_word_is_found_again():
    archive = Slot("stage", suffix="/source.tar")
    words = place(["deploy", "--source-archive=" + archive, archive, "<stage>"], [archive])
    assert words == ["deploy", "--source-archive=<stage>/source.tar", "<stage>/source.tar", "<stage>"]
    inside = words[1]
    assert is_slot(inside) and inside.fill("/s") == "--source-archive=/s/source.tar"
    assert words[2] is archive
    assert not is_slot(words[3]), "only a placed slot's whole text counts, not a bare marker"
    with pytest.raises(ValueError, match="more than one slot"):
        find_slot(f"{archive}:{archive}", [archive])


def test_a_helper_request_takes_slots_but_still_refuses_a_bad_digest():
    HelperRequest(host="h", expected_sha="a" * 40, expected_tree_sha256=Slot("tree_sha256"), stage_dir=Slot("stage"))
    with pytest.raises(ValueError, match="expected_tree_sha256"):
        HelperRequest(host="h", expected_sha="a" * 40, expected_tree_sha256="<tree_sha256>", stage_dir="/s")


def test_a_list_slot_stands_for_whole_words_and_refuses_to_be_iterated():
    keep = Slot("keep", label="kept sha", many=True)
    assert keep == "[<kept sha>]..." and is_list_slot(keep) and not is_list_slot(Slot("stage"))
    assert keep.fill_words(["a", "b"]) == ["a", "b"] and keep.fill_words([]) == []
    each = keep.each("--keep")
    assert each == "[--keep <kept sha>]..." and each.name == "keep" and is_list_slot(each)
    assert each.fill_words(("a", "b")) == ["--keep", "a", "--keep", "b"]
    assert keep.each(prefix="--keep=").fill_words(["a"]) == ["--keep=a"]
    for twin in (copy.deepcopy(each), copy.copy(each)):
        assert is_list_slot(twin) and twin.fill_words(["x"]) == ["--keep", "x"]
    assert json.dumps([each]) == '["[--keep <kept sha>]..."]'
    with pytest.raises(TypeError, match="list slot"):
        [sha for sha in keep]  # a provider that loops over the keep set fails loudly, never with letters
    with pytest.raises(TypeError, match="list slot"):
        sorted(keep)
    with pytest.raises(TypeError):
        " ".join(keep)
    with pytest.raises(TypeError):
        keep.fill("a")
    with pytest.raises(TypeError):
        Slot("stage").fill_words(["a"])
    with pytest.raises(TypeError):
        keep.fill_words("ab")  # a string is not a list of words
    for bad in ("two words", "[x]", "<x>", ""):
        with pytest.raises(ValueError):
            keep.each(bad)
    with pytest.raises(ValueError):
        Slot("stage", before=("--x",))  # words before each value belong to a list slot


def test_a_list_slot_is_placed_as_one_whole_argv_word_never_inside_one_or_in_env():
    keep = Slot("keep", label="kept sha", many=True)
    assert place(["/prune", str(keep)], [keep]) == ["/prune", keep] and is_list_slot(place([str(keep)], [keep])[0])
    with pytest.raises(ValueError, match="whole argv word"):
        place(["--keep=" + keep], [keep])
    with pytest.raises(EvidenceError, match="list slot"):
        ProviderCommand(argv=("/prune",), env=(("KEEP", keep),))


def test_a_prune_request_carries_the_keep_set_as_a_list_slot_or_as_shas():
    settings = {"prune_command": ("/site/prune",)}
    request = PruneRequest("vibeqc", "h", KEEP, settings)
    assert request.keep is KEEP and request.keep_words("--keep") == (KEEP.each("--keep"),)
    shas = PruneRequest("vibeqc", "h", ("b" * 40, "A" * 40), settings)
    assert shas.keep_words("--keep") == ("--keep", "a" * 40, "--keep", "b" * 40)
    assert shas.keep_words(prefix="-k") == ("-k" + "a" * 40, "-k" + "b" * 40)
    with pytest.raises(EvidenceError, match="one-word slot"):
        PruneRequest("vibeqc", "h", Slot("keep"), settings)
    with pytest.raises(EvidenceError, match="string"):
        PruneRequest("vibeqc", "h", "a" * 40, settings)  # type: ignore[arg-type]


# -- execute ----------------------------------------------------------------------------------


class Recording:
    """A transport double: records what it was asked to run."""

    where = "double"

    def __init__(self) -> None:
        self.ran: list[tuple[list[str], dict[str, str] | None]] = []

    def run(self, argv, *, timeout, env=None, stdin=None, watch=None):
        self.ran.append((list(argv), env))
        return RunResult(list(argv), self.where, 0, b"{}", b"", 0.01)


def staged_step():
    plan = Plan()
    return plan.add("stage-verify", "double", ["/agent", "stage-verify", "--stage", Slot("stage"),
                                                "--tree-sha256", Slot("tree_sha256")], "prove the stage",
                    {"VQ_HELPER_STAGE": Slot("stage"), "LANG": "C"})


def test_execute_runs_exactly_the_planned_argv_with_its_slots_filled():
    step, transport = staged_step(), Recording()
    planned_text = [str(w) for w in step.planned_argv]
    result = execute(step, transport, timeout=5, stage="/scratch/stage.1", tree_sha256="f" * 64)
    assert result.exit_code == 0
    argv = ["/agent", "stage-verify", "--stage", "/scratch/stage.1", "--tree-sha256", "f" * 64]
    assert transport.ran == [(argv, {"VQ_HELPER_STAGE": "/scratch/stage.1", "LANG": "C"})]
    record = step.record().to_value()
    assert record["argv"] == argv and record["status"] == "ok"
    assert record["env"] == {"VQ_HELPER_STAGE": "/scratch/stage.1", "LANG": "C"}
    assert step.planned_argv == planned_text, "the plan itself is never rewritten"
    assert not any(is_slot(w) for w in step.argv)


def test_execute_keeps_the_planned_environment_so_a_step_can_run_again():
    step, transport = staged_step(), Recording()
    execute(step, transport, timeout=5, stage="/scratch/stage.1", tree_sha256="f" * 64)
    assert is_slot(step.env["VQ_HELPER_STAGE"]), "the planned env keeps its slot after a run"
    execute(step, transport, timeout=5, stage="/scratch/stage.2", tree_sha256="e" * 64)
    assert [env for _argv, env in transport.ran] == [{"VQ_HELPER_STAGE": "/scratch/stage.1", "LANG": "C"},
                                                     {"VQ_HELPER_STAGE": "/scratch/stage.2", "LANG": "C"}]
    assert step.record().env == {"VQ_HELPER_STAGE": "/scratch/stage.2", "LANG": "C"}, "the receipt: what ran"


@pytest.mark.parametrize("values, message", [
    ({"stage": "/scratch/stage.1"}, "no value for its slot 'tree_sha256'"),
    ({}, "no value for its slot 'stage'"),
    ({"stage": "/s", "tree_sha256": "f" * 64, "attempt": "x"}, "no slot attempt"),
])
def test_execute_refuses_an_unfilled_or_unknown_slot_before_anything_runs(values, message):
    step, transport = staged_step(), Recording()
    with pytest.raises(SlotError, match=message):
        execute(step, transport, timeout=5, **values)
    assert transport.ran == [] and step.status == "planned" and step.argv is None


def test_execute_refuses_slot_values_next_to_an_explicit_argv():
    step, transport = staged_step(), Recording()
    with pytest.raises(SlotError, match="explicit argv"):
        execute(step, transport, ["/agent", "x"], timeout=5, stage="/s")
    assert transport.ran == []


def test_execute_fills_a_list_slot_with_a_list_and_refuses_the_wrong_kind_of_value():
    def prune_step():
        return Plan().add("prune", "double", ["/prune", "--program", "p", KEEP.each("--keep"), "--root",
                                              Slot("stage")], "prune")

    step, transport = prune_step(), Recording()
    execute(step, transport, timeout=5, keep=["a" * 40, "b" * 40], stage="/s")
    argv = ["/prune", "--program", "p", "--keep", "a" * 40, "--keep", "b" * 40, "--root", "/s"]
    assert transport.ran == [(argv, None)] and step.record().argv == argv
    assert step.planned_argv[3] == "[--keep <kept sha>]..."
    empty = prune_step()
    execute(empty, transport, timeout=5, keep=(), stage="/s")
    assert empty.argv == ["/prune", "--program", "p", "--root", "/s"], "zero words for an empty list"
    for values, message in (({"keep": "a" * 40, "stage": "/s"}, "list slot: its value 'keep' must be a list"),
                            ({"keep": ["a" * 40], "stage": ["/s"]}, "stands for one word: its value 'stage'"),
                            ({"keep": [1], "stage": "/s"}, "must be a list of strings")):
        step, transport = prune_step(), Recording()
        with pytest.raises(SlotError, match=message):
            execute(step, transport, timeout=5, **values)
        assert transport.ran == [] and step.status == "planned" and step.argv is None
    listed_env = Plan().add("x", "double", ["/x"], "x", {"KEEP": KEEP})
    with pytest.raises(SlotError, match="never an environment value"):
        execute(listed_env, Recording(), timeout=5, keep=["a"])


def test_a_planned_provider_command_is_filled_word_by_word():
    archive = Slot("stage", suffix="/source.tar")
    command = ProviderCommand(argv=("/deploy", "--source-archive", archive), env=(("ARCHIVE", archive),))
    done = fill_command(command, stage="/s")
    assert done.argv == ("/deploy", "--source-archive", "/s/source.tar") and done.env == (("ARCHIVE", "/s/source.tar"),)
    assert not any(is_slot(w) for w in done.argv)
    with pytest.raises(SlotError):
        fill_command(command)


def test_filled_leaves_a_step_without_slots_alone():
    step = Plan().add("census", "double", ["/usr/bin/squeue", "--noheader"], "jobs")
    assert filled(step) == (["/usr/bin/squeue", "--noheader"], {})


# -- provider hooks: once per run, with the slots ---------------------------------------------


class Counting(SiteLikeRuntime):
    """A provider double that records every hook call and its request: runtime hooks answer
    like site_example (placing ``--source-archive`` as a whole word), the helper update as
    the built-in command provider plus two env values holding the slots."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def note(self, hook: str, request: object) -> None:
        self.calls.append((hook, request))

    @hookimpl
    def vq_admin_helper_update(self, request):
        self.calls.append(("helper_update", request))
        base = command_provider.vq_admin_helper_update(request)
        # an env value that is a slot, and one that embeds a slot
        return ProviderCommand(argv=base.argv, env=(("SITE_STAGE", request.stage_dir),
                                                    ("SITE_TREE", "tree=" + request.expected_tree_sha256)))

    @hookimpl
    def vq_admin_runtime_prune(self, request):
        from vq_site_example.plugin import vq_admin_runtime_prune

        self.calls.append(("runtime_prune", request))
        return vq_admin_runtime_prune(request)

    def hooks(self, name: str) -> list[object]:
        return [request for hook, request in self.calls if hook == name]


@pytest.fixture
def world(tmp_path):
    lanes = two_lanes(tmp_path)
    repo, helper_root, sha_b = lanes.repo, lanes.helper_root, lanes.b
    program, runtime_sha, runtime_root = lanes.program, lanes.runtime_sha, lanes.runtime_root
    (runtime_root / "releases").mkdir(parents=True)
    text = helper_table("cluster", root=helper_root, repo=repo.path, scratch=tmp_path / "scratch",
                        extra='helper_provider = "counting"')
    text += (f"[hosts.cluster.scheduler_runtime_deployments.vibeqc]\nprovider = \"counting\"\n"
             f"provider_options = {{ root = \"{runtime_root}\", command = \"{SITE_EXAMPLE}\" }}\n"
             f"source_repo = \"{program.path}\"\n")
    return {"config": load_config(write_config(tmp_path / "counting.toml", text)), "state": tmp_path / "state",
            "b": sha_b, "runtime_sha": runtime_sha, "program": program, "runtime_root": runtime_root}


def run_lane(world, make, provider: Counting, *, dry_run: bool):
    with Session(None) as session:
        ctx = RunContext(world["config"], StateDir(world["state"]), session,
                         Providers.from_plugins({"counting": provider}), RunOptions(json=True, dry_run=dry_run))
        return make(ctx).run()


def test_the_runtime_lane_asks_its_update_hook_once_and_runs_the_planned_argv(world, monkeypatch, capsys):
    make = lambda ctx: RuntimeUpdate(ctx, "cluster", "vibeqc", world["runtime_sha"], None)  # noqa: E731
    dry = run_lane(world, make, Counting(), dry_run=True)
    provider = Counting()
    done = run_lane(world, make, provider, dry_run=False)
    assert done.outcome.value == "ok", done.errors
    updates = provider.hooks("runtime_update")
    assert len(updates) == 1, "asked once per run, when the plan is made"
    assert len(provider.hooks("runtime_verify")) == 1, "the pre-verify and the verify ask the same question once"
    archive = updates[0].source_archive
    assert is_slot(archive) and archive == "<stage>/source.tar"
    plan, ran = dry.plan.to_list(), done.plan.to_list()
    assert [s["argv"] for s in plan] == [[str(w) for w in s.planned_argv] for s in done.plan.steps], \
        "the real run made the dry run's plan"
    deploy = next(s for s in plan if s["name"] == "deploy")
    assert deploy["argv"][-2:] == ["--source-archive", "<stage>/source.tar"]
    values = slot_values(plan, ran, names={"source", "stage-create", "stage-receive", "stage-verify", "deploy",
                                           "verify", "verify-readback", "stage-reclaim"})
    assert values["stage"] == done.stage.dir
    assert values["tree_sha256"] == done.source.tree_sha256
    assert values["success|failed"] == "success"
    assert values["active_path"] == done.verify.final["receipt"]["active_path"]


def test_the_helper_lane_asks_its_hook_once_and_fills_the_tree_digest(world):
    make = lambda ctx: HelperUpdate(ctx, "cluster", world["b"])  # noqa: E731
    dry = run_lane(world, make, Counting(), dry_run=True)
    provider = Counting()
    done = run_lane(world, make, provider, dry_run=False)
    assert done.outcome.value == "ok", done.errors
    asked = provider.hooks("helper_update")
    assert len(asked) == 1 and [hook for hook, _ in provider.calls] == ["helper_update"], \
        "asked once per run, when the plan is made"
    request = asked[0]
    assert is_slot(request.stage_dir) and request.stage_dir == "<stage>"
    assert is_slot(request.expected_tree_sha256) and request.expected_tree_sha256 == "<tree_sha256>"
    plan, ran = dry.plan.to_list(), done.plan.to_list()
    helper = next(s for s in plan if s["name"] == "helper")
    assert helper["env"]["SITE_TREE"] == "tree=<tree_sha256>" and helper["env"]["SITE_STAGE"] == "<stage>"
    values = slot_values(plan, ran, names={"stage-create", "stage-receive", "stage-verify", "helper",
                                           "stage-reclaim"})
    assert values["tree_sha256"] == done.source.tree_sha256 and values["stage"] == done.stage.dir
    step = next(s for s in ran if s["name"] == "helper")
    assert step["env"]["SITE_TREE"] == f"tree={done.source.tree_sha256}"
    assert step["env"]["SITE_STAGE"] == step["env"]["VQ_HELPER_STAGE"] == done.stage.dir
    assert Path(done.stage.dir).name.startswith("stage.")


def test_one_run_asks_a_provider_each_question_once():
    from vq_admin_hookspecs import RuntimeRequest

    provider = Counting()
    providers = Providers.from_plugins({"counting": provider})
    request = RuntimeRequest(program="vibeqc", host="h", expected_sha="a" * 40, tag=None,
                             settings={"provider_options": {"root": "/apps", "command": "/bin/site"}})
    first = providers.runtime_verify("counting", request)
    assert providers.runtime_verify("counting", request) is first
    other = RuntimeRequest(program="vibeqc", host="h", expected_sha="b" * 40, tag=None,
                           settings=request.settings)
    assert providers.runtime_verify("counting", other).argv != first.argv
    assert len(provider.hooks("runtime_verify")) == 2
    providers.remember = False  # the conformance kit: every question asked again
    providers.runtime_verify("counting", request)
    assert len(provider.hooks("runtime_verify")) == 3


def test_prune_asks_its_hook_once_and_fills_the_keep_set_slot(world, monkeypatch, tmp_path):
    # no Slurm here: the agent's census lists an empty queue (the census itself is tested over the real Slurm
    # in test_prune and test_census_real)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    shas = [world["runtime_sha"], world["program"].commit("vibeqc 2"), world["program"].commit("vibeqc 3")]
    for sha in shas:
        deployed = run_lane(world, lambda ctx, sha=sha: RuntimeUpdate(ctx, "cluster", "vibeqc", sha, None), Counting(),
                            dry_run=False)
        assert deployed.outcome.value == "ok", deployed.errors
    make = lambda ctx: RuntimePrune(ctx, "cluster", "vibeqc", 1)  # noqa: E731
    asked = Counting()
    dry = run_lane(world, make, asked, dry_run=True)
    assert dry.outcome.value == "ok", dry.errors
    assert len(asked.hooks("runtime_prune")) == 1
    plan = dry.plan.to_list()
    planned = next(s for s in plan if s["name"] == "prune")
    assert planned["argv"][-1] == "[--keep <kept sha>]...", "the dry-run plan shows the keep set's slot"
    assert planned["status"] == "planned"
    provider = Counting()
    done = run_lane(world, make, provider, dry_run=False)
    assert done.outcome.value == "ok", done.errors
    prunes = provider.hooks("runtime_prune")
    assert len(prunes) == 1, "asked once per run, when the plan is made"
    assert is_list_slot(prunes[0].keep) and prunes[0].keep == "[<kept sha>]..."
    keep = sorted(done.prune.keep)
    assert shas[2] in keep and shas[0] not in keep and done.prune.removed == [shas[0]]
    ran = done.plan.to_list()
    step = next(s for s in ran if s["name"] == "prune")
    assert step["argv"][-2 * len(keep):] == [w for sha in keep for w in ("--keep", sha)], "the filled words"
    assert not any("<" in w for w in step["argv"])
    values = slot_values(plan, ran, names={"verify-active", "census", "prune", "verify"})
    assert values["kept sha"] == keep


class Unplaced(Counting):
    """A prune hook that forgets the keep set (or hides it inside a word): never run."""

    def __init__(self, argv) -> None:
        super().__init__()
        self.argv = argv

    @hookimpl
    def vq_admin_runtime_prune(self, request):
        self.calls.append(("runtime_prune", request))
        return ProviderCommand(argv=tuple(self.argv(request)))


@pytest.mark.parametrize("argv, message", [
    (lambda r: ("/site/prune", "--program", r.program), "places the keep set 0 times"),
    (lambda r: ("/site/prune", *r.keep_words("--keep"), *r.keep_words("-k")), "places the keep set 2 times"),
    (lambda r: ("/site/prune", "--keep=" + r.keep), "whole argv word"),
    (lambda r: ("/site/prune", *[w for sha in r.keep for w in ("--keep", sha)]), "list slot"),
])
def test_a_prune_command_that_does_not_carry_the_keep_set_once_is_refused(world, argv, message):
    with Session(None) as session:  # asked while the lane is built, before anything is read or run
        ctx = RunContext(world["config"], StateDir(world["state"]), session,
                         Providers.from_plugins({"counting": Unplaced(argv)}), RunOptions(json=True, dry_run=True))
        with pytest.raises(UsageError, match=message):
            RuntimePrune(ctx, "cluster", "vibeqc", 1)


@pytest.mark.parametrize("argv, env, refusal", [
    ([], (), "ProviderCommand.argv must be a non-empty list of strings"),
    (["x", 1], (), "ProviderCommand.argv[1] is int, not str"),
    (["x", "a\nb"], (), "ProviderCommand.argv[1] holds a NUL or newline"),
    (["x"], (("A", "a\0b"),), "ProviderCommand.env[A] holds a NUL or newline"),
    (["x"], (("1A", "v"),), "ProviderCommand.env name '1A' is not a valid variable name"),
])
def test_a_provider_command_with_a_bad_word_is_refused_naming_it(argv, env, refusal):
    with pytest.raises(EvidenceError) as raised:
        ProviderCommand(argv=tuple(argv), env=env)
    assert str(raised.value) == refusal
