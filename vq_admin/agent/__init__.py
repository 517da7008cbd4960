"""The scheduler-side helper (``vq-admin-agent``): verbs the driver runs on a
login or build host.  Standard library only; imports nothing of the driver."""
