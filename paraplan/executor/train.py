"""The trainer: ``train_worker`` runs one rank of a plan on the tiny GPT and measures it.

A launcher initialises ``torch.distributed`` (default group = all ranks) and calls
``train_worker(rank, world_size, config)`` in every process. ``reference_run(config)`` is the
one-process run the parallel one must reproduce (same weights, data and optimizer).

``config`` keys (``CONFIG_KEYS``):

- ``"model"``: ``TinyGPTConfig`` fields (dict).
- ``"plan"``: ``tp``, ``pp``, ``dp`` (None/absent = world / (tp pp)), ``ep``,
  ``sequence_parallel``, ``zero_stage`` (0 or 1), ``micro_batch_size``, ``schedule``
  (``"gpipe"``/``"afab"`` or ``"1f1b"``), ``layers_per_stage`` (optional); ``cp``, ``etp``,
  ``virtual_stages`` must be 1. Any other ``ParallelPlan`` field is refused by name: a run
  must never be labelled with a knob it did not execute (``"ignored_plan_keys"`` stays
  empty).
- ``"global_batch_size"`` (sequences per step), ``"steps"`` (1), ``"seed"`` (0, the data
  seed), ``"lr"`` (1e-3), ``"optimizer"`` (``"adamw"`` or ``"sgd"``), ``"bucket_elements"``
  (25e6), ``"return_grads"`` (False); ``"num_threads"`` is the launcher's (ignored here).
  Any other key is an error naming it.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from paraplan.executor.comm import Comm, uncounted_all_gather
from paraplan.executor.data_parallel import (
    DEFAULT_BUCKET_ELEMENTS,
    FlatGroup,
    ZeroOneOptimizer,
    all_reduce_gradients,
)
from paraplan.executor.grid import ProcessGrid
from paraplan.executor.model import ReferenceGPT, TinyGPTConfig
from paraplan.executor.pipeline_parallel import PipelineStage, run_schedule, stage_layers

CONFIG_KEYS = ("model", "plan", "global_batch_size", "steps", "seed", "lr", "optimizer",
               "bucket_elements", "return_grads", "num_threads")
_MUST_BE_ONE = ("cp", "etp", "virtual_stages")


@dataclass(frozen=True)
class ExecPlan:
    """The parts of a ``ParallelPlan`` the executor runs."""

    tp: int
    pp: int
    dp: int
    ep: int
    sequence_parallel: bool
    zero_stage: int
    micro_batch_size: int
    schedule: str
    layers_per_stage: list[int] | None
    ignored: tuple[str, ...]


def parse_plan(plan: dict[str, Any], world_size: int) -> ExecPlan:
    """Read ``config["plan"]``; raises ValueError naming the key that cannot run."""
    tp, pp, ep = int(plan.get("tp", 1)), int(plan.get("pp", 1)), int(plan.get("ep", 1))
    dp = plan.get("dp") or max(world_size // max(tp * pp, 1), 1)
    for key in _MUST_BE_ONE:
        if plan.get(key) not in (None, 1):
            raise ValueError(f"plan.{key}={plan[key]} is not supported by the executor; use 1")
    zero = int(plan.get("zero_stage", 0))
    if zero not in (0, 1):
        raise ValueError(f"plan.zero_stage={zero} is not supported by the executor; use 0 or 1")
    schedule = plan.get("schedule", "1f1b")
    if schedule not in ("gpipe", "afab", "1f1b"):
        raise ValueError(f"plan.schedule={schedule!r} is not supported by the executor; use "
                         f"'gpipe' (= 'afab') or '1f1b'")
    cf = plan.get("moe_capacity_factor")
    if cf is not None and float(cf) != float(ep):
        raise ValueError(f"plan.moe_capacity_factor={cf} is not supported by the executor, "
                         f"which pads every all-to-all to ep={ep} (no token is dropped); "
                         f"use {ep} or leave it out")
    known = {"tp", "pp", "dp", "ep", "sequence_parallel", "zero_stage", "micro_batch_size",
             "schedule", "layers_per_stage", "moe_capacity_factor", *_MUST_BE_ONE}
    ignored = sorted(set(plan) - known)
    if ignored:
        # A knob the executor does not run would label a run with something it never did
        # (compress=powersgd sending dense bytes, h=10 syncing every step).
        key = ignored[0]
        raise ValueError(f"plan.{key}={plan[key]!r} is not something the executor runs; "
                         f"leave it out (it runs tp, pp, dp, ep, sp, zero 0/1, mbs, "
                         f"gpipe/1f1b and layer splits)")
    return ExecPlan(tp, pp, int(dp), ep, bool(plan.get("sequence_parallel", False)), zero,
                    int(plan.get("micro_batch_size", 1)), schedule,
                    plan.get("layers_per_stage"), tuple(ignored))


def check_plan(cfg: TinyGPTConfig, plan: ExecPlan, global_batch_size: int) -> None:
    """Raise ValueError (field, value, rule, fix) if ``plan`` cannot shard ``cfg``."""
    tp = plan.tp
    for field, value in (("heads", cfg.heads), ("kv_heads", cfg.kv_heads),
                         ("ffn_hidden", cfg.ffn_hidden), ("vocab", cfg.vocab)):
        if value % tp:
            raise ValueError(f"tp={tp} does not divide {field}={value}; choose tp in "
                             f"{[d for d in range(1, value + 1) if value % d == 0]}")
    if plan.sequence_parallel and cfg.seq_len % tp:
        raise ValueError(f"sequence_parallel needs tp={tp} to divide seq_len={cfg.seq_len}")
    if plan.ep > 1 and (not cfg.num_experts or cfg.num_experts % plan.ep):
        raise ValueError(f"ep={plan.ep} must divide num_experts={cfg.num_experts} (> 0)")
    if plan.pp > cfg.num_layers:
        raise ValueError(f"pp={plan.pp} exceeds num_layers={cfg.num_layers}")
    per_step = plan.micro_batch_size * plan.dp
    if global_batch_size % per_step:
        raise ValueError(f"global_batch_size={global_batch_size} is not a multiple of "
                         f"micro_batch_size * dp = {per_step}")


def synthetic_batch(cfg: TinyGPTConfig, global_batch_size: int, step: int,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s (tokens, targets), each ``[global_batch_size, seq_len]`` int64: uniform
    random tokens from ``seed`` (targets are the tokens shifted by one)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    data = torch.randint(0, cfg.vocab, (global_batch_size, cfg.seq_len + 1), generator=gen)
    return data[:, :-1], data[:, 1:]


def make_optimizer(name: str, lr: float) -> Callable[[list], torch.optim.Optimizer]:
    """An optimizer factory (``"adamw"``: torch AdamW defaults; ``"sgd"``: plain SGD)."""
    if name == "adamw":  # the fused kernel (one pass, as Apex FusedAdam) where torch has it
        return lambda params: torch.optim.AdamW(params, lr=lr, fused=_fused_ok(params))
    if name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr)
    raise ValueError(f"optimizer={name!r} is not one of 'adamw', 'sgd'")


def _fused_ok(params: list) -> bool:
    """Whether ``torch.optim.AdamW(fused=True)`` supports these tensors' device."""
    device = params[0].device.type if params else "cpu"
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # pragma: no cover - older torch
        return device == "cuda"
    return device in _get_fused_kernels_supported_devices()


