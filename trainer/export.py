"""Export a trained model for serving, each format verified against the PyTorch model.

Layout under the export URI::

    model_card.json                     written last: inputs, outputs, classes, metrics, config
    model.safetensors                   the serving module's weights (no pickle)
    model.pt                            TorchScript
    model_repository/                   a Triton model repository: point a KServe
      kftrain/config.pbtxt              InferenceService's storageUri here (runtime
      kftrain/1/model.onnx              kserve-tritonserver, modelFormat onnx)

What is exported is the task's serving module: for classification the normalisation is part of
the graph, so a serving stack feeds it the raw features the source table holds. A task without
one (its `serving_module` returns None) is served from other files: a fine-tuned pretrained
model as a Hugging Face folder and/or a peft adapter (trainer/export_pretrained.py, streamed
from the model file without loading the model), any other task from its `extra_exports`.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import warnings
from typing import Any

import numpy as np
import torch
from safetensors.torch import save as save_safetensors

from trainer.config import ExportConfig
from trainer.errors import KftrainError
from trainer.model_io import WEIGHTS, read_model_meta, weights
from trainer.progress import ProgressLine
from trainer.storage import ObjectStore, join_uri
from trainer.tasks import task_for_meta
from trainer.tasks.contract import checked_model, checked_serving

TORCHSCRIPT = "model.pt"
SAFETENSORS = "model.safetensors"
MODEL_CARD = "model_card.json"
REPOSITORY = "model_repository"
SERVING_NAME = "kftrain"
ONNX = f"{REPOSITORY}/{SERVING_NAME}/1/model.onnx"
TRITON_CONFIG = f"{REPOSITORY}/{SERVING_NAME}/config.pbtxt"
#: Model metadata copied into the card when the task records it.
CARD_FIELDS = ("classes", "feature_names", "tokenizer", "vocab_size")
_TRITON_TYPES = {torch.float32: "TYPE_FP32", torch.int64: "TYPE_INT64"}


class ExportError(KftrainError, RuntimeError):
    """An exported format does not reproduce the PyTorch model's outputs."""


#: How far an exported format's output may be from PyTorch's, as numpy's `allclose`: each output
#: within ATOL + RTOL x its own size. float32 has 24 bits: a relative part, or logits of 1e3 and
#: more fail on rounding alone (a model with logits of 1e12 differed by 6e6, 6e-6 of them).
ATOL, RTOL = 1e-4, 1e-4


def _check(name: str, got: np.ndarray, expected: np.ndarray) -> float:
    """`got`'s largest absolute difference from `expected`; :class:`ExportError` when an output
    is further than :data:`ATOL` + :data:`RTOL` x its size, or either side is not finite (a model
    whose outputs are NaN or inf is not one to serve)."""
    if not (np.all(np.isfinite(expected)) and np.all(np.isfinite(got))):
        raise ExportError(f"{name} output or the PyTorch model's is not finite (NaN or inf) on the check batch")
    diff = np.abs(got.astype(np.float64) - expected)
    err = float(diff.max()) if diff.size else 0.0
    if np.any(diff > ATOL + RTOL * np.abs(expected.astype(np.float64))):
        raise ExportError(
            f"{name} output differs from the PyTorch model by {err:.3g} (tolerance {ATOL} + {RTOL} x the output)"
        )
    return err


def onnx_bytes(module: torch.nn.Module, example: torch.Tensor, input_name: str, output_name: str, dims) -> bytes:
    """ONNX (opset 17) of `module` with dynamic `dims` of the input (batch, and sequence for LMs)."""
    buf = io.BytesIO()
    axes = {input_name: {d: f"d{d}" for d in dims}, output_name: {d: f"d{d}" for d in dims}}
    with warnings.catch_warnings():
        # The TorchScript-based exporter: no extra dependency (onnxscript), and stable output.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module, (example,), buf, input_names=[input_name], output_names=[output_name],
            dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
    return buf.getvalue()


def triton_config(input_name: str, output_name: str, example: torch.Tensor, out: torch.Tensor, dims) -> str:
    """config.pbtxt of the ONNX model (max_batch_size 0: the batch is an explicit dimension)."""

    def shape(t: torch.Tensor) -> str:
        return ", ".join("-1" if i in dims or i == 0 else str(n) for i, n in enumerate(t.shape))

    return (
        f'name: "{SERVING_NAME}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        f'input [ {{ name: "{input_name}" data_type: {_TRITON_TYPES[example.dtype]} dims: [ {shape(example)} ] }} ]\n'
        f'output [ {{ name: "{output_name}" data_type: {_TRITON_TYPES[out.dtype]} dims: [ {shape(out)} ] }} ]\n'
    )


