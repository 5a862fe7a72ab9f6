"""Bytes that trainers' framework code moves outside the model's own kernels: FSDP's copies
around its collectives, DDP's under autocast, and PyTorch ring attention's merges. Pure byte counts,
each from the framework source it cites; ``simulator.compute`` turns them into seconds."""

from __future__ import annotations

from typing import Any

from paraplan.specs.training import TrainingSpec


def fsdp_copy_bytes_per_param(training: TrainingSpec, zero_stage: int) -> float:
    """Bytes of memory traffic per (unsharded) parameter that sharded data parallelism adds
    to every micro-batch under ZeRO-2/3, outside the collectives (``training.fsdp_copies``).

    - ``per_param``, PyTorch FSDP2 ``fully_shard`` (torch/distributed/fsdp/_fully_shard/
      _fsdp_collectives.py): ``foreach_all_gather_copy_out`` copies each all-gather's output
      into the per-parameter tensors (``split_with_sizes_copy``: read and write, 2 x the
      compute dtype); ``foreach_reduce`` packs the gradients into the reduce-scatter input
      with ``torch._chunk_cat`` (read the compute dtype, write the reduce dtype). ZeRO-3
      gathers twice per micro-batch (forward, and again for backward after the forward
      reshard); ZeRO-2 (``reshard_after_forward=False``) once when it re-gathers for every
      micro-batch (``training.zero2_regather``), else once per step, whose one copy-out is
      not charged.
    - ``flat``, FSDP1 FlatParameter: the all-gather writes the flat parameter itself, but
      the module's parameters are ``torch.split`` views of it taken under autograd
      (``_flat_param.py`` ``_use_unsharded_views``), so the backward concatenates their
      gradients into the flat gradient (``SplitWithSizesBackward``: read and write, 2 x the
      compute dtype); ``_post_backward_hook`` then casts it to the reduce dtype when that
      differs (``.to(reduce_dtype)``), and ``_reduce_grad`` divides the unsharded gradient
      in place by the pre-divide factor (``_div_if_needed(padded_unsharded_grad,
      _gradient_predivide_factor)``, > 1 for any group of two or more: read and write the
      reduce dtype) before the reduce-scatter (torch 2.6 ``_runtime_utils.py``; torch
      1.12-1.13 ``fully_sharded_data_parallel.py`` ``_post_backward_hook``: cast, then
      ``param.grad.div_(self.gradient_predivide_factor)``).
    - None: not priced (0).

    The reduce copy-in runs on FSDP's reduce-scatter stream, beside compute, but it still
    moves these bytes through the same memory; it is charged in full.
    """
    if zero_stage < 2 or training.fsdp_copies is None:
        return 0.0
    cb, rb = float(training.compute_bytes), float(training.grad_reduce_bytes)
    if training.fsdp_copies == "flat":
        return 2.0 * cb + (cb + rb if rb != cb else 0.0) + 2.0 * rb
    gathers = 2.0 if zero_stage == 3 else float(training.zero2_regather)
    return gathers * 2.0 * cb + cb + rb


def ddp_autocast_bytes_per_param(training: TrainingSpec, m: Any, synced: Any) -> Any:
    """Bytes of memory traffic per parameter and step that replicated data parallelism
    (zero_stage 0) under ``torch.autocast`` adds (``training.ddp_autocast``; 0 otherwise), for
    ``m`` micro-batches; ``synced``: DDP wraps the model (dp x cp > 1). Numbers or numpy
    arrays alike.

    - Each micro-batch's forward casts every fp32 weight to the compute dtype once (autocast
      caches the cast of a leaf that requires grad for its region: read 4, write 2 B) and
      its backward casts the weight gradient back to fp32 (``ToCopyBackward``: read 2, write
      4 B).
    - Micro-batches after the first add into the fp32 ``.grad`` (``AccumulateGrad``: read 8,
      write 4 B).
    - Each DDP sync copies the gradients into the reducer's buckets, dividing by the world
      size on the way (torch/csrc/distributed/c10d/reducer.cpp ``copy_grad_to_bucket``:
      ``mul_out``), and back after the all-reduce (``finalize_bucket_dense`` with
      ``gradient_as_bucket_view=False``, the default composer's ``prepare_ddp_module`` and
      torchtitan's ``replicate`` keep): 2 x (read 4, write 4) B; once per step, or every
      micro-batch where ``training.ddp_sync_every_microbatch``.
    """
    if not training.ddp_autocast or training.compute_bytes >= 4:
        return 0.0 * m
    cb = float(training.compute_bytes)
    syncs = (m if training.ddp_sync_every_microbatch else 1) * synced
    return m * 2.0 * (4.0 + cb) + (m - 1) * 12.0 + syncs * 16.0


