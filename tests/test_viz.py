"""Figures (memory, timeline, topology, sensitivity), the Chrome trace, what-if sweeps and
their CLI flags (through the real entry point)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from paraplan import load_cluster, load_model, simulate
from paraplan.simulator.pipeline import simulate_pipeline
from paraplan.specs.errors import SpecError
from paraplan.specs.loaders import cluster_from_dict
from paraplan.specs.plan import parse_plan
from paraplan.specs.training import TrainingSpec
from paraplan.sweep import COLUMNS, sweep
from paraplan.viz.memory import memory_figure
from paraplan.viz.sensitivity import sensitivity_figure
from paraplan.viz.timeline import save_figure, timeline_figure
from paraplan.viz.topology import topology_figure, topology_graph
from paraplan.viz.trace import PIPELINE_PID, chrome_trace, write_chrome_trace
from tests.test_cli import CMD

TRAINING = TrainingSpec(global_batch_size=64, seq_len=2048)
SIM_ARGS = ["--model", "gpt3-350m", "--cluster", "dgx-h100", "--nodes", "2",
            "--global-batch", "64", "--seq-len", "2048"]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PARAPLAN_DEBUG"}
    env["COLUMNS"] = "120"
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=120, env=env)


def assert_real_png(path: Path, min_kb: float = 8, min_colors: int = 12) -> None:
    """A PNG that is more than a blank canvas: size, pixel variance, distinct colours."""
    assert path.is_file() and path.stat().st_size > min_kb * 1024, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    rgb = img[..., :3]
    assert float(rgb.std()) > 0.03
    q = (rgb * 255).astype(np.uint32)
    colors = np.unique((q[..., 0] << 16) | (q[..., 1] << 8) | q[..., 2])
    assert colors.size > min_colors
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".paraplan-")]


@pytest.fixture(scope="module")
def gpt350m():
    return load_model("gpt3-350m")


@pytest.fixture(scope="module")
def two_nodes():
    return load_cluster("dgx-h100", nodes=2)


def report_of(model, cluster, plan: str, training: TrainingSpec = TRAINING) -> dict:
    return simulate(model, cluster, training, parse_plan(plan)).to_dict()


# ---- memory and timeline figures --------------------------------------------------------------
def test_memory_and_timeline_figures(tmp_path, gpt350m, two_nodes):
    rep = report_of(gpt350m, two_nodes, "tp=2,pp=4,mbs=1")
    fig = memory_figure(rep)
    ax = fig.axes[0]
    assert "worst" in " ".join(t.get_text() for t in ax.texts)
    assert any(line.get_linestyle() == "--" for line in ax.get_lines())  # capacity line
    save_figure(fig, tmp_path / "memory.png")
    assert_real_png(tmp_path / "memory.png")
    fig = timeline_figure(rep)
    assert len(fig.axes) == 2
    assert fig.axes[1].get_ylabel() == ax.get_ylabel() == "GiB per GPU"  # one drawing function
    assert "worst" in " ".join(t.get_text() for t in fig.axes[1].texts)
    save_figure(fig, tmp_path / "timeline.png")
    assert_real_png(tmp_path / "timeline.png", min_kb=20)


def test_memory_figure_of_a_plan_that_does_not_fit(tmp_path):
    rep = report_of(load_model("llama2-7b"), load_cluster("dgx-a100-80gb"), "tp=1,pp=1,mbs=4",
                    TrainingSpec(global_batch_size=32, seq_len=4096))
    assert not rep["feasible"] and rep["memory_gb"]["peak"] > rep["memory_capacity_gb"]
    save_figure(memory_figure(rep), tmp_path / "oom.png")
    assert_real_png(tmp_path / "oom.png")
    with pytest.raises(SpecError, match="feasible"):
        timeline_figure(rep)


def test_save_figure_bad_path_is_spec_error(tmp_path, gpt350m, two_nodes):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpecError) as err:
        save_figure(memory_figure(report_of(gpt350m, two_nodes, "tp=8,pp=1,mbs=1")),
                    blocker / "sub" / "m.png")
    assert err.value.field == "--plot"


# ---- topology ------------------------------------------------------------------------------
def test_topology_graph_collapses_big_groups():
    small = topology_graph(load_cluster("dgx-h100", nodes=3))
    boxes = [d for _, d in small.nodes(data=True) if d["kind"] == "nodes"]
    assert len(boxes) == 3 and all(b["count"] == 1 for b in boxes)
    nic = [d for _, _, d in small.edges(data=True) if d["tier"] == "nic"]
    assert len(nic) == 3 and "400 Gb/s" in nic[0]["label"]
    big = topology_graph(load_cluster("dgx-h100", nodes=512))
    boxes = [d for _, d in big.nodes(data=True) if d["kind"] == "nodes"]
    assert len(boxes) == 1 and boxes[0]["count"] == 512 and "x 512 nodes" in boxes[0]["label"]
    world = topology_graph(load_cluster("dtfm-worldwide"))
    assert sum(d["kind"] == "fabric" for _, d in world.nodes(data=True)) == 8
    wan = [d for _, _, d in world.edges(data=True) if d["tier"] == "wan"]
    assert len(wan) == 28 and all("Gb/s" in d["label"] and "ms" in d["label"] for d in wan)


def mixed_cluster():
    return cluster_from_dict({"name": "mixed", "node_groups": [
        {"name": "h100s", "gpu": "h100-sxm", "gpus_per_node": 8, "num_nodes": 2,
         "intra_node_link": "nvlink4", "inter_node_link": "ib-ndr", "nics_per_node": 8,
         "region": "east"},
        {"name": "a100s", "gpu": "a100-sxm-80gb", "gpus_per_node": 8, "num_nodes": 40,
         "intra_node_link": "nvlink3", "inter_node_link": "ib-hdr", "nics_per_node": 8,
         "region": "west"}],
        "region_links": [{"a": "east", "b": "west", "latency_ms": 35, "bandwidth_Gbps": 100}]})


@pytest.mark.parametrize("name", ["dgx-h100", "dtfm-worldwide", "mixed"])
def test_topology_figure(tmp_path, name):
    cluster = mixed_cluster() if name == "mixed" else load_cluster(
        name, nodes=4 if name == "dgx-h100" else None)
    fig = topology_figure(cluster)
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    if name == "dtfm-worldwide":
        assert len(fig.axes) == 3  # the drawing, the WAN matrix and its colour bar
        assert "Tokyo" in texts or "Tokyo" in str([a.get_yticklabels() for a in fig.axes])
    if name == "mixed":
        assert "x 40 nodes" in texts and "WAN 100 Gb/s, 35 ms" in texts
        assert "nvlink3 300 GB/s/GPU" in texts
    save_figure(fig, tmp_path / f"{name}.png")
    assert_real_png(tmp_path / f"{name}.png")


# ---- Chrome trace --------------------------------------------------------------------------
@pytest.mark.parametrize("plan, passes", [
    ("tp=2,pp=4,mbs=1", 2),
    ("tp=2,pp=4,mbs=1,schedule=gpipe", 2),
    ("tp=2,pp=4,mbs=1,schedule=zb-h1", 3),
    ("tp=2,pp=4,mbs=1,schedule=interleaved,vpp=2", 4),
    ("tp=2,pp=4,mbs=2,layers=4/8/8/4", 2),
])
def test_chrome_trace(gpt350m, two_nodes, plan, passes):
    rep = report_of(gpt350m, two_nodes, plan)
    trace = chrome_trace(rep)
    json.dumps(trace)  # serializable
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    p, m = len(rep["stage_forward_s"]), rep["num_microbatches"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == PIPELINE_PID}
    assert names == {i: f"stage {i}" for i in range(p)}
    pipe = [e for e in events if e["ph"] == "X" and e["pid"] == PIPELINE_PID]
    for stage in range(p):
        mine = sorted((e for e in pipe if e["tid"] == stage), key=lambda e: e["ts"])
        compute = [e for e in mine if e["cat"] == "compute"]
        assert len(compute) == m * passes
        assert all(e["name"].startswith(f"{e['args']['kind'][0].upper()} mb") for e in compute)
        assert {e["args"]["microbatch"] for e in compute} == set(range(m))
        sends = [e for e in mine if e["cat"] == "p2p"]
        assert len(sends) == sum(e["name"][0] != "W" for e in compute)
        for a, b in zip(mine, mine[1:], strict=False):  # no overlap within a stage
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-6, (a, b)
    span_s = (max(e["ts"] + e["dur"] for e in pipe) - min(e["ts"] for e in pipe)) / 1e6
    v = rep["plan"]["virtual_stages"]
    expected = simulate_pipeline(rep["plan"]["schedule"], rep["stage_forward_s"],
                                 rep["stage_backward_s"], m, v=v, t_w=rep["stage_wgrad_s"],
                                 t_p2p=rep["pp_p2p_s"], record_events=False).total_s
    assert span_s == pytest.approx(expected, abs=1e-6)
    if "layers" in plan:  # uneven split: the report's pipeline span is the event simulation
        t = rep["time_s"]
        assert rep["tied_embedding_s"] > 0  # gpt3-350m ties its embedding
        assert span_s == pytest.approx(rep["step_time_s"] - t["dp_comm"] - t["optimizer"]
                                       - rep["tied_embedding_s"], abs=1e-6)


def test_write_chrome_trace_and_infeasible(tmp_path, gpt350m, two_nodes):
    rep = report_of(gpt350m, two_nodes, "tp=8,pp=1,mbs=1")
    (tmp_path / "t").mkdir()
    path = write_chrome_trace(rep, tmp_path / "t" / "trace.json")
    data = json.loads(path.read_text())
    assert [e for e in data["traceEvents"] if e.get("cat") == "p2p"] == []  # pp=1: no sends
    assert os.listdir(tmp_path / "t") == ["trace.json"]
    bad = report_of(gpt350m, two_nodes, "tp=3,pp=1,mbs=1")
    with pytest.raises(SpecError):
        chrome_trace(bad)


# ---- sweeps --------------------------------------------------------------------------------
def test_sweep_fixed_plan_bandwidth_is_monotonic(tmp_path, gpt350m):
    cluster = load_cluster("dgx-a100-80gb", nodes=2)
    values = [0.01, 0.1, 0.5, 1, 4]
    frame = sweep(gpt350m, cluster, TRAINING, parameter="inter_node_bandwidth", values=values,
                  plan="tp=2,pp=2,mbs=1")
    assert list(frame.columns) == list(COLUMNS)
    for col in ("parameter", "value", "feasible", "reason", "plan", "step_time_s",
                "tokens_per_s", "mfu", "memory_peak_gb", "compute_s", "bubble_s", "tp_comm_s",
                "cp_comm_s", "ep_comm_s", "pp_comm_s", "dp_comm_s", "optimizer_s"):
        assert col in frame.columns
    assert frame["feasible"].all() and list(frame["value"]) == values
    steps = list(frame["step_time_s"])
    assert all(b <= a * (1 + 1e-12) for a, b in zip(steps, steps[1:], strict=False))
    assert steps[0] > 1.5 * steps[-1]  # a 100x slower network shows
    base = cluster.node_groups[0].inter_node_link.bandwidth_GBps
    assert list(frame["inter_node_bandwidth_GBps"]) == pytest.approx([base * x for x in values])
    parts = frame[[f"{k}_s" for k in ("compute", "bubble", "tp_comm", "cp_comm", "ep_comm",
                                       "pp_comm", "dp_comm", "optimizer")]].sum(axis=1)
    assert list(parts) == pytest.approx(steps, rel=1e-9)
    save_figure(sensitivity_figure(frame), tmp_path / "sens.png")
    assert_real_png(tmp_path / "sens.png", min_kb=20)


def test_sweep_keeps_infeasible_rows_and_searches(tmp_path):
    model = load_model("llama2-7b")
    training = TrainingSpec(global_batch_size=64, seq_len=4096)
    fixed = sweep(model, "dgx-h100", training, parameter="num_nodes", values=[1, 2, 4],
                  plan="tp=8,pp=2,mbs=1")
    assert list(fixed["feasible"]) == [False, True, True]
    assert "divide" in fixed["reason"][0] and math.isnan(fixed["step_time_s"][0])
    assert list(fixed["num_gpus"]) == [8, 16, 32]
    assert fixed["step_time_s"][2] < fixed["step_time_s"][1]
    calls: list[tuple[int, int]] = []
    best = sweep(model, "dgx-h100", training, parameter="global_batch", values=[16, 64],
                 progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 2), (2, 2)]
    assert best["feasible"].all() and (best["searcher"] == "exhaustive").all()
    assert list(best["global_batch"]) == [16, 64] and all(best["plan"].str.contains("tp="))
    assert best["step_time_s"][1] > best["step_time_s"][0]
    fig = sensitivity_figure(fixed)
    assert any("does not run" in t.get_text() for a in fig.axes for t in a.texts)
    save_figure(fig, tmp_path / "fixed.png")
    assert_real_png(tmp_path / "fixed.png")


@pytest.mark.parametrize("kwargs, field", [
    ({"parameter": "bandwidth", "values": [1]}, "parameter"),
    ({"parameter": "num_nodes", "values": []}, "values"),
    ({"parameter": "num_nodes", "values": [2, 1.5]}, "values[1]"),
    ({"parameter": "global_batch", "values": [True]}, "values[0]"),
    ({"parameter": "inter_node_bandwidth", "values": [0]}, "values[0]"),
    ({"parameter": "inter_node_bandwidth", "values": [float("nan")]}, "values[0]"),
    ({"parameter": "inter_node_bandwidth", "values": [1], "searcher": "magic"}, "searcher"),
    ({"parameter": "global_batch", "values": [10**9], "plan": "tp=1"}, "training"),
])
def test_sweep_bad_input_is_spec_error(gpt350m, two_nodes, kwargs, field):
    with pytest.raises(SpecError) as err:
        sweep(gpt350m, two_nodes, TRAINING, **kwargs)
    assert err.value.field is not None and err.value.field.startswith(field)
    if field.startswith("values["):  # names the parameter, the value and what is allowed
        assert kwargs["parameter"] in str(err.value) and err.value.allowed


def test_sweep_num_nodes_needs_one_node_type(gpt350m):
    with pytest.raises(SpecError, match="node group"):
        sweep(gpt350m, "dtfm-spot", TRAINING, parameter="num_nodes", values=[2], plan="tp=1")


def test_sensitivity_figure_bad_frame():
    import pandas as pd

    with pytest.raises(SpecError):
        sensitivity_figure(pd.DataFrame({"value": [1]}))


# ---- CLI -----------------------------------------------------------------------------------
def test_cli_simulate_trace_and_plot(tmp_path):
    trace, plot = tmp_path / "out" / "t.json", tmp_path / "out" / "tl.png"
    trace.parent.mkdir()
    res = run("simulate", *SIM_ARGS, "--plan", "tp=2,pp=4,mbs=1", "--trace", str(trace),
              "--plot", str(plot), "--format", "json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    data = json.loads(trace.read_text())
    compute = [e for e in data["traceEvents"] if e.get("cat") == "compute"]
    assert len(compute) == 4 * 2 * report["num_microbatches"]
    assert_real_png(plot, min_kb=20)


@pytest.mark.parametrize("args, field", [
    (["simulate", *SIM_ARGS, "--plan", "tp=2,pp=4,mbs=1", "--trace", "t.txt"], "--trace"),
    (["simulate", *SIM_ARGS, "--plan", "tp=3,pp=1,mbs=1", "--trace", "t.json"], "--trace"),
    (["best", *SIM_ARGS, "--plot", "best.gif"], "--plot"),
    (["describe", "--cluster", "dgx-h100", "--plot", "topo.txt"], "--plot"),
    (["describe", "--model", "gpt3-125m", "--plot", "topo.png"], "--plot"),
])
def test_cli_bad_output_paths_exit_2(tmp_path, args, field):
    args = [str(tmp_path / a) if a.endswith((".txt", ".json", ".gif", ".png")) else a
            for a in args]
    res = run(*args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error:") and field in res.stderr
    assert "Traceback" not in res.stderr and list(tmp_path.iterdir()) == []


def test_cli_best_plot_and_describe_plot(tmp_path):
    best_png = tmp_path / "best.png"
    res = run("best", *SIM_ARGS, "--top", "2", "--plot", str(best_png), "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["plans"] and best_png.is_file()
    assert_real_png(best_png, min_kb=15)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.png"]  # one figure, no extras
    topo = tmp_path / "topo.png"
    res = run("describe", "--cluster", "dtfm-multi-university", "--plot", str(topo))
    assert res.returncode == 0, res.stderr
    assert f"wrote {topo}" in res.stderr
    assert_real_png(topo)
