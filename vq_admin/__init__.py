"""vq-admin: keep the vq helper and managed scientific runtimes on daemonless
Slurm login hosts exactly right.

This package's ``__init__`` imports nothing, so the queue driver's per-job
path (:mod:`vq_admin.bindings`) and the scheduler-side helper
(:mod:`vq_admin.agent`) stay light.
"""

__version__ = "1.0.0"