def _options(config: dict[str, Any]) -> dict[str, Any]:
    unknown = set(config) - set(CONFIG_KEYS)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; known: {list(CONFIG_KEYS)}")
    return {"steps": int(config.get("steps", 1)), "seed": int(config.get("seed", 0)),
            "make_opt": make_optimizer(config.get("optimizer", "adamw"),
                                       float(config.get("lr", 1e-3))),
            "bucket": int(config.get("bucket_elements", DEFAULT_BUCKET_ELEMENTS))}


def reference_run(config: dict[str, Any]) -> dict[str, Any]:
    """One process, whole batch: {"loss": per step, "grads": name -> first-step gradient}."""
    cfg, opts = TinyGPTConfig(**config["model"]), _options(config)
    model = ReferenceGPT(cfg)
    optimizer = opts["make_opt"](list(model.parameters()))
    losses, grads = [], {}
    for step in range(opts["steps"]):
        optimizer.zero_grad(set_to_none=True)
        loss = model(*synthetic_batch(cfg, config["global_batch_size"], step, opts["seed"]))
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    return {"loss": losses, "grads": grads}


def _reference_grads(stage: PipelineStage, grid: ProcessGrid) -> dict[str, torch.Tensor]:
    """This rank's gradients under reference names, TP shards gathered (uncounted)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in stage.named_parameters():
        pieces = p.grad.split(stage.piece_rows[name], dim=0)
        for shard, piece in zip(stage.shards[name], pieces, strict=True):
            full = piece if shard.split_dim is None else uncounted_all_gather(
                piece, grid.tp_group, dim=shard.split_dim)
            out[shard.name] = full.detach().cpu().clone()
    return out


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def train_worker(rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """Train ``config["steps"]`` optimizer steps of the plan on this rank and measure them.

    Args:
        rank: this process's global rank (the default group is already initialised).
        world_size: number of processes.
        config: see the module docstring.

    Returns:
        ``rank``; ``coords`` (pp, dp, tp, ep); ``loss`` (global mean token loss per step,
        the same on every rank); ``step_time_s`` (wall seconds per step); ``phase_s``
        (seconds summed over steps: forward, backward (TP/EP communication inside them),
        tp_grad_sync (SP), dp_grad_sync, optimizer (ZeRO-1 all-gather inside),
        pipeline_p2p, comm (all ``Comm`` seconds; overlaps the others));
        ``bytes_by_kind``, ``seconds_by_kind``, ``calls_by_kind`` (``Comm`` counters summed
        over all steps); ``peak_memory_bytes``; ``num_params_local``;
        ``num_micro_batches``; ``ignored_plan_keys``; with ``return_grads``, ``grads``:
        reference name -> this rank's full (TP-gathered, DP-reduced) first-step gradient,
        for every reference tensor this rank holds.
    """
    cfg, opts = TinyGPTConfig(**config["model"]), _options(config)
    plan = parse_plan(config["plan"], world_size)
    batch = int(config["global_batch_size"])
    check_plan(cfg, plan, batch)
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":  # the launcher's device: LOCAL_RANK (torchrun) or rank
        local = os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())
        device = torch.device("cuda", int(local))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    grid = ProcessGrid(plan.dp, plan.pp, plan.tp, plan.ep, rank=rank, world_size=world_size)
    comm = Comm()
    layers = stage_layers(cfg.num_layers, plan.pp, plan.layers_per_stage)[grid.pp_rank]
    stage = PipelineStage(cfg, grid, comm, layers, plan.sequence_parallel)
    stage.load_reference(ReferenceGPT(cfg).state_dict())
    stage.to(device)
    named = list(stage.named_parameters())
    dense_params = [p for n, p in named if ".experts." not in n]
    expert_params = [p for n, p in named if ".experts." in n]
    pad = (lambda g: dist.get_world_size(g)) if plan.zero_stage else (lambda g: 1)
    dense = FlatGroup(dense_params, opts["bucket"], pad(grid.dp_group), grad_views=True)
    expert = FlatGroup(expert_params, opts["bucket"], pad(grid.edp_group), grad_views=True)
    tp_partial = FlatGroup(stage.tp_replicated_parameters()
                           if plan.sequence_parallel and plan.tp > 1 else [], opts["bucket"])
    zeros = [ZeroOneOptimizer(fg, comm, g, plan.dp, opts["make_opt"])
             for fg, g in ((dense, grid.dp_group), (expert, grid.edp_group))
             if fg.params] if plan.zero_stage else []
    steppers = zeros or [opts["make_opt"]([p for _, p in named])]
    m = batch // (plan.micro_batch_size * plan.dp)
    s_local = cfg.seq_len // plan.tp if plan.sequence_parallel else cfg.seq_len
    act_shape = (plan.micro_batch_size, s_local, cfg.hidden)
    phase = dict.fromkeys(("forward", "backward", "tp_grad_sync", "dp_grad_sync", "optimizer"),
                          0.0)
    losses, step_times, grads = [], [], None
    for step in range(opts["steps"]):
        t_step = time.perf_counter()
        tokens, targets = synthetic_batch(cfg, batch, step, opts["seed"])
        rows = slice(grid.dp_rank * batch // plan.dp, (grid.dp_rank + 1) * batch // plan.dp)
        mbs = list(zip(tokens[rows].to(device).split(plan.micro_batch_size),
                       targets[rows].to(device).split(plan.micro_batch_size), strict=True))
        dense.zero_grad()
        expert.zero_grad()
        loss = run_schedule(plan.schedule, stage, mbs, comm, act_shape, phase)
        t0 = time.perf_counter()
        all_reduce_gradients(tp_partial, comm, grid.tp_group, 1)  # SP: sum partial grads
        t1 = time.perf_counter()
        if plan.zero_stage:
            for z in zeros:
                z.reduce_scatter_gradients()
        else:
            all_reduce_gradients(dense, comm, grid.dp_group, plan.dp)
            all_reduce_gradients(expert, comm, grid.edp_group, plan.dp)
        t2 = time.perf_counter()
        if step == 0 and config.get("return_grads"):
            for z in zeros:
                z.gather_gradients_for_test()
            grads = _reference_grads(stage, grid)
        t3 = time.perf_counter()
        for opt in steppers:
            opt.step()
            opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t4 = time.perf_counter()
        phase["tp_grad_sync"] += t1 - t0
        phase["dp_grad_sync"] += t2 - t1
        phase["optimizer"] += t4 - t3
        # Metric (uncounted): the global mean loss, identical on every rank.
        mine = loss / plan.dp if grid.is_last_stage and grid.tp_rank == 0 else loss * 0
        dist.all_reduce(mine)
        losses.append(float(mine))
        step_times.append(time.perf_counter() - t_step)
    phase["pipeline_p2p"] = comm.seconds_by_kind["p2p_send"]
    phase["comm"] = sum(comm.seconds_by_kind.values())
    grid.destroy()
    result = {"rank": rank, "coords": {"pp": grid.pp_rank, "dp": grid.dp_rank,
                                       "tp": grid.tp_rank, "ep": grid.ep_rank},
              "loss": losses, "step_time_s": step_times, "phase_s": phase,
              "bytes_by_kind": dict(comm.bytes_by_kind),
              "seconds_by_kind": dict(comm.seconds_by_kind),
              "calls_by_kind": dict(comm.calls_by_kind),
              "peak_memory_bytes": _peak_memory_bytes(device),
              "num_params_local": sum(p.numel() for _, p in named),
              "num_micro_batches": m,
              "ignored_plan_keys": list(plan.ignored)}
    if grads is not None:
        result["grads"] = grads
    return result
