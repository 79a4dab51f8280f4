"""Export a trained model for serving: TorchScript, safetensors and a JSON model card.

What is exported is the task's serving module: for classification the normalisation is part
of the graph, so a serving stack feeds it the raw features the source table holds.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any

import torch
from safetensors.torch import save as save_safetensors

from trainer.model import _tied_parameters, load_model
from trainer.storage import ObjectStore, join_uri
from trainer.tasks import get_task

TORCHSCRIPT = "model.pt"
SAFETENSORS = "model.safetensors"
MODEL_CARD = "model_card.json"
#: Model metadata copied into the card when the task records it.
CARD_FIELDS = ("classes", "feature_names", "tokenizer", "vocab_size")


def export_model(
    store: ObjectStore,
    model_uri: str,
    output_uri: str,
    metrics: dict[str, Any] | None = None,
    training_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the export files under `output_uri`; return the model card (written last)."""
    model, meta = load_model(store, model_uri)
    serving, example = get_task(meta["task"]).serving_module(model, meta)
    with torch.no_grad():
        out = serving(example)
        scripted = torch.jit.trace(serving, example)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    store.put_bytes(join_uri(output_uri, TORCHSCRIPT), buf.getvalue())
    tied = {name for name, _ in _tied_parameters(serving)}
    state = {k: v.detach().contiguous() for k, v in serving.state_dict().items() if k not in tied}
    store.put_bytes(join_uri(output_uri, SAFETENSORS), save_safetensors(state))
    card = {
        "name": f"kftrain-{meta['task']}",
        "task": meta["task"],
        "inputs": {"dtype": str(example.dtype).removeprefix("torch."), "shape": [-1, *example.shape[1:]]},
        "outputs": {"dtype": str(out.dtype).removeprefix("torch."), "shape": [-1, *out.shape[1:]]},
        **{k: meta[k] for k in CARD_FIELDS if k in meta},
        "architecture": meta["architecture"],
        "files": {"torchscript": TORCHSCRIPT, "safetensors": SAFETENSORS},
        "metrics": metrics or {},
        "training_config": training_config or {},
        "source_dataset_uri": meta["dataset_uri"],
        "source_model_uri": model_uri,
    }
    store.put_bytes(join_uri(output_uri, MODEL_CARD), json.dumps(card, indent=2).encode())
    return card


def load_torchscript(store: ObjectStore, export_uri: str) -> torch.jit.ScriptModule:
    """Load the exported TorchScript module back (as a serving stack would)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, TORCHSCRIPT)
        store.get_file(join_uri(export_uri, TORCHSCRIPT), path)
        return torch.jit.load(path)
