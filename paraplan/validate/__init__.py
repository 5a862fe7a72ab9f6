"""paraplan.validate."""
