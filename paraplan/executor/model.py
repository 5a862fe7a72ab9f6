"""Tiny GPT: its config and the single-process reference every parallel run must reproduce.

The reference is a pre-LN decoder: token embedding + learned positions, ``num_layers`` blocks
of ``x + Attn(LN(x))`` (causal, grouped KV heads) and ``x + MLP(LN(x))`` (GELU, or a top-k MoE),
final LN, an untied LM head and the mean token cross-entropy. Weights are PyTorch's default
initialisation under ``torch.manual_seed(config.seed)``; parallel ranks slice their shards
from this model's ``state_dict()`` so every run starts from the same numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyGPTConfig:
    """Shape of the tiny GPT (all sizes in elements)."""

    num_layers: int
    """Transformer blocks."""
    hidden: int
    """Model width h."""
    heads: int
    """Query heads; divides ``hidden`` (head_dim = hidden / heads)."""
    kv_heads: int
    """Key/value heads (grouped-query attention); divides ``heads``."""
    seq_len: int
    """Tokens per sequence (also the number of learned positions)."""
    vocab: int
    """Vocabulary size."""
    ffn_hidden: int
    """MLP (and each expert's) inner width."""
    num_experts: int = 0
    """Experts per MoE layer; 0 = dense MLP in every block, > 0 = MoE in every block."""
    top_k: int = 1
    """Experts each token is routed to (MoE only)."""
    seed: int = 0
    """Seed of the weight initialisation."""

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"heads={self.heads} does not divide hidden={self.hidden}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} does not divide heads={self.heads}")
        if self.num_experts and not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, num_experts="
                             f"{self.num_experts}]")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    def to_dict(self) -> dict[str, int]:
        """Plain-dict form (the ``config["model"]`` of ``train_worker``)."""
        return asdict(self)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int,
                     kv_heads: int) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + causal mask) V with grouped KV heads.

    Args:
        q: ``[b, s, heads * d]``; k, v: ``[b, s, kv_heads * d]``.
        heads, kv_heads: local head counts; query head ``i`` reads KV head
            ``i // (heads / kv_heads)``.

    Returns:
        ``[b, s, heads * d]``.
    """
    b, s, width = q.shape
    d = width // heads
    q = q.view(b, s, heads, d).transpose(1, 2)
    k = k.view(b, s, kv_heads, d).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)
    v = v.view(b, s, kv_heads, d).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, s, width)


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax router, top-k experts per token, weights NOT renormalised (Switch style, so the
    router gets a gradient even for k = 1). Returns (weights ``[T, k]``, experts ``[T, k]``)."""
    return torch.softmax(logits, dim=-1).topk(top_k, dim=-1)


class Attention(nn.Module):
    """Causal self-attention with separate Q, K, V projections (reference layout)."""

    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        d = cfg.head_dim
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        self.q = nn.Linear(cfg.hidden, cfg.heads * d)
        self.k = nn.Linear(cfg.hidden, cfg.kv_heads * d)
        self.v = nn.Linear(cfg.hidden, cfg.kv_heads * d)
        self.o = nn.Linear(cfg.heads * d, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = causal_attention(self.q(x), self.k(x), self.v(x), self.heads, self.kv_heads)
        return self.o(y)


class MLP(nn.Module):
    """``fc2(gelu(fc1(x)))``."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """Top-k mixture of experts, unlimited capacity: ``y_t = sum_k p_tk * E_{e_tk}(x_t)``."""

    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.hidden, cfg.ffn_hidden)
                                     for _ in range(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, experts = route(self.router(flat), self.top_k)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (experts == e).nonzero(as_tuple=True)
            if token.numel():
                y = expert(flat[token]) * weights[token, slot].unsqueeze(-1)
                out = out.index_add(0, token, y)
        return out.view_as(x)


class Block(nn.Module):
    """Pre-LN transformer block."""

    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        if cfg.num_experts:
            self.moe = MoE(cfg)
        else:
            self.mlp = MLP(cfg.hidden, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        ffn = self.moe if hasattr(self, "moe") else self.mlp
        return x + ffn(self.ln2(x))


class ReferenceGPT(nn.Module):
    """The one-process model; parameter names are the reference names used everywhere."""

    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
            self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
            # Non-trivial LayerNorm affine parameters, so their gradients are tested too.
            for name, p in self.named_parameters():
                if ".ln" in f".{name}":  # blocks.i.ln1/ln2 and ln_f
                    nn.init.normal_(p, mean=1.0 if name.endswith("weight") else 0.0, std=0.1)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[b, s, vocab]``, or the mean token cross-entropy when ``targets`` given."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
