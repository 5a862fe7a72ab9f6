"""Which matmuls torchtitan's op-level selective activation checkpointing keeps and re-runs.

torchtitan's ``selective_ac_option = "op"`` policy (parallelize_llama.py ``_get_custom_policy``
at 9dec370, 2024-12; distributed/activation_checkpoint.py ``SelectiveAC`` at b5bcd76c6,
2026-08) counts the
``aten.mm`` calls of each checkpointed block in forward order and saves the output of every
odd-numbered one (and of the attention kernel and the reduce-scatters), so every second
matmul runs again in the backward: "Saves output of all compute ops, except every second mm".
Which matmuls those are depends on the block's order of calls: a torchtitan Llama block runs
``wq``, ``wk``, ``wv``, ``wo``, then ``w2(silu(w1(x)) * w3(x))`` (w1 before w3), so it re-runs
``wk``, ``wo`` and ``w3``, 36-39% of its matmul FLOPs for Llama 2/3, not half. A linear with
a bias runs ``aten.addmm``, which the policy neither counts nor saves, so models with biases
keep the half rule (``op_sac_matmuls`` returns None).
"""

from __future__ import annotations

from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.training import TrainingSpec


def rerun_skips_down_projection(training: TrainingSpec) -> bool:
    """A whole-layer re-run of a dense layer stops before its MLP's down projection: the
    checkpoint stops early (``TrainingSpec.recompute_early_stop``) and no dropout follows that
    GEMM (its mask is saved after the GEMM runs). Time (``layer_terms.rerun_skip_time``) and
    hardware FLOPs (``flops.hardware_flops_per_step``) both read it."""
    return training.recompute_early_stop and not training.dropout


def op_sac_matmuls(model: ModelSpec, plan: ParallelPlan, *, moe: bool
                   ) -> tuple[tuple[float, float, bool, bool], ...] | None:
    """``(n, k, saved, row)`` per rank of each matmul of one layer in forward order (output
    and input widths in elements per token, TP-split; ``saved``: the op-level policy keeps its
    output; ``row``: row-parallel, its output the full hidden width before the reduction), or
    None where the order of calls is not known: MoE blocks (router and grouped expert GEMMs),
    attention other than separate q, k, v projections from the hidden state plus an output
    projection (MLA's latents), and linears with biases (``aten.addmm``, not counted)."""
    att, h, t = model.attention, model.hidden_size, plan.tp
    projections = att.projections
    standard = (len(projections) == 2 and projections[0].split == "column"
                and projections[0].k_in == h and projections[1].split == "row"
                and not att.latent_width)
    if moe or not standard or model.use_bias or model.qkv_bias:
        return None
    ffn = model.ffn_hidden_size / t
    calls = [(att.q_width / t, h, False), (att.k_width / t, h, False),
             (att.v_width / t, h, False), (h, att.o_width / t, True)]
    if model.mlp_matrices == 3:  # w1 (gate), w3 (up), w2 (down)
        calls += [(ffn, h, False), (ffn, h, False), (h, ffn, True)]
    else:  # fc1, fc2
        calls += [(ffn, h, False), (h, ffn, True)]
    return tuple((n, k, i % 2 == 0, row) for i, (n, k, row) in enumerate(calls))
