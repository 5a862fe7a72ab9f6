"""The plans of a space that a trainer can run: ``specs.trainer.trainer_reasons`` restated over
the space's integer columns (one boolean mask per rule), so a search never ranks a plan the
named trainer cannot express. Rejected plans are counted under one reason per rule."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from paraplan.search.space.fix import RECOMPUTES
from paraplan.simulator.pipeline import SCHEDULES
from paraplan.specs.errors import SpecError
from paraplan.specs.model import ModelSpec
from paraplan.specs.plan import relaxed_knobs
from paraplan.specs.trainer import TrainerSpec, missing_features, optimizer_state_reasons
from paraplan.specs.trainer_rules import ddp_beside_others, mixed_precision_off
from paraplan.specs.training import TrainingSpec


def check_trainer_inputs(trainer: TrainerSpec, model: ModelSpec, training: TrainingSpec,
                         constants: dict) -> None:
    """Refuse, before any search, what no plan can fix: the model, the precision, a pinned
    relaxed-synchronization knob the trainer cannot express."""
    can, who = trainer.can, trainer.label
    if model.is_moe and not can.moe:
        raise SpecError(f"{who} (as paraplan exports it) has no mixture-of-experts models; "
                        "use --trainer megatron-core or torchtitan", field="--trainer",
                        value=trainer.name)
    missing = missing_features(trainer, model)
    if missing:
        raise SpecError(f"{who} has no {', '.join(missing)} in its model code, which "
                        f"{model.name} needs; pick a trainer whose profile lists them under "
                        "can.model_features (generic for a what-if study)", field="--trainer",
                        value=trainer.name)
    if model.is_moe and training.moe_dispatcher not in can.moe_dispatchers:
        raise SpecError(f"{who} has no {training.moe_dispatcher} MoE token dispatcher",
                        field="--moe-dispatcher", value=training.moe_dispatcher,
                        allowed=list(can.moe_dispatchers))
    if model.is_moe and training.moe_a2a_overlap and not can.moe_a2a_overlap:
        raise SpecError(f"{who} cannot overlap expert-parallel all-to-alls with compute",
                        field="--moe-a2a-overlap", value=True)
    if model.is_moe and training.precision == "fp8" and not can.fp8_moe:
        raise SpecError(f"{who} trains mixture-of-experts models in fp8 only as a prototype "
                        "paraplan does not write", field="--precision", value="fp8",
                        allowed=[p for p in can.precisions if p != "fp8"])
    if training.precision not in can.precisions:
        raise SpecError(f"{who} cannot train in --precision {training.precision}; it has "
                        f"{', '.join(can.precisions)}", field="--precision",
                        value=training.precision, allowed=list(can.precisions))
    for field, value, why in optimizer_state_reasons(trainer, training):
        raise SpecError(why, field=field, value=value)
    if not can.relaxed_sync:
        pinned = relaxed_knobs(constants)
        if pinned:
            raise SpecError(f"{who} synchronizes dense gradients every step; {pinned[0]} "
                            "cannot be pinned (use --trainer generic for what-if studies)",
                            field="--fix", value=pinned[0])


def _structural_rules(trainer: TrainerSpec, tp: Any, pp: Any, sched: Any
                      ) -> list[tuple[str, Any]]:
    """``trainer_mask``'s first rules, which read only tp, pp and the schedule: (reason,
    refused) for numbers or numpy arrays alike."""
    can, who = trainer.can, trainer.label
    allowed_sched = np.array([s in can.schedules for s in SCHEDULES])
    return [
        (f"{who} has no tensor parallelism", (tp > 1) & (not can.tensor_parallel)),
        (f"{who} has no pipeline parallelism", (pp > 1) & (not can.pipeline_parallel)),
        (f"{who} cannot run that pipeline schedule ({', '.join(can.schedules)} only)",
         (pp > 1) & ~allowed_sched[sched]),
    ]


def structural_reason(trainer: TrainerSpec, tp: int, pp: int, sched: int) -> str | None:
    """Why the trainer refuses every plan of a (tp, pp, schedule) block, by ``trainer_mask``'s
    first rules (``_structural_rules``: they read nothing else and come before every other
    rule, so a space that drops such blocks before building their rows counts them under the
    same reasons); None if it does not."""
    return next((reason for reason, refused in _structural_rules(trainer, tp, pp, sched)
                 if refused), None)


def trainer_mask(cols: dict[str, np.ndarray], trainer: TrainerSpec, model: ModelSpec,
                 training: TrainingSpec | None = None) -> tuple[np.ndarray, Counter]:
    """(rows the trainer can run, rejected plans counted by reason)."""
    can, who = trainer.can, trainer.label
    tp, pp, cp, ep, etp = cols["tp"], cols["pp"], cols["cp"], cols["ep"], cols["etp"]
    sp, zero, sched, v, rc, m = (cols["sp"], cols["zero"], cols["sched"], cols["v"], cols["rc"],
                                 cols["m"])
    piped = pp > 1
    allowed_rc = np.array([r in can.recompute for r in RECOMPUTES])
    allowed_zero = np.array([z in can.zero_stages for z in range(4)])
    piped_zero = can.zero_stages if can.zero_stages_with_pp is None else can.zero_stages_with_pp
    allowed_piped_zero = np.array([z in piped_zero for z in range(4)])
    # structural_reason's rules first: build_space drops those blocks under the same reasons.
    rules: list[tuple[str, np.ndarray]] = _structural_rules(trainer, tp, pp, sched) + [
        (f"{who} cannot express that ZeRO stage ({', '.join(map(str, can.zero_stages))} only)",
         ~piped & ~allowed_zero[zero]),
        (f"{who} runs ZeRO {', '.join(map(str, piped_zero))} with pipeline parallelism",
         piped & ~allowed_piped_zero[zero]),
        (f"{who} runs ZeRO <= {can.max_zero_stage_with_pp} with pipeline parallelism",
         piped & (zero > can.max_zero_stage_with_pp)),
        (f"{who} needs ZeRO >= {can.min_zero_stage_with_ep} with expert parallelism",
         (ep > 1) & (zero < can.min_zero_stage_with_ep)),
        (f"{who} cannot recompute that way ({', '.join(can.recompute)} only)",
         ~allowed_rc[rc]),
        (f"{who} splits layers evenly over the pipeline stages",
         (cols["uneven"] == 1) & (not can.uneven_layers)),
        (f"{who} has no context parallelism", (cp > 1) & (not can.context_parallel)),
        (f"{who} cannot pipeline a model whose word embedding is its output layer",
         piped & model.tie_word_embeddings & (not can.tied_embeddings_with_pp)),
        (f"{who} runs replicated data parallelism only without tp, pp or cp",
         ddp_beside_others(zero, cols["dp"], tp, pp, cp) & can.ddp_only_alone),
        (f"{who} trains in mixed precision with tp or pp only under FSDP",
         mixed_precision_off(zero, cols["dp"], tp, pp, cp) & can.mixed_precision_needs_fsdp
         & (training is not None and training.precision != "fp32")),
        (f"{who} does not set expert parallelism in its config",
         (ep > 1) & (not can.expert_parallel)),
        (f"{who} has no expert tensor-parallel degree other than tp",
         (etp != tp) & (not can.expert_tensor_parallel) & model.is_moe),
    ]
    if not can.empty_end_chunks:  # accounted splits of one layer per chunk (pipeline_chunks)
        rules.append((f"{who} gives every pipeline chunk a decoder layer",
                      (cols["uneven"] == 1) & (v > 1) & (pp * v == model.num_layers + 2)))
    if can.max_virtual_stages is not None:
        rules.append((f"{who} runs at most {can.max_virtual_stages} virtual stages per rank",
                      v > can.max_virtual_stages))
    if can.sequence_parallel == "never":
        rules.append((f"{who} has no Megatron sequence parallelism", (tp > 1) & (sp == 1)))
    if can.sequence_parallel == "always":
        rules.append((f"{who} always uses sequence parallelism with tp > 1",
                      (tp > 1) & (sp == 0)))
    if model.is_moe and can.moe_tp_needs_sp:
        rules.append((f"{who} trains MoE layers with tp > 1 only with sequence parallelism",
                      (tp > 1) & (sp == 0)))
    if model.is_moe and training is not None and training.moe_a2a_overlap:
        # specs.trainer.a2a_overlap_needs, over the plan space (the run-level two hold for
        # every plan or none).
        run_level = training.precision == "fp32" or model.num_mtp_layers > 1
        rules.append((f"{who} overlaps expert-parallel all-to-alls only with ep > 1, vpp > 1 "
                      "when pp > 1, no full recomputation, 16-bit weights and at most one MTP "
                      "layer",
                      (ep == 1) | (piped & (v == 1))
                      | (rc == RECOMPUTES.index("full")) | run_level))
    if training is not None and training.moments_dtype == "bf16":
        stages = np.array([z in can.bf16_moments_zero_stages for z in range(4)])
        rules.append((f"{who} keeps bf16 optimizer moments only with ZeRO "
                      f"{', '.join(map(str, can.bf16_moments_zero_stages))}", ~stages[zero]))
    if can.microbatches_per_stage:
        rules.append((f"{who} needs at least one micro-batch per pipeline stage",
                      piped & (m < pp * v)))
    if can.one_f_one_b_needs_pp_minus_1:
        rules.append((f"{who}'s 1F1B engine needs at least pp - 1 micro-batches",
                      piped & (sched == SCHEDULES.index("1f1b")) & (m < pp - 1)))
    keep = np.ones(len(tp), dtype=bool)
    rejected: Counter = Counter()
    for reason, bad in rules:
        hit = keep & bad
        count = int(hit.sum())
        if count:
            rejected[reason] += count
            keep &= ~hit
    return keep, rejected
