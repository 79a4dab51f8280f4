"""How a trained model of any task is saved to and loaded from the store.

A saved model is a folder: ``model.safetensors`` (the state dict, no pickle) and ``model.json``
(everything needed to rebuild it: the task, its architecture and whatever else the task
records, e.g. a classifier's classes and input normalisation). The task rebuilds the module.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.safetensors_file import write_safetensors
from trainer.storage import CorruptObject, ObjectNotFound, ObjectStore, decode_object, join_uri
from trainer.tasks import task_for_meta
from trainer.tasks.contract import checked_model

WEIGHTS = "model.safetensors"
MODEL_META = "model.json"


def save_model(
    store: ObjectStore,
    model_uri: str,
    model: nn.Module,
    meta: dict[str, Any],
    state: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write weights first and the metadata last, so a folder with `model.json` is complete.

    `state`: the full weights by name when `model` holds only shards (FSDP); default: its own.
    The file is written one tensor at a time (each tied tensor once) to a local temporary file
    and uploaded from there.
    """
    tied = tied_names(model)
    state = model.state_dict() if state is None else state
    with tempfile.TemporaryDirectory(prefix="kftrain-model-") as tmp:
        path = Path(tmp) / WEIGHTS
        write_safetensors(path, {k: v for k, v in state.items() if k not in tied})
        publish_model(store, model_uri, path, meta)


def publish_model(store: ObjectStore, model_uri: str, weights_path: str | Path, meta: dict[str, Any]) -> None:
    """Upload a local safetensors file as the model's weights, then its metadata, last."""
    store.put_file(join_uri(model_uri, WEIGHTS), weights_path)
    store.put_bytes(join_uri(model_uri, MODEL_META), json.dumps(meta, indent=2).encode())


def read_model_meta(store: ObjectStore, model_uri: str, name: str = MODEL_META) -> dict[str, Any]:
    """The JSON object `name` (the metadata, `model.json`; or the training record, `training.json`)
    of the model kftrain's train step wrote at `model_uri`; a clear error when there is none (most
    often another artifact wired into a step's `model` input, in a user's pipeline) or it is not a
    JSON object."""
    uri = join_uri(model_uri, name)
    try:
        raw = store.get_bytes(uri)
    except ObjectNotFound:
        raise ObjectNotFound(
            f"no file at {uri}: {model_uri} is not a model kftrain's train step wrote; give the step the `model` "
            "output of train"
        ) from None
    record = decode_object(uri, raw, json.loads, f"kftrain model's {name}")
    if not isinstance(record, dict):
        raise CorruptObject(f"{uri} is not a kftrain model's {name} (a JSON object): rerun the train step")
    return record


def load_model(store: ObjectStore, model_uri: str) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a saved model (of any task) in eval mode on the CPU, with its metadata."""
    meta = read_model_meta(store, model_uri)
    task = task_for_meta(meta)
    model = checked_model(task, task.model_from_meta(meta))
    task.load_weights(model, meta, store, join_uri(model_uri, WEIGHTS))
    return model.eval(), meta


def trained_state(model: nn.Module, frozen: set[str]) -> dict[str, torch.Tensor]:
    """The model's state dict without its frozen weights: what a run saves as its model."""
    return {k: v for k, v in model.state_dict().items() if k not in frozen}


def frozen_names(model: nn.Module) -> set[str]:
    """Parameters that do not train (a LoRA run's pretrained base): not checkpointed or saved."""
    return {name for name, p in model.named_parameters() if not p.requires_grad}


def _tie_groups(model: nn.Module) -> list[list[str]]:
    """The names of each parameter registered under more than one (weight tying), first seen first."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def tied_names(model: nn.Module) -> set[str]:
    """Names under which an already-seen parameter is registered again (weight tying)."""
    return {name for group in _tie_groups(model) for name in group[1:]}


def shared_names(model: nn.Module) -> set[str]:
    """Every name of a parameter registered under more than one: both sides of a weight tie (the
    embeddings and `lm_head`), where :func:`tied_names` has the copies only."""
    return {name for group in _tie_groups(model) for name in group}


def weights(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The state dict (`state`, or the model's own) for a safetensors file: on the CPU,
    contiguous, each tied tensor once."""
    tied = tied_names(model)
    state = model.state_dict() if state is None else state
    return {k: v.detach().cpu().contiguous() for k, v in state.items() if k not in tied}
