"""What a run reports: outcomes and exit codes, the receipt, the JSON envelope, narration,
progress, status tables and metrics."""
