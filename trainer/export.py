"""Export a trained model for serving, each format verified against the PyTorch model.

Layout under the export URI::

    model_card.json                     written last: inputs, outputs, classes, metrics, config
    model.safetensors                   the serving module's weights (no pickle)
    model.pt                            TorchScript
    model_repository/                   a Triton model repository: point a KServe
      kftrain/config.pbtxt              InferenceService's storageUri here (runtime
      kftrain/1/model.onnx              kserve-tritonserver, modelFormat onnx)

What is exported is the task's serving module: for classification the normalisation is part of
the graph, so a serving stack feeds it the raw features the source table holds.
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

from trainer.errors import KftrainError
from trainer.model_io import load_model, weights
from trainer.progress import ProgressLine
from trainer.storage import ObjectStore, join_uri
from trainer.tasks import task_for_meta

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


def _check(name: str, got: np.ndarray, expected: np.ndarray, atol: float = 1e-4) -> float:
    err = float(np.abs(got - expected).max())
    if not np.isfinite(err) or err > atol:
        raise ExportError(f"{name} output differs from the PyTorch model by {err:.3g} (tolerance {atol})")
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
) -> dict[str, Any]:
    """Write and verify every format under `output_uri`; return the model card (written last)."""
    import onnxruntime

    line = ProgressLine(f"export to {output_uri}")

    def put(name: str, data: bytes) -> None:
        store.put_bytes(join_uri(output_uri, name), data)
        line.add(len(data), name)

    model, meta = load_model(store, model_uri)
    task = task_for_meta(meta)
    serving, example = task.serving_module(model, meta)
    with torch.no_grad():
        expected = serving(example)
        scripted = torch.jit.trace(serving, example[:1])
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    ts_err = _check(
        "TorchScript", torch.jit.load(io.BytesIO(buf.getvalue()))(example).detach().numpy(), expected.numpy()
    )
    put(TORCHSCRIPT, buf.getvalue())

    names, dims = (task.serving_input, task.serving_output), task.serving_dynamic_dims
    onnx_model = onnx_bytes(serving, example[:1], *names, dims)
    session = onnxruntime.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    onnx_err = _check("ONNX", session.run(None, {names[0]: example.numpy()})[0], expected.numpy())
    put(ONNX, onnx_model)
    put(TRITON_CONFIG, triton_config(*names, example, expected, dims).encode())

    extra = task.extra_exports(model, meta)
    for name, data in extra.items():
        put(name, data)
    put(SAFETENSORS, save_safetensors(weights(serving)))
    card = {
        "name": f"kftrain-{meta['task']}",
        "task": meta["task"],
        "inputs": {
            "name": names[0],
            "dtype": str(example.dtype).removeprefix("torch."),
            "shape": _shape(example, dims),
        },
        "outputs": {
            "name": names[1],
            "dtype": str(expected.dtype).removeprefix("torch."),
            "shape": _shape(expected, dims),
        },
        **{k: meta[k] for k in CARD_FIELDS if k in meta},
        "architecture": meta["architecture"],
        "files": {
            "torchscript": TORCHSCRIPT,
            "safetensors": SAFETENSORS,
            "onnx": ONNX,
            "triton_model_repository": REPOSITORY,
            **({"extra": sorted(extra)} if extra else {}),
        },
        "verification": {"torchscript_max_abs_error": ts_err, "onnx_max_abs_error": onnx_err, "batch": len(example)},
        "metrics": metrics or {},
        "training_config": training_config or {},
        "source_dataset_uri": meta["dataset_uri"],
        "source_model_uri": model_uri,
    }
    put(MODEL_CARD, json.dumps(card, indent=2).encode())
    line.done("each format verified")
    return card


def _shape(t: torch.Tensor, dims) -> list[int]:
    return [-1 if i in dims else n for i, n in enumerate(t.shape)]


def load_torchscript(store: ObjectStore, export_uri: str) -> torch.jit.ScriptModule:
    """Load the exported TorchScript module back (as a serving stack would)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, TORCHSCRIPT)
        store.get_file(join_uri(export_uri, TORCHSCRIPT), path)
        return torch.jit.load(path)
