# ruff: noqa: B023, B905, F821  (closures are called at once, inside their loop iteration)
"""One-shot measurements on a single NVIDIA GPU (run on the lent H200), torch only.

What paraplan's cost model needs from a real machine and cannot read from a datasheet:

* host (CPU) seconds per eager PyTorch op and per autograd layer (forward, backward), and the
  kernels each launches, so the simulator can price launch-bound work;
* a device-to-host sync's round trip (dropless MoE without sync-free buffers syncs per layer);
* the GPU time of a GPT block's parts at MosaicML MPT shapes (LayerNorm, attention, GEMMs,
  GELU, adds), forward and backward, to check the roofline piece by piece;
* grouped-GEMM throughput at fine-grained MoE expert shapes (one grouped kernel vs a loop of
  per-expert GEMMs vs one dense GEMM of the same rows);
* a long bf16 GEMM run, its throughput over time (the sustained clock under the power limit).

Writes one JSON file (``--out``). Every section is independent; a failing section records its
error and the rest still run. Usage: ``python3 benchmarks/device/measure_h200.py --out m.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import time
import traceback

import torch
import torch.nn.functional as F

DEV = "cuda"
BF16 = torch.bfloat16


def gpu_time(fn, iters: int = 20, warmup: int = 3) -> float:
    """Mean GPU seconds of ``fn`` between CUDA events (after warm-up)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def host_time(fn, iters: int) -> tuple[float, float]:
    """(host seconds per call with no sync inside, wall seconds per call incl. the final sync)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / iters, (t2 - t0) / iters


def kernels_launched(fn) -> int:
    """CUDA kernels (and memcpy/memset) one call of ``fn`` launches, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    try:
        return _count_kernels(fn, ProfilerActivity, profile)
    except Exception:  # noqa: BLE001
        return -1


def _count_kernels(fn, ProfilerActivity, profile) -> int:  # noqa: N803
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    n = 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            n += 1
    return n


class LlamaBlockEager(torch.nn.Module):
    """torchtitan-style Llama block in eager PyTorch: fp32 RMSNorm, complex rotary, SDPA,
    SwiGLU (as torchtitan's llama3 model.py without torch.compile)."""

    def __init__(self, h: int, heads: int, ffn: int):
        super().__init__()
        self.h, self.heads = h, heads
        self.wq = torch.nn.Linear(h, h, bias=False)
        self.wk = torch.nn.Linear(h, h, bias=False)
        self.wv = torch.nn.Linear(h, h, bias=False)
        self.wo = torch.nn.Linear(h, h, bias=False)
        self.w1 = torch.nn.Linear(h, ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, h, bias=False)
        self.w3 = torch.nn.Linear(h, ffn, bias=False)
        self.n1 = torch.nn.Parameter(torch.ones(h))
        self.n2 = torch.nn.Parameter(torch.ones(h))

    @staticmethod
    def _norm(x, w):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
        return out.type_as(x) * w

    def _rope(self, x, freqs):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs).flatten(3).type_as(x)

    def forward(self, x, freqs):
        b, s, _ = x.shape
        d = self.h // self.heads
        y = self._norm(x, self.n1)
        q = self.wq(y).view(b, s, self.heads, d)
        k = self.wk(y).view(b, s, self.heads, d)
        v = self.wv(y).view(b, s, self.heads, d)
        q, k = self._rope(q, freqs), self._rope(k, freqs)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, self.h))
        y = self._norm(x, self.n2)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class GPTBlock(torch.nn.Module):
    """MPT-style block (llm-foundry MPTBlock): LayerNorm without bias, fused QKV, causal SDPA,
    out proj, GELU MLP (expansion 4), no biases."""

    def __init__(self, h: int, heads: int, ffn: int):
        super().__init__()
        self.h, self.heads = h, heads
        self.ln1 = torch.nn.LayerNorm(h, bias=False)
        self.ln2 = torch.nn.LayerNorm(h, bias=False)
        self.qkv = torch.nn.Linear(h, 3 * h, bias=False)
        self.proj = torch.nn.Linear(h, h, bias=False)
        self.fc1 = torch.nn.Linear(h, ffn, bias=False)
        self.fc2 = torch.nn.Linear(ffn, h, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        d = self.h // self.heads
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d).unbind(2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, self.h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="none"))


def section_env() -> dict:
    p = torch.cuda.get_device_properties(0)
    out = {"torch": torch.__version__, "gpu": p.name, "sm_count": p.multi_processor_count,
           "mem_gb": p.total_memory / 2**30}
    try:
        q = "clocks.max.sm,clocks.sm,power.limit,power.max_limit,clocks.max.mem"
        out["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv"], capture_output=True,
            text=True, timeout=20).stdout
    except Exception as e:  # noqa: BLE001
        out["nvidia_smi"] = repr(e)
    try:
        out["cpu"] = subprocess.run(["bash", "-c", "grep -m1 'model name' /proc/cpuinfo; nproc"],
                                    capture_output=True, text=True, timeout=10).stdout
    except Exception as e:  # noqa: BLE001
        out["cpu"] = repr(e)
    return out


