"""The two maintenance lanes, each a readable sequence of steps."""
