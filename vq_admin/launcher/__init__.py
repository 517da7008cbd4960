"""The per-job launcher lookup for the queue driver and the registry of verified launchers
(standard library only)."""
