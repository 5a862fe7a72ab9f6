"""Sweep grids: a YAML file of models, clusters with node counts, batches, sequence lengths,
trainers and precisions, expanded to jobs (plain dicts of the grid's values, one ``best``
search each) with stable ids, so a sweep can be resumed and its jobs sent to any worker."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from paraplan.search.dispatch import SEARCHERS
from paraplan.specs.base import StrictModel
from paraplan.specs.errors import SpecError, from_validation_error
from paraplan.specs.safe_io import parse_yaml, read_user_text

MAX_JOBS = 100_000
"""Most jobs one grid may expand to (each is a full search; more is a typo, not a plan)."""
MAX_ROWS = 1_000_000
"""Most rows (jobs x top) one sweep's table may hold (the table is built in memory)."""


class ClusterAxis(StrictModel):
    """One cluster preset (or YAML path) and the node counts to try on it."""

    cluster: str = Field(min_length=1, max_length=500)
    nodes: list[int | None] = Field(default=[None], min_length=1, max_length=1000)
    """Node counts (``--nodes``); null keeps the preset's own size."""


class Grid(StrictModel):
    """A design-space sweep: every combination of the lists below is one job."""

    models: list[str] = Field(min_length=1, max_length=1000)
    clusters: list[ClusterAxis] = Field(min_length=1, max_length=1000)
    global_batches: list[int] = Field(min_length=1, max_length=1000)
    seq_lens: list[int] = Field(min_length=1, max_length=1000)
    trainers: list[str | None] = Field(default=[None], min_length=1, max_length=100)
    """Trainer profiles (null: every plan the simulator can price)."""
    precisions: list[Literal["bf16", "fp16", "fp8", "fp32"]] = Field(
        default=["bf16"], min_length=1, max_length=4)
    searcher: str = "auto"
    top: int = Field(default=3, ge=1, le=100)
    """Plans kept per job (rows per job in the results)."""
    tokens_to_train: float | None = Field(default=None, gt=0, le=1e18)
    """Total training tokens, for the time-to-train and cost-to-train columns."""


def parse_grid(data: Any, source: str = "grid") -> Grid:
    """A :class:`Grid` from parsed YAML/JSON, with every value checked.

    Raises:
        SpecError: a field the grid does not know, a bad value, or more than ``MAX_JOBS`` jobs.
    """
    if not isinstance(data, dict):
        raise SpecError(f"{source} must be a mapping of grid fields, got "
                        f"{type(data).__name__}", field="grid", value=type(data).__name__)
    try:
        grid = Grid.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, "grid") from None
    if grid.searcher not in SEARCHERS:
        raise SpecError(f"grid.searcher={grid.searcher!r} is not a searcher",
                        field="grid.searcher", value=grid.searcher, allowed=list(SEARCHERS))
    for name, values in (("global_batches", grid.global_batches), ("seq_lens", grid.seq_lens)):
        bad = [v for v in values if not 0 < v <= 100_000_000]
        if bad:
            raise SpecError(f"grid.{name} has {bad[0]}; each must be in 1..100000000",
                            field=f"grid.{name}", value=bad[0])
    for axis in grid.clusters:
        bad = [n for n in axis.nodes if n is not None and not 0 < n <= 1_000_000]
        if bad:
            raise SpecError(f"grid.clusters.nodes has {bad[0]} for {axis.cluster!r}; node "
                            "counts must be in 1..1000000", field="grid.clusters.nodes",
                            value=bad[0])
    for name in ("models", "global_batches", "seq_lens", "trainers", "precisions"):
        found, twice = _first_repeat(getattr(grid, name))
        if found:
            raise SpecError(f"grid.{name} lists {twice!r} twice; each value once",
                            field=f"grid.{name}", value=twice)
    found, twice = _first_repeat([(a.cluster, n) for a in grid.clusters for n in a.nodes])
    if found:
        raise SpecError(f"grid.clusters lists {twice[0]!r} with nodes {twice[1]} twice; each "
                        "cluster size once", field="grid.clusters", value=twice[0])
    count = count_jobs(grid)
    if count > MAX_JOBS:
        raise SpecError(f"the grid expands to {count} jobs; at most {MAX_JOBS} are allowed "
                        "(split it into several sweeps)", field="grid", value=count)
    if count * grid.top > MAX_ROWS:
        raise SpecError(f"the grid makes up to {count * grid.top} rows ({count} jobs x top "
                        f"{grid.top}); at most {MAX_ROWS} (lower top or split the grid)",
                        field="grid.top", value=grid.top)
    return grid


def _first_repeat(values: list[Any]) -> tuple[bool, Any]:
    """(True, the first value listed twice in ``values``), or (False, None)."""
    for i, v in enumerate(values):
        if v in values[:i]:
            return True, v
    return False, None


def load_grid(path: str) -> Grid:
    """Read and check a grid file (YAML or JSON, data only), names included."""
    grid = parse_grid(parse_yaml(read_user_text(path, "grid"), "grid", path), path)
    check_names(grid)
    return grid


def check_names(grid: Grid) -> None:
    """Every model, cluster and trainer the grid names must load (a typo is bad input, said
    before the sweep starts; a combination that does not fit is a failed job's row).

    Raises:
        SpecError: the loader's one-line error, naming the grid field.
    """
    from paraplan.specs.loaders import load_cluster, load_model, load_trainer

    for field, names, load in (("models", grid.models, load_model),
                               ("clusters.cluster", [a.cluster for a in grid.clusters],
                                load_cluster),
                               ("trainers", [t for t in grid.trainers if t], load_trainer)):
        for name in dict.fromkeys(names):
            try:
                load(name)
            except SpecError as exc:
                raise SpecError(f"grid.{field}: {exc}", field=f"grid.{field}",
                                value=name) from None


def count_jobs(grid: Grid) -> int:
    nodes = sum(len(axis.nodes) for axis in grid.clusters)
    return (len(grid.models) * nodes * len(grid.global_batches) * len(grid.seq_lens)
            * len(grid.trainers) * len(grid.precisions))


def expand(grid: Grid) -> list[dict[str, Any]]:
    """Every job of the grid, in a fixed order, each a plain dict with its ``job_id``."""
    pairs = [(axis.cluster, n) for axis in grid.clusters for n in axis.nodes]
    jobs = []
    for model, (cluster, nodes), batch, seq, trainer, precision in itertools.product(
            grid.models, pairs, grid.global_batches, grid.seq_lens, grid.trainers,
            grid.precisions):
        job = {"model": model, "cluster": cluster, "nodes": nodes, "global_batch": batch,
               "seq_len": seq, "trainer": trainer, "precision": precision,
               "searcher": grid.searcher, "top": grid.top,
               "tokens_to_train": grid.tokens_to_train}
        job["job_id"] = job_id(job)
        jobs.append(job)
    return jobs


def job_id(job: dict[str, Any]) -> str:
    """A stable id of a job's inputs (the same job in any grid, on any machine). A model,
    cluster or trainer given as a file counts with its contents, so editing the file
    between a sweep and its ``--resume`` makes new jobs instead of mixing results."""
    inputs = {k: v for k, v in job.items() if k != "job_id"}
    for key in ("model", "cluster", "trainer"):
        path = Path(str(inputs.get(key)))
        if inputs.get(key) and path.is_file():
            inputs[key + "_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
