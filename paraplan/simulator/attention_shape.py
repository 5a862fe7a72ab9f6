"""How far a fused attention kernel falls below its long-sequence throughput at a short
sequence or a small head dimension (a pure lookup; no times).

The profiles' attention efficiencies (``GPUSpec.attention_efficiency_fwd/_bwd``: FlashAttention
papers' best, long-sequence figures) hold for long sequences and 128-wide heads. Shorter
kernels spend more of their time on the causal diagonal's half-empty tiles, in the per-block
prologue and epilogue and in a partial last wave, and 64-wide heads do half the work per
loaded tile. Measured on the lent H200 at its power-limited clock (PyTorch 2.11's
FlashAttention-2 backend, causal bf16, forward and backward, benchmarks/device/
measure_h200_kernels.py, results/h200_kernels_2026-11-28.json), relative to the 8192-token,
d = 128 runs (311 TFLOP/s forward, 298 backward at 2.5x the forward FLOPs):

==========  =====  ==========  ===========
seq         d      forward     backward
==========  =====  ==========  ===========
8192        128    1.00        1.00
4096        128    0.99        0.90
2048        128    0.88        0.77
2048        64     0.78        0.68
1024        64     0.63        0.50
==========  =====  ==========  ===========

cuDNN's fused attention on the same runs falls alike (2048 / d=128: 0.86 and 0.81 of its
8192 figures; 1024 / d=64: 0.56 and 0.49), so one shape rule serves every fused kernel.
Sequence and head dimension are taken as separable: the d = 64 / d = 128 ratio at 2048 tokens
(0.89 forward, 0.88 backward) is the head factor, and 1024 tokens at d = 128 is the d = 64
point divided by it. Beyond the measured range the nearest point holds (no run shorter than
1024 tokens or narrower than 64 was measured, so shorter ones are, if anything, priced fast).

The head factor belongs to FlashAttention-2-class kernels only. FlashAttention-1-class kernels
(flash-attn 1.x's CUDA kernel and its Triton port, ``TrainingSpec.flash_attention_version``
1) run 64-wide heads as fast as 128-wide ones or faster: FlashAttention-2's own causal
forward + backward benchmark (Dao 2023, Fig. 4; Dao-AILab/flash-attention
assets/flash2_a100_fwd_bwd_benchmark.png at 4f285b35, A100 80GB, TFLOP/s at 512 / 1k / 2k /
4k / 8k / 16k tokens) has

=========================  ==============================  ==============================
kernel                     d = 64                          d = 128
=========================  ==============================  ==============================
FlashAttention-2           88 / 119 / 140 / 156 / 165 / 171  99 / 133 / 155 / 173 / 182 / 189
FlashAttention (CUDA 1.x)  58 / 70 / 77 / 87 / 92 / 97      55 / 62 / 69 / 76 / 80 / 83
FlashAttention Triton      59 / 75 / 79 / 76 / 79 / 80      50 / 61 / 68 / 74 / 78 / 80
=========================  ==============================  ==============================

(FlashAttention-2 at d = 64: 0.89-0.91 of d = 128, the head factor above; the 1.x kernels:
1.00-1.23), and its H100 chart (assets/flash2_h100_fwd_bwd_benchmark.png) the same: 0.86-0.89
for FlashAttention-2, 1.06-1.26 for flash-attn 1.x. Their short-sequence gain at d = 64 is
left out (those calls are priced slow, if anything).
"""

from __future__ import annotations

import math

# (log2 tokens per attention call, forward factor, backward factor) at d = 128.
_SEQ_POINTS = ((10.0, 0.63 / 0.89, 0.50 / 0.88), (11.0, 0.88, 0.77), (12.0, 0.99, 0.90),
               (13.0, 1.0, 1.0))
# (log2 head dim, forward factor, backward factor) at 2048 tokens.
_HEAD_POINTS = ((6.0, 0.78 / 0.88, 0.68 / 0.77), (7.0, 1.0, 1.0))


def _lookup(points: tuple[tuple[float, float, float], ...], x: float) -> tuple[float, float]:
    """Piecewise-linear in x over ``points`` (sorted by x), clamped at both ends."""
    if x <= points[0][0]:
        return points[0][1], points[0][2]
    for (x0, f0, b0), (x1, f1, b1) in zip(points, points[1:], strict=False):
        if x <= x1:
            w = (x - x0) / (x1 - x0)
            return f0 + w * (f1 - f0), b0 + w * (b1 - b0)
    return points[-1][1], points[-1][2]


def attention_shape_factors(tokens: float, head_dim: float, *,
                            narrow_head_penalty: bool = True) -> tuple[float, float]:
    """(forward, backward) fraction of the long-sequence attention throughput a fused kernel
    reaches on ``tokens`` queries (and as many keys) per call with ``head_dim``-wide heads.
    ``narrow_head_penalty`` False (FlashAttention-1-class kernels) leaves out the head factor:
    their 64-wide heads run as fast as 128-wide ones (module docstring)."""
    if tokens <= 0 or head_dim <= 0:
        return 1.0, 1.0
    sf, sb = _lookup(_SEQ_POINTS, math.log2(tokens))
    if not narrow_head_penalty:
        return sf, sb
    hf, hb = _lookup(_HEAD_POINTS, math.log2(head_dim))
    return sf * hf, sb * hb
