"""paraplan.search."""
