"""Pareto fronts: the dominance filter against brute force, and fronts from the evaluator."""

from __future__ import annotations

import json
import subprocess

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from paraplan import TrainingSpec, load_cluster, load_model, search
from paraplan.search.pareto import pareto_front, pareto_mask
from tests.test_cli import run


@settings(max_examples=150, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 40), st.just(3)),
              elements=st.integers(0, 6).map(float)))
def test_pareto_mask_matches_brute_force(obj: np.ndarray) -> None:
    maximize = (True, True, False)
    signed = np.where(np.array(maximize), obj, -obj)
    want = np.array([not any(np.all(signed[j] >= signed[i]) and np.any(signed[j] > signed[i])
                             for j in range(len(obj))) for i in range(len(obj))])
    assert (pareto_mask(obj, maximize) == want).all()


def test_front_is_nondominated_and_holds_the_fastest_plan() -> None:
    model, cl = load_model("llama3-8b"), load_cluster("dgx-h100")
    tr = TrainingSpec(global_batch_size=128, seq_len=4096)
    pts = pareto_front(model, cl, tr, nodes=[1, 2])
    assert pts
    obj = np.array([[p.tokens_per_s, p.headroom_gib, p.dollars_per_hour] for p in pts])
    assert pareto_mask(obj, (True, True, False)).all()
    fastest = search(model, cl.with_nodes(2), tr, top=1).best
    assert max(p.tokens_per_s for p in pts) == fastest.tokens_per_s
    cheapest = min(p.dollars_per_hour for p in pts)
    assert cheapest == 8 * cl.gpu.price_per_hour_usd


def test_pareto_cli(tmp_path) -> None:
    png = tmp_path / "front.png"
    res = run("pareto", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1,2",
              "--global-batch", "64", "--seq-len", "4096", "--format", "json", "--plot",
              str(png), "--limit", "5")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert 1 <= len(data["points"]) <= 5 and png.stat().st_size > 1000
    bad = run("pareto", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "x",
              "--global-batch", "64", "--seq-len", "4096")
    assert bad.returncode == 2 and "--nodes" in bad.stderr
    assert isinstance(bad, subprocess.CompletedProcess)
