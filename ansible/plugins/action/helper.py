# -*- coding: utf-8 -*-
# Copyright: vq-admin maintainers; BSD-3-Clause (see LICENSE of vq-admin)
"""C(host) defaults to the inventory host name: the action of vq.admin.runtime."""

from ansible_collections.vq.admin.plugins.action.runtime import ActionModule

__all__ = ["ActionModule"]
