"""What the fine-tuning benchmarks share: a Llama-shaped model built from a config (nothing is
downloaded), saved as a Hugging Face folder, and the bytes a process holds."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def add_llama_arguments(parser: argparse.ArgumentParser, **defaults: int) -> None:
    """The model-shape options of a Llama benchmark, with the benchmark's own defaults."""
    d = {"layers": 6, "hidden": 768, "heads": 12, "kv_heads": 4, "intermediate": 2048, "vocab": 32000, **defaults}
    parser.add_argument("--layers", type=int, default=d["layers"])
    parser.add_argument("--hidden", type=int, default=d["hidden"])
    parser.add_argument("--heads", type=int, default=d["heads"])
    parser.add_argument("--kv-heads", type=int, default=d["kv_heads"])
    parser.add_argument("--intermediate", type=int, default=d["intermediate"])
    parser.add_argument("--vocab", type=int, default=d["vocab"], help="ignored where a tokenizer sets it")


def llama_config(args: argparse.Namespace, vocab: int | None = None, context: int = 4096):
    """A transformers LlamaConfig of the benchmark's shape (GQA, RoPE, RMSNorm, SwiGLU, untied)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab or args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=context,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def save_llama_folder(folder: str | Path, config, tokenizer=None, seed: int = 0) -> str:
    """A model of `config` with random weights (fixed seed) saved with save_pretrained, with
    `tokenizer` if given; returns the folder's path."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    del model
    return str(folder)


def proc_status_kb(*fields: str) -> dict[str, int]:
    """Fields of /proc/self/status in kB (VmRSS, VmHWM, RssAnon, RssFile, ...)."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in fields:
            out[name] = int(rest.split()[0])
    return out
