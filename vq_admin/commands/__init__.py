"""One module per verb of ``vq admin``."""
