"""Megatron-LM command-line arguments for a plan, pinned to Megatron-Core v0.15.

Flag names are those ``megatron/training/arguments.py`` defines in the v0.15 line (recorded
from a v0.15-era commit in ``tests/data/trainer_keys/megatron_core_v0.15.txt``). v0.15 has no
``--virtual-pipeline-model-parallel-size``: interleaving is
``--num-layers-per-virtual-pipeline-stage`` (even chunks); uneven splits use
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` when the
middle stages are equal, and ``--pipeline-model-parallel-layout`` otherwise.

Megatron's own start-up asserts (see ../shared/trainer_configs.md: world % (tp*pp*cp) == 0,
heads and query groups divisible by tp, SP needs tp > 1, interleaving needs pp > 1,
world % (etp*ep*pp) == 0, seq_len % (2*cp) == 0 with cp > 1) are ``check_plan`` rules,
enforced by ``export_context`` before this module runs; ``_check`` refuses what v0.15 cannot
run on top of them (GPipe, zero-bubble schedules, relaxed synchronization).
"""

from __future__ import annotations

import shlex

from paraplan.export.common import (
    ExportContext,
    refuse,
    refuse_optimizer_state,
    refuse_relaxed_sync,
)
from paraplan.specs.loaders import load_trainer
from paraplan.specs.trainer import a2a_overlap_needs
from paraplan.specs.trainer_names import MEGATRON_FP8_RECIPES, MEGATRON_FSDP_SHARDING

TRAINER = "Megatron-LM"
VERSION = "core_v0.15"


def megatron_args(ctx: ExportContext) -> list[str]:
    """The plan as Megatron-LM flags (one flag or flag + value per list item).

    Raises:
        ExportError: a rule is broken or the plan uses something Megatron cannot express.
    """
    m, t, p = ctx.model, ctx.training, ctx.plan
    _check(ctx)
    args = [
        f"--tensor-model-parallel-size {p.tp}",
        f"--pipeline-model-parallel-size {p.pp}",
        f"--context-parallel-size {p.cp}",
    ]
    if m.is_moe:
        args += [f"--expert-model-parallel-size {p.ep}",
                 f"--expert-tensor-parallel-size {p.expert_tp}"]
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    args += _pipeline_split(ctx)
    args += [
        f"--micro-batch-size {p.micro_batch_size}",
        f"--global-batch-size {t.global_batch_size}",
        f"--seq-length {t.seq_len}",
        f"--max-position-embeddings {max(t.seq_len, m.max_position_embeddings or 0)}",
        f"--num-layers {m.num_layers}",
        f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}",
        f"--num-attention-heads {m.num_attention_heads}",
    ]
    if m.kv_heads != m.num_attention_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    if m.head_dim is not None and m.head_dim != m.hidden_size // m.num_attention_heads:
        args.append(f"--kv-channels {m.head_dim}")
    args += _architecture(ctx)
    args += _recompute(ctx)
    args += _data_parallel(ctx)
    args += _precision(ctx)
    return args


def _check(ctx: ExportContext) -> None:
    p = ctx.plan
    refuse_relaxed_sync(ctx.plan, TRAINER)
    # Megatron-LM arguments.py: --exp-avg-dtype / --exp-avg-sq-dtype (fp32, fp16, bf16, fp8)
    # with --use-precision-aware-optimizer, which runs in the distributed optimizer.
    refuse_optimizer_state(ctx.training, TRAINER, moments=("fp32", "bf16"))
    stages = load_trainer("megatron-core").can.bf16_moments_zero_stages  # one source of truth
    if ctx.training.moments_dtype != "fp32" and p.zero_stage not in stages:
        raise refuse("training.moments_dtype", ctx.training.moments_dtype, TRAINER,
                     "paraplan writes --use-precision-aware-optimizer only with the "
                     f"distributed optimizer (zero_stage={', '.join(map(str, stages))})")
    # The rules Megatron's arguments.py shares with check_plan (query groups, SP and
    # interleaving degrees, 2*cp | seq_length, expert-parallel divisibility) were enforced
    # by export_context; what is left is what only Megatron v0.15 cannot run.
    if p.schedule == "gpipe":
        raise refuse("schedule", "gpipe", TRAINER, "Megatron runs 1F1B (interleaved 1F1B "
                     "with virtual stages); use schedule=1f1b")
    if p.schedule == "zb-h1":
        raise refuse("schedule", "zb-h1", TRAINER, "v0.15 has no zero-bubble schedule flag; "
                     "use schedule=1f1b or interleaved")


