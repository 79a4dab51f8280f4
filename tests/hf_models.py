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


def model_variant(
    folder: str | Path,
    out: str | Path,
    *,
    drop: tuple[str, ...] = (),
    config: dict | None = None,
    tokenizer_config: dict | None = None,
    drop_tensors: tuple[str, ...] = (),
    add: dict[str, str] | None = None,
) -> str:
    """A copy of the model folder `folder` at `out`, broken or changed on purpose: without the
    files in `drop`, with `config` merged into config.json and `tokenizer_config` into
    tokenizer_config.json (a None value removes the key), without the tensors in
    `drop_tensors`, and with the text files of `add`; returns its path."""
    from safetensors.torch import load_file, save_file

    folder, out = Path(folder), Path(out)
    out.mkdir(parents=True)
    for path in folder.iterdir():
        if path.name not in drop:
            (out / path.name).write_bytes(path.read_bytes())
    for name, changes in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        if changes and (out / name).exists():
            merged = {**json.loads((out / name).read_text()), **changes}
            (out / name).write_text(json.dumps({k: v for k, v in merged.items() if v is not None}))
    if drop_tensors:
        weights = load_file(out / "model.safetensors")
        save_file({k: v for k, v in weights.items() if k not in drop_tensors}, out / "model.safetensors")
    for name, text in (add or {}).items():
        (out / name).write_text(text)
    return str(out)


def base_model_config(init_from: str, extra: str = "", block_size: int = 128) -> str:
    """A causal_lm config fine-tuning `init_from`, with the sections of the YAML `extra` merged in."""
    import yaml

    tree = {"task": "causal_lm", "model": {"init_from": init_from, "block_size": block_size}}
    for section, fields in (yaml.safe_load(extra) or {}).items():
        tree.setdefault(section, {}).update(fields)
    return yaml.safe_dump(tree)
