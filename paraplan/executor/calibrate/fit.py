"""Fits of the measurements to the simulator's models: ring alpha-beta coefficients per collective,
the GEMM grid, collective efficiencies."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
KiB, MiB = 1024, 1024 * 1024
# Sizes (GEMM: matrix dims; memory and collectives: bytes), repeats, and timed calls per
# collective size.
# Attention shapes (batch, heads, seq, head_dim) and elementwise shapes (tokens, hidden, ffn).
ATTENTION_SHAPES = [(2, 4, 256, 64), (1, 8, 512, 64)]
ELEMENTWISE_SHAPES = [(512, 256, 1024), (1024, 512, 2048)]
QUICK = {"gemm_sizes": [128, 256, 512, 1024, 2048], "gemm_repeats": 3, "mem_bytes": 256 * MiB,
         "mem_repeats": 5, "comm_sizes": [4 * KiB, 64 * KiB, MiB, 16 * MiB], "comm_trials": 40}
FULL = {"gemm_sizes": [128, 256, 512, 1024, 2048], "gemm_repeats": 5, "mem_bytes": 256 * MiB,
        "mem_repeats": 10, "comm_sizes": [4 * KiB * 4**i for i in range(8)], "comm_trials": 60}
COLD_SETS, COLD_BYTES = 16, 32 * MiB  # GEMM operand sets cycled per shape (see gemm_seconds)
COMM_BURST = 512  # square GEMM run before each timed collective (~0.27 GFLOP, ~1.3 ms on a core)


def coefficients(kind: str, n: int) -> tuple[float, float]:
    """(latency multiplier, bytes multiplier) of ``kind`` on ``n`` ranks in the simulator's
    ring model: time = a * alpha + b * S / B (``paraplan.simulator.collectives``). S is the
    buffer for all_reduce, the gathered output for all_gather, the full input for
    reduce_scatter, the bytes each rank holds for all_to_all and the message for p2p."""
    if kind == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if kind in ("all_gather", "all_to_all", "reduce_scatter"):
        return float(n - 1), (n - 1) / n
    if kind == "p2p":
        return 1.0, 1.0
    raise ValueError(f"unknown collective kind {kind!r}")


def fit_alpha_beta(samples: Iterable[dict], n: int) -> dict:
    """Least-squares (alpha seconds, bandwidth bytes/s) for timings ``samples``
    ({"kind", "bytes", "seconds"}) on ``n`` ranks, in relative error (each sample weighs the
    same whatever its size). alpha is clamped at >= 0. Returns ``alpha_s``,
    ``bandwidth_Bps`` and ``rel_rms`` (root-mean-square relative error of the fit)."""
    rows, sizes = [], []
    for s in samples:
        a, b = coefficients(s["kind"], n)
        t = float(s["seconds"])
        rows.append((a / t, b * float(s["bytes"]) / t))
        sizes.append(b * float(s["bytes"]) / t)
    if not rows:
        raise ValueError("no timings to fit")
    x = np.array(rows)
    (alpha, beta), *_ = np.linalg.lstsq(x, np.ones(len(rows)), rcond=None)
    if alpha < 0:  # refit the bandwidth alone with alpha = 0
        alpha = 0.0
        beta = float(x[:, 1].sum() / (x[:, 1] @ x[:, 1]))
    if beta <= 0:  # times do not grow with size: bandwidth bounded by the best rate seen
        beta = 1.0 / max(sizes)
        alpha = max(0.0, float(np.mean((1 - beta * x[:, 1]) / x[:, 0])))
    rel = x @ np.array([alpha, beta]) - 1.0
    return {"alpha_s": float(alpha), "bandwidth_Bps": float(1.0 / beta),
            "rel_rms": float(np.sqrt(np.mean(rel**2)))}


def fit_all(samples: list[dict], n: int) -> dict[str, dict]:
    """``fit_alpha_beta`` of each measured kind's timings, and ``"joint"`` of all of them
    (empty when nothing was measured)."""
    fits = {kind: fit_alpha_beta([s for s in samples if s["kind"] == kind], n)
            for kind in COLLECTIVE_KINDS if any(s["kind"] == kind for s in samples)}
    if samples:
        fits["joint"] = fit_alpha_beta(samples, n)
    return fits


def sig(x: float, digits: int = 6) -> float:
    return float(f"{x:.{digits}g}")


def gemm_grid(cells: list[dict]) -> tuple[list[int], list[float]]:
    """Sorted sizes and the full m-major TFLOP/s grid over them; a cell that was not measured
    takes the throughput of a square GEMM of the same volume ((m*n*k)^(1/3), log-interpolated
    between the measured squares, or the nearest measured cell)."""
    sizes = sorted({c[a] for c in cells for a in "mnk"})
    have = {(c["m"], c["n"], c["k"]): c["tflops"] for c in cells}
    squares = sorted((m, t) for (m, n, k), t in have.items() if m == n == k)

    def guess(m: int, n: int, k: int) -> float:
        g = math.log2(m * n * k) / 3
        if squares:
            xs = [math.log2(s) for s, _ in squares]
            return float(np.interp(g, xs, [t for _, t in squares]))
        near = min(have, key=lambda c: sum((math.log2(a) - g) ** 2 for a in c))
        return have[near]

    grid = [have.get((m, n, k)) or guess(m, n, k) for m in sizes for n in sizes for k in sizes]
    return sizes, grid


def collective_efficiency(fits: dict[str, dict], link_fit: str = "all_reduce"
                          ) -> dict[str, float]:
    """``ClusterSpec.collective_efficiency`` from the per-kind fits: each measured kind's
    fitted ring bandwidth over the bandwidth of the fit the link carries (``link_fit``), kept
    in the (0, 4] range the profile allows. Empty when the link carries the joint fit (one
    bandwidth for every kind by construction)."""
    if link_fit == "joint" or link_fit not in fits:
        return {}
    base = fits[link_fit]["bandwidth_Bps"]
    return {kind: sig(min(4.0, fits[kind]["bandwidth_Bps"] / base), 3)
            for kind in ("all_gather", "reduce_scatter", "all_to_all", "p2p")
            if kind in fits and kind != link_fit}
