"""Data-parallel gradient synchronisation outside ZeRO-3: DDP / Megatron buckets over a group,
by NCCL-style collectives or parameter servers (``plan.dp_algorithm``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paraplan.simulator import collectives as coll
from paraplan.simulator.compression import effective_grad_bytes
from paraplan.simulator.memory import dp_bucket_elements
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import ParallelPlan
from paraplan.specs.topology import Topology
from paraplan.specs.training import TrainingSpec


def bucketed_grad_sync(topo: Topology, group: tuple[int, ...], model: ModelSpec,
                       plan: ParallelPlan, training: TrainingSpec, count: float) -> float:
    """``grad_sync_parts`` summed: the whole synchronisation of one step, seconds."""
    return sum(grad_sync_parts(topo, group, model, plan, training, count))


def pp_grad_chains(training: TrainingSpec, plan: ParallelPlan) -> int:
    """Gradient reductions a pipelined step waits for in full, one after another (0: they
    overlap the backward as usual). Sharded data parallelism (ZeRO-1/2; ZeRO-3's per-layer
    gathers and reduce-scatters are priced apart, ``step.simulate``) under PyTorch's
    pipelining reduces each stage's gradients as one chain of per-layer-group
    reduce-scatters after its last backward, each waiting on the compute stream for the one
    before (FSDP2 ``FSDPParamGroup.post_backward``): ``after_schedule`` runs every stage's
    chain at once after the schedule (1), ``cascade`` runs it before the stage sends its last
    input gradient back, so the last backward's wave waits for each stage's in turn (pp;
    ``TrainingSpec.pp_grad_sync``). DDP (ZeRO 0) keeps its hooks under the last backward."""
    if plan.zero_stage < 1 or plan.zero_stage == 3 \
            or (plan.zero_stage == 2 and training.zero2_regather):
        return 0
    return chains_per_step(training, plan.pp)


def chains_per_step(training: TrainingSpec, pp: int) -> int:
    """``pp_grad_chains`` of a plan with ``pp`` stages whose ZeRO stage has the chains (the
    search evaluator masks the ZeRO stages per plan itself)."""
    if pp <= 1 or training.pp_grad_sync == "overlapped":
        return 0
    return pp if training.pp_grad_sync == "cascade" else 1


def grad_sync_parts(topo: Topology, group: tuple[int, ...], model: ModelSpec,
                    plan: ParallelPlan, training: TrainingSpec, count: float, *,
                    gather_bytes: float | None = None) -> tuple[float, float]:
    """Seconds to synchronise ``count`` parameters' gradients over ``group`` without ZeRO-3,
    in DDP/Megatron buckets (``memory.dp_bucket_elements``: Megatron-Core's max(40M, 1M x
    dp) parameters; one bucket when the reduction is not overlapped, as Megatron sets
    ``bucket_size = None`` then), each paying the collective's latency.

    DDP all-reduces the gradients (with ``plan.dp_algorithm`` ps / sharded_ps: through a
    parameter server or DT-FM's sharded one instead of NCCL's collectives). ZeRO-1/2
    (Megatron's distributed optimizer, DeepSpeed ZeRO-1/2) reduce-scatter them and all-gather
    the updated parameters in the compute dtype, each a ring over the group
    (``collectives.group_collective``: NCCL runs reduce-scatter and all-gather as rings, with
    no tree to shorten their (n - 1) latency steps; its docs list Ring, plus NVLS/CollNet
    inside a switch domain and PAT for one GPU per node, for both), at the library's
    measured speed on that kind (``ClusterSpec.collective_efficiency``; gloo's
    reduce-scatter is ~3x slower than its all-reduce, NCCL's kinds are even).

    Returns (gradient part, parameter part): the all-reduce and 0 for DDP, the reduce-scatter
    and the all-gather for ZeRO-1/2 (ZeRO-2 repeats the first every micro-batch: step.py);
    ZeRO-1 all-reduces the gradients in full where ``training.zero1_grad_all_reduce``.
    ``gather_bytes``: bytes per gathered parameter (default: ``training.param_gather_bytes``
    over the plan's data-parallel degree, derived from the cluster's GPUs when the plan leaves
    it out: the group also holds the context-parallel ranks, which must not count, so a plan
    with ``dp`` given and the same plan without it price alike).
    """
    if count <= 0 or len(group) <= 1:
        return 0.0, 0.0
    dp = plan.resolved_dp(topo.num_gpus)
    if gather_bytes is None:
        gather_bytes = training.param_gather_bytes(dp)
    # Megatron-Core sizes buckets by the data-parallel size (without CP; expert buffers
    # alike) and reduces in one bucket when the reduction is not overlapped.
    buckets = max(1.0, count / float(dp_bucket_elements(dp, training.ddp_bucket_size))) \
        if plan.overlap_grad_reduce else 1.0
    grad_bytes = effective_grad_bytes(model, training, plan)

    def all_reduce(nbytes: float) -> float:
        if plan.dp_algorithm == "sharded_ps":
            return buckets * coll.sharded_ps_all_reduce(topo, group, nbytes / buckets)
        if plan.dp_algorithm == "ps":
            return buckets * coll.ps_all_reduce(topo, group, nbytes / buckets)
        return buckets * coll.group_collective(topo, group, "all_reduce", nbytes / buckets)

    def half(kind: str, nbytes: float) -> float:
        """A reduce-scatter or all-gather: a ring in NCCL; through a parameter server, which
        has none of its own, half of its all-reduce over the library's speed on that kind."""
        if plan.dp_algorithm in ("ps", "sharded_ps"):
            return 0.5 * all_reduce(nbytes) / coll.kind_efficiency(topo, kind)
        return buckets * coll.group_collective(topo, group, kind, nbytes / buckets)

    if plan.zero_stage not in (1, 2):
        return all_reduce(count * grad_bytes), 0.0
    params = half("all_gather", count * gather_bytes)
    if plan.zero_stage == 1 and training.zero1_grad_all_reduce:
        # DeepSpeed's bf16 pipeline engine: the whole gradient, then the updated parameters.
        return all_reduce(count * grad_bytes), params
    return half("reduce_scatter", count * grad_bytes), params


def overlapped_grad_sync(sync_s: Any, window_s: Any, buckets: Any, nccl_slowdown: float) -> Any:
    """Seconds a gradient synchronisation of ``sync_s`` leaves exposed when its buckets
    overlap a backward of ``window_s``: what the window cannot cover, but at least the last
    of ``buckets`` buckets (it starts when the backward ends), plus the compute NCCL's SMs
    take from the covered part (``Device.nccl_slowdown``). Numbers or numpy arrays alike:
    ``step.simulate``, the vectorized evaluator and the ILP's union DP time share it."""
    return (np.maximum(sync_s - window_s, sync_s / buckets)
            + np.minimum(sync_s, window_s) * nccl_slowdown)


def exposed_grad_sync(training: TrainingSpec, plan: ParallelPlan, m: int, grads: float,
                      params: float, exposed: Callable[[float], float]) -> float:
    """Seconds of one step's data-parallel synchronisation left exposed, given the gradient
    reduction (``grads``) and parameter gather (``params``) times of ``grad_sync_parts`` and
    ``exposed``, what a transfer leaves uncovered behind the backward (buckets, overlap,
    NCCL's SMs: the caller's rule). The one rule ``step.simulate`` and the ILP's union DP
    time share:

    - a pipelined stage under FSDP reduces its gradients as chains after its last backward
      (``pp_grad_chains``): nothing hides them;
    - ZeRO-2 keeps only its shard of the gradients, so with m > 1 micro-batches every
      micro-batch's gradients are reduce-scattered as its backward ends (DeepSpeed stage 2):
      m reduce-scatters, each hidden only behind its own backward, then one parameter
      all-gather (FSDP's re-gathering ZeRO-2 is priced per layer, by the caller);
    - DDP without ``no_sync`` (torchtitan, ``training.ddp_sync_every_microbatch``)
      all-reduces every micro-batch under its backward;
    - otherwise one reduction and gather per step. Divided by ``plan.dp_sync_interval``."""
    chains = pp_grad_chains(training, plan)
    if chains:
        out = chains * grads + exposed(params)
    elif plan.zero_stage == 2 and m > 1:
        out = (m - 1) * exposed(grads) + exposed(grads + params)
    elif plan.zero_stage == 0 and training.ddp_sync_every_microbatch:
        out = m * exposed(grads + params)
    else:
        out = exposed(grads + params)
    return out / plan.dp_sync_interval


def tied_embedding_sync(topo: Topology, model: ModelSpec, training: TrainingSpec,
                        plan: ParallelPlan, span: int,
                        placement: tuple[int, ...] | None = None) -> float:
    """Seconds a pipelined step waits to all-reduce the gradient of a word embedding whose
    copy sits on the last stage (``ModelSpec.embedding_on_last_stage``: tied to the output
    layer, or MTP's input embedding; 0 otherwise or with pp = 1): the first stage holds the
    embedding, the last its copy, and after the backward (and the data-parallel reduction)
    every trainer sums the two copies' gradients before the optimizer step, with nothing
    to hide it: Megatron-Core ``finalize_model_grads`` runs ``finish_grad_sync``, then
    ``_allreduce_word_embedding_grads`` on ``main_grad`` (megatron/core/distributed/
    finalize_model_grads.py); DeepSpeed's pipeline engine runs ``ReduceTiedGrads`` before
    ``ReduceGrads`` and the optimizer step (runtime/pipe/schedule.py, engine.py
    ``_exec_reduce_tied_grads``: the BF16 optimizer's fp32 ``_hp_grad``); Megatron-LM 2021-22
    ``train_step`` alike (``backward-embedding-all-reduce``). Each rank holds the vocab / tp
    rows of its TP shard, in the gradient buffer's dtype (fp32 where the trainer reduces or
    accumulates in fp32, ``training.grad_reduce_fp32`` / ``grad_accumulation`` fp32_add;
    compression knobs do not apply: it is not a data-parallel reduction)."""
    if not model.embedding_on_last_stage or plan.pp <= 1:
        return 0.0
    return coll.tied_embedding_all_reduce(topo, span, plan.pp,
                                          tied_embedding_bytes(model, training, plan.tp),
                                          placement)


def tied_embedding_bytes(model: ModelSpec, training: TrainingSpec, tp: int | float) -> float:
    """Bytes of the tied embedding gradient one rank all-reduces (``tied_embedding_sync``);
    numbers or numpy arrays of ``tp``."""
    fp32 = training.grad_reduce_fp32 or training.grad_accumulation == "fp32_add"
    elem = 4 if fp32 else training.compute_bytes
    return model.vocab_size * model.hidden_size / tp * elem
