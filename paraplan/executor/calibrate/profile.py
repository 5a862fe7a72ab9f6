"""The measurements as a paraplan cluster profile YAML (one node of CPU GPUs with the measured GEMM
table and fitted links)."""

from __future__ import annotations

import statistics

import yaml

from paraplan.executor.calibrate.fit import (
    COLLECTIVE_KINDS,
    collective_efficiency,
    fit_all,
    gemm_grid,
    sig,
)
from paraplan.simulator.attention_shape import attention_shape_factors


class _Dumper(yaml.SafeDumper):
    """Safe YAML without anchors; lists of numbers on one (wrapped) line."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = bool(data) and all(isinstance(x, int | float) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


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
    # fractions of the GEMM peak and of the copy bandwidth (capped at 1). The simulator prices
    # attention at the profile's efficiency times its short-call / narrow-head factor
    # (``attention_shape``), so each shape's rate is divided by that factor first: the
    # profile then gives back the measured times at the measured shapes.
    attn = measurements.get("attention") or []
    eff_f = eff_b = None
    if attn:
        factors = [attention_shape_factors(a["s"], a["d"]) for a in attn]
        eff_f = min(1.0, statistics.median(
            a["forward_tflops"] / f[0] for a, f in zip(attn, factors, strict=True)) / peak)
        eff_b = min(1.0, statistics.median(
            a["backward_tflops"] / f[1] for a, f in zip(attn, factors, strict=True)) / peak)
    elem = measurements.get("elementwise") or []
    mem_eff = 1.0
    if elem:
        achieved = statistics.median(e["bandwidth_Bps"] for e in elem) / 1e9
        mem_eff = min(1.0, achieved / mem_GBps)
    gpu = {
        "name": f"{name}-cpu-rank", "display_name": f"{machine['cpu']} ({threads} thread(s))",
        "vendor": "other", "architecture": "cpu",
        "memory_GiB": sig(machine["memory_bytes"] / nproc / 2**30, 4),
        "memory_bandwidth_GBps": sig(mem_GBps),
        "memory_bandwidth_efficiency": sig(mem_eff, 4),
        "peak_tflops": {"fp32": sig(peak)}, "matmul_efficiency": sig(min(1.0, large / peak)),
        "gemm_table": {"name": f"{name}-fp32", "reference_peak_tflops": sig(peak),
                       "m": list(sizes), "n": list(sizes), "k": list(sizes),
                       "tflops": [sig(t) for t in grid],
                       "sources": ["paraplan calibrate (torch.matmul fp32, all ranks at once)"]},
        **({"attention_efficiency_fwd": sig(eff_f, 4),
            "attention_efficiency_bwd": sig(eff_b, 4)} if attn else {}),
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
                "kind": "ethernet", "bandwidth_GBps": sig(chosen["bandwidth_Bps"] / 1e9),
                "latency_us": sig(chosen["alpha_s"] * 1e6), "efficiency": 1.0,
                "notes": f"Ring alpha-beta fit of the measured gloo {link_fit} timings. All "
                         f"fits: {detail}."}
        node["intra_node_link"] = link
        node["inter_node_link"] = dict(link, name=f"{name}-gloo-inter",
                                       notes="One node: placeholder, same as the intra link.")
        kind_eff = collective_efficiency(fits, link_fit)
    else:  # one rank: no collectives were measured and no link is ever used
        kind_eff = {}
        node["inter_node_link"] = {"name": f"{name}-unmeasured", "kind": "ethernet",
                                   "bandwidth_GBps": sig(mem_GBps), "latency_us": 0.0,
                                   "notes": "Not measured (one rank); unused on one node."}
    cluster = {"name": name,
               "description": f"This machine ({machine['cpu']}), {nproc} executor ranks on one "
                              "node, measured by paraplan calibrate",
               "node": node,
               **({"collective_efficiency": kind_eff} if kind_eff else {}),
               "sources": [f"paraplan calibrate, torch {machine.get('torch', '?')}, "
                           f"{machine.get('platform', '?')}, quick={measurements.get('quick')}"]}
    return yaml.dump(cluster, Dumper=_Dumper, sort_keys=False, width=100)
