"""Every message vq-admin prints that says nothing ran (or changed, was submitted, installed, pushed,
pruned, started ...) is true where it is printed.

:data:`CLAIMS` has one row per place in the shipped code (``vq_admin``, ``hookspecs``,
``site_example``) whose message text says so: the file, the function holding the text, the claim
as :data:`PHRASE` finds it, how many times the function says it, and the test that shows the claim
true in the situation that prints it (nothing ran: the transport double recorded no call, a marker
is absent, the deployed state is unchanged).  :data:`NOT_CLAIMS` lists the texts the phrase finds
that claim nothing (a check's name, a value).  The guard below fails when a message says one of
these things and has no row, when a row names a claim the code no longer makes, and when a row's
proving test does not exist: a new "nothing was run" gets its proof with it.

Where only read-only checks had run when a run stopped, the message says exactly that, from one
text (:data:`vq_admin.report.outcome.READ_ONLY_RAN`).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What a claim of nothing sounds like (case-insensitive, whitespace-insensitive).
PHRASE = re.compile(r"""(?ix)
    \bnothing\s+(?:was|is|has\s+been|were)\s+(?!active\b|known\b|broken\b)\w+(?:\s+or\s+\w+)?
  | \bnothing\s+(?:ran|changed|started)\b
  | \bchanged\s+nothing\b
  | \bno\s+[\w-]+(?:\s+[\w-]+){0,3}\s+(?:was|were)\s+(?:run|started|submitted|installed|changed|pushed|written|made)\b
  | \b(?:was|were)\s+not\s+(?:run|started|submitted|installed|changed|created|written|pushed|built)\b
  | (?<!could\s)(?<!do\s)\bnot\s+(?:run|started)\b
  | \bdid\s+not\s+run\b | \bnever\s+ran\b | \bunchanged\b | \buntouched\b
