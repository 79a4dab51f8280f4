"""The causal LM as a Hugging Face `transformers` folder (GPT-2 architecture), which vLLM and
other serving stacks that read HF checkpoints load too.

kftrain's GPT is GPT-2's architecture (pre-norm blocks, tanh-GELU MLP, learned positions, tied
embeddings, LayerNorm eps 1e-5), so only names change, and the linear layers are transposed
(GPT-2 stores them as Conv1D, input-major). The tokenizer is the tokenizer.json training used
(trainer/tokenizer.py): by default byte-level with no merges (token id = byte value).
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import save as save_safetensors

from trainer.gpt import GPT
from trainer.tokenizer import EOS_TOKEN, Tokenizer, byte_tokenizer_json, tokenizer_from_json


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


def tokenizer_config(tokenizer: Tokenizer, model_max_length: int) -> dict:
    """tokenizer_config.json that matches `tokenizer` (its special token as bos and eos, like GPT-2)."""
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length}
    if tokenizer.eos_id is not None:
        config.update(bos_token=EOS_TOKEN, eos_token=EOS_TOKEN)
    # Older transformers default to True, which rewrites " ." as "." on decode: the text would
    # no longer be what the model's ids stand for.
    config["clean_up_tokenization_spaces"] = False
    return config


def hf_folder(model: GPT, tokenizer_json: bytes | None = None) -> dict[str, bytes]:
    """Every file of the Hugging Face folder, by name, with `tokenizer_json` (default: `bytes`)."""
    raw = tokenizer_json if tokenizer_json is not None else byte_tokenizer_json()
    tokenizer = tokenizer_from_json(raw, "of the Hugging Face export")
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} token ids but the model only {model.config.vocab_size}: "
            "export the tokenizer the model was trained with"
        )
    config, generation = hf_config(model), generation_config(model)
    if tokenizer.eos_id is not None:  # its end-of-text token begins and ends texts, as in GPT-2
        for c in (config, generation):
            c.update(bos_token_id=tokenizer.eos_id, eos_token_id=tokenizer.eos_id)
    return {
        "config.json": json.dumps(config, indent=2).encode(),
        "generation_config.json": json.dumps(generation, indent=2).encode(),
        "model.safetensors": save_safetensors(hf_state_dict(model), metadata={"format": "pt"}),
        "tokenizer.json": raw,
        "tokenizer_config.json": json.dumps(tokenizer_config(tokenizer, model.config.block_size)).encode(),
    }
