"""The causal LM as a Hugging Face `transformers` folder (GPT-2 architecture), which vLLM and
other serving stacks that read HF checkpoints load too.

kftrain's GPT is GPT-2's architecture (pre-norm blocks, tanh-GELU MLP, learned positions, tied
embeddings, LayerNorm eps 1e-5), so only names change, and the linear layers are transposed
(GPT-2 stores them as Conv1D, input-major). The tokenizer is byte-level with no merges: token
id = byte value, exactly what training used.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import save as save_safetensors

from trainer.gpt import GPT


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Weights under GPT2LMHeadModel's names (lm_head is tied to wte and not stored)."""
    sd = {"transformer.wte.weight": model.wte.weight, "transformer.wpe.weight": model.wpe.weight}
    for i, b in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        sd.update(
            {
                p + "ln_1.weight": b.ln1.weight,
                p + "ln_1.bias": b.ln1.bias,
                p + "attn.c_attn.weight": b.attn.qkv.weight.t(),
                p + "attn.c_attn.bias": b.attn.qkv.bias,
                p + "attn.c_proj.weight": b.attn.proj.weight.t(),
                p + "attn.c_proj.bias": b.attn.proj.bias,
                p + "ln_2.weight": b.ln2.weight,
                p + "ln_2.bias": b.ln2.bias,
                p + "mlp.c_fc.weight": b.fc.weight.t(),
                p + "mlp.c_fc.bias": b.fc.bias,
                p + "mlp.c_proj.weight": b.proj.weight.t(),
                p + "mlp.c_proj.bias": b.proj.bias,
            }
        )
    sd["transformer.ln_f.weight"] = model.ln_f.weight
    sd["transformer.ln_f.bias"] = model.ln_f.bias
    return {k: v.detach().cpu().contiguous() for k, v in sd.items()}


def hf_config(model: GPT) -> dict:
    """config.json of the equivalent GPT2LMHeadModel."""
    c = model.config
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": 4 * c.n_embd,
        "activation_function": "gelu_new",  # GELU, tanh approximation
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        # GPT-2's name for the context length, still read by older loaders.
        "n_ctx": c.block_size,
        # What the model computes; vLLM's GPT-2 asserts the first three are off and always scales
        # attention by 1/sqrt(head_dim).
        "add_cross_attention": False,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "scale_attn_weights": True,
        # The byte vocabulary has no special tokens. Left out, GPT2Config would default both to
        # 50256, an id outside this 256-token vocabulary that generation would then wait for.
        "bos_token_id": None,
        "eos_token_id": None,
    }


def generation_config(model: GPT) -> dict:
    """generation_config.json: no begin/end-of-text token (generation ends at the request's
    max_tokens or stop strings), and the whole context available to generate()."""
    return {"bos_token_id": None, "eos_token_id": None, "max_length": model.config.block_size}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level tokenizers."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer(model_max_length: int) -> dict[str, bytes]:
    """tokenizer.json (byte-level BPE without merges: id = byte value) and tokenizer_config.json."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {ch: b for b, ch in _bytes_to_unicode().items()},
            "merges": [],
        },
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length}
    return {
        "tokenizer.json": json.dumps(tokenizer, ensure_ascii=False).encode(),
        "tokenizer_config.json": json.dumps(config).encode(),
    }


def hf_folder(model: GPT) -> dict[str, bytes]:
    """Every file of the Hugging Face folder, by name."""
    return {
        "config.json": json.dumps(hf_config(model), indent=2).encode(),
        "generation_config.json": json.dumps(generation_config(model), indent=2).encode(),
        "model.safetensors": save_safetensors(hf_state_dict(model), metadata={"format": "pt"}),
        **byte_tokenizer(model.config.block_size),
    }
