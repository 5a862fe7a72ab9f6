"""TrainingSpec: what is being trained per step and in what precision."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from paraplan.specs.base import StrictModel

Precision = Literal["bf16", "fp16", "fp8", "fp32"]

# Bytes per element of the compute/weight dtype.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4, "tf32": 4}


MAX_BUCKET_ELEMENTS = 10**12
"""Largest gradient-reduction bucket a run may set (parameters)."""


class TrainingSpec(StrictModel):
    """One optimizer step: ``global_batch_size`` sequences of ``seq_len`` tokens."""

    global_batch_size: int = Field(gt=0, le=100_000_000)
    """Sequences per optimizer step (all data-parallel replicas together)."""
    seq_len: int = Field(gt=0, le=100_000_000)
    """Tokens per sequence."""
    precision: Precision = "bf16"
    """Compute dtype of matmuls. fp8 keeps bf16 weights/activations for everything else."""
    optimizer: Literal["adam", "adamw", "sgd", "sgd_momentum", "adafactor"] = "adam"
    """Mixed-precision Adam/AdamW keeps fp32 master weights, momentum and variance."""
    master_weights: bool = True
    """Keep an fp32 master copy (mixed precision). Ignored for fp32 training."""
    master_weights_dtype: Literal["fp32", "bf16", "remainder"] = "fp32"
    """How the optimizer keeps its copy of the parameters (with ``master_weights``). fp32:
    4 B. bf16: a 16-bit copy, 2 B (apex DistributedFusedAdam ``store_params`` with a bf16
    ``dtype``). remainder: fp32 precision as the bf16 parameter itself plus the 16 low bits,
    2 B (apex ``store_param_remainders``, which NeMo turns on for bf16 models with an fp32
    optimizer state: nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py
    ``setup_optimization``). A trainer that updates the 16-bit parameters directly has no
    copy: ``master_weights=False``."""
    moments_dtype: Literal["fp32", "bf16"] = "fp32"
    """dtype of the optimizer's moments (Adam's momentum and variance, SGD's momentum). bf16:
    2 B each instead of 4 (apex DistributedFusedAdam ``dtype: bf16``; Megatron-Core
    ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``;
    DeepSeek-V3 tracks both AdamW moments in BF16, arXiv 2412.19437 sec 3.3.3)."""
    optimizer_impl: Literal["fused", "foreach", "for_loop"] = "fused"
    """How the optimizer update runs: one fused multi-tensor kernel (apex / Transformer Engine
    / DeepSpeed ``FusedAdam``, ``torch.optim.AdamW(fused=True)``), PyTorch's ``foreach``
    implementation, or a Python loop over the parameters (Composer's ``DecoupledAdamW``);
    the unfused ones pass over the fp32 tensors many more times
    (``simulator.grads.optimizer_bytes_per_param``)."""
    clip_scales_always: bool = False
    """Gradient clipping multiplies every gradient by the clamped coefficient even when it
    does not clip (PyTorch's ``clip_grad_norm_``, FSDP's, torchtitan's); False: only when the
    norm exceeds the limit (Megatron-Core)."""
    fused_rope_scales: bool = True
    """Its fused rotary-embedding kernel applies YaRN's attention factor
    (``ModelSpec.rope_attention_factor``). False: a model whose factor is not 1 gets its RoPE
    in unfused PyTorch ops (Megatron-Core: Transformer Engine's fused RoPE takes no scale,
    ``elementwise.UNFUSED_ROPE_BYTES``)."""
    flash_attention: bool = True
    """Fused attention: no s^2 activation tensor stored (Dao et al. 2022)."""
    flash_attention_version: Literal[1, 2] = 2
    """1 = FlashAttention-1-class kernels (flash-attn 1.x, the Triton flash kernel): about
    half the throughput of FlashAttention-2 (Dao 2023, abstract: "2x speedup";
    ``simulator.compute.FA1_SLOWDOWN``), the Triton one faster in its forward
    (``flash_attention_triton``)."""
    flash_attention_triton: bool = False
    """The FlashAttention-1-class kernel is flash-attn's Triton implementation
    (``flash_attn_triton.py``; llm-foundry's ``attn_impl: triton``), whose forward is faster
    than the CUDA one's (``simulator.compute.FA1_SLOWDOWN``). Read only with
    ``flash_attention_version`` 1."""
    qkv_split_cat: bool = False
    """The attention splits its fused QKV projection's output into q, k and v views
    (``torch.split``), so the backward concatenates dq, dk and dv into the projection's
    gradient (PyTorch's split backward is a ``cat``: ``simulator.copies.qkv_cat_bytes``).
    Megatron-LM 2021 and its Megatron-DeepSpeed fork, llm-foundry's MPT."""
    kv_repeat: bool = False
    """Grouped-query K and V are repeated to the query heads before the attention call
    (torchtitan's ``repeat_kv`` until ff0829c10, 2026-01-27): the attention kernel, the
    ring attention's exchanges and merges and the saved activations see query-width K/V,
    and the copy runs each way (``simulator.copies.kv_repeat_bytes``)."""
    attention_unpad: bool = False
    """The attention call packs q, k and v into flash-attn's variable-length layout and
    scatters the output back (flash-attn ``bert_padding.unpad_input`` / ``pad_input`` around
    ``flash_attn_varlen_func``: llm-foundry's ``attn_impl: flash``), memory-bound copies each
    way (``simulator.copies.unpad_bytes``)."""
    kernels: Literal["fused", "eager"] = "fused"
    """Non-GEMM kernels: fused (Megatron fused kernels, torch.compile) or eager PyTorch ops,
    which move several times more bytes for RMSNorm, rotary and SwiGLU."""
    loss_kernels: Literal["fused", "eager", "one_kernel"] | None = None
    """Kernels of the cross-entropy loss when they differ from ``kernels`` (None: the same).
    torchtitan before 2025-02-20 compiled each TransformerBlock but left the loss eager
    (``apply_compile`` in parallelize_llama.py; the loss was first compiled in d1f62be7,
    "Adding loss_fn to TrainSpec", and made its own ``compile.components`` entry in #1608).
    ``one_kernel``: one fused kernel each way on the 16-bit logits (flash-attn's
    ``xentropy_cuda_lib``, llm-foundry's default ``loss_fn: fused_crossentropy``)."""
    logit_metric_passes: int = Field(default=0, ge=0, le=16)
    """Extra no-grad cross entropies over the logits every micro-batch, for logged training
    metrics (Composer evaluates each train metric on every micro-batch's outputs)."""
    fp8_scaling: Literal["delayed", "current", "block"] = "delayed"
    """How fp8 training scales each tensor it casts: ``delayed`` (a scale from earlier steps'
    amax: Transformer Engine's DelayedScaling, Megatron-Core's default ``fp8_recipe``), so the
    cast can run inside the kernel that produces the tensor; ``current`` (the tensor's own
    amax: TE's per-tensor current scaling, Megatron's ``fp8_recipe='tensorwise'``, torchao's
    dynamic scaling that torchtitan runs), whose cast must wait for a reduction over the whole
    tensor and so re-reads it; ``block`` (MXFP8 and blockwise: each block's scale computed
    inside the cast). Ignored unless precision is fp8."""
    fp8_cast_kernels: int = Field(default=0, ge=0, le=16)
    """Kernels each current-scaled fp8 cast launches beside the cast itself, every one a
    launch on the GPU's stream (``compute.KERNEL_OVERHEAD_S``): Transformer Engine 3 (zero the
    amax, reduce it, compute the scale: the ``megatron-core`` profile), paid per expert by
    grouped experts; 0 where the amax is fused into the producing kernel or not known. Ignored
    unless precision is fp8 with ``fp8_scaling`` current."""
    fp8_weight_cache: bool = False
    """fp8 training casts the weights once per step and reuses them on every micro-batch
    (Transformer Engine's ``is_first_microbatch``, which Megatron passes), instead of casting
    them for every micro-batch's GEMMs."""
    fp8_param_gather: bool = False
    """fp8 training all-gathers sharded parameters as fp8 (1 byte per element instead of the
    compute dtype's 2): torchao ``Float8LinearConfig(enable_fsdp_float8_all_gather=True)``,
    which torchtitan sets with ``quantize.linear.float8.enable_fsdp_float8_all_gather``
    (torchtitan docs/float8.md: "cast Float8Linear.weight from high precision to float8 before
    FSDP all-gather so we can communicate in float8"). Ignored unless precision is fp8."""
    fp8_tp_gather: bool = False
    """fp8 training runs the sequence-parallel all-gathers of the transformer blocks' linears
    in fp8 (1 byte per element): the column-parallel inputs in the forward (and their backward
    re-gather for the weight gradient) and the row-parallel output gradients in the backward;
    the reduce-scatters stay in the compute dtype. Transformer Engine quantizes before it
    gathers (module/layernorm_linear.py and linear.py ``gather_along_first_dim(...,
    quantizer=...)``, module/base.py ``grad_output_preprocess``; TE d0067d0); torchao's
    ``Float8ColwiseParallel`` / ``PrepareFloat8ModuleInput`` cast before the all-gather and
    ``Float8RowwiseParallel`` casts the output gradient before its backward all-gather
    (torchao v0.8.0 float8/float8_tensor_parallel.py; torchtitan docs/float8.md: "float8
    all-gather ... for TP (by default for Float8Linear)"). An MoE block's own token gather
    (its dispatcher's) and the output layer stay 16-bit. Ignored unless precision is fp8 and
    the plan is sequence parallel."""
    fsdp_copies: Literal["flat", "per_param"] | None = None
    """Memory copies the sharded data-parallel implementation adds to every micro-batch under
    zero_stage 2/3 (``simulator.copies.fsdp_copy_bytes_per_param``): ``flat`` (PyTorch FSDP1
    FlatParameter: the all-gather writes the flat parameter in place; the backward concatenates
    the parameter views' gradients into the flat gradient, which is cast to the reduce dtype
    when it differs and pre-divided in place), ``per_param`` (FSDP2 ``fully_shard``: every
    all-gather is copied out into the per-parameter tensors and every reduce-scatter input is
    packed by a copy-in); None: not priced (Megatron's and DeepSpeed's own buffers)."""
    zero1_grad_all_reduce: bool = False
    """ZeRO-1 all-reduces the gradients in full (every rank then updates its shard and the
    updated parameters are all-gathered) instead of reduce-scattering them: DeepSpeed's
    pipeline engine with its BF16 optimizer (pipe/engine.py ``_bf16_reduce_grads``)."""
    ddp_bucket_size: int | None = Field(default=None, gt=0, le=MAX_BUCKET_ELEMENTS)
    """Parameters per gradient-reduction bucket (Megatron ``--ddp-bucket-size``, DeepSpeed
    ``reduce_bucket_size``); None: Megatron-Core's default, max(40M, 1M x dp)
    (``memory.dp_bucket_elements``). Buckets are reduced one by one as the backward frees
    them, so they set how much of the reduction can hide under it and how many collective
    latencies it pays."""
    grad_accumulation: Literal["fused", "eager", "fp32_add"] | None = None
    """How each micro-batch's weight gradients reach the gradient buffer
    (``grads.accumulation_time``): ``fused`` (the weight-gradient GEMM accumulates into the
    buffer, Megatron's ``gradient_accumulation_fusion``), ``eager`` (PyTorch ``AccumulateGrad``
    adds each new 16-bit gradient into the buffer: read both, write one), ``fp32_add``
    (DeepSpeed's BF16 optimizer: after every backward, ``hp_grad.add_(lp.grad.to(fp32))`` adds
    the 16-bit gradients into fp32 ones in a pass of its own); None: as ``kernels``."""
    ddp_autocast: bool = False
    """Replicated data parallelism (zero_stage 0) runs ``torch.autocast`` over fp32 parameters
    and PyTorch DDP's reducer (composer's ``amp_bf16``; torchtitan's ``maybe_enable_amp`` for
    DDP): every forward casts each weight to the compute dtype and the backward casts its
    gradient back, micro-batches after the first add into the fp32 ``.grad``, and every sync
    copies the gradients into DDP's buckets and back (``gradient_as_bucket_view=False``):
    ``simulator.copies.ddp_autocast_bytes_per_param``."""
    ddp_sync_every_microbatch: bool = False
    """Replicated data parallelism all-reduces every micro-batch's gradients (no ``no_sync``:
    torchtitan's train loop) instead of only the last one's (composer's SINGLE_AUTO_SYNC)."""
    zero2_regather: bool = False
    """ZeRO-2 gathers the parameters again for every micro-batch: PyTorch FSDP with
    ``reshard_after_forward=False`` still reshards after each backward (FSDP2
    ``FSDPParamGroup.reshard_after_backward`` defaults to True), so with gradient
    accumulation each micro-batch all-gathers them (torchtitan ``fsdp_reshard_after_forward =
    "never"``). True also means FSDP's granularity: ZeRO-2 gathers and reduce-scatters per
    layer, as ZeRO-3 does but once per micro-batch (``simulator.step``). False: bucketed, the
    parameters gathered once per step after the optimizer (DeepSpeed stage 2)."""
    cp_merge: Literal["fused", "eager_fp32"] = "fused"
    """How ring attention (context parallelism) merges its per-step partial results:
    ``fused`` (Transformer Engine ``AttnFuncWithCPAndKVP2P``: in-place 16-bit corrections,
    dK/dV passed at 16 bits) or ``eager_fp32`` (PyTorch ``context_parallel``, which
    torchtitan uses: eager fp32 merges, fp32 dQ/dK/dV accumulators and an fp32 dK/dV ring;
    ``simulator.copies.eager_ring_bytes``)."""
    cp_kv_exchange: Literal["ring", "allgather"] = "ring"
    """How ring attention's ranks get each other's keys and values: ``ring`` (a block to the
    next rank at every step, hidden under that step's attention: Transformer Engine, and
    PyTorch's ``context_parallel`` with rotate method ``alltoall``) or ``allgather`` (one
    all-gather of every block, waited on after the first step, so only 1/cp of the attention
    hides it: PyTorch's ``_AllGatherRotater``, torchtitan's default
    ``context_parallel_rotate_method = "allgather"``)."""
    pp_grad_sync: Literal["overlapped", "after_schedule", "cascade"] = "overlapped"
    """When a pipelined stage with sharded data parallelism (ZeRO-1/2, pp > 1) reduces its
    gradients: ``overlapped`` (bucket by bucket under the last backward, as Megatron-Core's
    ``overlap_grad_reduce``), ``after_schedule`` (PyTorch ``torch.distributed.pipelining``
    with FSDP2 since pytorch/pytorch PR #165106, 2025-10: ``PipelineStage._post_backward``
    reduce-scatters every layer group after the whole schedule, one group after another on
    the compute stream, so one stage's full chain follows the span) or ``cascade`` (the same
    library before that PR, torch 2.6 ``stage.py`` ``backward_maybe_with_nosync``: the chain
    runs right after each stage's last backward and before that backward's gradient is sent
    to the stage before it, so the last backward's wave waits for every stage's chain:
    pp chains on the critical path; the PR: "The reduce scatter compute stream sync blocks
    the other stages from executing their backwards leading to bubbles")."""
    moe_dispatcher: Literal["alltoall", "hierarchical"] = "alltoall"
    """How MoE tokens travel to their experts' ranks: ``alltoall`` (NCCL all-to-all of every
    routed copy; Megatron ``--moe-token-dispatcher-type alltoall``) or ``hierarchical``
    (DeepEP / HybridEP: a token crosses to each remote node it is routed to once and is
    forwarded over NVLink there, and expert outputs are summed inside the node before they
    cross back; Megatron ``--moe-token-dispatcher-type flex``)."""
    moe_a2a_overlap: bool = False
    """Expert-parallel all-to-alls hidden behind another micro-batch's compute (Megatron
    ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``: the forward of one
    micro-batch and the backward of another run merged, each one's all-to-all under the
    other's compute)."""
    moe_dispatcher_sms: int | None = Field(default=None, ge=1, le=1024)
    """SMs the ``hierarchical`` dispatcher's dispatch and combine kernels hold while they run
    (Megatron-Core ``--moe-flex-dispatcher-num-sms``, formerly ``--moe-deepep-num-sms`` and
    ``--moe-hybridep-num-sms``); under ``moe_a2a_overlap`` the compute beside them loses that
    share of the GPU's SMs. None: DeepEP's 20, what DeepSeek-V3 gives its kernels (report
    sec. 3.2.2) and Megatron-Core's historical ``moe_deepep_num_sms`` default. NVIDIA's
    Megatron-Bridge benchmarks run HybridEP on 32 (``_benchmark_common`` in
    perf_recipes/_common.py, v0.6.0; scripts/performance/utils/overrides.py, v0.4.2)."""
    moe_host_sync_s: float = Field(default=0.0, ge=0.0, le=0.1)
    """Seconds the GPU waits on the host in each MoE layer's forward, per micro-batch, on a DGX
    H100's Xeon (``GPUSpec.host_time_factor`` scales it to other hosts): dropless MoE
    layers that copy their token counts to the host and synchronise (Megatron-Core before
    sync-free MoE) leave the GPU idle while the host issues the kernels after the sync. 0
    where the trainer does not synchronise (``TrainerRuns.moe_host_sync_s``)."""
    moe_load_imbalance: float = Field(default=1.3, ge=1.0, le=64.0)
    """Routed tokens on the busiest expert-parallel rank over the mean (the rank that paces
    every MoE layer: its expert GEMMs, its all-to-all share and its expert activations).
    Default 1.3: the least inter-rank imbalance UltraEP measured in training and prefill
    across MoE models of 106B-671B parameters without rebalancing (1.30-4.01; arXiv
    2606.04101, abstract); expert-level, an auxiliary-loss-balanced router still leaves the
    busiest expert 1.52-1.72x the mean (Wang et al. 2024, arXiv 2408.15664, Table 2
    MaxVio_global). 1.0: balanced, as Megatron's ``--moe-router-force-load-balancing``
    (random router logits, "only for benchmark") makes NVIDIA's published MoE benchmarks."""
    tp_overlap: Literal["userbuffers", "async_tp"] = "userbuffers"
    """How overlapped TP collectives run (``plan.tp_comm_overlap``): Transformer Engine's
    userbuffers (Megatron-Core), whose pipelined and bulk overlaps hold SMs beside the GEMMs
    (``simulator.tp_overlap``), or PyTorch's async TP (torchtitan
    ``enable_async_tensor_parallel``), whose hidden part is charged the SMs of any overlapped
    collective (``compute.NCCL_SMS``)."""
    recompute_early_stop: bool = False
    """A whole-layer recompute stops once every tensor the backward needs exists again, so
    the dense MLP's down projection is not re-run (PyTorch's non-reentrant checkpoint from
    torch 2.1 on, and compiled blocks: ``layer_terms.rerun_skip_time``); False: the whole
    forward runs again (Megatron's and DeepSpeed's reentrant checkpointing, torch <= 2.0)."""
    tp_dgrad_overlap: bool = False
    """Without ``plan.tp_comm_overlap``, each column-parallel linear's backward runs its
    input-gradient TP collective (the all-reduce; under sequence parallelism the
    reduce-scatter) during its weight-gradient GEMM, and under sequence parallelism re-gathers
    its input during its data-gradient GEMM (Megatron-LM's async tensor-parallel all-reduce
    from 2021-08, ``LinearWithGradAccumulationAndAsyncCommunication``; Transformer Engine's
    ``_Linear.backward``). ``tp_overlap.dgrad_overlap_delta`` prices it."""
    grad_reduce_fp32: bool = False
    """Reduce gradients across data-parallel ranks in fp32 (4 bytes/param) instead of the
    compute dtype (torchtitan's FSDP2 default ``mixed_precision_reduce = float32``)."""
    dropout: bool = False
    """Dropout layers (GPT-3-era training); adds masks to activation memory (Korthikanti)."""
    tokens_to_train: float | None = Field(default=None, gt=0)
    """Total training tokens, for time-to-train estimates."""

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def grad_reduce_bytes(self) -> int:
        """Bytes per gradient element sent in the data-parallel reduction."""
        return 4 if self.grad_reduce_fp32 else self.compute_bytes

    @property
    def grad_buffer_bytes(self) -> int:
        """Bytes per element of the gradient buffer kept through the step: a trainer that
        reduces in fp32 accumulates into fp32 (Megatron-Core ``grad_reduce_in_fp32``: the DDP
        grad buffer's dtype is float32: Megatron-LM docs/source/api-guide/dist_optimizer.md,
        "bf16 parameters, fp32 gradients: 18 | 6 + 12/d" bytes per parameter without and with
        the distributed optimizer), else in the compute dtype. DeepSpeed's BF16 optimizer
        (``grad_accumulation`` fp32_add) keeps both its fp32 gradients and the 16-bit ``.grad``
        of the last backward: its engines clear those only before the next micro-batch's
        backward and call ``update_hp_grads(clear_lp_grads=False)`` (DeepSpeed 38327e0
        runtime/pipe/engine.py ``_exec_backward_pass``, runtime/bf16_optimizer.py ``backward``),
        so 4 + 2 B per parameter through the forward passes."""
        if self.grad_accumulation == "fp32_add" and self.compute_bytes < 4:
            return 4 + self.compute_bytes
        return self.grad_reduce_bytes

    @property
    def sharded_grad_bytes(self) -> int:
        """Bytes per element of a ZeRO-2/3 gradient shard kept through the step. PyTorch FSDP
        (``fsdp_copies`` set) casts each reduced shard back to its parameter shard's dtype,
        which is the optimizer's fp32 master with ``master_weights`` (FSDP1
        ``_cast_grad_to_param_dtype`` unless ``keep_low_precision_grads``; FSDP2
        ``foreach_reduce``: ``new_sharded_grad.to(orig_dtype)``), so a bf16 reduction still keeps
        4 B per element; other trainers keep their gradient buffer's dtype
        (``grad_buffer_bytes``)."""
        if self.fsdp_copies is not None and self.master_weights and self.precision != "fp32":
            return 4 if self.master_weights_dtype == "fp32" else 2
        return self.grad_buffer_bytes

    @property
    def compute_bytes(self) -> int:
        """Bytes per weight/activation element (fp8 runs keep bf16 tensors)."""
        return 2 if self.precision == "fp8" else DTYPE_BYTES[self.precision]

    @property
    def tp_gather_bytes(self) -> float:
        """Bytes per element of a transformer block's sequence-parallel all-gather: with fp8
        gathers (``fp8_tp_gather``) 1, plus the block scales block scaling gathers with the
        data (MXFP8: one E8M0 byte per 32 elements; 1x128 blocks: one fp32 per 128, the same
        1/32 B; a per-tensor scale is negligible), else the compute dtype's."""
        if not (self.fp8_tp_gather and self.precision == "fp8"):
            return float(self.compute_bytes)
        return 1.0 + (1.0 / 32.0 if self.fp8_scaling == "block" else 0.0)

    def param_gather_bytes(self, dp: int) -> int:
        """Bytes per dense parameter element a ZeRO/FSDP parameter all-gather over ``dp``
        data-parallel replicas moves: 1 with fp8 all-gathers (``fp8_param_gather``) when
        ``dp > 1``, else the compute dtype. torchtitan enables them only when FSDP shards over
        data-parallel replicas (v0.2.2 float8.py: ``parallel_dims.dp_shard_enabled``); sharding
        over context-parallel ranks alone gathers in 16 bits. Expert weights are not
        ``nn.Linear`` modules and are never gathered in fp8 (callers use ``compute_bytes``).
        The embedding and norms stay 16-bit under torchao; they are a small share of the
        weights and are counted at 1 byte too."""
        fp8 = self.fp8_param_gather and self.precision == "fp8" and dp > 1
        return 1 if fp8 else self.compute_bytes

    @property
    def optimizer_state_bytes_per_param(self) -> int:
        """Master weights + optimizer moments per parameter (Rajbhandari et al. 2020, sec 3.1).

        Adam: 4 (master) + 4 (momentum) + 4 (variance) = 12; SGD with momentum 4 + 4;
        plain SGD 4 (master only); Adafactor ~ master + factored moments (4 + ~0). A 16-bit
        ``master_weights_dtype`` or ``moments_dtype`` halves its part (a bf16 copy and bf16
        moments: 2 + 2 + 2 = 6; NeMo's fp32 state on bf16 parameters: 2 + 4 + 4 = 10).
        """
        master = (2 if self.master_weights_dtype != "fp32" else 4) \
            if (self.master_weights and self.precision != "fp32") else 0
        moments = {"adam": 2, "adamw": 2, "sgd": 0, "sgd_momentum": 1, "adafactor": 0}
        return master + moments[self.optimizer] * DTYPE_BYTES[self.moments_dtype]
