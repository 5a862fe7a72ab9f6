# ruff: noqa: B023, F821  (closures are called at once, inside their loop iteration)
"""Sustained GEMM tables and kernel efficiencies on one NVIDIA GPU (run on the lent H200).

Each GEMM shape is captured in a CUDA graph (enough calls for ~20 ms of work, so launch gaps
are a busy stream's, not Python's) and replayed for ``--seconds-per-shape``; the last half is
timed with CUDA events. A 4 s 8192^3 warm-up first brings the GPU to its power-limited clock,
so big shapes are measured where training runs them (the SM clock is recorded). bf16 through
``torch.matmul`` (cuBLAS) and fp8 e4m3 through ``torch._scaled_mm`` (cuBLASLt, per-tensor
scales, bf16 out: Transformer Engine's Hopper fp8 GEMM). Writes one JSON (``--out``).
(The run of 2026-11-28 also tried attention and memory-bound kernels here under CUDA graphs;
they failed under capture and were measured by ``measure_h200_kernels.py`` instead, so those
sections are gone; results/h200_gemm_tables_2026-11-28.json keeps their error records.)
"""

from __future__ import annotations

import argparse
import subprocess
import time

import torch
from common import heat, run_sections

DEV = "cuda"
BF16 = torch.bfloat16


def sm_clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return repr(e)


def steady_seconds(fn, seconds: float, calls_per_graph_s: float = 0.02) -> float:
    """Seconds per call of ``fn`` replayed in a CUDA graph for ``seconds``; the second half
    timed."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    # A rough per-call time (host-bound for tiny shapes) sets the graph size; refined below.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(5):
        fn()
    e1.record()
    torch.cuda.synchronize()
    one = min(one, e0.elapsed_time(e1) / 1e3 / 5)
    calls = int(min(2000, max(1, calls_per_graph_s / max(one, 1e-7))))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    replays = max(2, int(seconds / max(calls * one, 1e-6)))
    half = replays // 2
    for _ in range(replays - half):
        g.replay()
    e0.record()
    for _ in range(half):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    del g
    return e0.elapsed_time(e1) / 1e3 / (half * calls)


def gemm_table(dtype: str, sizes_m, sizes_n, sizes_k, seconds: float) -> dict:
    out = {"dtype": dtype, "m": list(sizes_m), "n": list(sizes_n), "k": list(sizes_k),
           "tflops": [], "clock_samples": []}
    heat(4.0)
    out["clock_after_heat"] = sm_clock()
    for m in sizes_m:
        for n in sizes_n:
            for k in sizes_k:
                try:
                    if dtype == "bf16":
                        a = torch.randn(m, k, device=DEV, dtype=BF16)
                        b = torch.randn(k, n, device=DEV, dtype=BF16)
                        c = torch.empty(m, n, device=DEV, dtype=BF16)

                        def fn():
                            torch.matmul(a, b, out=c)
                    else:
                        a = torch.randn(m, k, device=DEV).to(torch.float8_e4m3fn)
                        b = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn).t()
                        one = torch.ones((), device=DEV)

                        def fn():
                            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=BF16)
                    sec = steady_seconds(fn, seconds)
                    out["tflops"].append(2.0 * m * n * k / sec / 1e12)
                except Exception as e:  # noqa: BLE001
                    out["tflops"].append(None)
                    out.setdefault("errors", []).append(f"{m},{n},{k}: {e!r}"[:300])
            out["clock_samples"].append([m, n, sm_clock()])
            torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds-per-shape", type=float, default=0.12)
    ap.add_argument("--sections", default="bf16,fp8")
    args = ap.parse_args()
    grid_m = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    grid_nk = (256, 512, 1024, 2048, 4096, 8192, 16384)
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "seconds_per_shape": args.seconds_per_shape}
    run_sections(args.out, res, [
        (sec, lambda sec=sec: gemm_table(sec, grid_m, grid_nk, grid_nk, args.seconds_per_shape))
        for sec in args.sections.split(",")])


if __name__ == "__main__":
    main()
