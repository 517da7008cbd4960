"""The ssh side of a run: the transport (local or ssh), the one local process runner,
ssh command lines, the early start and the connect check."""
