"""paraplan sweep: grids, jobs, the resumable store, serial and Ray execution, the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from paraplan.fleet import (
    COLUMNS,
    INT_COLUMNS,
    ResultStore,
    expand,
    parse_grid,
    ray_available,
    run_job,
    run_sweep,
)
from paraplan.fleet.grid import MAX_JOBS, check_names, job_id
from paraplan.specs import SpecError
from tests.test_cli import run

GRID = {"models": ["gpt3-350m", "gpt3-760m"],
        "clusters": [{"cluster": "dgx-a100-80gb", "nodes": [1, 2]},
                     {"cluster": "dgx-h100", "nodes": [1]}],
        "global_batches": [64], "seq_lens": [2048], "top": 2, "tokens_to_train": 3e11}
TIMING = ["wall_s", "jobs_per_s"]


def _table(path: Path) -> pd.DataFrame:
    return pd.read_csv(path).sort_values(["job_id", "rank"]).reset_index(drop=True)


def test_grid_expands_to_every_combination_with_stable_ids():
    grid = parse_grid({**GRID, "trainers": [None, "megatron-core"], "precisions": ["bf16"]})
    jobs = expand(grid)
    assert len(jobs) == 2 * 3 * 1 * 1 * 2 * 1
    assert len({j["job_id"] for j in jobs}) == len(jobs)
    assert jobs[0] == {**jobs[0], "model": "gpt3-350m", "cluster": "dgx-a100-80gb", "nodes": 1,
                       "trainer": None, "searcher": "auto", "top": 2}
    assert all(j["job_id"] == job_id(j) for j in jobs)
    assert expand(grid) == jobs  # the same grid gives the same jobs, ids included
    assert all(isinstance(v, (str, int, float, type(None))) for j in jobs for v in j.values())


@pytest.mark.parametrize("bad,field", [
    ({"modles": ["gpt3-350m"]}, "grid"),
    ({"global_batches": [0]}, "grid.global_batches"),
    ({"clusters": [{"cluster": "dgx-h100", "nodes": [-1]}]}, "grid.clusters.nodes"),
    ({"searcher": "magic"}, "grid.searcher"),
    ({"precisions": ["int4"]}, "grid"),
    ({"seq_lens": list(range(1, 1001)), "global_batches": list(range(1, 1001))}, "grid"),
])
def test_bad_grids_are_refused_by_name(bad, field):
    with pytest.raises(SpecError) as err:
        parse_grid({**GRID, **bad})
    assert err.value.field.startswith(field)
    assert "\n" not in str(err.value)


def test_unknown_names_are_refused_before_the_sweep():
    with pytest.raises(SpecError, match="grid.models: unknown model 'gpt3-1.3b'"):
        check_names(parse_grid({**GRID, "models": ["gpt3-1.3b"]}))
    with pytest.raises(SpecError, match="grid.trainers"):
        check_names(parse_grid({**GRID, "trainers": ["megatron-9000"]}))


def test_repeated_grid_values_and_huge_tables_are_refused():
    with pytest.raises(SpecError, match="grid.models lists 'gpt3-350m' twice"):
        parse_grid({**GRID, "models": ["gpt3-350m", "gpt3-350m"]})
    with pytest.raises(SpecError, match="grid.clusters lists 'dgx-h100' with nodes 1 twice"):
        parse_grid({**GRID, "clusters": [{"cluster": "dgx-h100", "nodes": [1]},
                                         {"cluster": "dgx-h100", "nodes": [2, 1]}]})
    big = {**GRID, "global_batches": list(range(1, 401)), "seq_lens": list(range(1, 51))}
    with pytest.raises(SpecError) as err:  # 2 x 3 x 400 x 50 = 120,000 jobs
        parse_grid(big)
    assert err.value.field == "grid" and str(MAX_JOBS) in str(err.value)


def test_rows_are_plain_json_values():
    import numpy as np

    from paraplan.fleet.jobs import _plain

    row = _plain({"a": np.float64("nan"), "b": np.int64(3), "c": float("inf"), "d": "x"})
    assert row == {"a": None, "b": 3, "c": None, "d": "x"} and type(row["b"]) is int
    json.dumps(run_job(expand(parse_grid(GRID))[0]), allow_nan=False)


def test_a_job_is_its_best_search_and_a_bad_combination_is_a_row():
    jobs = expand(parse_grid({**GRID, "models": ["gpt3-350m", "llama3-405b"]}))
    ok = run_job(jobs[0])
    assert [r["rank"] for r in ok] == [1, 2] and all(r["status"] == "ok" for r in ok)
    first = ok[0]
    assert first["tokens_per_s"] == pytest.approx(64 * 2048 / first["step_time_s"])
    assert first["usd_per_million_tokens"] == pytest.approx(
        first["usd_per_hour"] / (first["tokens_per_s"] * 3600) * 1e6)
    assert first["time_to_train_days"] == pytest.approx(3e11 / first["tokens_per_s"] / 86400)
    too_big = run_job(next(j for j in jobs if j["model"] == "llama3-405b"))
    assert len(too_big) == 1 and too_big[0]["status"] == "failed"
    assert "no plan fits" in too_big[0]["reason"] and too_big[0]["plan"] is None


def test_serial_sweep_stores_every_job_and_resumes_without_repeating(tmp_path):
    jobs = expand(parse_grid(GRID))
    out = tmp_path / "res.csv"
    store = ResultStore(out, jobs, resume=False)
    seen = []
    summary = run_sweep(jobs[:2], store, backend="serial", progress=lambda d, n: seen.append(d))
    assert summary.ran == 2 and seen[-1] == 2
    with pytest.raises(SpecError, match="--resume"):
        ResultStore(out, jobs, resume=False)
    with pytest.raises(SpecError, match="another grid"):
        ResultStore(out, jobs[:3], resume=True)
    again = ResultStore(out, jobs, resume=True)
    summary = run_sweep(jobs, again, backend="serial")
    assert (summary.skipped, summary.ran, summary.jobs) == (2, len(jobs) - 2, len(jobs))
    written = again.write_table(COLUMNS, INT_COLUMNS)
    frame = _table(out)
    assert written == [out] and list(frame.columns) == list(COLUMNS)
    assert len(frame) == 2 * len(jobs) and set(frame["status"]) == {"ok"}
    assert frame.groupby("job_id").size().eq(2).all()  # nothing lost, nothing twice


def _kill_and_resume(tmp_path: Path, backend: list[str], min_parts: int) -> None:
    """Run a 36-job sweep, SIGKILL its driver (and what it started) once ``min_parts`` jobs
    are stored, resume it, and compare with an uninterrupted serial run."""
    grid = tmp_path / "grid.yaml"
    # 36 short jobs: the kill lands after a few of them, well before the last.
    grid.write_text(json.dumps({**GRID, "global_batches": [64, 128, 256],
                                "seq_lens": [1024, 2048]}))
    whole = tmp_path / "whole.csv"
    proc = run("sweep", "--grid", str(grid), "--out", str(whole), "--backend", "serial",
               "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ran"] == 36
    cut = tmp_path / "cut.csv"
    args = [sys.executable, "-m", "paraplan", "sweep", "--grid", str(grid), "--out", str(cut),
            *backend, "--format", "json"]
    killed = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    parts = tmp_path / "cut.csv.parts"
    deadline = time.time() + 180
    while time.time() < deadline and len(list(parts.glob("*.json"))) < min_parts:
        time.sleep(0.02)
    os.killpg(killed.pid, signal.SIGKILL)  # the driver and anything it started
    killed.wait()
    stored = len(list(parts.glob("*.json"))) - 1  # the grid manifest
    assert 3 <= stored < 36, stored
    proc = run("sweep", "--grid", str(grid), "--out", str(cut), *backend, "--resume",
               "--format", "json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["skipped"] == stored and summary["ran"] == 36 - stored
    pd.testing.assert_frame_equal(_table(cut), _table(whole))  # nothing lost or repeated


def test_cli_sweep_killed_half_way_resumes_to_the_uninterrupted_table(tmp_path):
    _kill_and_resume(tmp_path, ["--backend", "serial"], 4)


@pytest.mark.skipif(not ray_available(), reason="Ray is the fleet extra (paraplan[fleet])")
def test_ray_driver_killed_half_way_resumes_to_the_serial_table(tmp_path):
    _kill_and_resume(tmp_path, ["--backend", "ray", "--workers", "2"], 5)


def test_bad_options_are_refused_before_anything_is_written(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(json.dumps(GRID))
    out = tmp_path / "r.csv"
    for extra, field in ((["--workers", "0"], "--workers"),
                         (["--backend", "magic"], "--backend"),
                         (["--backend", "serial", "--workers", "2"], "--workers"),
                         (["--plot", str(tmp_path / "p.txt")], "--plot"),
                         (["--plot", str(tmp_path / "r.csv")], "--plot")):
        proc = run("sweep", "--grid", str(grid), "--out", str(out), *extra)
        assert proc.returncode == 2 and field in proc.stderr, (extra, proc.stderr)
        assert not (tmp_path / "r.csv.parts").exists() and not out.exists()
    (tmp_path / "r.csv.parts").write_text("not a folder")
    proc = run("sweep", "--grid", str(grid), "--out", str(out), "--backend", "serial")
    assert proc.returncode == 2 and "is not a folder" in proc.stderr
    (tmp_path / "r.csv.parts").unlink()
    (tmp_path / "r.csv.parts").mkdir()  # left by a run killed before its first job
    proc = run("sweep", "--grid", str(grid), "--out", str(out), "--backend", "serial")
    assert proc.returncode == 0, proc.stderr


def test_cli_sweep_bad_input_is_one_line(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("models: [gpt3-350m]\nclusters: [{cluster: dgx-h100}]\n"
                    "global_batches: [64]\nseq_lens: [2048]\nsearcher: magic\n")
    proc = run("sweep", "--grid", str(grid), "--out", str(tmp_path / "r.csv"))
    assert proc.returncode == 2 and "grid.searcher" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    grid.write_text(json.dumps(GRID))
    proc = run("sweep", "--grid", str(grid), "--out", str(tmp_path / "r.txt"))
    assert proc.returncode == 2 and "--out" in proc.stderr


@pytest.mark.skipif(not ray_available(), reason="Ray is the fleet extra (paraplan[fleet])")
def test_ray_sweep_gives_the_serial_results(tmp_path):
    jobs = expand(parse_grid(GRID))
    tables = []
    for backend in ("serial", "ray"):
        out = tmp_path / f"{backend}.parquet"
        store = ResultStore(out, jobs, resume=False)
        summary = run_sweep(jobs, store, backend=backend,
                            workers=2 if backend == "ray" else None)
        assert summary.backend == backend and summary.ran == len(jobs)
        store.write_table(COLUMNS, INT_COLUMNS)
        tables.append(pd.read_parquet(out).sort_values(["job_id", "rank"])
                      .reset_index(drop=True))
    pd.testing.assert_frame_equal(tables[0], tables[1])


def test_cli_sweep_plots_cost_against_time_and_scaling(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(json.dumps(GRID))
    plot = tmp_path / "sweep.png"
    proc = run("sweep", "--grid", str(grid), "--out", str(tmp_path / "r.csv"), "--backend",
               "serial", "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    for path in (plot, tmp_path / "sweep-scaling.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in proc.stderr and "jobs/s" in proc.stderr