""")

#: The shipped constants that say what ran: a message that puts one in an f-string makes the claim.
CLAIM_TEXTS = ("READ_ONLY_RAN", "PRE_VERIFY_CUT", "AGENT_NOT_RUN")

T = "tests/"
#: (file, function, claim, times, the test proving it true where it is printed)
CLAIMS: list[tuple[str, str, str, int, str]] = [
    # -- site_example (the example provider's own messages) --
    ("site_example/vq_site_example/cli.py", "terminate", "unchanged", 1,
     T + "test_site_example.py::test_sigterm_during_the_build_leaves_current_unchanged"),
    ("site_example/vq_site_example/deploy.py", "_build_new", "unchanged", 1,
     T + "test_site_example.py::test_failing_selftest_leaves_current_on_old_release"),
    ("site_example/vq_site_example/deploy.py", "_reuse", "unchanged", 1,
     T + "test_site_example.py::test_a_reused_release_failing_validation_now_leaves_current_unchanged"),
    ("site_example/vq_site_example/layout.py", "DeployLock.__enter__", "nothing was done", 1,
     T + "test_site_example.py::test_held_lock_exits_75_and_verify_reports_it"),
    # -- the agent --
    ("vq_admin/agent/allocation.py", "<module>", "was not run", 1,
     T + "trust/test_job_binding.py::test_a_changed_argv_is_not_run"),
    ("vq_admin/agent/allocation.py", "bind", "nothing was submitted", 1,
     T + "trust/test_job_binding.py::test_the_agent_refuses_an_archive_that_changed_before_it_submits"),
    ("vq_admin/agent/lease.py", "hold_work", "nothing was started", 1,
     T + "test_allocation_real.py::test_two_concurrent_runs_never_remove_each_others_current_attempt"),
    ("vq_admin/core/agentjudge.py", "<module>", "nothing was run", 1,
     T + "trust/test_trust_round_three.py::test_an_agent_in_a_group_writable_directory_is_refused_before_it_runs"),
    ("vq_admin/core/agentjudge.py", "_head", "nothing was run", 1,
     T + "test_agentjudge.py::test_a_refusal_after_the_interpreter_ran_says_what_ran"),
    ("vq_admin/core/agentjudge.py", "_first_word", "nothing was run", 2,
     T + "test_agentjudge.py::test_a_refusal_after_the_interpreter_ran_says_what_ran"),
    ("vq_admin/core/agentjudge.py", "_interpreter", "nothing was run", 2,
     T + "test_agentjudge.py::test_a_refusal_after_the_interpreter_ran_says_what_ran"),
    # -- conformance kit --
    ("vq_admin/conformance/__init__.py", "Report.text", "not run", 1,
     T + "test_conformance_command.py::test_provider_test_deploys_the_sites_own_source_with_source_repo_and_sha"),
    # -- the driver --
    ("vq_admin/fleet.py", "Rollout.not_started", "not started", 2,
     T + "test_fleet.py::test_a_failing_canary_starts_nothing_else"),
    ("vq_admin/fleet.py", "dry_run_lines", "nothing is run", 1,
     T + "test_fleet.py::test_dry_run_prints_hosts_in_order_with_their_plans"),
    ("vq_admin/lanes/allocation_stream.py", "framed_step.stream", "no job was submitted", 1,
     T + "test_chaos.py::test_a_full_state_filesystem_refuses_before_any_mutation"),
    ("vq_admin/lanes/allocation_step.py", "AllocationDeploy._conclude", "nothing ran", 1,
     T + "test_chaos.py::test_scancel_of_a_pending_job_is_failed_nothing_ran"),
    ("vq_admin/lanes/allocation_step.py", "AllocationDeploy.tampered", "did not run", 1,
     T + "trust/test_job_binding.py::test_a_changed_argv_is_not_run"),
    ("vq_admin/lanes/command_files.py", "refuse", "no configured command was run", 1,
     T + "trust/test_remote_commands.py::test_helper_command_with_an_attacker_script_is_refused_on_the_stage_host"),
    ("vq_admin/lanes/command_files.py", "run_places", "changed nothing", 1,
     T + "test_chaos_ssh.py::test_ssh_client_killed_at_the_command_file_checks"),
    ("vq_admin/lanes/command_files.py", "run_places", "no configured command was run", 2,
     T + "test_lease.py::test_the_driver_reads_a_held_work_lock_as_locked_and_an_unsafe_path_as_refused"),
    ("vq_admin/lanes/command_files_stat.py", "_call", "changed nothing", 1,
     T + "test_stat_paths.py::test_an_interrupted_read_is_a_failure_naming_the_step"),
    ("vq_admin/lanes/command_files_stat.py", "_call", "no configured command was run", 1,
     T + "test_stat_paths.py::test_an_interrupted_read_is_a_failure_naming_the_step"),
    ("vq_admin/lanes/command_files_stat.py", "_unreadable", "no configured command was run", 1,
     T + "test_stat_paths.py::test_facts_that_cannot_be_read_back_refuse"),
    ("vq_admin/lanes/command_files_stat.py", "check_place", "no configured command was run", 1,
     T + "test_stat_paths.py::test_a_refusal_names_the_key_and_runs_nothing_further"),
    ("vq_admin/lanes/conclude.py", "provider_locked", "nothing was changed", 1,
     T + "test_lease.py::test_a_provider_exiting_75_is_locked_and_its_stage_reclaimed"),
    ("vq_admin/lanes/confirm_step.py", "Confirmation.run", "was not submitted", 1,
     T + "test_lease.py::test_a_build_verb_that_cannot_take_the_work_lock_says_why_in_its_exit"),
    ("vq_admin/lanes/detached_step.py", "left_running", "no build was started", 1,
     T + "test_detached.py::"
     "test_a_deploy_dropped_before_the_agent_started_fences_the_attempt_and_says_nothing_was_built"),
    ("vq_admin/lanes/first_call.py", "_record_check", "no configured command was run", 1,
     T + "test_chaos_ssh.py::test_ssh_client_killed_at_the_command_file_checks"),
    ("vq_admin/lanes/first_call.py", "unreached", "changed nothing", 1,
     T + "test_unreachable.py::test_an_update_that_cannot_reach_its_host_is_failed_and_changed_nothing"),
    ("vq_admin/lanes/first_call.py", "unreached", "no build was started", 1,
     T + "test_unreachable.py::test_an_update_that_cannot_reach_its_host_is_failed_and_changed_nothing"),
    ("vq_admin/lanes/first_call.py", "unreached", "nothing was changed", 1,
     T + "test_unreachable.py::test_an_update_that_cannot_reach_its_host_is_failed_and_changed_nothing"),
    ("vq_admin/lanes/helper.py", "HelperUpdate.run", "nothing was staged or installed", 2,
     T + "test_nothing_ran.py::test_an_interrupted_read_only_first_read_stages_installs_and_deploys_nothing"),
    ("vq_admin/lanes/helper.py", "HelperUpdate.unknown", "nothing was staged or installed", 1,
     T + "test_nothing_ran.py::test_an_interrupted_read_only_first_read_stages_installs_and_deploys_nothing"),
    ("vq_admin/lanes/interrupted.py", "left_behind", "no build was started", 1,
     T + "test_chaos_ssh.py::test_ssh_client_of_the_push_killed_while_the_mirror_receives"),
    ("vq_admin/lanes/mirror_step.py", "MirrorFeed._prepare", "no build was started", 1,
     T + "test_chaos_ssh.py::test_ssh_client_of_the_preparer_killed_after_the_feed"),
    ("vq_admin/lanes/mirror_step.py", "MirrorFeed._prepare", "nothing was staged or built", 1,
     T + "test_chaos_ssh.py::test_ssh_client_of_the_preparer_killed_after_the_feed"),
    ("vq_admin/lanes/mirror_step.py", "MirrorFeed.run", "no build was started", 1,
     T + "test_chaos_ssh.py::test_ssh_client_of_the_push_killed_while_the_mirror_receives"),
    ("vq_admin/lanes/prune.py", "RuntimePrune.__init__", "nothing was pruned", 1,
     T + "test_nothing_ran.py::test_a_prune_without_last_ok_is_refused_before_it_runs_anything"),
    ("vq_admin/lanes/prune.py", "RuntimePrune.__init__", "nothing was verified", 1,
     T + "test_nothing_ran.py::test_a_prune_without_last_ok_is_refused_before_it_runs_anything"),
    ("vq_admin/lanes/prune.py", "RuntimePrune.prune", "was not run", 1,
     T + "test_prune.py::test_the_prune_report_is_parsed_strictly"),
    ("vq_admin/lanes/prune.py", "RuntimePrune.run", "nothing was pruned", 1,
     T + "test_prune.py::test_prune_with_the_controller_stopped_removes_nothing"),
    ("vq_admin/lanes/prune.py", "RuntimePrune.take_census", "nothing was pruned", 1,
     T + "test_census_real.py::test_slurmctld_stopped_during_the_census_refuses_the_prune"),
    ("vq_admin/lanes/prune.py", "keep_lines", "nothing is called", 1,
     T + "test_prune.py::test_prune_keeps_what_a_held_job_needs_and_the_job_then_runs"),
    ("vq_admin/lanes/rollback.py", "RuntimeRollback.make_plan", "nothing is built", 1,
     T + "test_rollback.py::test_rollback_through_activate_on_an_allocation_profile_submits_no_job"),
    ("vq_admin/lanes/rollback.py", "RuntimeRollback.__init__", "nothing was run", 1,
     T + "test_confirm.py::test_the_record_is_the_one_seam_and_the_launcher_refuses_an_unconfirmed_sha"),
    ("vq_admin/lanes/rollback.py", "verified_target", "nothing was run", 4,
     T + "test_rollback.py::test_rollback_refusals_run_nothing"),
    ("vq_admin/lanes/runtime.py", "<module>", "nothing was deployed or activated", 1,
     T + "test_nothing_ran.py::test_an_interrupted_read_only_first_read_stages_installs_and_deploys_nothing"),
    ("vq_admin/lanes/runtime.py", "RuntimeUpdate.unknown", "nothing was deployed or activated", 1,
     T + "test_nothing_ran.py::test_an_interrupted_read_only_first_read_stages_installs_and_deploys_nothing"),
    ("vq_admin/lanes/staging.py", "SourceStage.require", "nothing was installed", 3,
     T + "test_chaos_ssh.py::test_ssh_client_of_a_mirror_read_killed_before_the_push"),
    ("vq_admin/lanes/staging.py", "SourceStage.stage", "nothing was installed", 1,
     T + "test_interruptions.py::test_stage_verify_exit_0_without_a_proving_verdict_installs_nothing"),
    ("vq_admin/lease.py", "Lease._acquire", "changed nothing", 1,
     T + "test_unreachable.py::test_an_update_that_cannot_reach_its_host_is_failed_and_changed_nothing"),
    ("vq_admin/lease.py", "Lease._acquire", "nothing was run", 1,
     T + "test_nothing_ran.py::test_a_lease_whose_command_cannot_start_runs_nothing"),
    ("vq_admin/lease.py", "Lease._refuse", "changed nothing", 1,
     T + "test_unreachable.py::test_an_update_that_cannot_reach_its_host_is_failed_and_changed_nothing"),
    ("vq_admin/lease.py", "Lease._start_session", "nothing was run", 1,
     T + "test_nothing_ran.py::test_a_lease_whose_command_cannot_start_runs_nothing"),
    ("vq_admin/plan.py", "execute", "was not run", 1,
     T + "test_plan_slots.py::test_execute_refuses_slot_values_next_to_an_explicit_argv"),
    ("vq_admin/plan.py", "execute_stream", "was not run", 1,
     T + "test_nothing_ran.py::test_a_step_refused_while_its_words_are_filled_is_not_run"),
    ("vq_admin/plan.py", "fill", "was not run", 3,
     T + "test_plan_slots.py::test_execute_refuses_an_unfilled_or_unknown_slot_before_anything_runs"),
    ("vq_admin/plan.py", "fill_env", "was not run", 1,
     T + "test_nothing_ran.py::test_a_step_refused_while_its_words_are_filled_is_not_run"),
    ("vq_admin/plan.py", "filled", "was not run", 1,
     T + "test_plan_slots.py::test_execute_refuses_an_unfilled_or_unknown_slot_before_anything_runs"),
    ("vq_admin/provider_install.py", "_check_args", "nothing was installed", 1,
     T + "trust/test_trust_round_three.py::test_provider_install_of_another_users_file_is_refused"),
    ("vq_admin/record/signing.py", "Signer.__init__", "nothing was signed or checked", 1,
     T + "test_nothing_ran.py::test_signing_without_ssh_keygen_signs_and_checks_nothing"),
    ("vq_admin/report/outcome.py", "<module>", "nothing was changed", 1,
     T + "test_nothing_ran.py::test_a_refusal_after_read_only_checks_says_only_they_ran"),
    ("vq_admin/report/output.py", "_rollback_text", "nothing was changed", 1,
     T + "test_rollback.py::test_rollback_to_last_good_through_activate"),
    ("vq_admin/report/output.py", "plan_summary", "nothing is run", 1,
     T + "test_helper_lane.py::test_dry_run_prints_the_plan_and_changes_nothing"),
    ("vq_admin/source/mirror.py", "<module>", "nothing was pushed", 3,
     T + "test_mirror_feed.py::test_branch_advanced_past_the_pin_is_refused_with_the_documented_text"),
    ("vq_admin/source/mirror_feed.py", "Feed.__init__", "not run", 1,
     T + "test_mirror_cli.py::test_drifted_lane_branch_is_refused_before_the_preparer_and_the_deploy"),
    ("vq_admin/source/mirror_feed.py", "Feed._refused_by_git", "nothing changed", 3,
     T + "test_mirror_feed.py::test_mirror_moved_between_read_and_push_is_refused_with_nothing_half_applied"),
    ("vq_admin/source/mirror_feed.py", "Feed._untouched", "nothing changed", 2,
     T + "test_mirror_feed.py::test_a_push_that_never_reached_the_mirror_fails_with_nothing_changed"),
    ("vq_admin/source/mirror_feed.py", "Feed.no_symrefs", "nothing was pushed", 1,
     T + "trust/test_host_trust.py::test_a_symbolic_ref_in_the_set_refuses_the_feed"),
    ("vq_admin/source/mirror_feed.py", "Feed.probe", "nothing was pushed", 1,
     T + "test_mirror_feed.py::test_a_mirror_that_is_not_a_bare_repository_is_refused_with_the_creation_command"),
    ("vq_admin/source/mirror_feed.py", "Feed.read", "nothing was pushed", 1,
     T + "test_chaos_ssh.py::test_ssh_client_of_a_mirror_read_killed_before_the_push"),
    ("vq_admin/ssh/effective.py", "check", "nothing was run", 1,
     T + "trust/test_trust_round_three.py::test_what_ssh_would_load_from_another_user_is_refused_before_ssh_runs"),
    # -- the messages that say what ran through a shipped constant (CLAIM_TEXTS) --
    ("vq_admin/interrupts.py", "early_error", "READ_ONLY_RAN", 1,
     T + "test_early_signals.py::test_a_signal_before_the_lane_is_130_with_one_json_document"),
    ("vq_admin/lanes/allocation_attempt.py", "_still_going", "READ_ONLY_RAN", 3,
     T + "test_chaos.py::test_sigterm_while_the_allocation_job_is_pending"),
    ("vq_admin/lanes/allocation_attempt.py", "reconcile_previous", "READ_ONLY_RAN", 1,
     T + "test_plan_contingent.py::test_previous_attempt_is_planned_from_the_record_the_plan_saw"),
    ("vq_admin/lanes/command_files.py", "run_places", "was not run", 1,
     T + "test_plan_execute_everywhere.py::"
     "test_a_check_planned_for_other_words_than_its_place_is_refused_before_it_runs"),
    ("vq_admin/lanes/command_files_stat.py", "check_place", "was not run", 1,
     T + "test_plan_execute_everywhere.py::"
     "test_a_check_planned_for_other_words_than_its_place_is_refused_before_it_runs"),
    ("vq_admin/lanes/confirm_step.py", "unconfirmed_refusal", "READ_ONLY_RAN", 1,
     T + "test_confirm_real.py::"
     "test_a_failing_confirmation_reverts_and_the_queue_keeps_the_previous_launcher"),
    ("vq_admin/lanes/first_call.py", "open_runtime", "READ_ONLY_RAN", 1,
     T + "test_chaos.py::test_a_hung_verifier_is_failed_with_the_true_reason_and_ended_on_the_host"),
    ("vq_admin/lanes/helper.py", "HelperUpdate.run", "AGENT_NOT_RUN", 1,
     T + "test_helper_lane.py::test_a_first_installation_says_what_to_run_and_then_works_as_printed"),
    ("vq_admin/lanes/helper.py", "HelperUpdate.run", "READ_ONLY_RAN", 1,
     T + "test_helper_lane.py::test_a_first_installation_says_what_to_run_and_then_works_as_printed"),
    ("vq_admin/lanes/helper.py", "open_helper", "READ_ONLY_RAN", 1,
     T + "test_lease.py::test_an_agent_of_another_version_is_refused_once_with_the_update_command"),
    ("vq_admin/lanes/mirror_step.py", "MirrorFeed._recorder.run_step", "was not run", 1,
     T + "test_plan_execute_everywhere.py::"
     "test_a_check_planned_for_other_words_than_its_place_is_refused_before_it_runs"),
    ("vq_admin/lanes/runtime.py", "RuntimeUpdate.__init__", "READ_ONLY_RAN", 2,
     T + "test_recall_real.py::test_quarantine_holds_pending_jobs_and_refuses_the_generation_until_lifted"),
    ("vq_admin/lanes/runtime.py", "RuntimeUpdate.require_quiescent", "READ_ONLY_RAN", 3,
     T + "test_interruptions.py::test_a_pre_verify_that_is_not_a_receipt_refuses_before_any_mutation"),
    ("vq_admin/lease.py", "<module>", "was not run", 1,
     T + "test_helper_lane.py::test_a_first_installation_says_what_to_run_and_then_works_as_printed"),
    ("vq_admin/lease.py", "Lease._other_protocol", "READ_ONLY_RAN", 1,
     T + "test_lease.py::test_an_agent_of_another_version_is_refused_once_with_the_update_command"),
    ("vq_admin/lease.py", "_agent_cannot_run", "AGENT_NOT_RUN", 1,
     T + "test_helper_lane.py::test_a_first_installation_says_what_to_run_and_then_works_as_printed"),
    ("vq_admin/lease.py", "_nothing_ran", "READ_ONLY_RAN", 1,
     T + "test_nothing_ran.py::test_a_refusal_after_read_only_checks_says_only_they_ran"),
    ("vq_admin/lease.py", "held_message", "READ_ONLY_RAN", 1,
     T + "test_lease.py::test_a_second_administrator_gets_75_naming_the_first_and_runs_nothing"),
    ("vq_admin/lockwait.py", "LockWait.pause", "READ_ONLY_RAN", 1,
     T + "test_lease.py::test_wait_lock_waits_for_the_lane_lock_and_the_lease_then_gives_up_with_75"),
    ("vq_admin/source/__init__.py", "expected_tag", "READ_ONLY_RAN", 1,
     T + "test_source.py::test_several_tags_ask_for_tag_and_one_may_be_chosen"),
    ("vq_admin/source/__init__.py", "make_archive", "was not written", 1,
     T + "test_nothing_ran.py::test_an_archive_planned_for_other_words_is_not_written"),
    ("vq_admin/ssh/transport.py", "SshTransport.refuse_shell", "READ_ONLY_RAN", 1,
     T + "trust/test_host_trust.py::test_a_non_posix_login_shell_is_refused_on_first_contact"),
    ("vq_admin/state/locks.py", "lane_lock", "READ_ONLY_RAN", 1,
     T + "test_lease.py::test_wait_lock_waits_for_the_lane_lock_and_the_lease_then_gives_up_with_75"),
    ("vq_admin/state/records.py", "StateDir.require_free_space", "READ_ONLY_RAN", 2,
     T + "test_chaos.py::test_a_full_state_filesystem_refuses_before_any_mutation"),
]

#: Texts :data:`PHRASE` finds that claim nothing: (file, function, phrase, times, what the text is)
NOT_CLAIMS: list[tuple[str, str, str, int, str]] = [
    ("vq_admin/conformance/kit.py", "<module>", "unchanged", 1, "the name of a check"),
    ("vq_admin/conformance/kit.py", "Kit.failed_validation", "unchanged", 1, "the name of a check"),
    ("vq_admin/conformance/kit.py", "Kit.check_argv_shape", "unchanged", 1,
     "a failure: the provider does not pass the words unchanged"),
    ("vq_admin/lanes/mirror_step.py", "MirrorFeed.run", "unchanged", 1, "advice: how a rerun shows an applied feed"),
    ("vq_admin/source/mirror.py", "FeedRef.pushed", "unchanged", 1, "a ref's planned action"),
    ("vq_admin/source/mirror.py", "decide", "unchanged", 1, "a ref's planned action"),
    ("vq_admin/source/mirror_feed.py", "Feed.push_refs", "untouched", 1,
     "a failure: the refs could not be shown to be untouched"),
]


def shipped_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "vq_admin", "hookspecs", "site_example"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [name for name in out.split() if name.endswith(".py")]


def claims_in(path: Path) -> dict[tuple[str, str], int]:
    """(function, phrase) -> how often: every claim in a string of *path* that is not a docstring, and
    every f-string use of one of :data:`CLAIM_TEXTS` (the phrase is then the constant's name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found: dict[tuple[str, str], int] = {}

    def visit(node: ast.AST, qual: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = qual
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{qual}.{child.name}" if qual else child.name
            if isinstance(child, ast.FormattedValue) and isinstance(child.value, ast.Name) \
                    and child.value.id in CLAIM_TEXTS:
                key = (inner or "<module>", child.value.id)
                found[key] = found.get(key, 0) + 1
            if isinstance(child, ast.Constant) and isinstance(child.value, str) and id(child) not in docs:
                for match in PHRASE.finditer(child.value):
                    key = (inner or "<module>", " ".join(match.group(0).lower().split()))
                    found[key] = found.get(key, 0) + 1
            visit(child, inner)

    visit(tree, "")
    return found


def test_every_claim_of_nothing_in_a_message_has_a_row_and_every_row_a_claim():
    in_code = {(name, qual, phrase): times for name in shipped_files()
               for (qual, phrase), times in claims_in(ROOT / name).items()}
    listed = {row[:3]: row[3] for row in CLAIMS + NOT_CLAIMS}
    assert len(listed) == len(CLAIMS) + len(NOT_CLAIMS), "a row is listed twice"
    missing = sorted(f"{k} x{n}" for k, n in in_code.items() if listed.get(k) != n)
    stale = sorted(f"{k} x{n}" for k, n in listed.items() if in_code.get(k) != n)
    assert not missing, ("a message claims nothing ran or changed without a row (add one naming the test "
                         "that proves it):\n" + "\n".join(missing))
    assert not stale, "a row names a claim the code does not make (so many times):\n" + "\n".join(stale)


@pytest.mark.parametrize("row", CLAIMS, ids=[f"{r[0]}:{r[1]}:{r[2]}" for r in CLAIMS])
def test_each_claim_names_a_test_that_exists(row):
    file, _sep, name = row[4].partition("::")
    tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
    assert any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body), f"no test {row[4]}"


def test_the_phrase_finds_the_claims_and_not_the_advice():
    said = ["nothing was run", "nothing ran", "this run changed nothing", "no configured command was run",
            "the job was not submitted", "nothing was staged or installed", "current unchanged", "not started: x"]
    for text in said:
        assert PHRASE.search(text), text
    for text in ("do not run it", "could not run the computation", "nothing is active", "nothing to prune"):
        assert not PHRASE.search(text), text


# -- the proofs this file holds itself ------------------------------------------------------------


class _NoCall:
    """A transport double that fails the test if anything is run through it."""

    where = "double"

    def __init__(self) -> None:
        self.ran: list[list[str]] = []

    def run(self, argv, **_kwargs):  # pragma: no cover - reaching it is the failure
        self.ran.append(list(argv))
        raise AssertionError(f"ran {argv}")


def test_a_step_refused_while_its_words_are_filled_is_not_run():
    from vq_admin_hookspecs import Slot

    from vq_admin.plan import Plan, SlotError, execute, execute_stream

    plan, transport, streamed = Plan(), _NoCall(), []
    keep = Slot("keep", many=True)
    listed = plan.add("prune", "double", ["/prune", keep], "prune", {"KEEP": keep})
    with pytest.raises(SlotError, match=r"the list slot .* is never an environment value; the step was not run"):
        execute(listed, transport, timeout=5, keep=["a" * 40])
    with_env = plan.add("stream", "double", ["/agent", "x"], "stream", {"LANG": "C"})
    with pytest.raises(SlotError, match="a streamed step has no environment of its own; the step was not run"):
        execute_stream(with_env, transport, streamed.append)
    assert transport.ran == [] and streamed == []
    assert listed.argv is None and with_env.argv is None and listed.status == with_env.status == "planned"


def test_signing_without_ssh_keygen_signs_and_checks_nothing(tmp_path, monkeypatch):
    from vq_admin.config import Signing
    from vq_admin.record.signing import Signer
    from vq_admin.report.outcome import Refused

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    key, allowed = tmp_path / "key", tmp_path / "allowed_signers"
    with pytest.raises(Refused, match="ssh-keygen is not on PATH; nothing was signed or checked"):
        Signer(Signing(key=str(key), allowed_signers=str(allowed)))
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "no signature, no key, nothing written"


def test_a_refusal_after_read_only_checks_says_only_they_ran():
    """The lease refusals (the agent ran its read-only lease and checks) say so, once, from one text;
    a refusal whose agent judge already said what ran adds nothing to it."""
    from vq_admin import lease
    from vq_admin.report.outcome import READ_ONLY_RAN

    assert READ_ONLY_RAN == "only read-only checks ran; nothing was changed"
    assert lease._nothing_ran("a lock that does not work") == f"; {READ_ONLY_RAN}"
    judged = "refused: /x is group-writable; the agent would run it; nothing was run"
    assert lease._nothing_ran(judged) == ""
    assert lease._nothing_ran("only the agent interpreter's own start-up ran (/p -I -S)") == ""
    held = lease.held_message("the lease", lease.LeaseReply.from_value(
        {"holder": {"pid": 7, "user": "u", "driver_host": "d"}}, "the lease's answer"))
    assert held.splitlines()[0].endswith(f"; {READ_ONLY_RAN}") and "nothing was run" not in held


def test_a_lease_whose_command_cannot_start_runs_nothing(tmp_path, monkeypatch):
    """ssh (or the local agent) that cannot be started: failed, "nothing was run", and nothing was."""
    from vq_admin.lease import LeaseUnreachable
    from vq_admin.ssh import process

    started = []

    def spawn(argv, **_kwargs):
        started.append(argv)
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(process, "spawn", spawn)
    from vq_admin import lease as lease_module

    class Wrapping:
        where = "double"

        def wrap(self, argv, _env):
            return [str(tmp_path / "missing-ssh"), *argv]

    lease = lease_module.Lease.__new__(lease_module.Lease)
    lease.transport, lease.argv, lease.record, lease.proc = Wrapping(), ["/agent", "lease"], {}, None
    lease._stderr = None
    with pytest.raises(LeaseUnreachable, match="cannot start .*missing-ssh: No such file or directory; nothing was run"
                       ):
        lease._acquire()
    assert len(started) == 1 and lease.proc is None and not list(tmp_path.iterdir())
    # the session's start (over ssh: no local agent to call missing instead)
    ssh = object.__new__(lease_module.SshTransport)
    monkeypatch.setattr(lease_module, "take", lambda *_a: None)
    with pytest.raises(LeaseUnreachable, match="cannot start .*missing-ssh: No such file or directory; nothing was run"
                       ):
        lease._start_session(ssh, [str(tmp_path / "missing-ssh"), "cluster", "session"], {"lease": {}})
    assert len(started) == 2 and lease.proc is None and not list(tmp_path.iterdir())


def _tree(root: Path) -> dict[str, bytes | str]:
    """Every path below *root* with its bytes (a symlink: its target; a directory: "dir")."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")) if root.exists() else []:
        key = str(path.relative_to(root))
        found[key] = (f"-> {path.readlink()}" if path.is_symlink() else "dir" if path.is_dir()
                      else path.read_bytes())
    return found


@pytest.mark.parametrize("lane", ["helper", "runtime", "rollback-by-activation", "helper-without-record"])
def test_an_interrupted_read_only_first_read_stages_installs_and_deploys_nothing(lane, tmp_path, monkeypatch):
    """The pre-identity (helper lane) or pre-verify (runtime lane) cut off: ``unknown``, and the
    message's "nothing was staged or installed" / "nothing was deployed or activated" is true: no
    step after it ran, no stage exists, the installed trees are byte for byte as before.  So is the
    refusal of a live helper without an install record ("no helper this lane installed ...")."""
    from test_plan_slots import Counting, run_lane, world as make_world
    from vq_admin_hookspecs import HelperIdentity

    from vq_admin.lanes import helper as helper_lane
    from vq_admin.lanes import runtime as runtime_lane
    from vq_admin.lanes.helper_identity import IdentityRead
    from vq_admin.lanes.verify import Verification

    w = make_world.__wrapped__(tmp_path)  # the fixture's body: a local helper and runtime lane
    cut = "the transport was interrupted (a test double)"
    if lane == "helper-without-record":
        live = HelperIdentity("1", None, "f" * 64, "missing", "/opt/site-packages/vq_admin", "/usr/bin/python3")
        monkeypatch.setattr(helper_lane, "read_identity", lambda *_a, **_k: IdentityRead("pre-identity", live))
        before = _tree(tmp_path / "helper")
        with pytest.raises(helper_lane.Refused, match="no helper this lane installed is there yet; .*; nothing "
                                                      "was staged or installed"):
            run_lane(w, lambda ctx: helper_lane.HelperUpdate(ctx, "cluster", w["b"]), Counting(), dry_run=False)
        assert not list((tmp_path / "scratch").rglob("stage.*")) and _tree(tmp_path / "helper") == before
        return
    if lane == "helper":
        monkeypatch.setattr(helper_lane, "read_identity",
                            lambda *_a, **_k: IdentityRead("pre-identity", error=cut, interrupted=True))
        make = lambda ctx: helper_lane.HelperUpdate(ctx, "cluster", w["b"])  # noqa: E731
        said, installed = "the read-only pre-identity read was interrupted; nothing was staged or installed", \
            tmp_path / "helper"
    else:
        monkeypatch.setattr(runtime_lane.RuntimeUpdate, "verify",
                            lambda self, step, *_a, **_k: Verification(step.name, error=cut, interrupted=True))
        make = lambda ctx: runtime_lane.RuntimeUpdate(ctx, "cluster", "vibeqc", w["runtime_sha"], None)  # noqa: E731
        said, installed = runtime_lane.PRE_VERIFY_CUT, w["runtime_root"]
    provider = Counting()
    if lane == "rollback-by-activation":  # a verified target, and an activation that would leave a marker
        from vq_admin_hookspecs import ProviderCommand, hookimpl

        from vq_admin.lanes import rollback

        marker = tmp_path / "activated"

        class Activating(Counting):
            @hookimpl
            def vq_admin_runtime_activate(self, request):
                return ProviderCommand(argv=("/usr/bin/touch", str(marker)))

        provider = Activating()
        target = rollback.registry.Entry(host="cluster", program="vibeqc", sha=w["runtime_sha"], tag=None,
                                         launcher="/unused", launcher_sha256="e" * 64, receipt="r", verified_at="t")
        monkeypatch.setattr(rollback, "verified_target", lambda *_a: target)
        make = lambda ctx: rollback.RuntimeRollback(ctx, "cluster", "vibeqc", w["runtime_sha"])  # noqa: E731
    before = _tree(installed)
    done = run_lane(w, make, provider, dry_run=False)
    assert done.outcome.value == "unknown" and done.readback.reason == said, (done.errors, done.readback)
    assert done.readback.advice.startswith("nothing was staged or installed by this run" if lane == "helper"
                                         else "nothing was deployed or activated by this run")
    ran = [s.name for s in done.plan.steps if s.argv is not None]
    assert not {"stage-create", "stage-receive", "stage-verify", "helper", "deploy", "verify"} & set(ran), ran
    assert not list((tmp_path / "scratch").rglob("stage.*")), "a stage was created"
    assert _tree(installed) == before, "the installed tree changed"
    if lane == "rollback-by-activation":
        assert done.rollback.via == "activate" and "activate" not in ran and not marker.exists()


def test_an_archive_planned_for_other_words_is_not_written(tmp_path):
    """A ``source`` step planned for other words than the archive of the commit: refused before git runs."""
    from support import GitRepo

    from vq_admin import source
    from vq_admin.report.outcome import VqAdminError

    repo = GitRepo(tmp_path / "src")
    sha = repo.commit("one")
    workdir = tmp_path / "work"
    workdir.mkdir()
    with pytest.raises(VqAdminError, match="is not the archive of .*; the archive was not written"):
        source.make_archive(source.resolve(str(repo.path), sha, None), str(workdir), ["git", "archive", "HEAD"])
    assert list(workdir.iterdir()) == [], "git ran, or something was written"


def test_a_prune_without_last_ok_is_refused_before_it_runs_anything(tmp_path, monkeypatch):
    """No LAST OK in this state directory: 77 while the lane is built; no step ran (the prune hook is
    only asked for its command), the runtime tree is as it was."""
    from test_plan_slots import Counting, world as make_world

    from vq_admin.context import RunContext, RunOptions
    from vq_admin.plugins import Providers
    from vq_admin.report.outcome import Refused
    from vq_admin.ssh.transport import Session
    from vq_admin.state.records import StateDir

    from vq_admin.lanes import prune

    ran: list[str] = []
    monkeypatch.setattr(prune, "execute", lambda step, *_a, **_k: ran.append(step.name))
    w = make_world.__wrapped__(tmp_path)
    before, provider = _tree(w["runtime_root"]), Counting()
    with Session(None) as session:
        ctx = RunContext(w["config"], StateDir(w["state"]), session, Providers.from_plugins({"counting": provider}),
                         RunOptions(json=True))
        with pytest.raises(Refused, match="has no LAST OK in .*: nothing was verified here, .*; nothing was pruned"):
            prune.RuntimePrune(ctx, "cluster", "vibeqc", 1)
    assert ran == [] and _tree(w["runtime_root"]) == before
