"""Facts of the published sources that their CSV rows leave out (each cited): Megatron 2021 Table
1's script settings, Korthikanti's batch sizes, default vocabularies, BLOOM's layer split and
Jean Zay's Omni-Path links."""

from __future__ import annotations

import re

from paraplan.simulator.stages import accounted_split

# NVIDIA/Megatron-LM examples/sc21/run_table_1.sh: model -> (tp, pp, mbs, gbs, vpp, DDP impl);
# vpp = layers / pp / --num-layers-per-virtual-pipeline-stage; every model uses
# "--recompute-method uniform" (full recompute).
SC21_TABLE_1: dict[str, tuple[int, int, int, int, int, str]] = {
    "GPT-1.7B": (1, 1, 16, 512, 1, "torch"),
    "GPT-3.6B": (2, 1, 16, 512, 1, "torch"),
    "GPT-7.5B": (4, 1, 16, 512, 1, "torch"),
    "GPT-18B": (8, 1, 8, 1024, 1, "torch"),
    "GPT-39B": (8, 2, 4, 1536, 1, "local"),
    "GPT-76B": (8, 4, 2, 1792, 3, "local"),
    "GPT-145B": (8, 8, 2, 2304, 2, "local"),
    "GPT-310B": (8, 16, 1, 2160, 2, "local"),
    "GPT-530B": (8, 35, 1, 2520, 3, "local"),
    "GPT-1T": (8, 64, 1, 3072, 1, "local"),
}

# Korthikanti Table 5 global batch per model (hidden size), for memory rows that omit it.
KORTHIKANTI_GBS = {6144: 4, 12288: 64, 20480: 280, 25600: 512}
# Korthikanti's configurations interleave the 175B and 530B pipelines 3 ways (calculon's
# transcription of the paper's Table 3, 'pipeline_interleaving' in validation/seqsel/tab5,
# as the throughput rows of the same runs carry), for rows that leave vpp empty (the memory
# rows). The paper's interleaved first stage holds 1 + (p - 1) / (p v) times the 1F1B
# activations (v = interleave count), which is what their activation values show: 1.29
# (p 8) and 1.32 (p 35) times the 1F1B value.
KORTHIKANTI_VPP = {12288: 3, 20480: 3}

# Vocabulary where a source's row leaves it empty.
DEFAULT_VOCAB = {
    # DT-FM's Megatron baselines ran dist_megatron_train_qqp.py (DS3Lab/Decentralized_FM_alpha
    # scripts/local_scripts/megatron_gpt3_xl_mp8_dp8.sh, megatron_gpt3_39b_mp8_dp8.sh @9be8558f):
    # Megatron's BERT Classification on QQP (BertWordPieceLowerCase, bert-large-cased-vocab.txt:
    # 28,996 tokens; a pooler and a 2-way classifier instead of an LM head), one untimed and 2
    # (GPT-XL) or 1 (39B) timed iterations. paraplan prices the GPT the table names (an LM
    # head of 50257), which over-counts the head: README "DT-FM's Megatron baselines".
    "dtfm_yuan2022": (50257, "vocab 50257 and an LM head: the measured run is Megatron's BERT "
                             "classifier (28,996-token WordPiece vocab, no LM head; "
                             "source_facts.DEFAULT_VOCAB)"),
    "korthikanti2022": (51200, "vocab 51200 (the Megatron GPT vocabulary of the throughput rows)"),
    "megatron2021_narayanan": (51200, "vocab 51200 (Megatron README)"),
    "megascale2024_megatron_baseline": (50257, "vocab 50257 (GPT-3 175B's BPE; MegaScale trains "
                                                "the GPT-3 architecture)"),
}

