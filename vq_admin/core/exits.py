"""Exit statuses, one table for both sides (CONTRACT section 2): the driver's outcomes
(:class:`vq_admin.report.outcome.Outcome`) and the agent's verbs (:mod:`vq_admin.agent.cli`).
Standard library only, Python 3.8: the agent's ``.pyz`` packs ``vq_admin/core``.
"""

#: The driver's outcomes.
OK, FAILED, USAGE, UNKNOWN, LOCKED, REFUSED, INTERRUPTED = 0, 1, 2, 3, 75, 77, 130
#: Most severe first: what a fleet exits with when not every host succeeded.
SEVERITY = (UNKNOWN, FAILED, USAGE, LOCKED, REFUSED)

#: The agent's verbs: mismatch is a read-back that differs, unsafe a path the trust rule refuses,
#: held a lock another process holds (EX_TEMPFAIL, as a provider's own host lock).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISMATCH, EXIT_UNSAFE, EXIT_HELD = 0, 1, 2, 3, 4, LOCKED
#: A provider exited this when its own host lock is held; the agent's job script, when its argv was tampered.
PROVIDER_LOCKED, JOB_TAMPERED = LOCKED, 86
