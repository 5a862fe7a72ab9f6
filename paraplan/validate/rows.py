# longer than 400 lines: one row-to-spec translation (model, cluster, plan, training) whose
# parts read the same cells and notes; split, they would pass the row state around.
"""Specs from one published CSV row: model, cluster, training and plan, with per-source rules.

Row filling rules (each recorded in the case's ``assumptions``; a guessed plan field makes the
case ``doubtful``):
- Megatron 2021 Table 1: micro-batch, interleaving (virtual stages), full recompute and the
  DDP implementation come from NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``, the script
  the authors published for that table; it also confirms the tp/pp split and heads, which
  resolves the row's doubt.
- torchtitan: an empty seq_len is the Llama 3 default 8192 and an empty recompute the
  ``llama3_8b.toml`` default (selective, per op); with PP the CSV's micro_batch is the local
  batch, split into pp*vpp micro-batches (torchtitan's default ``pipeline_parallel_microbatches``)
  with torchtitan's default layer split and 2 stages per rank for interleaved schedules.
- BLOOM: 70 layers over 12 stages as tr11 partitions them (embeddings count as layers):
  5, 6 x 10, 5.
- Empty micro-batch elsewhere: 1; empty recompute elsewhere: none (both doubtful).

Clusters: A100 80/40GB -> dgx-a100-80gb/-40gb (Selene: 8x HDR 200G per node), except MosaicML's
"1600 Gbps RoCE" (8x roce-200g) and BLOOM's Jean Zay nodes (4x Omni-Path 100G); H100 ->
dgx-h100, except torchtitan's Grand Teton hosts (400 Gb/s RDMA per GPU) -> dgx-h100-roce;
H200 -> hgx-h200; V100 p3.16xlarge -> aws-p3.16xlarge (25 Gbps). The GPU memory is set to the
row's gpu_mem_gb where it differs from the preset (Grand Teton H100: 96/95 GB)."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

from paraplan.simulator.step import even_split
from paraplan.specs import (
    ClusterSpec,
    ModelSpec,
    ParallelPlan,
    SpecError,
    TrainingSpec,
    check_plan,
    load_cluster,
)
from paraplan.specs.loaders import cluster_from_dict, load_gpu, load_trainer
from paraplan.specs.mesh import cut_node
from paraplan.specs.trainer import TrainerSpec, apply_trainer, run_kernels
from paraplan.validate.conventions import (
    SOURCES,
    precision_from_text,
    recompute_from_text,
    zero_stage_from_text,
)
from paraplan.validate.row_cells import (
    PRESET_MODEL_SOURCES,
    SkipRow,
    cell,
    int_cell,
    make_spec,
    model_family,
    preset_model,
)
from paraplan.validate.source_facts import (
    BLOOM_LAYERS_PER_STAGE,
    DEFAULT_VOCAB,
    KORTHIKANTI_GBS,
    KORTHIKANTI_VPP,
    OMNI_PATH_100G,
    PLAN_DOUBT,
    SC21_TABLE_1,
    TIED_EMBEDDING_SOURCES,
    TORCHTITAN_AC_EARLY_STOP_OFF_FROM,
    TORCHTITAN_FP8_TP_GATHER_OFF_FROM,
    TORCHTITAN_FUSED_ADAMW_FROM,
    TORCHTITAN_GQA_WITHOUT_REPEAT_FROM,
    TORCHTITAN_LOSS_COMPILED_FROM,
    TORCHTITAN_PP_GRAD_SYNC_AFTER_SCHEDULE_FROM,
    llama3_paper_layout,
    mpt_flash_attention_version,
    mpt_pure_mixed_precision,
    recipe_chunks,
    row_year_month,
)

LAYOUT_GUESSED = "recipe layout not modelled"
"""Note on a row whose pipeline layout paraplan guessed (the near-even split of a recipe that
lays its stages out by hand); ``validate.recipes`` prices such recipes at their best split."""


@dataclass
class _Specs:
    source: str
    framework: str
    """The trainer profile's name (``hardware_profiles/trainers``)."""
    notes: list[str]
    doubt: bool = False
    model: ModelSpec | None = None
    cluster: ClusterSpec | None = None
    training: TrainingSpec | None = None
    plan: ParallelPlan | None = None
    num_gpus: int | None = None
    overlap: bool | None = None
    skip: str | None = None
    gbs: int | None = None
    seq_len: int | None = None

    def guess(self, note: str) -> None:
        self.notes.append(note)
        self.doubt = True


