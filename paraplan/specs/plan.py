"""ParallelPlan: how one training step is split across GPUs.

Field names follow Megatron-LM where one exists (tp = tensor-model-parallel size, pp =
pipeline-model-parallel size, cp = context-parallel size, ep = expert-model-parallel size).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from paraplan.specs.base import StrictModel
from paraplan.specs.errors import SpecError, from_validation_error
from paraplan.specs.safe_io import parse_json

Schedule = Literal["gpipe", "1f1b", "interleaved", "zb-h1"]
Recompute = Literal["none", "selective", "op", "full", "layer"]


class ParallelPlan(StrictModel):
    """A parallel plan. ``dp`` may be left out: it is then world size / (tp * pp * cp)."""

    tp: int = Field(default=1, ge=1, le=65_536)
    """Tensor (Megatron) parallel degree."""
    pp: int = Field(default=1, ge=1, le=65_536)
    """Pipeline stages."""
    dp: int | None = Field(default=None, ge=1, le=10_000_000)
    """Data-parallel replicas; None = derived from the cluster size."""
    cp: int = Field(default=1, ge=1, le=65_536)
    """Context parallel degree (sequence split across ranks, ring attention)."""
    ep: int = Field(default=1, ge=1, le=65_536)
    """Expert parallel degree (MoE experts split across ranks of the dp*cp group)."""
    etp: int | None = Field(default=None, ge=1, le=65_536)
    """Tensor parallel degree inside experts; None = tp (Megatron's default)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (norm/dropout activations split over tp)."""
    moe_capacity_factor: float | None = Field(default=None, gt=0, le=1_000)
    """MoE all-to-all buffers padded to this multiple of the mean routed rows (Megatron-Core
    --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity; paraplan's executor
    pads to ep, so no token is ever dropped). None = dropless: exactly the routed rows."""
    zero_stage: Literal[0, 1, 2, 3] = 0
    """ZeRO: 1 shards optimizer states, 2 also gradients, 3 also weights (FSDP), over dp."""
    micro_batch_size: int = Field(default=1, ge=1, le=1_000_000)
    """Sequences per micro-batch per replica."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule; 'interleaved' needs virtual_stages > 1."""
    virtual_stages: int = Field(default=1, ge=1, le=1024)
    """Model chunks per pipeline rank (Megatron's virtual pipeline size)."""
    recompute: Recompute = "none"
    """Activation recomputation: none; selective (Megatron: the attention core); op
    (torchtitan's op-level selective checkpointing: keep attention outputs and every other
    matmul output, recompute the rest); full (whole layer); layer (torchtitan's layer-level
    selective checkpointing, ``selective_ac_option = "2"``: every other layer fully
    recomputed, the others kept whole). The searchers do not pick ``layer``; simulate, import,
    export and validation price it."""
    layers_per_stage: list[int] | None = None
    """Explicit transformer layers per pipeline stage (uneven split); None = even."""
    allow_cross_node_tp: bool = False
    """Permit a TP group to span nodes (normally a mistake: TP needs NVLink bandwidth)."""
    tp_comm_overlap: bool = False
    """Overlap TP collectives with the adjacent GEMMs (torchtitan async TP, Megatron-Core
    --tp-comm-overlap with Transformer Engine userbuffers)."""
    overlap_p2p_comm: bool = False
    """Interleaved schedules: each pipeline send/receive overlapped with the next chunk's
    compute (Megatron's default, ``--no-overlap-p2p-communication`` turns it off:
    megatron/training/arguments.py). Only what one chunk's forward cannot hide stays exposed.
    No effect without interleaving."""
    overlap_grad_reduce: bool = True
    """DP gradient reduction overlaps the backward pass (Megatron-Core --overlap-grad-reduce,
    PyTorch DDP/FSDP buckets). False for frameworks that reduce after the pipeline flush
    (Megatron-LM 2021, DeepSpeed pipeline engine)."""
    dp_sync_interval: int = Field(default=1, ge=1, le=1_000_000)
    """Local SGD / DiLoCo: replicas synchronize every H steps (1 = every step)."""
    grad_compression_ratio: float = Field(default=1.0, ge=1.0, le=1e6)
    """Bytes of DP gradient traffic are divided by this (any compressor you measured);
    ``grad_compression`` names one whose ratio paraplan computes."""
    grad_compression: Literal["none", "powersgd", "quantize", "topk", "cocktail"] = "none"
    """DP gradient compressor (``simulator.compression``): powersgd needs compression_rank,
    quantize compression_bits, topk compression_topk, cocktail both. Bytes only:
    convergence effects are not modelled."""
    compression_rank: int | None = Field(default=None, ge=1, le=65_536)
    """PowerSGD rank r."""
    compression_bits: int | None = Field(default=None, ge=1, le=32)
    """Bits per transmitted gradient value (quantize, cocktail)."""
    compression_topk: float | None = Field(default=None, gt=0, le=1)
    """Fraction of gradient values kept (topk, cocktail)."""
    dp_algorithm: Literal["collective", "ps", "sharded_ps"] = "collective"
    """How data-parallel gradients are exchanged (ZeRO 0-2): collective = NCCL's ring / tree /
    node hierarchy; ps = one parameter server; sharded_ps = every replica serves 1/n (DT-FM's
    alternative for slow, uneven networks). ``simulator.collectives`` prices each."""
    pseudo_grad_bits: int | None = Field(default=None, ge=1, le=32)
    """DiLoCo: bits per value of the outer pseudo-gradient sent every dp_sync_interval steps
    (None = the gradient dtype)."""
    activation_compression_bits: int | None = Field(default=None, ge=1, le=32)
    """AQ-SGD: bits per value of activations (and their gradients) between pipeline stages
    (None = the compute dtype)."""
    placement: list[int] | None = None
    """GPU index of each rank (``placement[rank]``, a permutation of the cluster's GPUs; ranks
    in Megatron order, see ``simulator.step``). None = rank order (rank r on GPU r). Set by
    the evolutionary searcher (DT-FM-style topology-aware placement); ``simulate`` then
    prices every stage's data-parallel group and every pipeline boundary on the GPUs they
    actually use and takes the slowest."""

    @model_validator(mode="before")
    @classmethod
    def _chunks_mean_interleaved(cls, data: Any) -> Any:
        """virtual_stages > 1 with no schedule given means the interleaved schedule, the only
        one with model chunks (Megatron selects it from ``--num-layers-per-virtual-pipeline-
        stage`` alone); an explicit other schedule is still refused by ``check_plan``."""
        if isinstance(data, dict) and "schedule" not in data:
            v = data.get("virtual_stages")
            if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                return {**data, "schedule": "interleaved"}
        return data

    @model_validator(mode="after")
    def _shape(self) -> ParallelPlan:
        need = {"powersgd": ("compression_rank",), "quantize": ("compression_bits",),
                "topk": ("compression_topk",),
                "cocktail": ("compression_topk", "compression_bits")}.get(self.grad_compression,
                                                                          ())
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"grad_compression={self.grad_compression!r} needs "
                             f"{' and '.join(missing)}")
        if self.pseudo_grad_bits is not None and self.dp_sync_interval == 1:
            raise ValueError("pseudo_grad_bits is for DiLoCo: it needs dp_sync_interval > 1")
        if self.layers_per_stage is not None:
            if len(self.layers_per_stage) != self.pp * self.virtual_stages:
                raise ValueError(
                    f"layers_per_stage has {len(self.layers_per_stage)} entries; it needs "
                    f"pp*virtual_stages={self.pp * self.virtual_stages} (one per model chunk)"
                )
            if any(n < 0 for n in self.layers_per_stage):
                raise ValueError("layers_per_stage entries must be >= 0")
        if self.placement is not None:
            if len(set(self.placement)) != len(self.placement):
                raise ValueError("placement lists a GPU twice; it must map each rank to a "
                                 "different GPU")
            if any(g < 0 for g in self.placement):
                raise ValueError("placement entries are GPU indices >= 0")
        return self

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def model_parallel_size(self) -> int:
        """GPUs holding one model replica: tp * pp * cp."""
        return self.tp * self.pp * self.cp

    def resolved_dp(self, num_gpus: int) -> int:
        """dp as given, or num_gpus // (tp*pp*cp) when left out."""
        return self.dp if self.dp is not None else max(1, num_gpus // self.model_parallel_size)

    def world_size(self, num_gpus: int) -> int:
        return self.resolved_dp(num_gpus) * self.model_parallel_size

    def short(self) -> str:
        """Compact one-line form, e.g. ``tp=8 pp=4 dp=16 mbs=1 1f1b rc=selective``."""
        parts = [f"tp={self.tp}", f"pp={self.pp}"]
        if self.dp is not None:
            parts.append(f"dp={self.dp}")
        for key, default in (("cp", 1), ("ep", 1)):
            if getattr(self, key) != default:
                parts.append(f"{key}={getattr(self, key)}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.zero_stage:
            parts.append(f"zero={self.zero_stage}")
        parts.append(f"mbs={self.micro_batch_size}")
        if self.pp > 1:
            vpp = f"x{self.virtual_stages}" if self.virtual_stages > 1 else ""
            parts.append(self.schedule + vpp)
        if self.recompute != "none":
            parts.append(f"rc={self.recompute}")
        if self.dp_algorithm != "collective":
            parts.append(self.dp_algorithm)
        if self.dp_sync_interval > 1:
            parts.append(f"H={self.dp_sync_interval}")
        if self.grad_compression != "none":
            k, bits = self.compression_topk, self.compression_bits
            arg = {"powersgd": f"r{self.compression_rank}", "quantize": f"{bits}bit",
                   "topk": f"{k}", "cocktail": f"{k}x{bits}bit"}[self.grad_compression]
            parts.append(f"{self.grad_compression}:{arg}")
        if self.activation_compression_bits is not None:
            parts.append(f"aq{self.activation_compression_bits}bit")
        if not self.rank_order:
            parts.append("placed")
        return " ".join(parts)

    @property
    def rank_order(self) -> bool:
        """Ranks sit on GPUs in rank order: no placement, or the identity one (which the
        evolutionary searcher gives its rank-order baselines so that ``simulate`` prices
        every stage boundary on the GPUs it uses)."""
        return self.placement is None or self.placement == list(range(len(self.placement)))


# Short names users type in inline plans (`tp=8,pp=4,mbs=1,vpp=2,sp=1,zero=1,rc=full`).
ALIASES = {
    "mbs": "micro_batch_size",
    "micro_batch": "micro_batch_size",
    "vpp": "virtual_stages",
    "sp": "sequence_parallel",
    "zero": "zero_stage",
    "rc": "recompute",
    "layers": "layers_per_stage",
    "h": "dp_sync_interval",
    "compress": "grad_compression",
    "rank": "compression_rank",
    "bits": "compression_bits",
    "topk": "compression_topk",
    "aq_bits": "activation_compression_bits",
    "dp_algo": "dp_algorithm",
}


def _coerce_inline(key: str, raw: str) -> Any:
    if key == "layers_per_stage":
        return [int(x) for x in raw.replace("/", " ").replace(";", " ").split()]
    if key in ("sequence_parallel", "allow_cross_node_tp"):
        low = raw.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        return raw
    try:
        return int(raw)
    except ValueError:
        try:
            return float(raw)
        except ValueError:
            return raw


def parse_plan(text: str | dict[str, Any]) -> ParallelPlan:
    """Parse an inline plan (``tp=8,pp=4,mbs=1``), a JSON object string, or a dict.

    A dict may be a plan or a paraplan plan export with a ``plan`` key.

    Raises:
        SpecError: unknown keys, bad values, malformed text.
    """
    if isinstance(text, dict):
        data = text.get("plan", text) if isinstance(text.get("plan"), dict) else text
    elif not isinstance(text, str):
        raise SpecError(f"a plan must be a mapping of plan keys (or inline text such as "
                        f"tp=8,pp=4,mbs=1), not a {type(text).__name__}", field="plan",
                        value=type(text).__name__)
    else:
        stripped = text.strip()
        if not stripped.replace(",", "").strip():
            raise SpecError("plan is empty; write e.g. tp=8,pp=4,mbs=1", field="plan", value=text)
        if stripped.startswith("{"):
            data = parse_json(stripped, "plan JSON", "--plan")
            if not isinstance(data, dict):
                raise SpecError("plan JSON must be an object", field="plan", value=text)
            if isinstance(data.get("plan"), dict):
                data = data["plan"]
        else:
            data = {}
            for item in stripped.replace(" ", ",").split(","):
                if not item:
                    continue
                if "=" not in item:
                    if item in ("sp", "sequence_parallel"):
                        data["sequence_parallel"] = True
                        continue
                    raise SpecError(
                        f"plan item {item!r} is not key=value; write e.g. tp=8,pp=4,mbs=1",
                        field="plan", value=item, allowed="key=value pairs separated by commas",
                    )
                key, raw = item.split("=", 1)
                key = ALIASES.get(key.strip().lower(), key.strip().lower())
                if key in data:
                    raise SpecError(f"plan sets {key} twice ({item!r}); give each key once",
                                    field=f"plan.{key}", value=raw)
                try:
                    data[key] = _coerce_inline(key, raw.strip())
                except ValueError:
                    raise SpecError(
                        f"plan.{key}={raw!r} is not a list of integers (e.g. layers=20/20/20/20)",
                        field=f"plan.{key}", value=raw,
                    ) from None
    data = {ALIASES.get(str(k), str(k)): v for k, v in data.items()}
    try:
        return ParallelPlan(**data)
    except ValidationError as exc:
        raise from_validation_error(exc, "plan") from None
    except TypeError as exc:  # pragma: no cover - defensive (non-str keys)
        raise SpecError(f"plan is malformed: {exc}", field="plan") from None


RELAXED_FIELDS = ("dp_sync_interval", "grad_compression", "grad_compression_ratio",
                  "activation_compression_bits", "pseudo_grad_bits")
"""Plan fields of relaxed synchronization (local SGD, compression) no pinned trainer config
expresses; a trainer profile allows them with ``can.relaxed_sync``."""


def relaxed_knobs(values: dict[str, Any]) -> list[str]:
    """The relaxed-synchronization fields among plan ``values`` set away from their defaults."""
    return [f for f in RELAXED_FIELDS
            if f in values and values[f] != ParallelPlan.model_fields[f].default]