def _pipeline_split(ctx: ExportContext) -> list[str]:
    p, chunks = ctx.plan, ctx.chunk_layers
    pp, v = p.pp, p.virtual_stages
    if pp == 1:
        return []
    if ctx.even:
        return [f"--num-layers-per-virtual-pipeline-stage {chunks[0]}"] if v > 1 else []
    if v == 1:
        first, last, middle = chunks[0], chunks[-1], chunks[1:-1]
        if len(set(middle)) <= 1:
            # The middle stages share the rest evenly (Megatron divides it by pp - 2).
            return [f"--decoder-first-pipeline-num-layers {first}",
                    f"--decoder-last-pipeline-num-layers {last}"]
    # Any other split: one segment per model chunk in chunk order, embedding (E) on the first,
    # loss (L) on the last, one t per transformer layer.
    segments = ["t" * n for n in chunks]
    segments[0] = "E" + segments[0]
    segments[-1] = segments[-1] + "m" * ctx.model.num_mtp_layers + "L"
    # Quoted: '|' would end the bash array the script writes its flags into.
    return [f"--pipeline-model-parallel-layout {shlex.quote('|'.join(segments))}"]


def _architecture(ctx: ExportContext) -> list[str]:
    m = ctx.model
    out = []
    if m.activation == "swiglu" and m.glu_clamp:
        # gpt-oss's clamped GLU, as Megatron-LM's examples/gptoss/02_train.sh writes it
        out += ["--quick-geglu", "--glu-linear-offset 1.0",
                f"--activation-func-clamp-value {m.glu_clamp:g}"]
    elif m.activation == "swiglu":
        out.append("--swiglu")
    elif m.activation == "squared_relu":
        out.append("--squared-relu")
    elif m.activation not in ("gelu",):
        raise refuse("model.activation", m.activation, TRAINER,
                     "Megatron's MLP is gelu (default), --swiglu or --squared-relu")
    out.append(f"--normalization {'RMSNorm' if m.norm == 'rmsnorm' else 'LayerNorm'}")
    pos = {"rope": "rope", "learned": "learned_absolute"}.get(m.position_embedding)
    if pos is None:
        raise refuse("model.position_embedding", m.position_embedding, TRAINER,
                     "rope or learned (alibi is not in Megatron-Core)")
    out.append(f"--position-embedding-type {pos}")
    if not m.tie_word_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    if not m.use_bias:
        out.append("--disable-bias-linear")
    if m.qkv_bias and not m.use_bias:
        out.append("--add-qkv-bias")
    out += _attention(ctx)
    if m.is_moe:
        out += [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.moe_top_k}",
                f"--moe-ffn-hidden-size {m.expert_ffn}"]
        if m.num_shared_experts:
            out.append(f"--moe-shared-expert-intermediate-size "
                       f"{m.num_shared_experts * m.expert_ffn}")
        if m.num_dense_layers:
            pattern = [int(m.is_moe_layer(i)) for i in range(m.num_layers)]
            # Quoted: an unquoted [0,1,...] is a bash glob (a file named 1 would replace it).
            out.append("--moe-layer-freq " + shlex.quote(str(pattern).replace(" ", "")))
        if m.num_mtp_layers:
            out.append(f"--mtp-num-layers {m.num_mtp_layers}")
        if m.moe_router_groups:  # group-limited routing (core_v0.15.3 arguments.py L3098)
            out += [f"--moe-router-num-groups {m.moe_router_groups}",
                    f"--moe-router-group-topk {m.moe_router_group_topk}"]
        # Grouped expert GEMMs and fused permutation, as the simulator prices them; the
        # dispatcher the training spec names (Megatron's own default is allgather).
        out += ["--moe-grouped-gemm", "--moe-permute-fusion"]
        p, t = ctx.plan, ctx.training
        # The flex dispatcher needs TP x EP > 1 and no padding to capacity
        # (transformer_config.py core_v0.15.3 L823-831; token_dispatcher.py).
        if t.moe_dispatcher == "hierarchical" and p.ep * p.expert_tp > 1:
            if p.moe_capacity_factor is not None:
                raise refuse("training.moe_dispatcher", "hierarchical", TRAINER,
                             "DeepEP (flex) drops no tokens: leave moe_capacity_factor unset")
            out += ["--moe-token-dispatcher-type flex", "--moe-enable-deepep"]
            if t.moe_dispatcher_sms is not None:  # core_v0.15.3 arguments.py L3137 (20)
                if t.moe_dispatcher_sms % 2:
                    raise refuse("training.moe_dispatcher_sms", t.moe_dispatcher_sms, TRAINER,
                                 "DeepEP takes an even SM count (deep_ep/buffer.py "
                                 "Buffer.set_num_sms)")
                out.append(f"--moe-deepep-num-sms {t.moe_dispatcher_sms}")
        else:
            out.append("--moe-token-dispatcher-type alltoall")
        if t.moe_a2a_overlap and p.ep > 1:
            needs = a2a_overlap_needs(m, t, p)
            if needs:
                raise refuse("training.moe_a2a_overlap", True, TRAINER,
                             f"the all-to-all overlap needs {needs[0]}")
            out += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
        cf = ctx.plan.moe_capacity_factor
        if cf is not None:
            out += [f"--moe-expert-capacity-factor {cf:g}", "--moe-pad-expert-input-to-capacity"]
    return out