# Sources whose models tie the word embedding to the output layer (the rows' columns do not
# say): the GPT models of Megatron-LM 2021-22 (megatron/model/gpt_model.py: GPTModel is a
# MegatronModule with share_word_embeddings=True and computes its logits with
# word_embeddings_weight(); --untie-embeddings-and-output-weights came in 2023), BLOOM
# (bigscience Megatron-DeepSpeed GPTModelPipe: TiedLayerSpec('embed', EmbeddingPipe, ...) at both
# ends of the pipeline) and MPT (llm-foundry MPTConfig tie_word_embeddings=True: the logits
# reuse the SharedEmbedding wte). The others train Llama-style untied models; DT-FM's Megatron
# baseline is Megatron's BERT Classification (share_word_embeddings=False, see DEFAULT_VOCAB).
TIED_EMBEDDING_SOURCES = frozenset({"megatron2021_narayanan", "korthikanti2022",
                                    "bloom176b_bigscience", "mosaicml_llmfoundry_mpt"})

# The attention kernel of llm-foundry's large-scale H100 table (README section "H100 80GB BF16
# (Large Scale, >= 128 GPUs)", added in mosaicml/llm-foundry 5e85bd62d, 2024-01-06): its
# scripts/train/benchmarking/sweep.py passes --attn_impl flash for the 1b, 3b, 7b and 70b
# models and --attn_impl triton for 13b and 30b, and submit_benchmarks.py pip-installs
# '.[gpu-flash2]' (setup.py: flash-attn==2.4.2, whose kernel takes ALiBi slopes). The other
# tables (2023, '.[gpu]' = flash-attn 1.0.9, submit_benchmarks.py's default --attn_impl
# triton) keep the trainer profile's FlashAttention-1-class Triton kernel.
MPT_LARGE_SCALE_SECTION = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
MPT_LARGE_SCALE_FLASH2 = frozenset({"MPT-1b", "MPT-3b", "MPT-7b", "MPT-70b"})


def mpt_flash_attention_version(source_location: str, model_name: str) -> int | None:
    """FlashAttention version an llm-foundry benchmark row ran where its table's sweep
    names one other than the trainer profile's (2 for the large-scale H100 table's
    ``attn_impl: flash`` models), else None."""
    if MPT_LARGE_SCALE_SECTION in source_location and model_name in MPT_LARGE_SCALE_FLASH2:
        return 2
    return None


# The FSDP mixed-precision mode of llm-foundry's benchmark rows: each README row prints it
# (column "MP Mode", mosaicml/llm-foundry scripts/train/benchmarking/README.md @8c8dd48f).
# Composer's PURE (get_mixed_precision, composer/trainer/mosaic_fsdp.py and later
# mosaic_fsdp_utils.py: param, reduce and buffer dtype all the amp dtype, in every version)
# reduce-scatters bf16 gradients. DEFAULT is the trainer profile's bf16 parameters with float32
# reduction from composer v0.16.4 on (d745fcb1b, 2023-10-10); the DEFAULT rows are the H100
# tables (llm-foundry b2a43a147 and 5e85bd62d pin composer >= 0.16.4 and >= 0.17.2) and the A100
# 80GB table's October 2023 re-run (b2a43a147). PURE rows: every row of the A100 40GB table and
# the two MPT-70b rows of the A100 80GB table, kept from its May 2023 run (1ef7b4d21). The same
# split dates the software: the May 2023 runs used submit_benchmarks.py's default image
# (mosaicml/pytorch:1.13.1_cu117), whose non-reentrant checkpoint re-runs whole blocks; the
# DEFAULT rows' sweeps ran mosaicml/pytorch:2.1.0_cu121 (sweep.sh IMAGE at b2a43a147 and
# 5e85bd62d), whose checkpoint stops early (TrainingSpec.recompute_early_stop).
MPT_A100_40GB_SECTION = "A100 40GB with 1600 Gbps node-node interconnect (RoCE)"
MPT_A100_80GB_SECTION = "A100 80GB with 1600 Gbps node-node interconnect (RoCE)"


def mpt_pure_mixed_precision(source_location: str, model_name: str) -> bool:
    """True where an llm-foundry benchmark row's README row says MP Mode PURE (gradients
    reduced in bf16), False where it says DEFAULT (reduced in fp32)."""
    if MPT_A100_40GB_SECTION in source_location:
        return True
    return MPT_A100_80GB_SECTION in source_location and model_name == "MPT-70b"


