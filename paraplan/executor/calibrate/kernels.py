"""Micro-benchmarks run by each rank: GEMM, fused attention, eager elementwise kernels and gloo
collectives, timed as training sees them."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable

from paraplan.executor.calibrate.fit import COLD_BYTES, COLD_SETS
from paraplan.simulator.elementwise import ACTIVATION_KERNEL_COST, norm_bytes


def median_time(op: Callable[[], object], repeats: int) -> float:
    op()  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gemm_seconds(m: int, n: int, k: int, repeats: int) -> float:
    """Median seconds of one ``torch.matmul`` of (m x k) @ (k x n) as training issues it:
    operands cold (cycled through ``COLD_SETS`` pairs, at least ``COLD_BYTES`` together, so
    no call finds its inputs in the core's caches: a layer's GEMM reads an activation written
    one op earlier and a weight last touched a layer ago) and a freshly allocated output.
    Hot, reused operands run ~5-10% faster than that on a CPU core."""
    import torch

    sets = max(2, min(COLD_SETS, math.ceil(COLD_BYTES / (4 * (m * k + k * n)))))
    pairs = itertools.cycle([(torch.randn(m, k), torch.randn(k, n)) for _ in range(sets)])

    def op() -> None:
        torch.matmul(*next(pairs))

    return median_time(op, repeats)


def attention_flops(b: int, heads: int, s: int, d: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of causal fused attention as the simulator counts them:
    half of ``4 b s^2 a d`` forward, 2.5x the forward backward (FlashAttention-2 sec 4.1)."""
    fwd = 0.5 * 4.0 * b * s * s * heads * d
    return fwd, 2.5 * fwd


def attention_seconds(b: int, heads: int, s: int, d: int, repeats: int) -> tuple[float, float]:
    """(forward, backward) seconds of causal ``scaled_dot_product_attention`` in fp32."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(b, heads, s, d, requires_grad=True) for _ in range(3))
    fwd = median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                      repeats)
    grad = torch.randn(b, heads, s, d)

    def both() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return fwd, max(1e-9, median_time(both, repeats) - fwd)


def elementwise_bytes(tokens: int, hidden: int, ffn: int) -> float:
    """Copy-equivalent bytes the simulator counts for one layer's fp32 elementwise ops,
    forward plus backward (2x forward): two LayerNorms (4 B/element at the norm kernel's
    cost), two residual adds (6) and GELU (4 at the activation kernel's cost) at 16-bit
    sizes, doubled for fp32 (``elementwise_bytes_per_token``), so the bandwidth fitted from
    their time prices the same count back to the same time."""
    per_token = (2 * norm_bytes("layernorm", eager=False) + 2 * 6.0) * hidden \
        + 4.0 * ACTIVATION_KERNEL_COST["plain"] * ffn
    return 3.0 * tokens * per_token * 2.0


def elementwise_seconds(tokens: int, hidden: int, ffn: int, repeats: int) -> float:
    """Seconds of those ops (fp32, eager), forward and backward."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(tokens, hidden, requires_grad=True)
    u = torch.randn(tokens, ffn, requires_grad=True)
    w, bias = torch.ones(hidden, requires_grad=True), torch.zeros(hidden, requires_grad=True)

    def layer() -> None:
        a = F.layer_norm(x, (hidden,), w, bias)
        y = x + a
        c = F.layer_norm(y, (hidden,), w, bias)
        z = y + c
        g = F.gelu(u)
        torch.autograd.backward([z, g], [torch.ones_like(z), torch.ones_like(g)])

    return median_time(layer, repeats)


def comm_op(kind: str, elems: int, rank: int, world: int
            ) -> Callable[[], Callable[[], object]] | None:
    """The timed operation on ``elems`` fp32 elements (None: this rank sits it out).

    Its buffers are new on every call, as in training: the input is a fresh copy (an
    activation or gradient just written by the op before) and the output a fresh allocation
    (the executor's ``Comm`` and Megatron's collectives allocate theirs per call). The
    returned callable does the copying and allocating outside the timer: it prepares and
    returns the collective as a zero-argument callable to time."""
    import torch
    import torch.distributed as dist

    from paraplan.executor.comm import all_gather_single, reduce_scatter_single

    src = torch.ones(elems)
    if kind == "all_reduce":
        def ready() -> Callable[[], object]:
            x = src.clone()
            return lambda: dist.all_reduce(x)
    elif kind == "all_gather":
        def ready() -> Callable[[], object]:
            out, part = torch.empty(elems), src[: elems // world].clone()
            return lambda: all_gather_single(out, part)
    elif kind == "reduce_scatter":
        def ready() -> Callable[[], object]:
            full, part = src.clone(), torch.empty(elems // world)
            return lambda: reduce_scatter_single(part, full)
    elif kind == "all_to_all":
        def ready() -> Callable[[], object]:
            inp, dst = src.clone(), torch.empty(elems)
            return lambda: dist.all_to_all_single(dst, inp)
    elif kind == "p2p":  # ping-pong between ranks 0 and 1; one round trip (2 messages)
        if rank > 1:
            return None
        peer = 1 - rank

        def ready() -> Callable[[], object]:
            out, back = src.clone(), torch.empty(elems)
            if rank == 0:
                return lambda: (dist.send(out, peer), dist.recv(back, peer))
            return lambda: (dist.recv(back, peer), dist.send(out, peer))
    else:
        raise ValueError(f"unknown collective kind {kind!r}")
    return ready
