"""The shared core of the driver and the agent: standard library only, Python 3.8, shipped in
the single-file agent."""
