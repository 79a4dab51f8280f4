"""A GPT-style decoder-only transformer (GPT-2 architecture: pre-norm blocks, GELU MLP,
learned positions, tied input/output embeddings), sized by `GPTConfig`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model; GPT-2 small is n_layer=12, n_head=12, n_embd=768, block_size=1024."""

    vocab_size: int = 256
    """Token ids the embedding and the tied output layer cover (the tokenizer's vocabulary)."""
    block_size: int = 1024
    """Longest sequence, in tokens: the number of learned positions."""
    n_layer: int = 12
    """Transformer blocks."""
    n_head: int = 12
    """Attention heads per block; `n_embd` divides by it."""
    n_embd: int = 768
    """Width of the residual stream (embeddings and every block's input and output)."""
    dropout: float = 0.0
    """Dropout probability on the embeddings, attention weights and residual branches (0: none)."""

    def as_dict(self) -> dict:
        """Plain-mapping form, stored in the model metadata."""
        return asdict(self)


class SelfAttention(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_embd, self.dropout = c.n_head, c.n_embd, c.dropout
        self.qkv = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.proj = nn.Linear(c.n_embd, c.n_embd)
        self.resid_drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(self.n_embd, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        # Fused (flash / memory-efficient) attention kernels where the device has them.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(c.n_embd)
        self.attn = SelfAttention(c)
        self.ln2 = nn.LayerNorm(c.n_embd)
        self.fc = nn.Linear(c.n_embd, 4 * c.n_embd)
        self.proj = nn.Linear(4 * c.n_embd, c.n_embd)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    """Token ids (B, T) in, next-token logits (B, T, vocab) out."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings, as in GPT-2
        self.apply(self._init)
        # GPT-2: residual projections scaled down with depth so the residual stream stays O(1).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def num_params(self) -> int:
        """Parameters, counting the tied embedding once."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per weight (forward + backward) plus attention scores."""
        c = self.config
        non_embedding = self.num_params() - self.wpe.weight.numel()
        return 6.0 * non_embedding + 12.0 * c.n_layer * c.n_embd * c.block_size
