"""Export a trained model for serving: TorchScript, safetensors and a JSON model card.

The exported model takes raw (un-normalised) features: the training normalisation is part of
the exported graph, so a serving stack feeds it what the source table holds.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any

import torch
from safetensors.torch import save as save_safetensors
from torch import nn

from trainer.model import load_model
from trainer.storage import ObjectStore, join_uri

TORCHSCRIPT = "model.pt"
SAFETENSORS = "model.safetensors"
MODEL_CARD = "model_card.json"


class ServingModel(nn.Module):
    """Normalisation + classifier: raw features in, logits out."""

    def __init__(self, model: nn.Module, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.mean) / self.std)


def export_model(
    store: ObjectStore,
    model_uri: str,
    output_uri: str,
    metrics: dict[str, Any] | None = None,
    training_config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the export files under `output_uri`; return the model card (written last)."""
    model, meta = load_model(store, model_uri)
    serving = ServingModel(model, **meta["normalization"]).eval()
    example = torch.zeros(1, meta["architecture"]["num_features"])
    scripted = torch.jit.trace(serving, example)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    store.put_bytes(join_uri(output_uri, TORCHSCRIPT), buf.getvalue())
    state = {k: v.detach().contiguous() for k, v in serving.state_dict().items()}
    store.put_bytes(join_uri(output_uri, SAFETENSORS), save_safetensors(state))
    card = {
        "name": "kftrain-classifier",
        "task": meta["task"],
        "inputs": {
            "name": "features",
            "dtype": "float32",
            "shape": [-1, meta["architecture"]["num_features"]],
            "feature_names": meta["feature_names"],
            "normalized_inside_model": True,
        },
        "outputs": {"name": "logits", "dtype": "float32", "shape": [-1, len(meta["classes"])]},
        "classes": meta["classes"],
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
