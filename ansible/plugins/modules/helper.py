#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vq-admin maintainers; BSD-3-Clause (see LICENSE of vq-admin)

DOCUMENTATION = r"""
module: helper
short_description: Update the vq helper on a Slurm login host with vq-admin
description:
  - Runs C(vq admin update HOST --json) on the driver (the helper lane) and maps its receipt onto Ansible,
    as M(vq.admin.runtime) does. Outcome C(ok) is changed; C(already-current) is not changed; C(failed),
    C(unknown), C(refused), C(locked) and C(usage) fail the task with the receipt's first error line as
    C(msg).
  - In check mode nothing is mutated. The plan comes from C(vq admin update HOST --dry-run); the task
    reports changed unless the helper lane's LAST OK (C(vq admin status HOST)) names C(expected_sha).
    The helper lane has no read-only verify of its own, so without C(expected_sha) it reports changed.
    C(vq admin check --connect HOST) fails the task as a run would fail (the host or C(helper_update_host)
    unreachable, a missing or untrusted C(scratch_root)). Nothing ran, so C(outcome) and C(exit_code) are
    null.
version_added: 1.0.0
author: vq-admin maintainers (@vq-admin)
extends_documentation_fragment: vq.admin.common
options:
  host:
    description:
      - The vq-admin host name (a host of its configuration).
      - Default the inventory host name (filled in by the collection's action plugin).
    type: str
  expected_sha:
    description: The full commit SHA of the helper that must end up active (default the driver's own).
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
- name: Keep the vq helper current on every login host
  vq.admin.helper:
  delegate_to: localhost
"""

RETURN = r"""
outcome:
  description:
    - vq-admin's outcome (C(ok), C(already-current), C(failed), C(unknown), C(refused), C(locked), C(usage)).
    - Null in check mode when the task does not fail (nothing ran).
  returned: always, except when vq is missing or too old
  type: str
  sample: ok
exit_code:
  description: vq-admin's exit status, the outcome's code; null when C(outcome) is.
  returned: always, except when vq is missing
  type: int
  sample: 0
receipt:
  description: The receipt (C(vq-admin/receipt/1)); in check mode null.
  returned: always, except when vq is missing or too old
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
            host=dict(type="str"),
            expected_sha=dict(type="str"),
            cluster_install=dict(type="bool", default=False),
            update_script_args=dict(type="list", elements="str", default=[]),
            wait_lock=dict(type="float"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    vq = Vq(module)
    words = lane_words(p, p["host"])
    if not module.check_mode:
        vq.finish(vq.run(*words))
    plan = vq.run(*lane_words(p, p["host"], dry_run=True))
    if plan.get("outcome") != "ok":
        vq.finish(plan)
    status = vq.run("status", "--", p["host"])
    last_ok = ((status.get("hosts", {}).get(p["host"]) or {}).get("helper") or {}).get("last_ok") or {}
    current = bool(p["expected_sha"]) and last_ok.get("sha") == p["expected_sha"].lower()
    vq.check_mode_result(not current, plan=plan)


if __name__ == "__main__":
    main()