def eager_ring_bytes(cp: int, q_elems: float, kv_elems: float, cb: float
                     ) -> tuple[float, float, tuple[int, int]]:
    """(forward bytes, backward bytes, (forward, backward) kernel launches) of PyTorch's ring
    attention outside its attention kernels, one layer and micro-batch, counted op by op
    from torch/distributed/tensor/experimental/_attention.py (``_templated_ring_attention``,
    ``_SDPAMerger`` with the default ``convert_to_f32``, ``_templated_ring_attention_backward``;
    load balancing on, as torchtitan runs it). ``q_elems`` / ``kv_elems``: elements of the
    rank's queries and of its keys plus values; ``cb``: bytes of the compute dtype.

    Load balancing makes about half of the steps after the first "partial": they touch
    half of the queries (forward) or of the K/V (backward dK/dV; dQ on the other half) and
    then re-concatenate the whole fp32 accumulator (``_partial_update``: read and write,
    8 B per element). An op costing c B per element thus averages 0.75 c + 4 over the steps.

    Forward: every step's output is cast to fp32 (read cb, write 4), the first one included;
    each of the cp - 1 merges then computes ``out - block_out`` (12 B), scales it by the
    sigmoid of the LSE difference (8 B) and subtracts it from the running output (12 B):
    36 + cb per query element; every step but the last packs K and V for the send
    (``torch.cat``: 2 cb); the result is cast back once (4 + cb).
    Backward: fp32 accumulators zeroed (4 B per element of Q, K, V); at each of the cp
    steps dQ and dK/dV are added into them (read 4 + cb, write 4), and dK/dV are packed for
    the fp32 dK/dV ring (8 B); K and V are packed for their own ring (2 cb, cp - 1 times);
    the results are cast back once (4 + cb).
    Launches: per forward step after the first, the attention call and the receive wait (as
    the fused path counts them) plus two casts, five elementwise ops and the K/V pack; the
    first step's and the final cast; per backward step three accumulations and two packs,
    per step after the first the attention call and the wait; three zero-fills and three
    final casts.
    """
    steps = cp - 1
    merge = 0.75 * (36.0 + cb) + 4.0
    fwd = (steps * (merge * q_elems + 2.0 * cb * kv_elems)
           + 2.0 * (4.0 + cb) * q_elems)
    acc = 0.75 * (8.0 + cb) + 4.0
    bwd = (cp * (acc * q_elems + (acc + 8.0) * kv_elems) + steps * 2.0 * cb * kv_elems
           + (4.0 + 4.0 + cb) * (q_elems + kv_elems))
    return fwd, bwd, (10 * steps + 2, 5 * cp + 2 * steps + 6)


def unpad_bytes(qkv_elems: float, out_elems: float, cb: float) -> tuple[float, float]:
    """(forward, backward) bytes per token of flash-attn's variable-length packing around the
    attention kernel (``TrainingSpec.attention_unpad``; flash-attn ``bert_padding.py``, called
    by llm-foundry's ``flash_attn_fn`` at 5e85bd62d with flash-attn 2.4.2): ``unpad_input``
    gathers q, k and v into the packed layout (``IndexFirstAxis``: ``torch.gather``, read and
    write), ``pad_input`` scatters the output into a zeroed tensor (``IndexPutFirstAxis``:
    ``torch.zeros``, then read and write). Backward: each of q, k, v scatters its gradient
    into a zeroed tensor (zero, read, write), the output's gradient is gathered (read,
    write). ``qkv_elems``: q + k + v elements per token on the rank, ``out_elems``: the
    output's; ``cb``: bytes per element. (Each ``unpad_input`` also reads a host value back,
    ``nonzero`` and ``.item()``, which is not priced.)"""
    return cb * (2.0 * qkv_elems + 3.0 * out_elems), cb * (3.0 * qkv_elems + 2.0 * out_elems)


def kv_repeat_bytes(k_elems: float, v_elems: float, k_rep: float, v_rep: float, cb: float, *,
                    fused: bool) -> float:
    """Bytes per token, each way, of repeating grouped-query K and V to the query heads
    before the attention call (``TrainingSpec.kv_repeat``; torchtitan's ``repeat_kv``,
    models/llama/model.py at 9dec370: ``unsqueeze``, ``expand``, ``reshape``, which copies).
    Eager: the copy reads K (V) and writes it repeated; the backward sums the repeated
    gradient back (read the repeated width, write the native one), the same bytes. Compiled
    (torch.compile): the K copy fuses with the rotary kernel before it, which then writes the
    repeated width instead of the native one (and its backward reads it), so K adds only the
    difference; V has no op to fuse with (its producer is a GEMM) and pays the whole copy.
    ``k_elems``/``v_elems``: the native widths per token on the rank, ``k_rep``/``v_rep`` the
    repeated ones; ``cb``: bytes per element."""
    k_extra = (k_rep - k_elems) if fused else (k_elems + k_rep)
    return cb * (k_extra + v_elems + v_rep)


def qkv_cat_bytes(qkv_elems: float, cb: float) -> float:
    """Bytes per token of the backward's concatenation of dq, dk and dv into the fused QKV
    projection's gradient where the forward split its output into views
    (``TrainingSpec.qkv_split_cat``; ``torch.split``'s backward is ``torch.cat``, which reads
    and writes every element): Megatron-LM's ``split_tensor_along_last_dim(mixed_x_layer,
    3)`` (megatron/model/transformer.py ``ParallelAttention``, 2021; the same in
    bigscience-workshop/Megatron-DeepSpeed), llm-foundry's ``qkv.split(...)`` after ``Wqkv``
    (llmfoundry/models/layers/attention.py at b2a43a147 and 5e85bd62d). ``qkv_elems``: q + k
    + v elements per token on the rank; ``cb``: bytes per element."""
    return 2.0 * cb * qkv_elems
