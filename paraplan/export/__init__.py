"""paraplan.export."""
