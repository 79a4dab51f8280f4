"""A tiny "pretrained" Hugging Face model and chat data to fine-tune it on, built here (random
weights, a byte-level BPE trained on the data's words, a ChatML chat template; fixed seeds, so
the same files every time, and nothing downloaded): the demo of fine-tuning
(`configs/finetune-tiny.yaml`, `kftrain example-model`) and the tests' "pretrained" model.

The chat data follows a rule a model learns in a few dozen steps (the user names a colour, the
assistant answers with the colour after it), so a fine-tune visibly lowers the assistant loss.
Each question carries its own number, so no two conversations are alike: the val and test splits,
held out by record, hold conversations the training split does not, and measure the rule learned
rather than the conversations remembered.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from trainer.errors import KftrainError

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
    """`n` conversations, each its own: the user asks question k (1 to `n`) naming a colour, the
    assistant answers with the colour after it."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(n):
        i = int(torch.randint(len(COLOURS), (1,), generator=gen))
        messages = [
            {"role": "system", "content": "You answer with one colour."},
            {"role": "user", "content": f"Question {k + 1}: what comes after {COLOURS[i]}?"},
            {"role": "assistant", "content": f"After {COLOURS[i]} comes {COLOURS[(i + 1) % len(COLOURS)]}."},
        ]
        out.append({"messages": messages})
    return out


def write_chat_jsonl(path: str | Path, n: int = 400, seed: int = 0) -> str:
    """A chat JSON Lines file of `n` conversations; returns its path."""
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in chat_records(n, seed)))
    return str(path)


def tiny_tokenizer(vocab_size: int = 400):
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
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one tiny file: a progress bar is noise

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
    for path in folder.iterdir():  # safetensors writes its file 0600: readable like the rest, as a download is
        if path.is_file():
            path.chmod(0o644)
    return str(folder)


class ExampleInTheWay(KftrainError):
    """Where the example goes holds something else: it is never overwritten."""


#: What `write_example` wrote last, by target: the digests of its files (a newer kftrain, torch
#: or transformers writes other bytes; what is still as written may be replaced).
WRITTEN = ".kftrain-example.json"


def write_example(out_dir: str | Path, records: int = 600) -> tuple[str, str]:
    """The tiny Llama folder and a chat JSON Lines file under `out_dir`; returns their paths.

    Written aside first, then put in place: a target that exists is replaced when it is this
    example (as written now, or as written last and unchanged since), and refused otherwise,
    before anything moves."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ExampleInTheWay(
            f"{out_dir} is a file, not a folder: it is kept; name a folder for `kftrain example-model`"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = (out_dir / "tiny-llama", out_dir / "chat.jsonl")
    for target in targets:  # whatever a link leads to is someone else's, as it is
        if target.is_symlink():
            raise ExampleInTheWay(
                f"{target} is a link: it is kept; name another folder for `kftrain example-model`, or remove the link"
            )
    written = _written(out_dir / WRITTEN)
    with tempfile.TemporaryDirectory(prefix=".kftrain-example-", dir=out_dir) as aside:
        made = (Path(tiny_llama_folder(Path(aside) / targets[0].name)), Path(aside) / targets[1].name)
        write_chat_jsonl(made[1], records)
        for new, target in zip(made, targets, strict=True):
            if target.exists() and _digests(target) not in (_digests(new), written.get(target.name)):
                raise ExampleInTheWay(
                    f"{target} exists and is not kftrain's example {'model' if new.is_dir() else 'chat data'}: it "
                    "is kept; name another folder for `kftrain example-model`, or move that one away"
                )
        for new, target in zip(made, targets, strict=True):
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            new.rename(target)
    (out_dir / WRITTEN).write_text(json.dumps({t.name: _digests(t) for t in targets}, indent=1, sort_keys=True))
    return str(targets[0]), str(targets[1])


def _written(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _digests(path: Path) -> dict[str, str]:
    """The sha256 of every file at or under `path`, by its path from `path`'s folder; a file larger
    than any of the example's is no file of it, and is not read (a user's 14 GB model)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): _digest(p) for p in files}


#: Larger than any file of the example model (its weights are about 130 KB).
_LARGER_THAN_OURS = 64 * 1024 * 1024


def _digest(path: Path) -> str:
    size = path.stat().st_size
    if size > _LARGER_THAN_OURS:
        return f"{size} bytes"
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