def _attention(ctx: ExportContext) -> list[str]:
    """MLA, q/k norms, sinks and local attention (Megatron-LM arguments.py; the DeepSeek-R1
    and gpt-oss examples: examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-R1.sh,
    examples/gptoss/02_train.sh)."""
    m = ctx.model
    out = []
    if m.kv_lora_rank is not None:
        out += ["--multi-latent-attention", f"--kv-lora-rank {m.kv_lora_rank}",
                f"--qk-head-dim {m.qk_nope_head_dim}",
                f"--qk-pos-emb-head-dim {m.qk_rope_head_dim}", f"--v-head-dim {m.v_head_dim}",
                "--qk-layernorm"]  # MLA's latent norms
        if m.q_lora_rank is not None:
            out.append(f"--q-lora-rank {m.q_lora_rank}")
    elif m.qk_norm:
        out.append("--qk-layernorm")
    if m.attention_sinks:
        out.append("--softmax-type learnable")
    if m.local_attention == "chunked":
        raise refuse("model.local_attention", "chunked", TRAINER,
                     "Megatron-Core v0.15 has sliding windows (--window-size) but no chunked "
                     "attention")
    if m.local_attention == "sliding":
        out.append(f"--window-size {m.local_attention_window - 1},0")
        if m.local_attention_layers * 2 == m.num_layers:
            out.append("--window-attn-skip-freq 2")  # every other layer full (gpt-oss)
        elif m.local_attention_layers != m.num_layers:
            raise refuse("model.local_attention_layers", m.local_attention_layers, TRAINER,
                         "all layers or every other layer (--window-attn-skip-freq 2)")
    return out


def _recompute(ctx: ExportContext) -> list[str]:
    rc = ctx.plan.recompute
    if rc == "none":
        return []
    if rc == "selective":
        return ["--recompute-granularity selective"]
    if rc == "full":
        return ["--recompute-granularity full", "--recompute-method uniform",
                "--recompute-num-layers 1"]
    raise refuse("recompute", rc, TRAINER, "Megatron recomputes selective (attention core) "
                 "or full layers; torchtitan's op-level and every-other-layer checkpointing "
                 "have no Megatron flag")


def _data_parallel(ctx: ExportContext) -> list[str]:
    p = ctx.plan
    out = []
    if p.zero_stage == 1:
        out.append("--use-distributed-optimizer")
    elif p.zero_stage in (2, 3):
        strategy = next(k for k, v in MEGATRON_FSDP_SHARDING.items() if v == p.zero_stage)
        out += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}"]
    if p.overlap_grad_reduce and ctx.dp > 1:
        out.append("--overlap-grad-reduce")
        if p.zero_stage == 1:
            out.append("--overlap-param-gather")
    if ctx.training.ddp_bucket_size is not None:
        out.append(f"--ddp-bucket-size {ctx.training.ddp_bucket_size}")
    if ctx.training.grad_accumulation == "eager":
        out.append("--no-gradient-accumulation-fusion")
    if p.virtual_stages > 1 and not p.overlap_p2p_comm:
        out.append("--no-overlap-p2p-communication")  # overlap is Megatron's default
    if p.tp_comm_overlap:
        if not p.sequence_parallel:
            raise refuse("tp_comm_overlap", True, TRAINER, "--tp-comm-overlap needs "
                         "--sequence-parallel")
        out.append("--tp-comm-overlap")
    return out


def _precision(ctx: ExportContext) -> list[str]:
    # Megatron's dropout defaults are 0.1 (arguments.py --hidden-dropout/--attention-dropout);
    # a run without dropout (Llama-style, and how the megatron-core profile prices it) says so.
    out = [] if ctx.training.dropout else ["--hidden-dropout 0.0", "--attention-dropout 0.0"]
    if ctx.training.moments_dtype != "fp32":
        dtype = ctx.training.moments_dtype
        out += ["--use-precision-aware-optimizer", f"--exp-avg-dtype {dtype}",
                f"--exp-avg-sq-dtype {dtype}"]
    precision = ctx.training.precision
    if precision == "bf16":
        return [*out, "--bf16"]
    if precision == "fp16":
        return [*out, "--fp16"]
    if precision == "fp8":
        recipe = next(name for name, scaling in MEGATRON_FP8_RECIPES.items()
                      if scaling == ctx.training.fp8_scaling)
        flag = [] if recipe == "delayed" else [f"--fp8-recipe {recipe}"]  # delayed: default
        return [*out, "--bf16", "--fp8-format hybrid", *flag]
    return out  # fp32: Megatron's default


def megatron_script(ctx: ExportContext, header: list[str]) -> str:
    """A bash snippet defining ``MEGATRON_ARGS`` (source it, then
    ``torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}"``)."""
    args = megatron_args(ctx)
    lines = [f"# {h}" for h in header]
    lines.append("MEGATRON_ARGS=(")
    lines += [f"  {a}" for a in args]
    lines.append(")")
    return "\n".join(lines) + "\n"
