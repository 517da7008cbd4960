#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vq-admin maintainers; BSD-3-Clause (see LICENSE of vq-admin)

DOCUMENTATION = r"""
module: facts
short_description: vq-admin's records of a login host as facts
description:
  - Runs C(vq admin status HOST --json) on the driver and returns the host's records as the fact
    C(vq_admin) (C(helper) and C(runtimes), each with C(last), C(last_ok) and C(last_good)), for C(when)
    conditions and drift reports. It reads the driver's state directory only and changes nothing.
  - To read what is active on the login host now, use M(vq.admin.runtime) in check mode, or run
    C(vq admin verify).
version_added: 1.0.0
author: vq-admin maintainers (@vq-admin)
extends_documentation_fragment: vq.admin.common
options:
  host:
    description:
      - The vq-admin host name (a host of its configuration).
      - Default the inventory host name (filled in by the collection's action plugin).
    type: str
"""

EXAMPLES = r"""
- name: Read what vq-admin last proved on this login host
  vq.admin.facts:
  delegate_to: localhost

- name: Deploy only where LAST OK is another SHA
  vq.admin.runtime:
    program: vibeqc
    expected_sha: "{{ vibeqc_sha }}"
  delegate_to: localhost
  when: (vq_admin.runtimes.vibeqc.last_ok.sha | default('')) != vibeqc_sha
"""

RETURN = r"""
ansible_facts:
  description: The facts set.
  returned: always
  type: complex
  contains:
    vq_admin:
      description:
        - C(host), C(state_dir), C(helper) (null or C(last), C(last_ok), C(last_good)) and C(runtimes)
          (program to C(last), C(last_ok), C(last_good)); each record as C(vq admin status --json) prints it.
        - C(last_ok) and C(last_good) have C(sha), C(tag), C(launcher), C(launcher_sha256), C(receipt), C(at).
      returned: always
      type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vq.admin.plugins.module_utils.vq_admin import COMMON_ARGS, Vq


def main():
    module = AnsibleModule(argument_spec=dict(COMMON_ARGS, host=dict(type="str")), supports_check_mode=True)
    vq = Vq(module)
    host = vq.host
    status = vq.run("status", "--", host)
    if status.get("outcome") != "ok":
        vq.finish(status)
    slot = status.get("hosts", {}).get(host) or {"helper": None, "runtimes": {}}
    facts = dict(slot, host=host, state_dir=status.get("state_dir"))
    module.exit_json(changed=False, ansible_facts=dict(vq_admin=facts))


if __name__ == "__main__":
    main()
