# ruff: noqa: B023, F821  (closures are called at once, inside their loop iteration)
"""Sustained GEMM tables and kernel efficiencies on one NVIDIA GPU (run on the lent H200).

Each GEMM shape is captured in a CUDA graph (enough calls for ~20 ms of work, so launch gaps
are a busy stream's, not Python's) and replayed for ``--seconds-per-shape``; the last half is
timed with CUDA events. A 4 s 8192^3 warm-up first brings the GPU to its power-limited clock,
so big shapes are measured where training runs them (the SM clock is recorded). bf16 through
``torch.matmul`` (cuBLAS) and fp8 e4m3 through ``torch._scaled_mm`` (cuBLASLt, per-tensor
scales, bf16 out: Transformer Engine's Hopper fp8 GEMM). Also: causal attention through
PyTorch's FlashAttention-2 and cuDNN backends, forward and backward, at training shapes, and
the native norm / activation / add kernels' bandwidth. Writes one JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
import traceback

import torch
import torch.nn.functional as F

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


def heat(seconds: float) -> None:
    a = torch.randn(8192, 8192, device=DEV, dtype=BF16)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        for _ in range(50):
            a @ a
        torch.cuda.synchronize()


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


def attention(seconds: float) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    res = []
    heat(2.0)
    for b, heads, s, d in ((4, 32, 4096, 128), (1, 64, 8192, 128), (14, 16, 2048, 128),
                           (2, 32, 8192, 128), (16, 16, 1024, 64)):
        q, k, v = (torch.randn(b, heads, s, d, device=DEV, dtype=BF16, requires_grad=True)
                   for _ in range(3))
        flops_f = 0.5 * 4.0 * b * s * s * heads * d  # causal half of 4 b s^2 a d
        row = {"b": b, "heads": heads, "s": s, "d": d}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    g = torch.randn_like(o)
                    f = steady_seconds(lambda: F.scaled_dot_product_attention(
                        q, k, v, is_causal=True), seconds, 0.05)

                    def fb():
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(out, (q, k, v), g)
                    tfb = steady_seconds(fb, seconds, 0.05)
                row[name] = {"fwd_s": f, "bwd_s": tfb - f,
                             "fwd_tflops": flops_f / f / 1e12,
                             "bwd_tflops_2.5x": 2.5 * flops_f / max(tfb - f, 1e-9) / 1e12}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": repr(e)[:300]}
        res.append(row)
    return res


def elementwise(seconds: float) -> list:
    res = []
    for h in (768, 1024, 2048, 4096, 8192):
        rows = (64 * 2**20) // h  # 64 Mi elements: 128 MiB in bf16
        x = torch.randn(rows, h, device=DEV, dtype=BF16, requires_grad=True)
        y = torch.randn(rows, h, device=DEV, dtype=BF16)
        w = torch.ones(h, device=DEV, dtype=BF16, requires_grad=True)
        g = torch.randn_like(x)
        row = {"h": h, "rows": rows, "elements": rows * h}
        ops = {
            "layer_norm": lambda: F.layer_norm(x, (h,), w),
            "rms_norm": lambda: F.rms_norm(x, (h,), w),
            "gelu": lambda: F.gelu(x),
            "silu_mul": lambda: F.silu(x) * y,
            "add": lambda: x + y,
            "copy": lambda: y.clone(),
        }
        for name, op in ops.items():
            try:
                f = steady_seconds(op, seconds, 0.02)
                entry = {"fwd_s": f}
                if name not in ("copy",):
                    out = op()

                    def bwd():
                        torch.autograd.grad(out, [t for t in (x, w) if t.requires_grad
                                                  and name in ("layer_norm", "rms_norm")]
                                            or [x], g, retain_graph=True)
                    entry["bwd_s"] = steady_seconds(bwd, seconds, 0.02)
                row[name] = entry
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": repr(e)[:300]}
        res.append(row)
        del x, y, g
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds-per-shape", type=float, default=0.12)
    ap.add_argument("--sections", default="bf16,fp8,attention,elementwise")
    args = ap.parse_args()
    grid_m = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    grid_nk = (256, 512, 1024, 2048, 4096, 8192, 16384)
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "seconds_per_shape": args.seconds_per_shape}
    for sec in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            if sec in ("bf16", "fp8"):
                res[sec] = gemm_table(sec, grid_m, grid_nk, grid_nk, args.seconds_per_shape)
            elif sec == "attention":
                res[sec] = attention(0.3)
            elif sec == "elementwise":
                res[sec] = elementwise(0.05)
        except Exception:  # noqa: BLE001
            res[sec] = {"error": traceback.format_exc()[-2000:]}
        res.setdefault("elapsed_s", {})[sec] = time.perf_counter() - t0
        print(sec, "done in", round(time.perf_counter() - t0, 1), "s", flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
