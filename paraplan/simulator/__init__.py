"""paraplan.simulator."""
