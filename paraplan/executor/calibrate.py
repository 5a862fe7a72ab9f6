"""Measure this machine and write it as a paraplan cluster profile (one node, CPU "GPUs").

``calibrate()`` measures, with ``nproc`` gloo ranks started by ``launch`` and running at the
same time (as the executor's ranks do, ``threads`` torch threads each):

- fp32 GEMM throughput (``torch.matmul``) on an m x n x k grid of sizes, median of repeats
  after a warm-up, per rank while every rank multiplies at once;
- memory bandwidth: a large tensor copy, (bytes read + bytes written) / seconds, per rank;
- fused attention (``scaled_dot_product_attention``, causal) forward and backward, as the
  fraction of the GEMM peak it reaches under the simulator's FLOP accounting (forward
  ``0.5 * 4 b s^2 a d``, backward 2.5x that: ``paraplan.simulator.compute.layer_times``);
- eager elementwise kernels of a GPT layer (two LayerNorms, two residual adds, GELU, forward
  and backward), as the fraction of the copy bandwidth they reach under the simulator's byte
  accounting (``elementwise_bytes_per_token``);
- gloo collectives (all_reduce, all_gather, all_to_all, p2p send/recv) at several sizes,
  each fitted to the simulator's ring alpha-beta model (``fit_alpha_beta``).

It also times square GEMMs in this process alone (1 thread, and the cores one rank gets) for
reference. ``calibration_cluster_yaml(measurements)`` turns the result into a cluster YAML
whose GPU inlines the measured GEMM table, so the simulator's ``gemm_time`` reproduces the
measured GEMM times at the measured shapes, and whose links carry the fitted latency and
bandwidth. Units: seconds, bytes, bytes/s; the YAML uses the profile units (TFLOP/s, GB/s,
GiB, microseconds).
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import yaml

from paraplan.executor.launch import launch

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
COLD_SETS, COLD_BYTES = 16, 32 * MiB  # GEMM operand sets cycled per shape (see _gemm_seconds)
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


def _median_time(op: Callable[[], object], repeats: int) -> float:
    op()  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _gemm_seconds(m: int, n: int, k: int, repeats: int) -> float:
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

    return _median_time(op, repeats)


def attention_flops(b: int, heads: int, s: int, d: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of causal fused attention as the simulator counts them:
    half of ``4 b s^2 a d`` forward, 2.5x the forward backward (FlashAttention-2 sec 4.1)."""
    fwd = 0.5 * 4.0 * b * s * s * heads * d
    return fwd, 2.5 * fwd