def section_host() -> dict:
    out: dict = {}
    x = torch.randn(4096, device=DEV, dtype=BF16)
    y = torch.empty_like(x)
    out["add_out_host_s"], out["add_out_wall_s"] = host_time(lambda: torch.add(x, x, out=y), 20000)
    out["add_alloc_host_s"], _ = host_time(lambda: x + x, 20000)
    a = torch.randn(64, 256, device=DEV, dtype=BF16)
    w = torch.randn(256, 256, device=DEV, dtype=BF16)
    out["linear_host_s"], _ = host_time(lambda: F.linear(a, w), 10000)
    ag = a.clone().requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    out["linear_autograd_fwd_host_s"], _ = host_time(lambda: F.linear(ag, wg), 10000)

    # Whole layers with tiny shapes (GPU work far below host work): host s per fwd / bwd.
    for name, mk, extra in (
        ("llama_eager", lambda: LlamaBlockEager(256, 4, 512), True),
        ("gpt_mpt", lambda: GPTBlock(256, 4, 1024), False),
    ):
        layers = [mk().to(DEV, BF16) for _ in range(8)]
        b, s = 1, 64
        inp = torch.randn(b, s, 256, device=DEV, dtype=BF16, requires_grad=True)
        freqs = torch.polar(torch.ones(s, 256 // 4 // 2, device=DEV),
                            torch.randn(s, 256 // 4 // 2, device=DEV)).view(1, s, 1, -1)

        def fwd():
            h = inp
            for layer in layers:
                h = layer(h, freqs) if extra else layer(h)
            return h

        def fwd_bwd():
            fwd().sum().backward()

        reps = 60
        f_host, f_wall = host_time(fwd, reps)
        fb_host, fb_wall = host_time(fwd_bwd, reps)
        kf = kernels_launched(fwd)
        kfb = kernels_launched(fwd_bwd)
        out[name] = {
            "layers": len(layers),
            "fwd_host_s_per_layer": f_host / len(layers),
            "fwd_wall_s_per_layer": f_wall / len(layers),
            "fwd_bwd_host_s_per_layer": fb_host / len(layers),
            "fwd_bwd_wall_s_per_layer": fb_wall / len(layers),
            "kernels_fwd_per_layer": kf / len(layers),
            "kernels_fwd_bwd_per_layer": kfb / len(layers),
        }

    # Device-to-host sync round trip (what .item()/.tolist() after queued work costs).
    z = torch.zeros(1, device=DEV)

    def sync_once():
        (z + 1).item()

    out["item_roundtrip_s"], _ = host_time(sync_once, 2000)
    counts = torch.randint(0, 100, (16,), device=DEV)
    out["tolist16_roundtrip_s"], _ = host_time(lambda: counts.add(1).tolist(), 2000)
    out["synchronize_s"], _ = host_time(torch.cuda.synchronize, 5000)

    # Per-expert loop of small GEMMs (grouped linear as a Python loop), host s per GEMM.
    xs = [torch.randn(32, 256, device=DEV, dtype=BF16) for _ in range(16)]
    ws = [torch.randn(512, 256, device=DEV, dtype=BF16) for _ in range(16)]
    out["expert_loop16_host_s_per_gemm"] = host_time(
        lambda: [F.linear(a_, w_) for a_, w_ in zip(xs, ws)], 1000)[0] / 16
    return out


def _time_parts(h: int, heads: int, ffn: int, b: int, s: int) -> dict:
    """GPU seconds of each part of an MPT block, forward and backward (autograd), bf16."""
    d = h // heads
    tok = b * s
    res: dict = {"h": h, "heads": heads, "ffn": ffn, "b": b, "s": s}

    def fb(make_inputs, op, iters=10):
        ins = make_inputs()
        fwd = gpu_time(lambda: op(*ins), iters)
        outp = op(*ins)
        g = torch.randn_like(outp)

        def bwd():
            torch.autograd.grad(outp, [t for t in ins if t.requires_grad], g, retain_graph=True)
        return fwd, gpu_time(bwd, iters)

    def t(*shape, grad=True):
        return torch.randn(*shape, device=DEV, dtype=BF16, requires_grad=grad)

    ln = torch.nn.LayerNorm(h, bias=False).to(DEV, BF16)
    res["layernorm"] = fb(lambda: (t(tok, h),), ln)
    res["qkv_gemm"] = fb(lambda: (t(tok, h), t(3 * h, h)), F.linear)
    res["proj_gemm"] = fb(lambda: (t(tok, h), t(h, h)), F.linear)
    res["fc1_gemm"] = fb(lambda: (t(tok, h), t(ffn, h)), F.linear)
    res["fc2_gemm"] = fb(lambda: (t(tok, ffn), t(h, ffn)), F.linear)
    res["gelu"] = fb(lambda: (t(tok, ffn),), lambda a: F.gelu(a))
    res["residual_add"] = fb(lambda: (t(tok, h), t(tok, h)), torch.add)
    res["sdpa_causal"] = fb(lambda: (t(b, heads, s, d), t(b, heads, s, d), t(b, heads, s, d)),
                            lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                           is_causal=True))
    blk = GPTBlock(h, heads, ffn).to(DEV, BF16)
    x = t(b, s, h)
    res["block_fwd"] = gpu_time(lambda: blk(x), 10)
    res["block_fwd_bwd"] = gpu_time(lambda: blk(x).sum().backward(), 10)
    return res


def section_mpt_parts() -> list:
    cases = [  # (name, h, heads, ffn, mbs, seq): MPT configs at their benchmark micro-batches
        ("mpt-125m s2048", 768, 12, 3072, 26, 2048),
        ("mpt-1b s512", 2048, 16, 8192, 56, 512),
        ("mpt-1b s2048", 2048, 16, 8192, 14, 2048),
        ("mpt-1b s8192", 2048, 16, 8192, 3, 8192),
        ("mpt-7b s2048", 4096, 32, 16384, 6, 2048),
        ("mpt-7b s8192", 4096, 32, 16384, 2, 8192),
    ]
    out = []
    for name, h, heads, ffn, b, s in cases:
        try:
            r = _time_parts(h, heads, ffn, b, s)
            r["name"] = name
            out.append(r)
        except Exception as e:  # noqa: BLE001
            out.append({"name": name, "error": repr(e)})
        torch.cuda.empty_cache()
    return out


def section_grouped() -> list:
    out = []
    gmm = getattr(torch, "_grouped_mm", None)
    for experts, rows, n, k in ((16, 8192, 1536, 2048), (16, 2048, 1536, 2048),
                                (16, 512, 1536, 2048), (16, 8192, 2048, 768),
                                (16, 2048, 2048, 768), (8, 4096, 5760, 2880),
                                (8, 4096, 2880, 2880), (32, 1024, 4096, 7168)):
        r: dict = {"experts": experts, "rows": rows, "n": n, "k": k}
        flops = 2.0 * experts * rows * n * k
        try:
            xs = torch.randn(experts * rows, k, device=DEV, dtype=BF16)
            w = torch.randn(experts, k, n, device=DEV, dtype=BF16)
            wd = torch.randn(k, n, device=DEV, dtype=BF16)
            r["dense_tflops"] = flops / gpu_time(lambda: xs @ wd) / 1e12
            chunks = xs.split(rows)
            r["loop_tflops"] = flops / gpu_time(
                lambda: [c @ w[i] for i, c in enumerate(chunks)]) / 1e12
            if gmm is not None:
                offs = torch.arange(rows, experts * rows + 1, rows, device=DEV,
                                    dtype=torch.int32)
                wt = w.transpose(-2, -1).contiguous().transpose(-2, -1)
                r["grouped_tflops"] = flops / gpu_time(lambda: gmm(xs, wt, offs=offs)) / 1e12
        except Exception as e:  # noqa: BLE001
            r["error"] = repr(e)
        out.append(r)
        torch.cuda.empty_cache()
    return out


def section_gemm_grid() -> list:
    """A few square and skinny bf16 GEMMs (random data), TFLOP/s."""
    out = []
    for m, n, k in ((8192, 8192, 8192), (16384, 8192, 2048), (4096, 4096, 4096),
                    (2048, 2048, 2048), (53248, 3072, 768), (53248, 768, 3072),
                    (28672, 8192, 2048), (28672, 2048, 8192), (12288, 49152, 4096)):
        a = torch.randn(m, k, device=DEV, dtype=BF16)
        b = torch.randn(k, n, device=DEV, dtype=BF16)
        out.append({"m": m, "n": n, "k": k,
                    "tflops": 2.0 * m * n * k / gpu_time(lambda: a @ b, 20) / 1e12})
        del a, b
    return out


def section_sustained(seconds: float = 12.0) -> dict:
    """8192^3 bf16 GEMMs back to back for ``seconds``: TFLOP/s per 1 s window."""
    n = 8192
    a = torch.randn(n, n, device=DEV, dtype=BF16)
    b = torch.randn(n, n, device=DEV, dtype=BF16)
    flops = 2.0 * n ** 3
    windows = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        dt = gpu_time(lambda: a @ b, iters=400, warmup=0)
        windows.append(flops / dt / 1e12)
    clocks = ""
    try:
        clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                 "--format=csv"], capture_output=True, text=True,
                                timeout=20).stdout
    except Exception as e:  # noqa: BLE001
        clocks = repr(e)
    return {"tflops_windows": windows, "after": clocks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="env,host,gemm_grid,grouped,mpt_parts,sustained")
    args = ap.parse_args()
    results: dict = {}
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            results[name] = globals()[f"section_{name}"]()
        except Exception:  # noqa: BLE001
            results[name] = {"error": traceback.format_exc()}
        results.setdefault("elapsed_s", {})[name] = time.perf_counter() - t0
        print(name, "done in", round(time.perf_counter() - t0, 1), "s", flush=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    assert math.isfinite(1.0)


if __name__ == "__main__":
    main()
