# ruff: noqa: B023, F821  (closures are called at once, inside their loop iteration)
"""Attention and memory-bound kernels on one NVIDIA GPU at its power-limited clock (run on the
lent H200), timed with CUDA events over many back-to-back calls (no CUDA graphs: autograd and
the attention backends' RNG state do not survive capture here).

* causal attention, PyTorch's FlashAttention-2 and cuDNN backends, forward and backward;
* native PyTorch norm / activation / add kernels, and the same ops through torch.compile
  (Triton), forward and backward, as bytes per second against a device copy.
Writes one JSON (``--out``)."""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import heat, run_sections

DEV = "cuda"
BF16 = torch.bfloat16


def gpu_time(fn, seconds: float = 0.25) -> float:
    """Mean seconds per call over ~``seconds`` of back-to-back calls (after warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(3):
        fn()
    e1.record()
    torch.cuda.synchronize()
    one = e0.elapsed_time(e1) / 1e3 / 3
    n = max(5, min(5000, int(seconds / max(one, 1e-6))))
    e0.record()
    for _ in range(n):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / 1e3 / n


def attention() -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    res = []
    for b, heads, s, d in ((4, 32, 4096, 128), (1, 64, 8192, 128), (14, 16, 2048, 128),
                           (2, 32, 8192, 128), (16, 16, 1024, 64), (26, 12, 2048, 64)):
        q, k, v = (torch.randn(b, heads, s, d, device=DEV, dtype=BF16, requires_grad=True)
                   for _ in range(3))
        flops_f = 0.5 * 4.0 * b * s * s * heads * d  # causal half of 4 b s^2 a d
        row = {"b": b, "heads": heads, "s": s, "d": d}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("default", None)):
            try:
                ctx = sdpa_kernel(backend) if backend is not None else sdpa_kernel(
                    [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                     SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
                with ctx:
                    heat(0.5)
                    f = gpu_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    g = torch.randn(b, heads, s, d, device=DEV, dtype=BF16)

                    def fb():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(o, (q, k, v), g)
                    tfb = gpu_time(fb)
                row[name] = {"fwd_s": f, "bwd_s": tfb - f,
                             "fwd_tflops": flops_f / f / 1e12,
                             "bwd_tflops_2.5x": 2.5 * flops_f / max(tfb - f, 1e-9) / 1e12}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": repr(e)[:300]}
        res.append(row)
    return res


def elementwise(compiled: bool) -> list:
    res = []
    wrap = (lambda f: torch.compile(f)) if compiled else (lambda f: f)
    ln = wrap(lambda x, w: F.layer_norm(x, (x.shape[-1],), w))
    rms = wrap(lambda x, w: F.rms_norm(x, (x.shape[-1],), w))
    gelu = wrap(lambda x: F.gelu(x))
    swiglu = wrap(lambda x, y: F.silu(x) * y)
    add = wrap(lambda x, y: x + y)
    for h in (768, 2048, 4096, 8192):
        rows = (64 * 2**20) // h  # 64 Mi elements: 128 MiB in bf16
        x = torch.randn(rows, h, device=DEV, dtype=BF16, requires_grad=True)
        y = torch.randn(rows, h, device=DEV, dtype=BF16, requires_grad=True)
        w = torch.ones(h, device=DEV, dtype=BF16, requires_grad=True)
        g = torch.randn(rows, h, device=DEV, dtype=BF16)
        row = {"h": h, "rows": rows, "elements": rows * h,
               "copy_s": gpu_time(lambda: g.clone())}
        for name, op, ins in (("layer_norm", ln, (x, w)), ("rms_norm", rms, (x, w)),
                              ("gelu", gelu, (x,)), ("swiglu", swiglu, (x, y)),
                              ("add", add, (x, y))):
            try:
                f = gpu_time(lambda: op(*ins))

                def fb():
                    torch.autograd.grad(op(*ins), ins, g)
                row[name] = {"fwd_s": f, "fwd_bwd_s": gpu_time(fb)}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": repr(e)[:300]}
        res.append(row)
        del x, y, g
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    run_sections(args.out, res, [("attention", attention),
                                 ("elementwise_native", lambda: elementwise(False)),
                                 ("elementwise_compiled", lambda: elementwise(True))])


if __name__ == "__main__":
    main()
