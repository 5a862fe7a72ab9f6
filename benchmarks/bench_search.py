"""Search speed: plans evaluated per second and time to the best plan (2-core VM numbers go in
the README). Each case runs in a fresh process state (caches cleared) three times; the median
is reported.

Run: python benchmarks/bench_search.py [--quick] [--model M] [--trainer T [--pin-moe-run]]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from paraplan import TrainingSpec, load_cluster, load_model
from paraplan.search import search
from paraplan.search.space import build_space, evaluate_space
from paraplan.simulator import step
from paraplan.specs.loaders import load_trainer

CASES = [
    # model, cluster preset, nodes, global batch, seq len
    ("gpt3-175b", "dgx-a100-80gb", 16, 1536, 2048),
    ("llama3-405b", "dgx-h100", 2048, 2048, 8192),
    ("mixtral-8x22b", "dgx-h100", 64, 1024, 4096),
    ("deepseek-v3", "dgx-h800", 256, 15360, 4096),  # DeepSeek-V3's 2048 H800 (batch 15360)
    ("deepseek-v3", "gb200-nvl72", 16, 8192, 4096),  # 16 NVL72 racks = 1152 GB200
]
HETERO = str(Path(__file__).parent / "clusters" / "hetero-1024.yaml")
HETERO_CASES = [
    # model, cluster file, global batch, seq len (fp16: the V100s have no bf16)
    ("llama2-13b", HETERO, 2048, 4096),
    ("llama2-70b", HETERO, 2048, 4096),
]


def bench_hetero(case: tuple, searcher: str, repeats: int) -> dict:
    """Mixed GPU types: no vectorized space; plans evaluated = layouts the searcher
    considered (ILP: enumerated structural choices, most pruned by a bound)."""
    name, path, batch, seq = case
    model = load_model(name)
    tr = TrainingSpec(global_batch_size=batch, seq_len=seq, precision="fp16")
    totals, result = [], None
    for _ in range(repeats):
        step._pipeline_span.cache_clear()
        cl = load_cluster(path)
        t0 = time.perf_counter()
        result = search(model, cl, tr, searcher=searcher, top=10)
        totals.append(time.perf_counter() - t0)
    t = statistics.median(totals)
    best = result.best
    kinds = ", ".join(cl.gpu_types)
    return {"case": f"{name} on {cl.num_gpus} GPUs ({kinds})", "searcher": searcher,
            "plans": result.plans_evaluated, "plans_per_s": result.plans_evaluated / t,
            "time_to_best_s": t, "best": best.extra["plan_short"],
            "best_step_s": best.step_time_s, "best_mfu": best.mfu,
            "baseline_s": result.baseline_step_time_s}


def _fresh(cluster_name: str, nodes: int):
    step._pipeline_span.cache_clear()
    return load_cluster(cluster_name, nodes=nodes)  # a new Topology (empty memo)


def bench(case: tuple, searcher: str, repeats: int, trainer: str | None = None,
          pin_moe_run: bool = False) -> dict:
    """One case. ``trainer``: search that profile's space (MoE models: under every MoE run
    setting it has, ``search.dispatch.moe_runs``); ``pin_moe_run``: only the profile's own
    setting (the dispatcher and overlap set explicitly, as ``--moe-dispatcher`` does). The
    build+evaluate column times one space (the profile's own setting)."""
    name, cluster_name, nodes, batch, seq = case
    model = load_model(name)
    tr = TrainingSpec(global_batch_size=batch, seq_len=seq)
    spec = load_trainer(trainer) if trainer else None
    if spec is not None and pin_moe_run:
        tr = tr.model_copy(update={"moe_dispatcher": spec.runs.moe_dispatcher,
                                   "moe_a2a_overlap": spec.runs.moe_a2a_overlap})
    evals, totals, result = [], [], None
    for _ in range(repeats):
        cl = _fresh(cluster_name, nodes)
        t0 = time.perf_counter()
        space = build_space(model, cl, tr, trainer=spec)
        evaluate_space(space, exact_interleaved=False)
        evals.append((time.perf_counter() - t0, len(space), space.considered))
        cl = _fresh(cluster_name, nodes)
        t0 = time.perf_counter()
        result = search(model, cl, tr, searcher=searcher, top=10, trainer=spec)
        totals.append(time.perf_counter() - t0)
    ev_s = statistics.median(e[0] for e in evals)
    legal, considered = evals[0][1], evals[0][2]
    best = result.best
    return {"case": f"{name} on {cl.num_gpus}x {cl.gpu.name}", "searcher": searcher,
            "legal_plans": legal, "grid_plans": considered,
            "build_and_evaluate_s": ev_s, "legal_plans_per_s": legal / ev_s,
            "grid_plans_per_s": considered / ev_s,
            "time_to_best_s": statistics.median(totals),
            "best": best.extra["plan_short"], "best_step_s": best.step_time_s,
            "best_mfu": best.mfu}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one repeat, exhaustive only")
    ap.add_argument("--model", help="only the cases of this model (e.g. deepseek-v3)")
    ap.add_argument("--trainer", help="search this trainer profile's space (default: every "
                    "knob, no trainer)")
    ap.add_argument("--pin-moe-run", action="store_true", help="with --trainer: only its own "
                    "MoE dispatcher and overlap setting (not every setting it has)")
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    searchers = ("exhaustive",) if args.quick else ("exhaustive", "dp")
    print("| case | searcher | legal plans | grid plans | build+evaluate | legal plans/s "
          "| grid plans/s | time to best | best plan | step | MFU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for case in CASES:
        if args.model and case[0] != args.model:
            continue
        for s in searchers:
            r = bench(case, s, repeats, args.trainer, args.pin_moe_run)
            print(f"| {r['case']} | {s} | {r['legal_plans']:,} | {r['grid_plans']:,} | "
                  f"{r['build_and_evaluate_s']:.2f} s | {r['legal_plans_per_s']:,.0f} | "
                  f"{r['grid_plans_per_s']:,.0f} | {r['time_to_best_s']:.2f} s | "
                  f"`{r['best']}` | {r['best_step_s']:.2f} s | {100 * r['best_mfu']:.1f}% |",
                  flush=True)
    if args.model:
        return
    print()
    print("| heterogeneous case | searcher | layouts considered | layouts/s | time to best "
          "| best plan | step | slowest-type / rank-order baseline | speed-up |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    het_searchers = ("ilp",) if args.quick else ("ilp", "evolutionary")
    for case in HETERO_CASES:
        for s in het_searchers:
            r = bench_hetero(case, s, repeats)
            base = r["baseline_s"]
            print(f"| {r['case']} | {s} | {r['plans']:,} | {r['plans_per_s']:,.0f} | "
                  f"{r['time_to_best_s']:.2f} s | `{r['best']}` | {r['best_step_s']:.2f} s | "
                  f"{base:.2f} s | {base / r['best_step_s']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
