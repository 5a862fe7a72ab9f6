"""Search speed: plans evaluated per second and time to the best plan (2-core VM numbers go in
the README). Each case runs in a fresh process state (caches cleared) three times; the median
is reported.

Run: python benchmarks/bench_search.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

from paraplan import TrainingSpec, load_cluster, load_model
from paraplan.search import search
from paraplan.search.space import build_space, evaluate_space
from paraplan.simulator import step

CASES = [
    # model, cluster preset, nodes, global batch, seq len
    ("gpt3-175b", "dgx-a100-80gb", 16, 1536, 2048),
    ("llama3-405b", "dgx-h100", 2048, 2048, 8192),
    ("mixtral-8x22b", "dgx-h100", 64, 1024, 4096),
]


def _fresh(cluster_name: str, nodes: int):
    step._pipeline_span.cache_clear()
    return load_cluster(cluster_name, nodes=nodes)  # a new Topology (empty memo)


def bench(case: tuple, searcher: str, repeats: int) -> dict:
    name, cluster_name, nodes, batch, seq = case
    model = load_model(name)
    tr = TrainingSpec(global_batch_size=batch, seq_len=seq)
    evals, totals, result = [], [], None
    for _ in range(repeats):
        cl = _fresh(cluster_name, nodes)
        t0 = time.perf_counter()
        space = build_space(model, cl, tr)
        evaluate_space(space, exact_interleaved=False)
        evals.append((time.perf_counter() - t0, len(space), space.considered))
        cl = _fresh(cluster_name, nodes)
        t0 = time.perf_counter()
        result = search(model, cl, tr, searcher=searcher, top=10)
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
    args = ap.parse_args()
    repeats = 1 if args.quick else 3
    searchers = ("exhaustive",) if args.quick else ("exhaustive", "dp")
    print("| case | searcher | legal plans | grid plans | build+evaluate | legal plans/s "
          "| grid plans/s | time to best | best plan | step | MFU |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for case in CASES:
        for s in searchers:
            r = bench(case, s, repeats)
            print(f"| {r['case']} | {s} | {r['legal_plans']:,} | {r['grid_plans']:,} | "
                  f"{r['build_and_evaluate_s']:.2f} s | {r['legal_plans_per_s']:,.0f} | "
                  f"{r['grid_plans_per_s']:,.0f} | {r['time_to_best_s']:.2f} s | "
                  f"`{r['best']}` | {r['best_step_s']:.2f} s | {100 * r['best_mfu']:.1f}% |",
                  flush=True)


if __name__ == "__main__":
    main()
