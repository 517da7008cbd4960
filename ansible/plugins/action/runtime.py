# -*- coding: utf-8 -*-
# Copyright: vq-admin maintainers; BSD-3-Clause (see LICENSE of vq-admin)
"""The action of every vq.admin module: C(host) defaults to the inventory host name (a module cannot see
it), then the module runs where the task runs (the driver: delegate_to or connection: local)."""

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        if not args.get("host"):
            args["host"] = (task_vars or {}).get("inventory_hostname")
        result.update(self._execute_module(module_name=self._task.resolved_action, module_args=args,
                                           task_vars=task_vars))
        return result
