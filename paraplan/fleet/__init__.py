"""Fleet-scale design-space sweeps: a grid of models x clusters x node counts x batches x
sequences x trainers x precisions, one full ``best`` search per job, run serially or on Ray,
stored as each job finishes (resumable), and written as a tidy table (``paraplan sweep``)."""

from paraplan.fleet.grid import Grid, expand, load_grid, parse_grid
from paraplan.fleet.jobs import COLUMNS, INT_COLUMNS, run_job
from paraplan.fleet.runner import SweepSummary, ray_available, run_sweep
from paraplan.fleet.store import ResultStore

__all__ = ["COLUMNS", "INT_COLUMNS", "Grid", "ResultStore", "SweepSummary", "expand", "load_grid",
           "parse_grid", "ray_available", "run_job", "run_sweep"]
