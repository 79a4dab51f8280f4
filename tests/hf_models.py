"""Tiny "pretrained" Hugging Face models for the fine-tuning tests: random weights saved with
`save_pretrained`, a small byte-level BPE tokenizer with a ChatML chat template, and a chat
JSON Lines data set whose assistant answers follow a rule a model can learn in a few steps.
Nothing is downloaded: every folder is built here, the same bytes every time (fixed seeds)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: A ChatML template (the Qwen family's form), with the generation prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
COLOURS = ["red", "green", "blue", "yellow", "black", "white", "orange", "purple"]


def chat_records(n: int, seed: int = 0) -> list[dict]:
    """`n` conversations: the user names a colour, the assistant answers with the colour after it."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        i = int(torch.randint(len(COLOURS), (1,), generator=gen))
        messages = [
            {"role": "system", "content": "You answer with one colour."},
            {"role": "user", "content": f"What comes after {COLOURS[i]}?"},
            {"role": "assistant", "content": f"After {COLOURS[i]} comes {COLOURS[(i + 1) % len(COLOURS)]}."},
        ]
        out.append({"messages": messages})
    return out


def write_chat_jsonl(path: str | Path, n: int = 400, seed: int = 0) -> str:
    """A chat JSON Lines file of `n` conversations; returns its path."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in chat_records(n, seed)))
    return str(path)


def tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE trained on the chat data's words, as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [m["content"] for r in chat_records(200) for m in r["messages"]] + ["system user assistant"]
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def tiny_llama_folder(
    folder: str | Path,
    *,
    tie: bool = False,
    layers: int = 2,
    hidden: int = 64,
    chat_template: bool = True,
    seed: int = 0,
) -> str:
    """A Llama-shaped model (GQA, RoPE, RMSNorm, SwiGLU) with random weights, saved as a Hugging
    Face folder with its tokenizer; returns the folder's path."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    tokenizer = tiny_tokenizer()
    if not chat_template:
        tokenizer.chat_template = None
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
