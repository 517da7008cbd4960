"""vq-site-example: an example vq-admin site provider.

Two halves that never import each other's dependencies:

* :mod:`vq_site_example.plugin` runs inside vq-admin on the driver and only
  turns a runtime request into an argv (it imports ``vq_admin_hookspecs``);
* :mod:`vq_site_example.cli` (the ``vq-site-example`` command) runs on the
  build and login hosts: the standard library, and the identifier rules
  (full SHA, names, tags) of ``vq_admin_hookspecs``.
"""

__version__ = "1.0.0"
