"""The driver's state directory: the private tree, receipts, LAST OK / LAST GOOD, the admin log,
lane locks and the history index."""
