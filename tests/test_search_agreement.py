"""The searchers agree: on small homogeneous instances the ILP and the DP return the exhaustive
optimum (or beat it with an exact uneven layer split the exhaustive grid does not hold)."""

from __future__ import annotations

import pytest

from paraplan import TrainingSpec, load_cluster, load_model, simulate
from paraplan.search import search
from paraplan.specs.plan import ParallelPlan

CASES = [
    # model, cluster, nodes, global batch, seq len  (<= 64 GPUs each)
    ("gpt3-350m", "dgx-a100-40gb", 2, 64, 2048),
    ("gpt3-2.7b", "dgx-a100-80gb", 4, 128, 2048),
    ("llama2-7b", "dgx-h100", 8, 256, 4096),
    ("gpt3-760m", "aws-p3.16xlarge", 4, 64, 2048),
]


@pytest.mark.parametrize(("model", "cluster", "nodes", "batch", "seq"), CASES)
def test_ilp_and_dp_match_or_beat_the_exhaustive_optimum(model, cluster, nodes, batch, seq):
    m = load_model(model)
    c = load_cluster(cluster, nodes=nodes)
    tr = TrainingSpec(global_batch_size=batch, seq_len=seq,
                      precision="fp16" if "p3" in cluster else "bf16")
    fix = "schedule=1f1b,vpp=1"  # the ILP's schedule; the others search the same space
    ex, dp, ilp = (search(m, c, tr, searcher=s, top=1, fix=fix).best
                   for s in ("exhaustive", "dp", "ilp"))
    # The DP and the ILP split layers exactly; the exhaustive grid holds even and near-even
    # splits only. Neither may lose to it. Both objectives are blind to the order of the
    # stages' layer counts, which the 1F1B timeline is not (the ILP re-times adjacent swaps
    # of its answer), so they agree to the order effect, not to rounding (gpt3-760m on 4
    # p3.16xlarge: DP [6, 7, 7, 4] 0.8015 s, ILP [7, 7, 6, 4] 0.7993 s).
    # The ILP may also leave GPUs idle (on 4 p3.16xlarge over 25 Gb/s, one node of FSDP
    # beats every plan whose TP quads or pipeline cross the slow links): then it may beat
    # the others, which use every GPU, and its report is simulate's on the GPUs it uses.
    used = int(ilp.extra.get("num_gpus", c.num_gpus))
    assert dp.step_time_s <= ex.step_time_s * (1 + 1e-9)
    assert ilp.step_time_s <= ex.step_time_s * (1 + 1e-9)
    if used == c.num_gpus:
        assert ilp.step_time_s == pytest.approx(dp.step_time_s, rel=5e-3)
    else:
        assert ilp.step_time_s <= dp.step_time_s
    if ex.plan["pp"] == 1 and dp.plan["pp"] == 1 and used == c.num_gpus:
        assert ilp.step_time_s == pytest.approx(ex.step_time_s, rel=1e-12)  # the same optimum
    gpn = c.node_groups[0].gpus_per_node
    for rep, cl in ((ex, c), (dp, c), (ilp, load_cluster(cluster, nodes=used // gpn))):
        again = simulate(m, cl, tr, ParallelPlan(**rep.plan))  # simulate's own numbers
        assert again.step_time_s == pytest.approx(rep.step_time_s, rel=1e-12)


def test_all_four_searchers_agree_on_gpt3_175b_on_16_dgx_a100():
    """Issue 4: gpt3-175b on 16 dgx-a100-80gb (global batch 1536, seq 2048): the four
    searchers' best plans are within 2% of each other."""
    model = load_model("gpt3-175b")
    cluster = load_cluster("dgx-a100-80gb", nodes=16)
    training = TrainingSpec(global_batch_size=1536, seq_len=2048)
    best = {s: search(model, cluster, training, searcher=s, top=1)
            for s in ("exhaustive", "dp", "ilp", "evolutionary")}
    times = {s: r.best.step_time_s for s, r in best.items()}
    assert max(times.values()) <= min(times.values()) * 1.02, times
    # No searcher beats the whole-space exhaustive ranking by more than rounding.
    assert min(times.values()) >= times["exhaustive"] * (1 - 1e-9)
    for r in best.values():
        assert r.baseline_step_time_s is not None and r.plans_evaluated > 0
