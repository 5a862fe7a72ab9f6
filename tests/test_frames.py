"""DataFrames from the Python API: ``SearchResult.to_frame`` and ``StepReport.to_frame``.

Checked by hand: every frame value is the report dict value it came from, and rows follow
the searcher's rank order.
"""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from paraplan import TrainingSpec, load_cluster, load_model, parse_plan, search, simulate
from paraplan.search.exhaustive import TIME_PARTS
from paraplan.simulator.step import MEMORY_KEYS, TIME_KEYS


@pytest.fixture(scope="module")
def result():
    """Top 5 plans of Llama-3-8B on 2 DGX H100 nodes (an exhaustive search, ~0.1 s)."""
    return search(load_model("llama3-8b"), load_cluster("dgx-h100", nodes=2),
                  TrainingSpec(global_batch_size=64, seq_len=4096), top=5)


@pytest.fixture(scope="module")
def pipelined():
    """A hand-written pipelined plan with TP, so most time parts are non-zero."""
    return simulate(load_model("llama3-70b"), load_cluster("dgx-h100", nodes=4),
                    TrainingSpec(global_batch_size=64, seq_len=4096),
                    parse_plan("tp=8,pp=4,mbs=1,sp=1,rc=selective"))


def test_search_frame_has_one_row_per_plan_in_rank_order(result):
    frame = result.to_frame()
    assert isinstance(frame, pd.DataFrame)
    assert len(frame) == len(result.reports) == 5
    assert frame["rank"].tolist() == [1, 2, 3, 4, 5]
    assert frame["step_time_s"].tolist() == [r.step_time_s for r in result.reports]
    assert frame["step_time_s"].is_monotonic_increasing
    assert frame["plan"].tolist() == [r.extra["plan_short"] for r in result.reports]


def test_search_frame_values_equal_report_dicts(result):
    frame = result.to_frame()
    plans = result.to_dict()["plans"]
    for row, rep in zip(frame.to_dict("records"), plans, strict=True):
        for field in ("tp", "pp", "dp", "cp", "ep", "zero_stage", "micro_batch_size",
                      "schedule", "recompute", "virtual_stages", "sequence_parallel"):
            assert row[field] == rep["plan"][field], field
        assert row["step_time_s"] == rep["step_time_s"]
        assert row["tokens_per_s"] == rep["tokens_per_s"]
        assert row["mfu"] == rep["mfu"]
        assert row["memory_peak_gb"] == rep["memory_gb"]["peak"]
        assert row["memory_headroom_gb"] == rep["memory_headroom_gb"]
        assert row["num_microbatches"] == rep["num_microbatches"]
        assert row["feasible"] is True
        assert row["placed"] is False
        for part in TIME_PARTS:
            assert row[f"{part}_s"] == rep["time_s"][part], part


def test_search_frame_columns(result):
    frame = result.to_frame()
    assert set(TIME_PARTS) == set(TIME_KEYS)
    assert list(frame.columns[:3]) == ["rank", "plan", "tp"]
    for col in ("tp", "pp", "dp", "cp", "ep", "zero_stage", "micro_batch_size", "schedule",
                "recompute", "step_time_s", "tokens_per_s", "mfu", "memory_peak_gb",
                "feasible", *(f"{p}_s" for p in TIME_PARTS)):
        assert col in frame.columns, col
    assert "placement" not in frame.columns  # a list per rank: summarised by "placed"


def test_empty_search_result_frame_keeps_columns(result):
    from paraplan.search.exhaustive import SearchResult

    empty = SearchResult("exhaustive", 0, 0.0, [], None).to_frame()
    assert empty.empty
    assert list(empty.columns) == list(result.to_frame().columns)


def test_layers_per_stage_is_a_string(pipelined):
    from paraplan.search.exhaustive import SearchResult

    rep = simulate(load_model("llama3-70b"), load_cluster("dgx-h100", nodes=4),
                   TrainingSpec(global_batch_size=64, seq_len=4096),
                   parse_plan("tp=8,pp=4,mbs=1,sp=1,rc=selective,layers=19/21/21/19"))
    frame = SearchResult("manual", 2, 0.0, [pipelined, rep], None).to_frame()
    assert pd.isna(frame.loc[0, "layers_per_stage"])  # even split: None in the plan
    assert frame.loc[1, "layers_per_stage"] == "19/21/21/19"
    assert frame["pp"].tolist() == [4, 4]


def test_step_frame_is_tidy_and_equals_report(pipelined):
    frame = pipelined.to_frame()
    assert list(frame.columns) == ["category", "part", "value", "unit"]
    assert len(frame) == len(TIME_KEYS) + len(MEMORY_KEYS)
    time = frame[frame["category"] == "time"]
    memory = frame[frame["category"] == "memory"]
    assert time["part"].tolist() == list(pipelined.time_s)
    assert time["value"].tolist() == list(pipelined.time_s.values())
    assert set(time["unit"]) == {"s"}
    assert memory["part"].tolist() == list(pipelined.memory_gb)
    assert memory["value"].tolist() == list(pipelined.memory_gb.values())
    assert set(memory["unit"]) == {"GiB"}
    # By hand: the pipelined TP plan spends time on compute, TP, the bubble and p2p.
    values = time.set_index("part")["value"]
    for part in ("compute", "tp_comm", "bubble", "pp_comm"):
        assert values[part] > 0, part


def test_step_frame_of_an_infeasible_plan():
    rep = simulate(load_model("llama3-8b"), load_cluster("dgx-h100"),
                   TrainingSpec(global_batch_size=8, seq_len=4096), parse_plan("tp=3"))
    assert not rep.feasible
    frame = rep.to_frame()
    assert frame.loc[frame["category"] == "time", "value"].eq(0.0).all()
    assert len(frame) == len(TIME_KEYS) + len(MEMORY_KEYS)


def test_simulator_does_not_import_pandas_at_import_time():
    code = ("import sys, paraplan.simulator.step, paraplan.search.exhaustive; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
