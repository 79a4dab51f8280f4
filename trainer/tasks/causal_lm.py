"""The built-in causal language-model task: a GPT over byte tokens.

Tokenizer: the bytes of UTF-8 text (vocabulary 256), so nothing is downloaded at run time.
Data prep splits the text into contiguous train/val/test ranges and writes `uint8` token
shards; training reads fixed, non-overlapping windows of `block_size + 1` tokens.
"""

from __future__ import annotations

import io
import json
import math
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from trainer.config import Config
from trainer.data import DataError, read_manifest
from trainer.gpt import GPT, GPTConfig
from trainer.storage import ObjectStore, decode_object, join_uri
from trainer.tasks import Task

FORMAT = "kftrain.tokens.v1"
HF_FOLDER = "huggingface"
VOCAB_SIZE = 256
SPLITS = ("train", "val", "test")


def stdlib_text(max_bytes: int) -> bytes:
    """Python's own standard-library source as a corpus (always installed; sorted, so stable)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if "site-packages" in rel or "test" in rel or "tests" in rel:
            continue
        out += path.read_bytes() + b"\n"
        if max_bytes and len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes] if max_bytes else out)


class TokenWindows(Dataset):
    """Non-overlapping windows: item i is (tokens[i*T : i*T+T], tokens[i*T+1 : i*T+T+1])."""

    def __init__(self, tokens: np.ndarray, block_size: int) -> None:
        self.tokens = torch.from_numpy(tokens.astype(np.int64))
        self.block_size = block_size
        self.n = max(0, (len(tokens) - 1) // block_size)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[i * self.block_size : i * self.block_size + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def load_tokens(store: ObjectStore, dataset_uri: str, split: str, manifest: dict) -> np.ndarray:
    """All tokens of one split."""
    parts = []
    for name in manifest["splits"][split]["shards"]:
        uri = join_uri(dataset_uri, name)
        parts.append(decode_object(uri, store.get_bytes(uri), _load_npy, "token shard (.npy)"))
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _load_npy(raw: bytes) -> np.ndarray:
    return np.load(io.BytesIO(raw), allow_pickle=False)


class CausalLMTask(Task):
    name = "causal_lm"
    item_name = "tokens"
    serving_input = "tokens"
    serving_dynamic_dims = (0, 1)

    def prepare(self, cfg: Config, store: ObjectStore, dataset_uri: str) -> dict[str, Any]:
        d = cfg.data
        source = d.source or "python-stdlib"
        text = stdlib_text(d.max_bytes) if source == "python-stdlib" else store.get_bytes(source)
        if d.max_bytes:
            text = text[: d.max_bytes]
        tokens = np.frombuffer(text, dtype=np.uint8)
        n = len(tokens)
        n_test, n_val = int(n * d.test_fraction), int(n * d.val_fraction)
        ranges = {"train": (0, n - n_val - n_test), "val": (n - n_val - n_test, n - n_test), "test": (n - n_test, n)}
        block = cfg.model.block_size
        for split, (a, b) in ranges.items():
            if b - a < block + 1:
                raise DataError(
                    f"{source}: the {split} split has {b - a} tokens, fewer than model.block_size + 1 = {block + 1}; "
                    "use more text (data.max_bytes) or a shorter context"
                )
        manifest: dict[str, Any] = {"format": FORMAT, "source": source, "vocab_size": VOCAB_SIZE, "splits": {}}
        shard_tokens = d.shard_rows * 1024
        for split, (a, b) in ranges.items():
            shards = []
            for i, start in enumerate(range(a, b, shard_tokens)):
                name = f"{split}/tokens-{i:05d}.npy"
                buf = io.BytesIO()
                np.save(buf, tokens[start : min(b, start + shard_tokens)])
                store.put_bytes(join_uri(dataset_uri, name), buf.getvalue())
                shards.append(name)
            manifest["splits"][split] = {"tokens": b - a, "shards": shards}
        store.put_bytes(join_uri(dataset_uri, "manifest.json"), json.dumps(manifest, indent=2).encode())
        return manifest

    def datasets(self, cfg, store, dataset_uri, manifest):
        block = cfg.model.block_size
        return tuple(TokenWindows(load_tokens(store, dataset_uri, s, manifest), block) for s in ("train", "val"))

    def build_model(self, cfg, manifest):
        m = cfg.model
        gpt = GPTConfig(
            vocab_size=manifest["vocab_size"],
            block_size=m.block_size,
            n_layer=m.n_layer,
            n_head=m.n_head,
            n_embd=m.n_embd,
            dropout=m.dropout,
        )
        meta = {"architecture": gpt.as_dict(), "tokenizer": "bytes", "vocab_size": manifest["vocab_size"]}
        return GPT(gpt), meta

    def model_from_meta(self, meta):
        return GPT(GPTConfig(**meta["architecture"]))

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

    def items_per_sample(self, cfg):
        return cfg.model.block_size

    def flops_per_item(self, model, cfg):
        return float(model.flops_per_token())

    @torch.no_grad()
    def _mean_loss(self, model, dataset, device, batch_size, max_items=64):
        model.eval()
        total, count = 0.0, 0
        n = min(len(dataset), max_items)
        for start in range(0, n, batch_size):
            items = [dataset[i] for i in range(start, min(n, start + batch_size))]
            x = torch.stack([a for a, _ in items]).to(device)
            y = torch.stack([b for _, b in items]).to(device)
            total += float(self.loss(model, (x, y))) * len(items)
            count += len(items)
        model.train()
        return total / max(count, 1)

    def validate(self, model, dataset, device, batch_size):
        loss = self._mean_loss(model, dataset, device, batch_size)
        return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0))}

    def evaluate(self, model, meta, store, dataset_uri):
        manifest = read_manifest(store, dataset_uri, FORMAT)
        test = TokenWindows(load_tokens(store, dataset_uri, "test", manifest), meta["architecture"]["block_size"])
        loss = self._mean_loss(model, test, torch.device("cpu"), 8, max_items=len(test))
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "test_tokens": len(test) * test.block_size}

    def serving_module(self, model, meta):
        gen = torch.Generator().manual_seed(0)
        return model.eval(), torch.randint(
            0, meta["vocab_size"], (2, meta["architecture"]["block_size"]), generator=gen
        )

    def extra_exports(self, model, meta):
        from trainer.hf_export import hf_folder

        return {f"{HF_FOLDER}/{name}": data for name, data in hf_folder(model).items()}