def _seq_len(row: dict[str, Any], s: _Specs) -> int:
    seq = int_cell(row, "seq_len")
    if seq is None:
        if s.source != "torchtitan":
            raise SkipRow("seq_len is not published for this row")
        s.guess("seq_len 8192 assumed (torchtitan Llama 3 train configs' default)")
        seq = 8192
    return seq


def _model(row: dict[str, Any], s: _Specs, seq: int) -> ModelSpec:
    name = cell(row, "model_name") or "unnamed"
    if s.source in PRESET_MODEL_SOURCES:
        # Architectures the row's columns cannot describe (MLA, sinks, local attention, MTP,
        # shared experts): the row names its model preset.
        return preset_model(name)
    family = model_family(name, s.source)
    layers, hidden = int_cell(row, "layers"), int_cell(row, "hidden")
    if layers is None or hidden is None:
        raise SkipRow("layers and hidden size are needed to build the model")
    heads = int_cell(row, "heads")
    if heads is None:
        heads = max(1, hidden // 128)
        s.notes.append(f"heads {heads} = hidden/128 (GPT-3 head width 128; not in the row)")
    activation = cell(row, "activation") or ("swiglu" if family == "llama" else "gelu")
    ffn = int_cell(row, "ffn_hidden")
    if ffn is None:
        if activation in ("swiglu", "geglu"):
            raise SkipRow("ffn_hidden is needed for a gated MLP")
        ffn = 4 * hidden
    vocab = int_cell(row, "vocab")
    if vocab is None:
        if s.source not in DEFAULT_VOCAB:
            raise SkipRow("vocab size is not published for this row")
        vocab, note = DEFAULT_VOCAB[s.source]
        s.notes.append(note)
    experts = int_cell(row, "moe_experts", minimum=0) or 0
    topk = int_cell(row, "moe_topk", minimum=0) or 0
    return make_spec(
        ModelSpec, "model", name=name, family=family, num_layers=layers, hidden_size=hidden,
        num_attention_heads=heads, num_kv_heads=int_cell(row, "kv_heads"), ffn_hidden_size=ffn,
        vocab_size=vocab, activation=activation,
        norm="rmsnorm" if family == "llama" else "layernorm",
        position_embedding={"llama": "rope", "mpt": "alibi", "bloom": "alibi"}.get(
            family, "learned"),
        max_position_embeddings=seq, tie_word_embeddings=s.source in TIED_EMBEDDING_SOURCES,
        use_bias=family in ("gpt", "bloom"), embedding_layernorm=family == "bloom",
        num_experts=experts, moe_top_k=topk,
    )


@functools.lru_cache(maxsize=64)
def _base_cluster(kind: str) -> ClusterSpec:
    """A one-node cluster per kind (preset name, or 'a100-<size>gb-roce' / '-opa'); cached
    because the specs are frozen and reading YAML dominates loading time."""
    match = re.fullmatch(r"a100-(40|80)gb-(roce|opa)", kind)
    if match is None:
        return load_cluster(kind)
    size, opa = match.group(1), match.group(2) == "opa"
    return cluster_from_dict({
        "name": kind,
        "description": ("A100 nodes with 4x 100 Gb/s Omni-Path (BLOOM tr11, Jean Zay)" if opa
                        else "A100 nodes with 8x 200 Gb/s RoCE = 1600 Gbps per node (MosaicML)"),
        "node": {"gpu": f"a100-sxm-{size}gb", "gpus_per_node": 8, "num_nodes": 1,
                 "intra_node_link": "nvlink3",
                 "inter_node_link": OMNI_PATH_100G if opa else "roce-200g",
                 "nics_per_node": 4 if opa else 8},
    })


def _cluster_kind(row: dict[str, Any], s: _Specs) -> str:
    """gpu_type / gpu_mem_gb / inter_node_link -> cluster preset (or custom A100 kind)."""
    gpu_type = cell(row, "gpu_type")
    low, link = gpu_type.lower(), cell(row, "inter_node_link").lower()
    if "v100" in low:
        return "aws-p3.16xlarge"
    if "h200" in low:
        return "hgx-h200"
    if "h800" in low:
        return "dgx-h800"
    if "gb200" in low:
        return "gb200-nvl72"
    if "b200" in low:
        return "dgx-b200"
    if "h100" in low:
        # Grand Teton (torchtitan): 400 Gb/s RDMA per GPU; Meta trains on Grand Teton over RoCE
        # (Llama 3 paper sec. 3.3.1), so the RoCE 400G profile (same bandwidth as IB NDR).
        roce = s.source == "torchtitan" or "rdma" in link or "roce" in link
        return "dgx-h100-roce" if roce else "dgx-h100"
    if "a100" in low:
        size = 40 if int_cell(row, "gpu_mem_gb") == 40 else 80
        if "omni" in link:
            s.notes.append("inter-node: 4x Omni-Path 100G per node")
            return f"a100-{size}gb-opa"
        if "roce" in link:
            s.notes.append("inter-node: 8x RoCE 200G per node (1600 Gbps)")
            return f"a100-{size}gb-roce"
        return f"dgx-a100-{size}gb"
    raise SkipRow(f"GPU type {gpu_type!r} has no cluster preset")


def _cluster(row: dict[str, Any], s: _Specs, num_gpus: int) -> ClusterSpec:
    cluster = _base_cluster(_cluster_kind(row, s))
    group = cluster.node_groups[0]
    gpn = int_cell(row, "gpus_per_node") or group.gpus_per_node
    nodes = max(1, math.ceil(num_gpus / gpn))
    if gpn != group.gpus_per_node:
        # A scale-up domain the row states (DGX-GB200 runs use 64 of a rack's 72 GPUs as one
        # NVLink domain), with the preset's NICs per GPU.
        nics = max(1, round(group.nics_per_node * gpn / group.gpus_per_node))
        group = group.model_copy(update={"gpus_per_node": gpn, "nics_per_node": nics,
                                         **cut_node(group, 0, gpn)})
        s.notes.append(f"{gpn} GPUs per scale-up domain (the row's)")
    group = group.model_copy(update={"num_nodes": nodes})
    if "hbm2e" in cell(row, "gpu_type").lower() and group.gpu.name == "h100-sxm":
        # Grand Teton H100s carry HBM2e (2.41 TB/s), not the SXM5's HBM3 (3.35 TB/s).
        group = group.model_copy(update={"gpu": load_gpu("h100-sxm-hbm2e")})
        s.notes.append("GPU h100-sxm-hbm2e (HBM2e part at its 500 W power limit)")
    mem = int_cell(row, "gpu_mem_gb")
    if mem and abs(group.gpu.memory_GiB - mem) > 1:
        gpu = group.gpu.model_copy(update={"memory_GiB": float(mem)})
        group = group.model_copy(update={"gpu": gpu})
        s.notes.append(f"{gpu.name} memory set to the row's {mem} GB ({cell(row, 'gpu_type')})")
    if num_gpus < group.gpus_per_node:
        group = group.model_copy(update={"gpus_per_node": num_gpus, "num_nodes": 1,
                                         **cut_node(group, 0, num_gpus)})
    return cluster.model_copy(update={"node_groups": [group]})


def _torchtitan_split(layers: int, stages: int) -> list[int]:
    """torchtitan ``generate_split_points`` (2024-12): first stage base, middle stages take the
    remainder one by one, the last stage what is left."""
    base, extra = divmod(layers, stages)
    sizes = [base]
    for _ in range(stages - 2):
        take = base + (1 if extra > 0 else 0)
        extra -= 1 if extra > 0 else 0
        sizes.append(take)
    sizes.append(layers - sum(sizes))
    return sizes


def _plan(row: dict[str, Any], s: _Specs, model: ModelSpec, num_gpus: int) -> ParallelPlan:
    tp, pp = int_cell(row, "tp") or 1, int_cell(row, "pp") or 1
    cp, ep, dp = int_cell(row, "cp") or 1, int_cell(row, "ep") or 1, int_cell(row, "dp")
    zero = zero_stage_from_text(cell(row, "zero_stage"))
    if zero is None:
        raise SkipRow(f"zero_stage {cell(row, 'zero_stage')!r} is not understood")
    recompute = recompute_from_text(cell(row, "recompute"))
    if recompute is None and cell(row, "recompute"):
        raise SkipRow(f"recompute {cell(row, 'recompute')!r} is not understood")
    mbs, gbs = int_cell(row, "micro_batch"), int_cell(row, "global_batch")
    vpp_text = cell(row, "vpp")
    vpp: int | None = None
    if vpp_text:
        if re.fullmatch(r"\d+(\.0+)?", vpp_text):
            vpp = int_cell(row, "vpp")
        elif "interleav" not in vpp_text.lower():
            raise SkipRow(f"vpp {vpp_text!r} is not understood")
    layers_per_stage: list[int] | None = None
    name = cell(row, "model_name")

    if s.source == "megatron2021_narayanan":
        sc21 = SC21_TABLE_1.get(name)
        if sc21 and sc21[:2] == (tp, pp) and sc21[3] == gbs:
            mbs = mbs or sc21[2]
            vpp = vpp or sc21[4]
            recompute = recompute or "full"
            s.overlap = sc21[5] == "torch"
            s.notes.append(f"mbs={sc21[2]}, vpp={sc21[4]}, full recompute, DDP={sc21[5]} from "
                           "Megatron-LM examples/sc21/run_table_1.sh")
        else:
            s.guess("row does not match examples/sc21/run_table_1.sh; defaults used")
    if vpp is None and not vpp_text and s.source == "korthikanti2022":
        vpp = KORTHIKANTI_VPP.get(model.hidden_size)
        if vpp is not None:
            s.guess(f"{vpp}-way interleaving from the Table 3 config of this model")
    if vpp is None:
        if vpp_text:  # "interleaved; chunks not stated"
            vpp = 2
            s.guess("interleaved with 2 stages per rank (torchtitan's default when no split "
                    "points are given)")
        else:
            vpp = 1
    if s.source == "torchtitan" and pp > 1:
        local = mbs or 1
        n_micro = pp * vpp
        if gbs is None:
            gbs = local * (dp or max(1, num_gpus // (tp * pp * cp)))
            s.guess(f"global batch {gbs} = local batch {local} x dp (not in the row)")
        if local % n_micro == 0:
            mbs = local // n_micro
            s.guess(f"local batch {local} split into pp*vpp={n_micro} micro-batches of {mbs} "
                    "(torchtitan default pipeline_parallel_microbatches)")
        if model.num_layers % n_micro:
            layers_per_stage = _torchtitan_split(model.num_layers, n_micro)
            s.notes.append(f"layers per stage {layers_per_stage} (torchtitan default split)")
    piped_zero = _trainer(s.framework).can.zero_stages_with_pp
    if pp > 1 and piped_zero is not None and zero not in piped_zero and 1 in piped_zero:
        s.notes.append(f"zero_stage {zero} -> 1: {s.framework}'s FSDP under pipelining keeps "
                       "parameters and gradients unsharded until the last backward")
        zero = 1
    if s.source == "bloom176b_bigscience" and pp == 12 and model.num_layers == 70:
        layers_per_stage = list(BLOOM_LAYERS_PER_STAGE)
        s.notes.append("layers per stage 5,6x10,5 (tr11 'type:transformer|embedding' partition)")
    if s.source == "llama3_paper" and vpp == 1 and not vpp_text:
        layout = llama3_paper_layout(model.num_layers, pp)
        if layout is not None:
            vpp, layers_per_stage = layout
            s.notes.append(f"interleaved, V={vpp}, one layer per chunk with the first chunk "
                           "holding only the embedding and the last only the loss (paper "
                           "Sec. 3.3.2, p. 11: source_facts.llama3_paper_layout)")
    if recompute is None:
        if s.source == "torchtitan":
            recompute = "selective"
            s.guess("selective (per-op) recompute assumed: llama3_8b.toml default")
        else:
            recompute = "none"
            s.guess("recompute not stated; none assumed")
    if mbs is None:
        mbs = 1
        s.guess("micro-batch not stated; 1 assumed")
    s.gbs = gbs
    if s.source in PRESET_MODEL_SOURCES and layers_per_stage is None:
        known = recipe_chunks(model.name, model.num_layers, pp, vpp)
        if known is not None:
            layers_per_stage, note = known
            s.notes.append(note)
        elif model.num_layers % (pp * vpp):
            # The recipes lay uneven stages out with --pipeline-model-parallel-layout (e.g.
            # DeepSeek-V3 "Et|(tt|)*30mL"); the nearest even split stands in for it.
            layers_per_stage = even_split(model.num_layers, pp * vpp)
            s.guess(f"layers per pipeline chunk {layers_per_stage} ({LAYOUT_GUESSED})")
    return make_spec(
        ParallelPlan, "plan", tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        # torchtitan's TP plan always shards norms over the sequence (SequenceParallel) and
        # uses loss parallel (torchtitan/models/llama3/infra/parallelize.py apply_tp).
        sequence_parallel=cell(row, "sequence_parallel").lower() in ("1", "true", "yes")
        or (_trainer(s.framework).can.sequence_parallel == "always"
            and (int_cell(row, "tp") or 1) > 1),
        zero_stage=zero, micro_batch_size=mbs, schedule="interleaved" if vpp > 1 else "1f1b",
        virtual_stages=vpp, recompute=recompute, layers_per_stage=layers_per_stage,
        # Megatron-Bridge's MoE recipes set expert_tensor_parallel_size=1 (sources.md).
        **({"etp": 1} if s.source in PRESET_MODEL_SOURCES and model.is_moe else {}),
    )


def row_specs(row: dict[str, Any], memory: bool = False) -> _Specs:
    """Build every spec of one row; a problem ends up in ``skip`` with what was built so far."""
    source = cell(row, "source_id")
    conv = SOURCES.get(source)
    name = cell(row, "trainer") or (conv.trainer if conv else "generic")
    s = _Specs(source=source, framework=name, notes=[])
    if PLAN_DOUBT.search(cell(row, "doubt")):
        if source == "megatron2021_narayanan" and cell(row, "model_name") in SC21_TABLE_1:
            s.notes.append("doubt column resolved by examples/sc21/run_table_1.sh")
        else:
            s.guess(f"CSV doubt column: {cell(row, 'doubt')}")
    try:
        flash = conv.flash_attention if conv is not None else _flag(row, "flash_attention", True)
        seq = _seq_len(row, s)
        s.seq_len = seq
        s.model = _model(row, s, seq)
        num_gpus = int_cell(row, "num_gpus")
        if num_gpus is None:
            if not memory:
                raise SkipRow("num_gpus is not published for this row")
            dp = int_cell(row, "dp") or 1
            num_gpus = dp * ((int_cell(row, "tp") or 1) * (int_cell(row, "pp") or 1)
                             * (int_cell(row, "cp") or 1))
            s.guess(f"{num_gpus} GPUs = tp*pp*cp*dp with dp={dp} (GPU count not in the row)")
        s.num_gpus = num_gpus
        s.cluster = _cluster(row, s, num_gpus)
        s.plan = _plan(row, s, s.model, num_gpus)
        precision = precision_from_text(cell(row, "precision"))
        if precision is None:
            if source == "korthikanti2022":
                precision = "fp16"
                s.notes.append("fp16 (Korthikanti runs, per calculon's transcription)")
            elif not cell(row, "precision"):
                # bf16 and fp16 peaks are equal on A100/H100/H200, so this does not move the
                # time; a GPU without bf16 is rejected by the plan checker.
                precision = "bf16"
                s.guess("16-bit precision assumed (the row leaves it empty)")
            else:
                raise SkipRow(f"precision {cell(row, 'precision')!r} is not understood")
        if s.gbs is None and memory and source == "korthikanti2022":
            s.gbs = KORTHIKANTI_GBS.get(s.model.hidden_size)
            if s.gbs is not None:
                s.guess(f"global batch {s.gbs} from the Table 5 config of this model")
        if s.gbs is None:
            raise SkipRow("global batch size is not published, so neither the step time nor the "
                          "pipeline schedule of this run is known")
        notes = (cell(row, "notes") + " " + cell(row, "secondary_metrics")).lower()
        trainer = _trainer(s.framework)
        s.overlap = s.overlap if s.overlap is not None else trainer.runs.overlap_grad_reduce
        explicit: dict[str, Any] = {}
        when = row_year_month(cell(row, "source_location") + " " + notes)

        def torchtitan_before(date: tuple[int, int]) -> bool:
            """A torchtitan row dated before ``date`` (year, month)."""
            return s.framework == "torchtitan" and when is not None and when < date

        if "compile" in notes:
            explicit["kernels"] = "fused"
            if torchtitan_before(TORCHTITAN_LOSS_COMPILED_FROM):
                explicit["loss_kernels"] = "eager"
                s.notes.append("loss eager: torchtitan compiled only the TransformerBlocks "
                               "before 2025-02")
        if torchtitan_before(TORCHTITAN_PP_GRAD_SYNC_AFTER_SCHEDULE_FROM):
            explicit["pp_grad_sync"] = "cascade"  # matters only where pp > 1
        if torchtitan_before(TORCHTITAN_FUSED_ADAMW_FROM):
            explicit["optimizer_impl"] = "foreach"
        if torchtitan_before(TORCHTITAN_GQA_WITHOUT_REPEAT_FROM):
            explicit["kv_repeat"] = True
        if torchtitan_before(TORCHTITAN_AC_EARLY_STOP_OFF_FROM):
            explicit["recompute_early_stop"] = True
        if torchtitan_before(TORCHTITAN_FP8_TP_GATHER_OFF_FROM) and "rowwise" not in (
                notes + " " + cell(row, "precision").lower()):
            explicit["fp8_tp_gather"] = True  # matters only for fp8 with sequence parallel
        flash_v = mpt_flash_attention_version(cell(row, "source_location"),
                                              cell(row, "model_name"))
        if source == "mosaicml_llmfoundry_mpt" and flash_v is not None:
            explicit["flash_attention_version"] = flash_v
            explicit["attention_unpad"] = True  # flash_attn_fn's unpad_input / pad_input
            s.notes.append("attn_impl flash (flash-attn 2.4.2, varlen with unpad/pad): the "
                           "large-scale H100 sweep (llm-foundry 5e85bd62d sweep.py)")
        if source == "mosaicml_llmfoundry_mpt" and mpt_pure_mixed_precision(
                cell(row, "source_location"), cell(row, "model_name")):
            explicit["grad_reduce_fp32"] = False
            explicit["recompute_early_stop"] = False
            s.notes.append("FSDP mixed precision PURE: gradients reduced in bf16 (its README "
                           "row's MP Mode); the May 2023 sweep's torch 1.13 re-runs whole "
                           "blocks")
        if conv is not None and conv.grad_reduce_fp32 is not None:
            explicit["grad_reduce_fp32"] = conv.grad_reduce_fp32
        if conv is not None and conv.tp_dgrad_overlap is not None:
            explicit["tp_dgrad_overlap"] = conv.tp_dgrad_overlap
        if conv is not None and conv.sync_free_moe:
            explicit["moe_host_sync_s"] = 0.0
        # A row's own gradient-sync and optimizer-state dtypes (the config it ran: NeMo's
        # optim.grad_sync_dtype; apex DistributedFusedAdam's optim.dtype, "datatype for
        # optimizer state", its parameter copy and both moments; Megatron's precision-aware
        # optimizer --exp-avg-dtype / --exp-avg-sq-dtype, the moments only).
        if cell(row, "grad_sync_dtype"):
            explicit["grad_reduce_fp32"] = cell(row, "grad_sync_dtype") == "fp32"
            s.notes.append(f"gradients reduced in {cell(row, 'grad_sync_dtype')} (its config)")
        for column in ("master_weights_dtype", "moments_dtype"):
            if cell(row, column) == "none":  # the optimizer updates the 16-bit parameters
                explicit["master_weights"] = False
                s.notes.append("no master copy of the parameters (its config)")
            elif cell(row, column):
                explicit[column] = cell(row, column)
                s.notes.append(f"{column} {cell(row, column)} (its config)")
        if source == "stas00_h200_b200":
            # HF transformers' LlamaForCausalLM without Liger-Kernel or torch.compile
            # (bench_decompose.py USE_LIGER=0): every norm, rotary, SwiGLU and the loss eager.
            explicit["kernels"] = "eager"
            s.notes.append("eager PyTorch modules (HF transformers, no Liger, no compile)")
        if source == "llama3_paper" and "cp is all-gather based" in notes:
            # Llama 3 (arXiv:2407.21783 p. 11): "the key (K) and value (V) tensors are first
            # all-gathered, and then attention output is computed for the local query".
            explicit["cp_kv_exchange"] = "allgather"
            s.notes.append("context parallel K/V all-gathered before attention (the paper)")
        # NVIDIA's fp8 recipes name their scaling (perf summary: "FP8 current scaling",
        # "MXFP8"); the rest keep their trainer's recipe.
        if "current scaling" in notes:
            explicit["fp8_scaling"] = "current"
        elif "mxfp8" in notes:
            explicit["fp8_scaling"] = "block"
        # paraplan's own MoE rows name the recipe's dispatcher, all-to-all overlap and
        # routing balance (NVIDIA's benchmarks force it: --moe-router-force-load-balancing).
        if cell(row, "moe_dispatcher"):
            explicit["moe_dispatcher"] = cell(row, "moe_dispatcher")
        if cell(row, "moe_a2a_overlap"):
            explicit["moe_a2a_overlap"] = _flag(row, "moe_a2a_overlap", False)
        if cell(row, "moe_load_imbalance"):
            explicit["moe_load_imbalance"] = float(cell(row, "moe_load_imbalance"))
        if cell(row, "moe_dispatcher_sms"):  # the flex dispatcher's SMs (HybridEP: 32)
            explicit["moe_dispatcher_sms"] = int(cell(row, "moe_dispatcher_sms"))
        kernels = explicit.get("kernels", run_kernels(trainer.runs, precision))
        how = "torch.compile" if "kernels" in explicit else (
            f"{trainer.name} compiles fp8 runs" if kernels != trainer.runs.kernels
            else trainer.name)
        s.notes.append(f"{kernels} non-GEMM kernels ({how})")
        if s.framework == "torchtitan" and s.plan.recompute == "selective":
            if "selective layer" in cell(row, "secondary_metrics"):
                # docs/performance.md's "selective layer" rows: selective_ac_option "2", the
                # default of torchtitan's config_manager.py at 6a6f755d2 ("2 = checkpoint
                # every other layer").
                s.plan = s.plan.model_copy(update={"recompute": "layer"})
                s.notes.append("torchtitan selective layer = every other layer recomputed "
                               "(selective_ac_option='2')")
            else:
                # The llama3 train configs set selective_ac_option = "op".
                s.plan = s.plan.model_copy(update={"recompute": "op"})
                s.notes.append("torchtitan selective = op-level SAC (selective_ac_option='op')")
        # "AsyncTP" (the 2024-12 tables), "tp_mode=async TP" (the 2025-06 asyncTP table)
        if s.plan.tp > 1 and re.search(r"async\s*tp", notes):
            s.plan = s.plan.model_copy(update={"tp_comm_overlap": True})
        s.plan = s.plan.model_copy(update={"overlap_grad_reduce": s.overlap})
        training = make_spec(TrainingSpec, "training", global_batch_size=s.gbs, seq_len=seq,
                             precision=precision, flash_attention=flash, **explicit)
        s.training, s.plan = apply_trainer(trainer, training, s.plan)
        if s.plan.tp_comm_overlap:
            s.notes.append("TP communication overlapped with GEMMs (async TP / userbuffers)")
        reasons = check_plan(s.model, s.cluster, s.training, s.plan)
        if reasons:
            raise SkipRow("plan is illegal: " + "; ".join(reasons))
    except (SkipRow, SpecError) as exc:
        s.skip = str(exc)
    return s


@functools.lru_cache(maxsize=32)
def _trainer(name: str) -> TrainerSpec:
    """The trainer profile a row names (its own ``trainer`` column, else its source's)."""
    return load_trainer(name)


def _flag(row: dict[str, Any], key: str, default: bool) -> bool:
    text = cell(row, key).lower()
    return default if not text else text in ("1", "true", "yes")
