"""The provider conformance kit: site_example passes it; deliberately broken
providers fail it, each on the check for the rule it breaks, with a report
that names the check and the reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from vq_admin_hookspecs import ProviderCommand, hookimpl

from support import SITE_EXAMPLE, run_vq

from vq_admin.conformance import run_conformance

MINI = str(Path(__file__).with_name("conformance_mini.py"))


class MiniProvider:
    """An in-process provider plugin around tests/conformance_mini.py."""

    def __init__(self, fault: str = "none", drop_script_args: bool = False):
        self.fault = fault
        self.drop_script_args = drop_script_args

    def argv(self, verb: str, request) -> ProviderCommand:
        root = request.settings["provider_options"]["root"]
        argv = [sys.executable, MINI, verb, "--root", root, "--fault", self.fault]
        if verb == "deploy" and not self.drop_script_args:
            argv += list(request.update_script_args)
        argv += ["--program", request.program, "--expected-sha", request.expected_sha]
        if request.source_archive:
            argv += ["--source-archive", request.source_archive]
        return ProviderCommand(argv=tuple(argv))

    @hookimpl
    def vq_admin_runtime_update(self, request):
        return self.argv("deploy", request)

    @hookimpl
    def vq_admin_runtime_verify(self, request):
        return self.argv("verify", request)


def kit(tmp_path, **provider) -> "object":
    return run_conformance("mini", plugin=MiniProvider(**provider), workdir=str(tmp_path))


def test_site_example_passes(vq_provider_conformance):
    report = vq_provider_conformance("site_example", provider_options={"command": SITE_EXAMPLE},
                                     script_args=("--jobs", "2"))
    report.assert_ok()
    names = [c.name for c in report.checks]
    assert {"current-unchanged-until-validated", "older-kept-after-B", "evidence-A", "argv-shape"} <= set(names)


def test_cli_runs_the_kit_and_exits_by_the_verdict():
    done = run_vq("provider", "test", "site_example", "--option", f"command={SITE_EXAMPLE}", "--json")
    assert done.exit_code == 0, done.stdout + done.stderr
    assert done.json()["passed"] is True
    missing = run_vq("provider", "test", "no-such-provider")
    assert missing.exit_code == 2 and "no-such-provider" in missing.stderr  # cannot be loaded: usage


def test_the_correct_mini_provider_passes(tmp_path):
    kit(tmp_path).assert_ok()


def test_moving_current_before_validation_fails(tmp_path):
    report = kit(tmp_path, fault="current-first")
    assert not report.passed
    check = report.check("current-unchanged-until-validated")
    assert not check.ok and "during the failed deploy" in check.detail
    assert not report.check("verify-truthful").ok
    assert "FAIL current-unchanged-until-validated" in report.text()
    with pytest.raises(AssertionError, match="current-unchanged-until-validated"):
        report.assert_ok()


def test_deleting_an_older_release_fails(tmp_path):
    report = kit(tmp_path, fault="delete-old")
    check = report.check("older-kept-after-B")
    assert not check.ok and "was removed" in check.detail and "is gone or changed" in check.detail
    assert report.check("evidence-B").ok  # only the broken rule fails


def test_a_short_sha_in_the_receipt_fails(tmp_path):
    report = kit(tmp_path, fault="short-sha")
    check = report.check("evidence-A")
    assert not check.ok and "source_sha" in check.detail and "not a full commit SHA" in check.detail
    assert not report.passed


def test_dropping_script_arguments_fails_the_argv_shape(tmp_path):
    report = kit(tmp_path, drop_script_args=True)
    check = report.check("argv-shape")
    assert not check.ok and "--update-script-arg" in check.detail


# -- generations: activation and prune (vq_admin.conformance.generations) -----------------

DELETE_UNCURRENT = ("import json, os, shutil, sys; root = sys.argv[1]; "
                    "current = os.readlink(os.path.join(root, 'current')).rsplit('/', 1)[-1]; "
                    "[shutil.rmtree(os.path.join(root, 'releases', n)) for n in os.listdir(os.path.join(root, "
                    "'releases')) if n != current]; print(json.dumps({'removed': [], 'kept': []}))")


class DeletingPruner(MiniProvider):
    """Prunes by deleting every release but current's, whatever it was asked to keep."""

    @hookimpl
    def vq_admin_runtime_prune(self, request):
        root = request.settings["provider_options"]["root"]  # carries the keep set, and ignores it
        return ProviderCommand(argv=(sys.executable, "-c", DELETE_UNCURRENT, root, *request.keep_words("--keep")))


class IteratingPruner(MiniProvider):
    """Written for a tuple of SHAs: loops over the keep set, which vq-admin asks with as a list slot."""

    @hookimpl
    def vq_admin_runtime_prune(self, request):
        return ProviderCommand(argv=(sys.executable, "-c", "pass", *[w for sha in request.keep for w in ("-k", sha)]))


def test_a_provider_that_iterates_the_keep_set_fails_the_prune_cases_and_runs_nothing(tmp_path):
    report = run_conformance("mini", plugin=IteratingPruner(), workdir=str(tmp_path))
    failed = {c.name: c.detail for c in report.failed()}
    assert set(failed) == {"prune-keeps-kept", "prune-report-truthful"}, report.text()
    assert all("list slot" in detail and "prune exited None" in detail for detail in failed.values()), failed


def test_site_example_passes_the_activation_and_prune_cases(vq_provider_conformance):
    report = vq_provider_conformance("site_example", provider_options={"command": SITE_EXAMPLE})
    report.assert_ok()
    names = {c.name for c in report.checks}
    assert {"activate-B", "activate-refuses-unbuilt", "activate-A", "prune-keeps-kept",
            "prune-report-truthful"} <= names


def test_a_provider_that_deletes_a_kept_release_fails(tmp_path):
    report = run_conformance("mini", plugin=DeletingPruner(), workdir=str(tmp_path))
    assert not report.passed
    failed = {c.name: c.detail for c in report.failed()}
    assert list(failed)[0] == "prune-keeps-kept", report.text()
    assert set(failed) <= {"prune-keeps-kept", "prune-report-truthful"}, report.text()
    assert "kept release B" in failed["prune-keeps-kept"] and "removed" in failed["prune-keeps-kept"]
