# -*- coding: utf-8 -*-
# Copyright: vq-admin maintainers; BSD-3-Clause (see LICENSE of vq-admin)
"""The options every vq.admin module shares."""


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  vq:
    description:
      - The C(vq) command on the driver, a name looked up on C(PATH) or an absolute path.
      - The module fails with one line when it is missing, or when it is too old to print the
        vq-admin JSON document the module needs.
    type: str
    default: vq
  config:
    description:
      - The vq-admin configuration file (C(--config)); default C($VQ_ADMIN_CONFIG), else
        C($XDG_CONFIG_HOME/vq/admin.toml) of the user the task runs as.
    type: path
  state_dir:
    description:
      - The driver state directory (C(--state-dir)); default C($VQ_ADMIN_STATE_DIR), else
        C($XDG_STATE_HOME/vq-admin).
    type: path
notes:
  - >-
    The module runs on the driver, the machine with vq-admin, its configuration and its state
    directory; the inventory host is the login host. Run the task with C(delegate_to) the driver
    (or C(connection: local)), and C(host) defaults to the inventory host name.
  - Nothing secret passes through the module's arguments or results (no C(no_log) is needed).
"""
