"""Markers and names that tie a provider package to vq-admin.

A provider module decorates its hook implementations with :data:`hookimpl`
and is announced through the entry-point group :data:`ENTRY_POINT_GROUP`::

    [options.entry_points]
    vq_admin.providers =
        mysite = mysite_vq.provider

The entry-point name is the provider name a profile selects with
``provider = "mysite"``.
"""

import pluggy

#: The pluggy project name shared by specifications and implementations.
PROJECT_NAME = "vq_admin"

#: Entry-point group searched for provider plugins.
ENTRY_POINT_GROUP = "vq_admin.providers"

#: Decorates the hook specifications in :mod:`vq_admin_hookspecs.specs`.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

#: Decorates a provider's hook implementations.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