def export_model(
    store: ObjectStore,
    model_uri: str,
    output_uri: str,
    metrics: dict[str, Any] | None = None,
    training_config: dict[str, Any] | None = None,
    max_shard_bytes: int = ExportConfig().max_shard_bytes,
    merge_lora: bool = False,
    training: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write and verify every format under `output_uri`; return the model card (written last).

    `max_shard_bytes` and `merge_lora`: `export.*`, for a fine-tuned pretrained model.
    `training`: what the card says of the weights' training (steps, the step resumed from, the
    best checkpoint's step)."""
    line = ProgressLine(f"export to {output_uri}")

    def put(name: str, data: bytes) -> None:
        store.put_bytes(join_uri(output_uri, name), data)
        line.add(len(data), name)

    meta = read_model_meta(store, model_uri)
    task = task_for_meta(meta)
    # The weights are not loaded yet: a pretrained model's are streamed from the file instead.
    model = checked_model(task, task.model_from_meta(meta))
    if checked_serving(task, task.serving_module(model, meta)) is None:
        common = _common_card(meta, model_uri, metrics, training_config, training)
        if "base_model" in meta:
            from trainer.export_pretrained import write_pretrained_export

            card = write_pretrained_export(store, model_uri, output_uri, model, meta, line, max_shard_bytes, merge_lora)
        else:
            task.load_weights(model, meta, store, join_uri(model_uri, WEIGHTS))
            extra = task.extra_exports(model.eval(), meta)
            for name, data in extra.items():
                put(name, data)
            card = {"files": {"extra": sorted(extra)}}
        card = {**common, **card}
        put(MODEL_CARD, json.dumps(card, indent=2).encode())
        line.done("written")
        return card
    import onnxruntime

    task.load_weights(model, meta, store, join_uri(model_uri, WEIGHTS))
    # Built again over the loaded weights (a task may copy them into its serving module).
    serving, example = checked_serving(task, task.serving_module(model.eval(), meta))
    with torch.no_grad():
        expected = serving(example)
        scripted = torch.jit.trace(serving, example[:1])
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    ts_err = _check(
        "TorchScript", torch.jit.load(io.BytesIO(buf.getvalue()))(example).detach().numpy(), expected.numpy()
    )
    names, dims = (task.serving_input, task.serving_output), task.serving_dynamic_dims
    onnx_model = onnx_bytes(serving, example[:1], *names, dims)
    session = onnxruntime.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    onnx_err = _check("ONNX", session.run(None, {names[0]: example.numpy()})[0], expected.numpy())
    extra = task.extra_exports(model, meta)
    # Published only once every format passed its check: a failed check leaves the output empty,
    # not a TorchScript file beside no model card that a server could pick up.
    for name, data in (
        (TORCHSCRIPT, buf.getvalue()),
        (ONNX, onnx_model),
        (TRITON_CONFIG, triton_config(*names, example, expected, dims).encode()),
        *extra.items(),
        (SAFETENSORS, save_safetensors(weights(serving))),
    ):
        put(name, data)
    inputs: dict[str, Any] = {
        "name": names[0],
        "dtype": str(example.dtype).removeprefix("torch."),
        "shape": _shape(example, dims),
    }
    if 1 in dims and (longest := meta.get("architecture", {}).get("block_size")):
        # A sequence dimension the shape cannot bound (-1): past it the model has no position.
        inputs["max_length"] = int(longest)
    card = {
        **_common_card(meta, model_uri, metrics, training_config, training),
        "inputs": inputs,
        "outputs": {
            "name": names[1],
            "dtype": str(expected.dtype).removeprefix("torch."),
            "shape": _shape(expected, dims),
        },
        "files": {
            "torchscript": TORCHSCRIPT,
            "safetensors": SAFETENSORS,
            "onnx": ONNX,
            "triton_model_repository": REPOSITORY,
            **({"extra": sorted(extra)} if extra else {}),
        },
        "verification": {"torchscript_max_abs_error": ts_err, "onnx_max_abs_error": onnx_err, "batch": len(example)},
    }
    put(MODEL_CARD, json.dumps(card, indent=2).encode())
    line.done("each format verified")
    return card


def _common_card(
    meta: dict[str, Any],
    model_uri: str,
    metrics: dict[str, Any] | None,
    training_config: dict[str, Any] | None,
    training: dict[str, Any] | None,
) -> dict[str, Any]:
    """The card's fields every task has: what the model is, how it did, where it came from."""
    return {
        "name": f"kftrain-{meta['task']}",
        "task": meta["task"],
        **{k: meta[k] for k in CARD_FIELDS if k in meta},
        "architecture": meta["architecture"],
        "metrics": metrics or {},
        "training_config": training_config or {},
        "training": training or {},
        "source_dataset_uri": meta["dataset_uri"],
        "source_model_uri": model_uri,
    }


def _shape(t: torch.Tensor, dims) -> list[int]:
    return [-1 if i in dims else n for i, n in enumerate(t.shape)]


def load_torchscript(store: ObjectStore, export_uri: str) -> torch.jit.ScriptModule:
    """Load the exported TorchScript module back (as a serving stack would)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, TORCHSCRIPT)
        store.get_file(join_uri(export_uri, TORCHSCRIPT), path)
        return torch.jit.load(path)
