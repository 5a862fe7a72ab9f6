"""Measure this machine and write it as a paraplan cluster profile (one node, CPU "GPUs").

``calibrate()`` measures, with ``nproc`` gloo ranks started by ``launch`` and running at the
same time (as the executor's ranks do, ``threads`` torch threads each):

- fp32 GEMM throughput (``torch.matmul``) on an m x n x k grid of sizes, median of repeats
  after a warm-up, per rank while every rank multiplies at once;
- memory bandwidth: a large tensor copy, (bytes read + bytes written) / seconds, per rank;
- fused attention (``scaled_dot_product_attention``, causal) forward and backward, as the
  fraction of the GEMM peak it reaches under the simulator's FLOP accounting (forward
  ``0.5 * 4 b s^2 a d``, backward 2.5x that: ``paraplan.simulator.layer_terms.layer_times``);
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

Modules: ``fit`` (collective alpha-beta fits, the GEMM grid, efficiencies), ``kernels`` (timed
GEMM, attention, elementwise and collective micro-benchmarks), ``worker`` (what each rank
measures), ``machine`` (CPU, cores and memory of this machine, and ``calibrate``),
``profile`` (the measurements as a cluster profile YAML)."""

from __future__ import annotations

from paraplan.executor.calibrate.fit import (
    ATTENTION_SHAPES,
    COLD_BYTES,
    COLD_SETS,
    COLLECTIVE_KINDS,
    COMM_BURST,
    ELEMENTWISE_SHAPES,
    FULL,
    QUICK,
    KiB,
    MiB,
    coefficients,
    collective_efficiency,
    fit_all,
    fit_alpha_beta,
    gemm_grid,
)
from paraplan.executor.calibrate.kernels import attention_flops, elementwise_bytes
from paraplan.executor.calibrate.machine import calibrate
from paraplan.executor.calibrate.profile import calibration_cluster_yaml
from paraplan.executor.calibrate.worker import calibration_worker

__all__ = [
    "ATTENTION_SHAPES",
    "COLD_BYTES",
    "COLD_SETS",
    "COLLECTIVE_KINDS",
    "COMM_BURST",
    "ELEMENTWISE_SHAPES",
    "FULL",
    "KiB",
    "MiB",
    "QUICK",
    "attention_flops",
    "calibrate",
    "calibration_cluster_yaml",
    "calibration_worker",
    "coefficients",
    "collective_efficiency",
    "elementwise_bytes",
    "fit_all",
    "fit_alpha_beta",
    "gemm_grid",
]
