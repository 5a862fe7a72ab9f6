"""paraplan.viz."""
