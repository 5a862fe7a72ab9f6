"""The simulator's measured kernel constants follow from the measurement files they cite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.simulator.elementwise import ACTIVATION_KERNEL_COST, NORM_KERNEL_COST

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
H200_PEAK_BPS = 4.8e12  # NVIDIA H200 SXM datasheet, hardware_profiles/gpus/h200.yaml
PROFILE_EFFICIENCY = 0.9  # memory_bandwidth_efficiency of the profiles (copy-class kernels)


def _h200_kernels() -> dict:
    """The H200 attention and memory-bound kernel measurements."""
    return json.loads((RESULTS / "h200_kernels_2026-11-28.json").read_text())


def _fraction_of_peak(op: str, fwd_bytes: float) -> list[float]:
    """Forward + backward bandwidth of ``op`` against 3x its forward bytes (the simulator's
    count), as a fraction of HBM peak, one value per measured hidden size."""
    out = []
    for row in _h200_kernels()["elementwise_native"]:
        seconds = row[op]["fwd_bwd_s"]
        out.append(3.0 * fwd_bytes * row["elements"] / seconds / H200_PEAK_BPS)
    return out


def test_norm_and_activation_costs_match_the_h200_measurement() -> None:
    ln = _fraction_of_peak("layer_norm", 4.0)
    rms = _fraction_of_peak("rms_norm", 4.0)
    gelu = _fraction_of_peak("gelu", 4.0)
    swiglu = _fraction_of_peak("swiglu", 6.0)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert PROFILE_EFFICIENCY / mean(ln) == pytest.approx(NORM_KERNEL_COST["layernorm"], rel=0.03)
    assert PROFILE_EFFICIENCY / mean(rms) == pytest.approx(NORM_KERNEL_COST["rmsnorm"], rel=0.03)
    assert PROFILE_EFFICIENCY / mean(gelu) == pytest.approx(ACTIVATION_KERNEL_COST["plain"],
                                                           rel=0.03)
    assert PROFILE_EFFICIENCY / mean(swiglu) == pytest.approx(ACTIVATION_KERNEL_COST["gated"],
                                                             rel=0.03)
    # Every norm and activation ran below a copy's bandwidth, at every hidden size.
    assert max(ln + rms + gelu + swiglu) < PROFILE_EFFICIENCY


def test_attention_shape_factors_match_the_h200_flash_attention_runs() -> None:
    from paraplan.simulator.attention_shape import attention_shape_factors

    runs = {(r["s"], r["d"]): r["flash"] for r in _h200_kernels()["attention"]}
    ref = runs[(8192, 128)]
    for (s, d), run in runs.items():
        fwd, bwd = attention_shape_factors(s, d)
        # Each measured shape's throughput relative to the long, 128-wide run (the separable
        # rule reproduces every measured point within a few percent).
        assert fwd == pytest.approx(run["fwd_tflops"] / ref["fwd_tflops"], rel=0.05), (s, d)
        assert bwd == pytest.approx(run["bwd_tflops_2.5x"] / ref["bwd_tflops_2.5x"],
                                    rel=0.06), (s, d)
    # Monotone: longer calls and wider heads never run slower; clamped outside the range.
    assert attention_shape_factors(512, 64) == attention_shape_factors(1024, 64)
    assert attention_shape_factors(1 << 20, 256) == (1.0, 1.0)
    seq = [attention_shape_factors(2.0 ** e, 128) for e in (10, 10.5, 11, 11.5, 12, 13)]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(seq, seq[1:], strict=False))


def test_qk_norm_is_priced_as_rmsnorm_whatever_the_layer_norm() -> None:
    """Per-head q/k norms are RMSNorms (Qwen3, OLMo-2, Gemma-3), so a LayerNorm model with
    qk-norm adds RMSNorm-cost bytes for q and k, not LayerNorm's (review finding)."""
    from paraplan import ParallelPlan, TrainingSpec, load_model
    from paraplan.simulator.elementwise import elementwise_bytes_per_token

    base = load_model("llama3-8b").model_copy(update={"norm": "layernorm"})
    with_qk = base.model_copy(update={"qk_norm": True})
    tr, plan = TrainingSpec(global_batch_size=8, seq_len=2048), ParallelPlan(tp=2)
    extra = (elementwise_bytes_per_token(with_qk, tr, plan, moe=False)
             - elementwise_bytes_per_token(base, tr, plan, moe=False))
    att = base.attention
    assert extra == pytest.approx(4.0 * NORM_KERNEL_COST["rmsnorm"]
                                  * (att.q_width + att.k_width) / 2)