# Doubt-column phrases that mean a plan field (or seq_len / batch / GPU count) was guessed.
# Hardware-only or architecture-only notes ("interconnect not stated", "filled from the public
# model config", "arch from mpt-*.yaml") do not make a row doubtful.
PLAN_DOUBT = re.compile(
    r"\bderived\b|\bassumed\b|\binferred\b|transcription|not in README|\bunknown\b|"
    r"\(not read\)|seq_len (?:\d+ = |not stated)",
    re.IGNORECASE,
)

# BLOOM tr11 README: --pp-partition-method 'type:transformer|embedding' gives
# [embed | 5 blocks], 6 blocks x 10, [5 blocks | embed].
BLOOM_LAYERS_PER_STAGE = [5] + [6] * 10 + [5]

# Decoder layers per pipeline chunk of NVIDIA's DeepSeek-V3 recipes, by (pp, vpp):
# NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py
# _get_deepseek_v3_pipeline_layout (set_deepseek_v3_pipeline_model_parallel_layout, which the
# H100, B200 and GB200 perf recipes call): the embedding shares the first chunk, the MTP layer
# and the loss the last; e.g. (8, 2): [embedding + 4 decoders] + 14 x [4] + [1 + mtp + loss].
# NVIDIA's Qwen3-235B-A22B recipes count the embedding and the loss as one layer each when they
# split the pipeline: Megatron-Bridge recipes/qwen/h100/qwen3_moe.py
# qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config sets account_for_embedding_in_pipeline_split
# and account_for_loss_in_pipeline_split, and every H100/B200/GB200 perf recipe of the model
# starts from it (perf_recipes/qwen/*/qwen3_moe.py: qwen3_235b_a22b_pretrain_config()).
# Llama 3.1 405B's recipes too: Megatron-Bridge v0.4.2 src/megatron/bridge/recipes/llama/llama3.py
# L1132-1133 (llama31_405b_pretrain_config) set both, and the GB200/H100 perf configs
# (scripts/performance/configs/llama/llama31_workload_base_configs.py) start from it.
ACCOUNTED_SPLIT_MODELS = ("qwen3-235b-a22b", "llama3-405b")


