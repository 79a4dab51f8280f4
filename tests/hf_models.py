"""Tiny "pretrained" Hugging Face models for the fine-tuning tests: the example model and chat
data of `trainer/example_model.py`, and deliberately broken copies of a model folder."""

from __future__ import annotations

import json
from pathlib import Path


def model_variant(
    folder: str | Path,
    out: str | Path,
    *,
    drop: tuple[str, ...] = (),
    config: dict | None = None,
    tokenizer_config: dict | None = None,
    drop_tensors: tuple[str, ...] = (),
    add_tensors: tuple[str, ...] = (),
    add: dict[str, str] | None = None,
) -> str:
    """A copy of the model folder `folder` at `out`, broken or changed on purpose: without the
    files in `drop`, with `config` merged into config.json and `tokenizer_config` into
    tokenizer_config.json (a None value removes the key), without the tensors in
    `drop_tensors`, with a small tensor more for each name of `add_tensors`, and with the text files
    of `add`; returns its path."""
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
    if drop_tensors or add_tensors:
        import torch

        weights = load_file(out / "model.safetensors")
        weights = {k: v for k, v in weights.items() if k not in drop_tensors}
        save_file({**weights, **{k: torch.zeros(4) for k in add_tensors}}, out / "model.safetensors")
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