def _attention_seconds(b: int, heads: int, s: int, d: int, repeats: int) -> tuple[float, float]:
    """(forward, backward) seconds of causal ``scaled_dot_product_attention`` in fp32."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(b, heads, s, d, requires_grad=True) for _ in range(3))
    fwd = _median_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                       repeats)
    grad = torch.randn(b, heads, s, d)

    def both() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return fwd, max(1e-9, _median_time(both, repeats) - fwd)


def elementwise_bytes(tokens: int, hidden: int, ffn: int) -> float:
    """Bytes the simulator counts for one layer's eager fp32 elementwise ops, forward plus
    backward (2x forward): two LayerNorms (4 B/element), two residual adds (6) and GELU (4)
    at 16-bit sizes, doubled for fp32 (``elementwise_bytes_per_token``)."""
    per_token = (2 * 4.0 + 2 * 6.0) * hidden + 4.0 * ffn
    return 3.0 * tokens * per_token * 2.0


def _elementwise_seconds(tokens: int, hidden: int, ffn: int, repeats: int) -> float:
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

    return _median_time(layer, repeats)


def _comm_op(kind: str, elems: int, rank: int, world: int
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


def calibration_worker(rank: int, world_size: int, config: dict) -> dict:
    """One rank of ``calibrate``: GEMM grid, memory copy and collectives (see module doc).
    Returns per-rank medians in seconds."""
    import torch
    import torch.distributed as dist

    out: dict = {"rank": rank, "threads": torch.get_num_threads(), "gemm": [], "comm": []}
    sizes = config["gemm_sizes"]
    for m in sizes:
        for n in sizes:
            for k in sizes:
                dist.barrier()  # every rank multiplies at the same time
                out["gemm"].append({"m": m, "n": n, "k": k, "seconds": _gemm_seconds(
                    m, n, k, config["gemm_repeats"])})
    src = torch.ones(config["mem_bytes"] // 4)
    dst = torch.empty_like(src)
    dist.barrier()
    out["memory_seconds"] = _median_time(lambda: dst.copy_(src), config["mem_repeats"])
    src = dst = None  # free them before the collectives
    out["attention"] = []
    for b, heads, s, d in ATTENTION_SHAPES:
        dist.barrier()
        fwd, bwd = _attention_seconds(b, heads, s, d, config["gemm_repeats"])
        out["attention"].append({"b": b, "heads": heads, "s": s, "d": d,
                                 "forward_seconds": fwd, "backward_seconds": bwd})
    out["elementwise"] = []
    for tokens, hidden, ffn in ELEMENTWISE_SHAPES:
        dist.barrier()
        out["elementwise"].append({"tokens": tokens, "hidden": hidden, "ffn": ffn,
                                   "seconds": _elementwise_seconds(tokens, hidden, ffn,
                                                                   config["gemm_repeats"])})
    # Collectives are timed one call at a time, each right after a burst of GEMMs that every
    # rank starts together (a barrier, then the burst): that is how training issues them,
    # between layers' compute with caches, sockets and gloo's threads cold. A call issued
    # straight after a barrier finds gloo's threads awake and takes ~0.3-0.5 ms less than in
    # training, and one in a back-to-back loop up to 2x less. The small compute jitter of the
    # burst (~0.1 ms between two ranks) is counted too, as it is in training. The MEAN over
    # the trials is kept, not the median: a step adds up its collectives, so their expected
    # time is what predicts it, and gloo on a busy core has a heavy tail (a 1 MiB
    # all-reduce: median ~1 ms, mean ~2 ms, worst ~8 ms when its thread waits for a core),
    # which the median would drop. Buffers are fresh on every call (``_comm_op``): a reused
    # buffer stays in cache and runs ~0.4 ms faster per MiB than training's new tensors.
    a, b = torch.ones(COMM_BURST, COMM_BURST), torch.ones(COMM_BURST, COMM_BURST)
    for kind in config["kinds"] if world_size > 1 else ():
        for nbytes in config["comm_sizes"]:
            elems = max(world_size, nbytes // 4 // world_size * world_size)
            ready = _comm_op(kind, elems, rank, world_size)
            if ready is not None:
                ready()()  # warm-up: connections and buffers
            trials = []
            for _ in range(config["comm_trials"]):
                op = ready() if ready is not None else None
                dist.barrier()
                torch.mm(a, b)
                start = time.perf_counter()
                if op is not None:
                    op()
                trials.append(time.perf_counter() - start)
            if ready is not None:
                per_op = statistics.fmean(trials) / (2 if kind == "p2p" else 1)
                out["comm"].append({"kind": kind, "bytes": 4 * elems, "seconds": per_op})
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cores() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    try:  # cgroup v2 CPU quota ("max 100000" or "200000 100000")
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def _memory_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
            if text.isdigit():
                total = min(total, int(text))
        except OSError:
            pass
    return int(total)


def calibrate(*, quick: bool = False, nproc: int = 2, threads: int = 1,
              timeout_s: float = 600, progress: Callable[[str], None] | None = None) -> dict:
    """Measure this machine for ``nproc`` executor ranks of ``threads`` torch threads each.

    Returns a JSON-ready measurement dict (seconds, bytes, bytes/s) for
    ``calibration_cluster_yaml``. ``quick`` uses fewer sizes and repeats (under a minute on
    2 cores). Raises ``ExecutorError`` if the measuring ranks fail.
    """
    import torch

    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    cfg = dict(QUICK if quick else FULL, kinds=list(COLLECTIVE_KINDS), num_threads=threads)
    cores = _cores()
    per_rank = max(1, cores // nproc)
    solo = []
    saved = torch.get_num_threads()
    try:
        for t in sorted({1, per_rank}):
            say(f"GEMM alone in this process, {t} thread(s)")
            torch.set_num_threads(t)
            for s in cfg["gemm_sizes"]:
                sec = _gemm_seconds(s, s, s, cfg["gemm_repeats"])
                solo.append({"m": s, "n": s, "k": s, "threads": t, "seconds": sec,
                             "tflops": 2.0 * s**3 / sec / 1e12})
    finally:
        torch.set_num_threads(saved)
    say(f"{nproc} gloo ranks x {threads} thread(s): GEMM grid, memory copy, collectives")
    ranks = launch(calibration_worker, nproc, cfg, timeout_s=timeout_s, backend="gloo",
                   num_threads=threads)
    gemm = []
    for i, cell in enumerate(ranks[0]["gemm"]):
        sec = statistics.median(r["gemm"][i]["seconds"] for r in ranks)
        gemm.append({**{k: cell[k] for k in "mnk"}, "seconds": sec,
                     "tflops": 2.0 * cell["m"] * cell["n"] * cell["k"] / sec / 1e12})
    mem_s = statistics.median(r["memory_seconds"] for r in ranks)
    attention = []
    for i, shape in enumerate(ranks[0]["attention"]):
        fwd = statistics.median(r["attention"][i]["forward_seconds"] for r in ranks)
        bwd = statistics.median(r["attention"][i]["backward_seconds"] for r in ranks)
        f_flops, b_flops = attention_flops(shape["b"], shape["heads"], shape["s"], shape["d"])
        attention.append({**{k: shape[k] for k in ("b", "heads", "s", "d")},
                          "forward_seconds": fwd, "backward_seconds": bwd,
                          "forward_tflops": f_flops / fwd / 1e12,
                          "backward_tflops": b_flops / bwd / 1e12})
    elementwise = []
    for i, shape in enumerate(ranks[0]["elementwise"]):
        sec = statistics.median(r["elementwise"][i]["seconds"] for r in ranks)
        nbytes = elementwise_bytes(shape["tokens"], shape["hidden"], shape["ffn"])
        elementwise.append({**{k: shape[k] for k in ("tokens", "hidden", "ffn")},
                            "seconds": sec, "bytes_counted": nbytes,
                            "bandwidth_Bps": nbytes / sec})
    samples: dict[tuple[str, int], float] = {}
    for r in ranks:
        for c in r["comm"]:
            key = (c["kind"], c["bytes"])
            samples[key] = max(samples.get(key, 0.0), c["seconds"])  # the slowest rank
    comm = [{"kind": k, "bytes": b, "seconds": s} for (k, b), s in samples.items()]
    fits = fit_all(comm, nproc)
    return {
        "version": 1, "quick": quick, "nproc": nproc, "threads_per_rank": threads,
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": _cpu_name(), "cores": cores, "memory_bytes": _memory_bytes(),
                    "platform": platform.platform(), "torch": torch.__version__},
        "gemm": {"dtype": "fp32", "concurrent_ranks": nproc, "cells": gemm},
        "gemm_solo": solo,
        "memory": {"bytes_moved": 2 * cfg["mem_bytes"], "seconds": mem_s,
                   "bandwidth_Bps": 2 * cfg["mem_bytes"] / mem_s},
        "attention": attention, "elementwise": elementwise,
        "collectives": {"world_size": nproc, "samples": comm, "fits": fits},
        "elapsed_s": time.perf_counter() - started,
    }


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors; lists of numbers on one (wrapped) line."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = bool(data) and all(isinstance(x, int | float) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def _sig(x: float, digits: int = 6) -> float:
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
    return {kind: _sig(min(4.0, fits[kind]["bandwidth_Bps"] / base), 3)
            for kind in ("all_gather", "reduce_scatter", "all_to_all", "p2p")
            if kind in fits and kind != link_fit}


def calibration_cluster_yaml(measurements: dict, name: str = "this-machine", *,
                             link_fit: str = "all_reduce") -> str:
    """A cluster profile YAML (for ``paraplan.load_cluster``) from ``calibrate()`` output.

    One node of ``nproc`` "GPUs" (CPU ranks, fp32 only): peak = the best measured per-rank
    GEMM TFLOP/s, the inline ``gemm_table`` holds every measured shape (so simulated GEMM
    times equal the measured ones there), memory = RAM / nproc, memory bandwidth = the copy
    measurement. The link carries one (latency, bandwidth) fit; ``link_fit`` picks it: a kind
    of ``COLLECTIVE_KINDS`` (default ``all_reduce``, the most frequent collective in
    training) or ``"joint"`` (one fit of all kinds). The other kinds' bandwidths, relative to
    it, go to the cluster's ``collective_efficiency`` (gloo's reduce-scatter and all-gather
    are much slower than its all-reduce). Every kind's fit is listed in the link's notes.
    """
    if link_fit not in (*COLLECTIVE_KINDS, "joint"):
        raise ValueError(f"link_fit={link_fit!r} must be one of {[*COLLECTIVE_KINDS, 'joint']}")
    nproc = int(measurements["nproc"])
    machine = measurements["machine"]
    sizes, grid = gemm_grid(measurements["gemm"]["cells"])
    peak = max(grid)
    top = sizes[-1]
    large = grid[(sizes.index(top) * len(sizes) + sizes.index(top)) * len(sizes)
                 + sizes.index(top)]
    mem_GBps = measurements["memory"]["bandwidth_Bps"] / 1e9
    threads = measurements.get("threads_per_rank", 1)
    # Fused attention and eager elementwise kernels: medians over the measured shapes, as
    # fractions of the GEMM peak and of the copy bandwidth (capped at 1).
    attn = measurements.get("attention") or []
    eff_f = eff_b = None
    if attn:
        eff_f = min(1.0, statistics.median(a["forward_tflops"] for a in attn) / peak)
        eff_b = min(1.0, statistics.median(a["backward_tflops"] for a in attn) / peak)
    elem = measurements.get("elementwise") or []
    mem_eff = 1.0
    if elem:
        achieved = statistics.median(e["bandwidth_Bps"] for e in elem) / 1e9
        mem_eff = min(1.0, achieved / mem_GBps)
    gpu = {
        "name": f"{name}-cpu-rank", "display_name": f"{machine['cpu']} ({threads} thread(s))",
        "vendor": "other", "architecture": "cpu",
        "memory_GiB": _sig(machine["memory_bytes"] / nproc / 2**30, 4),
        "memory_bandwidth_GBps": _sig(mem_GBps),
        "memory_bandwidth_efficiency": _sig(mem_eff, 4),
        "peak_tflops": {"fp32": _sig(peak)}, "matmul_efficiency": _sig(min(1.0, large / peak)),
        "gemm_table": {"name": f"{name}-fp32", "reference_peak_tflops": _sig(peak),
                       "m": list(sizes), "n": list(sizes), "k": list(sizes),
                       "tflops": [_sig(t) for t in grid],
                       "sources": ["paraplan calibrate (torch.matmul fp32, all ranks at once)"]},
        **({"attention_efficiency_fwd": _sig(eff_f, 4),
            "attention_efficiency_bwd": _sig(eff_b, 4)} if attn else {}),
        "form_factor": "other",
        "notes": (f"Measured by paraplan calibrate on {measurements.get('date', '?')}: "
                  f"{nproc} ranks x {threads} torch thread(s) at once on {machine['cores']} "
                  f"cores; memory = RAM / ranks. fp32 only."),
    }
    samples = measurements.get("collectives", {}).get("samples") or []
    node: dict = {"gpu": gpu, "gpus_per_node": nproc, "nics_per_node": 1, "num_nodes": 1}
    if samples:
        fits = fit_all(samples, nproc)
        if link_fit not in fits:
            raise ValueError(f"link_fit={link_fit!r}: no {link_fit} timings were measured")
        chosen = fits[link_fit]
        detail = "; ".join(f"{k} {f['alpha_s'] * 1e6:.1f} us, {f['bandwidth_Bps'] / 1e9:.3g} "
                           f"GB/s (rel. rms {f['rel_rms']:.2f})" for k, f in fits.items())
        link = {"name": f"{name}-gloo", "display_name": "gloo over loopback TCP",
                "kind": "ethernet", "bandwidth_GBps": _sig(chosen["bandwidth_Bps"] / 1e9),
                "latency_us": _sig(chosen["alpha_s"] * 1e6), "efficiency": 1.0,
                "notes": f"Ring alpha-beta fit of the measured gloo {link_fit} timings. All "
                         f"fits: {detail}."}
        node["intra_node_link"] = link
        node["inter_node_link"] = dict(link, name=f"{name}-gloo-inter",
                                       notes="One node: placeholder, same as the intra link.")
        kind_eff = collective_efficiency(fits, link_fit)
    else:  # one rank: no collectives were measured and no link is ever used
        kind_eff = {}
        node["inter_node_link"] = {"name": f"{name}-unmeasured", "kind": "ethernet",
                                   "bandwidth_GBps": _sig(mem_GBps), "latency_us": 0.0,
                                   "notes": "Not measured (one rank); unused on one node."}
    cluster = {"name": name,
               "description": f"This machine ({machine['cpu']}), {nproc} executor ranks on one "
                              "node, measured by paraplan calibrate",
               "node": node,
               **({"collective_efficiency": kind_eff} if kind_eff else {}),
               "sources": [f"paraplan calibrate, torch {machine.get('torch', '?')}, "
                           f"{machine.get('platform', '?')}, quick={measurements.get('quick')}"]}
    return yaml.dump(cluster, Dumper=_Dumper, sort_keys=False, width=100)
