#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vq-admin maintainers; BSD-3-Clause (see LICENSE of vq-admin)

DOCUMENTATION = r"""
module: runtime
short_description: Deploy one managed runtime on a Slurm login host with vq-admin
description:
  - Runs C(vq admin update PROGRAM HOST --expected-sha SHA --json) on the driver and maps its receipt onto
    Ansible. Outcome C(ok) is changed; C(already-current) is not changed; C(failed), C(unknown), C(refused),
    C(locked) and C(usage) fail the task, with the receipt's first error line as C(msg) and C(outcome) and
    C(exit_code) returned; C(wait_lock) waits for a held lock first, and a playbook can still C(until) on
    C(outcome == 'locked').
  - vq-admin's driver lock and host-side lease stay the correctness layer (a second administrator is
    refused with C(locked)); the play's C(serial) and C(max_fail_percentage) throttle the rollout.
  - In check mode nothing is mutated anywhere. C(vq admin verify PROGRAM HOST --expected-sha SHA) (a
    read-only verify on the login host) says whether the task would change anything,
    C(vq admin update ... --dry-run) returns the plan, and C(vq admin check --connect HOST) fails the task as
    a run would fail (the host or a build host unreachable, a missing or untrusted C(scratch_root)). Nothing
    ran, so C(outcome) and C(exit_code) are null.
version_added: 1.0.0
author: vq-admin maintainers (@vq-admin)
extends_documentation_fragment: vq.admin.common
options:
  program:
    description: The runtime program (a C(scheduler_runtime_deployments) profile of the host).
    type: str
    required: true
  host:
    description:
      - The vq-admin host name (a host of its configuration).
      - Default the inventory host name (filled in by the collection's action plugin).
    type: str
  expected_sha:
    description: The full commit SHA (40 or 64 hex digits) that must end up active and verified.
    type: str
    required: true
  tag:
    description: The release tag the runtime must report (default inferred by vq-admin from the source repository).
    type: str
  cluster_install:
    description: Run the provider's install operation instead of its update (C(--cluster-install)).
    type: bool
    default: false
  update_script_args:
    description: Arguments passed to the provider's update or install command, in order (C(--update-script-arg)).
    type: list
    elements: str
    default: []
  wait_lock:
    description:
      - Wait up to this many seconds for a held lane lock or host-side lease (another administrator's run, or a
        build an interrupted run left running) instead of failing with C(locked) at once (C(--wait-lock)).
      - Once it has passed, the task fails with C(locked) as without it.
    type: float
"""

EXAMPLES = r"""
- name: Roll vibeqc out, one login host at a time, stopping at the first failure
  hosts: login_hosts
  gather_facts: false
  serial: 1
  max_fail_percentage: 0
  tasks:
    - name: Deploy the release
      vq.admin.runtime:
        program: vibeqc
        expected_sha: "{{ vibeqc_sha }}"
        wait_lock: 1800   # another administrator's run, or a build left running: wait up to 30 min for it
      delegate_to: localhost
"""

RETURN = r"""
outcome:
  description:
    - vq-admin's outcome (C(ok), C(already-current), C(failed), C(unknown), C(refused), C(locked), C(usage)).
    - Null in check mode when the task does not fail (nothing ran).
  returned: always, except when vq is missing or too old
  type: str
  sample: already-current
exit_code:
  description: vq-admin's exit status (0, 1, 2, 3, 75 or 77), the outcome's code; null when C(outcome) is.
  returned: always, except when vq is missing
  type: int
  sample: 0
receipt:
  description: The receipt (C(vq-admin/receipt/1)); in check mode null.
  returned: always, except when vq is missing or too old
  type: dict
verify:
  description:
    - Check mode only. The host's entry of C(vq admin verify) (C(state) current, drifted, unhealthy, broken,
      unknown).
  returned: in check mode
  type: dict
plan:
  description: Check mode only. The plan (C(vq-admin/plan/1)) that C(--dry-run) prints.
  returned: in check mode
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vq.admin.plugins.module_utils.vq_admin import COMMON_ARGS, Vq, lane_words


def main():
    module = AnsibleModule(
        argument_spec=dict(
            COMMON_ARGS,
            program=dict(type="str", required=True),
            host=dict(type="str"),
            expected_sha=dict(type="str", required=True),
            tag=dict(type="str"),
            cluster_install=dict(type="bool", default=False),
            update_script_args=dict(type="list", elements="str", default=[]),
            wait_lock=dict(type="float"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    vq = Vq(module)
    words = lane_words(p, p["program"], p["host"])
    if not module.check_mode:
        vq.finish(vq.run(*words))
    found = vq.run("verify", "--expected-sha=" + p["expected_sha"], "--", p["program"], p["host"])
    entry = found.get("hosts", {}).get(p["host"], {}).get(p["program"])
    if entry is None or entry["state"] == "unknown":
        vq.finish(found)  # a refusal or usage error, or the host could not be read: failed, saying why
    plan = vq.run(*lane_words(p, p["program"], p["host"], dry_run=True))
    if plan.get("outcome") != "ok":
        vq.finish(plan)
    vq.check_mode_result(entry["state"] != "current", verify=entry, plan=plan)


if __name__ == "__main__":
    main()
