"""paraplan.executor."""