DEEPSEEK_V3_RECIPE_CHUNKS: dict[tuple[int, int], tuple[int, ...]] = {
    (4, 1): (16, 16, 16, 13),
    (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
    (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,),
}


def recipe_chunks(model_name: str, num_layers: int, pp: int, vpp: int
                  ) -> tuple[list[int], str] | None:
    """Decoder layers per pipeline chunk of a published recipe's hand-made layout, with a note
    saying whose layout it is; None where paraplan does not know the recipe's layout."""
    if model_name == "deepseek-v3" and (pp, vpp) in DEEPSEEK_V3_RECIPE_CHUNKS:
        chunks = list(DEEPSEEK_V3_RECIPE_CHUNKS[(pp, vpp)])
        return chunks, (f"layers per pipeline chunk {chunks} (Megatron-Bridge's DeepSeek-V3 "
                        "layout; the MTP layer and the loss on the last chunk)")
    if model_name in ACCOUNTED_SPLIT_MODELS and pp > 1:
        split = accounted_split(num_layers, pp, vpp)
        if split is not None:
            return split, (f"layers per pipeline chunk {split} (the recipe counts the "
                           "embedding and the loss as a layer each)")
    return None


def llama3_paper_layout(num_layers: int, pp: int) -> tuple[int, list[int]] | None:
    """(V, decoder layers per pipeline chunk) of Llama 3 405B's pipeline, from its paper
    (arXiv:2407.21783 v3, Sec. 3.3.2, p. 11): "To balance the pipeline, one Transformer layer
    is reduced each from the first and the last stages, respectively. This means that the
    first model chunk on the first stage has only the embedding, and the last model chunk on
    the last stage has only output projection and loss calculation", with "an interleaved
    schedule ... with V pipeline stages on one pipeline rank". A first chunk holding nothing
    but the embedding means chunks of one layer with the embedding and the loss counted as one
    each: V = (layers + 2) / pp (126 + 2 = 16 x 8), Megatron-Core's accounted split. None
    where the layers do not split so."""
    if pp < 2 or (num_layers + 2) % pp:
        return None
    vpp = (num_layers + 2) // pp
    split = accounted_split(num_layers, pp, vpp)
    return (vpp, split) if split is not None else None


OMNI_PATH_100G = {
    "name": "omnipath-100g", "kind": "infiniband", "bandwidth_Gbps": 100, "latency_us": 20,
    "efficiency": 0.9,
    "notes": "Intel Omni-Path 100 Gb/s port (Jean Zay, BLOOM tr11: 4 OPA links per node); "
             "latency and efficiency copied from the ib-hdr profile (ESTIMATE)",
}

# pytorch/torchtitan d1f62be73 (2025-02-20, "Adding loss_fn to TrainSpec") first compiled the
# loss with ``training.compile``; before it ``apply_compile`` compiled each TransformerBlock
# and the cross entropy ran eager (parallelize_llama.py at e846b69, 2024-12).
TORCHTITAN_LOSS_COMPILED_FROM = (2025, 2)
# pytorch/pytorch PR #165106 (2025-10-09) moved FSDP's reduce-scatters under
# torch.distributed.pipelining to the end of the step; before it (torch 2.6 stage.py
# ``backward_maybe_with_nosync``) each stage ran them after its last backward, ahead of that
# backward's gradient send (``TrainingSpec.pp_grad_sync`` ``cascade``).
TORCHTITAN_PP_GRAD_SYNC_AFTER_SCHEDULE_FROM = (2025, 10)
# pytorch/torchtitan 6e4988550 (2025-02-24, #881 "use Fused AdamW as default"); before it
# ``optimizer.fused`` defaulted to False and ``build_optimizers`` passed ``foreach=not fused``
# (torchtitan 9dec370, 2024-12-26, the commit of the 2024-12 H100 benchmarks).
TORCHTITAN_FUSED_ADAMW_FROM = (2025, 2)
# pytorch/torchtitan 25413d224 (2025-08-29, #1580 "Add config to AC to toggle early-stop")
# passes ``early_stop=False`` (activation_checkpoint.early_stop, default False) to every
# checkpoint wrapper; before it ``ptd_checkpoint_wrapper(module, preserve_rng_state=False)``
# took torch's default, which stops the re-run early (TrainingSpec.recompute_early_stop).
TORCHTITAN_AC_EARLY_STOP_OFF_FROM = (2025, 9)
# pytorch/torchtitan ff0829c10 (2026-01-27, #2259 "GQA without kv repeats") passes grouped K/V
# to the attention call as they are; before it models/llama/model.py repeated them to the
# query heads first (``repeat_kv``: unsqueeze, expand, reshape; 9dec370, 2024-12-26, lines
# 116 and 201-202), so ring attention passed and merged query-width K/V
# (``TrainingSpec.kv_repeat``).
TORCHTITAN_GQA_WITHOUT_REPEAT_FROM = (2026, 2)
# pytorch/torchtitan 5b5d46856 (2025-09-26, #1701) replaced the fp8 converter 'float8' with
# 'quantize.dense.float8' (8a2686c4a, #1763, 2025-09-30: 'quantize.linear.float8'), which the
# tensor-parallel plan's check for a converter named 'float8' no longer finds; before it fp8
# tensorwise runs applied torchao's Float8ColwiseParallel / Float8RowwiseParallel, whose
# all-gathers carry fp8 (``TrainingSpec.fp8_tp_gather``; parallelize_llama.py at ba2469780,
# 2024-12-19, and models/llama3/infra/parallelize.py at 2887250bb, 2025-06-16).
TORCHTITAN_FP8_TP_GATHER_OFF_FROM = (2025, 10)
ROW_DATE = re.compile(r"(20[12]\d)[-_]?(0[1-9]|1[0-2])")


def row_year_month(text: str) -> tuple[int, int] | None:
    """The first year-month (``2024-12``, ``202412``) in a row's source text, if any."""
    found = ROW_DATE.search(text)
    return (int(found.group(1)), int(found.group(2))) if found else None
