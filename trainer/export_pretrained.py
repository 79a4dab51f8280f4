"""The export of a fine-tuned pretrained Hugging Face model (`model.init_from`): the folders that
transformers, peft and vLLM load.

Under the export URI::

    huggingface/                      a Hugging Face model folder: full fine-tuning, or LoRA with
      config.json                     export.merge_lora (AutoModelForCausalLM.from_pretrained,
      generation_config.json          vLLM, KServe's Hugging Face runtime)
      model.safetensors               or, above export.max_shard_bytes, model-00001-of-0000N
      tokenizer.json, ...             .safetensors files and model.safetensors.index.json
    adapter/                          LoRA: the peft adapter, on the base model
      adapter_config.json             (PeftModel.from_pretrained(base, folder), vLLM's
      adapter_model.safetensors       --lora-modules)

The weights are streamed: each tensor is read from the trained model file (or the base folder)
with one ranged read and appended to a local safetensors file (trainer/safetensors_file.py),
and each file is uploaded and deleted before the next one starts, so the export needs the
memory of one tensor and the disk of one shard whatever the model's size. The model itself is
only built on the meta device, for its tensor names, its tied weights and peft's LoRA layers.

A merged LoRA weight is made here as its tensor comes: the base weight W plus the layer's own
delta from peft (`get_delta_weight`: (alpha / r) B A, transposed where the layer stores its
weight input-major, as GPT-2's Conv1D does), added in float32 and cast back to W's dtype. Only
the adapters (small) are loaded; peft's `merge_and_unload` would need the whole base model in
memory.

Nothing here is traced or compared against a PyTorch model, which would mean loading it whole:
the full weights are the trained file's tensors byte for byte, a merged weight is peft's formula,
and the tests load every folder with transformers and peft and compare logits.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import pretrained
from trainer.model_io import WEIGHTS, tied_names
from trainer.progress import ProgressLine
from trainer.safetensors_file import SafetensorsWriter, TensorSpec
from trainer.storage import ObjectStore, join_uri, parse_uri
from trainer.tasks.causal_lm import HF_FOLDER

ADAPTER_FOLDER = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The name peft gives the one adapter kftrain trains (`trainer.tasks.pretrained_lm.apply_lora`);
#: peft's saved files leave it out of the tensor names.
ADAPTER_NAME = "default"
#: `model-00001-of-00003.safetensors`, as transformers names shards.
SHARD_NAME = "model-{:05d}-of-{:05d}.safetensors"
#: The metadata `save_pretrained` writes into every safetensors file (loaders check it).
FILE_METADATA = {"format": "pt"}


@dataclass(frozen=True, slots=True)
class _Source:
    """One tensor of a file to write: its name there, where its bytes are, and the LoRA layer
    whose delta is added to it (a merged export), if any."""

    name: str
    store: ObjectStore
    entry: pretrained.TensorEntry
    lora_layer: nn.Module | None = None

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.entry.dtype, self.entry.shape)

    def value(self) -> torch.Tensor:
        """The tensor to write (one ranged read; plus the adapter's delta when merging)."""
        # A scalar is one "row": read_rows' count of 0 means no data.
        tensor = pretrained.read_rows(self.store, self.entry, 0, self.entry.shape[0] if self.entry.shape else 1)
        if self.lora_layer is None:
            return tensor
        with torch.no_grad():
            delta = self.lora_layer.get_delta_weight(ADAPTER_NAME)
        if tuple(delta.shape) != tuple(tensor.shape):
            raise pretrained.PretrainedError(
                f"{self.entry.uri}: LoRA delta of {self.name} has shape {list(delta.shape)}, the base weight "
                f"{list(tensor.shape)}; the adapters were not trained on this base model"
            )
        return (tensor.float() + delta.float()).to(tensor.dtype)


class _Output:
    """Files put under the export URI: counted on the progress line and listed for the card."""

    def __init__(self, store: ObjectStore, uri: str, line: ProgressLine) -> None:
        self.store, self.uri, self.line = store, uri, line
        self.written: list[str] = []

    def put_bytes(self, name: str, data: bytes) -> None:
        self.store.put_bytes(join_uri(self.uri, name), data)
        self.line.add(len(data), name)
        self.written.append(name)

    def put_file(self, name: str, path: Path) -> None:
        size = path.stat().st_size
        self.store.put_file(join_uri(self.uri, name), path)
        self.line.add(size, name)
        self.written.append(name)


def shard_plan(sizes: list[int], max_shard_bytes: int) -> list[list[int]]:
    """Indexes of `sizes` (bytes of each tensor, in order) grouped into files as transformers'
    `save_pretrained` groups them: a new file when the next tensor would take the current one
    past `max_shard_bytes`; a tensor larger than that alone in its file."""
    shards: list[list[int]] = [[]]
    total = 0
    for i, size in enumerate(sizes):
        if shards[-1] and total + size > max_shard_bytes:
            shards.append([])
            total = 0
        shards[-1].append(i)
        total += size
    return shards


def write_pretrained_export(
    store: ObjectStore,
    model_uri: str,
    output_uri: str,
    model: nn.Module,
    meta: dict[str, Any],
    line: ProgressLine,
    max_shard_bytes: int,
    merge_lora: bool,
) -> dict[str, Any]:
    """Write the Hugging Face folder and/or the LoRA adapter of the saved model at `model_uri`
    (`model`: the task's model of `meta`, parameters on the meta device) under `output_uri`;
    return the model card's fields that describe them."""
    from trainer.tasks.pretrained_lm import source_from_meta

    out = _Output(store, output_uri, line)
    weights_uri = join_uri(model_uri, WEIGHTS)
    lora = meta.get("method") == "lora"
    card: dict[str, Any] = {
        "base_model": {"origin": meta["base_model"]["origin"], "revision": meta["base_model"]["revision"]},
        "method": meta.get("method", "full"),
    }
    files: dict[str, Any] = {}
    if lora:
        peft_config = adapter_config(model, meta)
        card["lora"] = {
            **meta["lora"],
            # peft's choice where the config left them empty: what the adapters are on.
            "target_modules": peft_config["target_modules"],
        }
        card["lora"]["merged"] = merge_lora
        layers = _load_adapters(model, store, weights_uri)
        lost = sorted(set(layers) - set(_model_names(model)))
        if merge_lora and lost:  # an adapter on a tied copy (lm_head tied to the embeddings): merging unties it
            raise pretrained.PretrainedError(
                f"export.merge_lora: the adapter on {lost[0]!r} changes a weight tied to another one, which a "
                "merged folder cannot hold; serve the adapter (export.merge_lora: false)"
            )
    source = source_from_meta(meta) if not lora or merge_lora else None
    if source is not None and not source.store.exists(join_uri(source.uri, "tokenizer.json")):
        raise _no_tokenizer(source)  # before any file: no folder without it
    if lora:
        _write_adapter(out, store, weights_uri, peft_config)
        files["adapter"] = ADAPTER_FOLDER
    if source is not None:
        if lora:
            index = pretrained.tensor_index(source)
            tensors = _tensors(model, index, source.store, f"the base model {source.origin!r}", layers)
        else:
            index = pretrained.file_index(store, weights_uri)
            tensors = _tensors(model, index, store, weights_uri)
        card["weights"] = _write_hf_folder(out, meta, source, tensors, max_shard_bytes)
        files["huggingface"] = HF_FOLDER
    card["files"] = {**files, "written": list(out.written)}
    return card


def _model_names(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """The Hugging Face names and shapes of the model's tensors, in state-dict order: no tied
    weights (transformers saves each once and ties them again on load), no adapters."""
    tied = tied_names(model)
    return {
        pretrained.base_name(name): tuple(t.shape)
        for name, t in model.state_dict(keep_vars=True).items()
        if name not in tied and ".lora_" not in name
    }


def _tensors(
    model: nn.Module,
    index: dict[str, pretrained.TensorEntry],
    store: ObjectStore,
    where: str,
    layers: dict[str, nn.Module] | None = None,
) -> list[_Source]:
    """Where each of the model's tensors comes from (`index`), with the LoRA layer that changes
    it (`layers`, a merge). An error names a tensor `index` lacks, or has with another shape, and
    for the trained model file (no `layers`) one it holds that the model has not."""
    names = _model_names(model)
    missing = [n for n in names if n not in index]
    if missing:
        raise pretrained.PretrainedError(
            f"{where}: no tensor {missing[0]!r} ({len(missing)} of the model's tensors missing), which the model "
            "built from the recorded config.json needs; the saved model and its model.json do not match"
        )
    extra = [n for n in index if n not in names] if layers is None else []
    if extra:
        raise pretrained.PretrainedError(
            f"{where}: tensor {extra[0]!r} ({len(extra)} such) is not in the model built from the recorded "
            "config.json; the saved model and its model.json do not match"
        )
    for name, shape in names.items():
        if tuple(index[name].shape) != shape:
            raise pretrained.PretrainedError(
                f"{where}: tensor {name!r} has shape {list(index[name].shape)}, the model built from the "
                f"recorded config.json {list(shape)}"
            )
    return [_Source(name, store, index[name], (layers or {}).get(name)) for name in names]


def _load_adapters(model: nn.Module, store: ObjectStore, weights_uri: str) -> dict[str, nn.Module]:
    """Give the meta-built peft model's adapter parameters the trained values (they are small);
    return its LoRA layers by the Hugging Face name of the weight each one changes."""
    from peft.tuners.lora import LoraLayer

    index = pretrained.file_index(store, weights_uri)
    wanted = [name for name in model.state_dict(keep_vars=True) if ".lora_" in name]
    missing, extra = sorted(set(wanted) - set(index)), sorted(set(index) - set(wanted))
    if missing or extra:
        raise pretrained.PretrainedError(
            f"{weights_uri}: the LoRA adapters do not match the model of its model.json (missing {missing[:3]}, "
            f"unexpected {extra[:3]}); train it again"
        )
    for name in wanted:
        owner, _, leaf = name.rpartition(".")
        value = _Source(name, store, index[name]).value()
        setattr(model.get_submodule(owner), leaf, nn.Parameter(value, requires_grad=False))
    return {
        pretrained.base_name(f"{path}.base_layer.weight"): layer
        for path, layer in model.named_modules()
        if isinstance(layer, LoraLayer)
    }


def saved_adapter_name(name: str) -> str:
    """A LoRA tensor's name in peft's saved adapter file: the model's, without the adapter's name
    after the `lora_*` component (`...q_proj.lora_A.default.weight` -> `...q_proj.lora_A.weight`)."""
    parts = name.split(".")
    keep = [p for i, p in enumerate(parts) if not (p == ADAPTER_NAME and i and parts[i - 1].startswith("lora_"))]
    return ".".join(keep)


def adapter_config(model: nn.Module, meta: dict[str, Any]) -> dict[str, Any]:
    """adapter_config.json: the peft config the model was built with, naming the base model
    (the Hub id and commit of an `hf://` model, else its URI)."""
    config = model.peft_config[ADAPTER_NAME].to_dict()
    base = meta["base_model"]
    if base["origin"].startswith(pretrained.HF_SCHEME):
        config["base_model_name_or_path"], _ = pretrained.parse_hf_uri(base["origin"])
        config["revision"] = base["revision"] or None
    else:
        # A local folder as typed (`~/m`, `./m`, `file:///m`) is no path peft can load: its absolute path.
        location = parse_uri(base["origin"])
        config["base_model_name_or_path"] = base["origin"] if location.is_remote else location.key
    config["inference_mode"] = True  # as peft saves it: the adapter is for inference now
    return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}


def _write_adapter(out: _Output, store: ObjectStore, weights_uri: str, config: dict[str, Any]) -> None:
    """adapter/: the trained adapters under peft's saved names, and adapter_config.json."""
    index = pretrained.file_index(store, weights_uri)
    tensors = [_Source(saved_adapter_name(name), store, index[name]) for name in index]
    with tempfile.TemporaryDirectory(prefix="kftrain-export-") as tmp:
        path = Path(tmp) / ADAPTER_WEIGHTS
        _write_file(path, tensors)
        out.put_file(f"{ADAPTER_FOLDER}/{ADAPTER_WEIGHTS}", path)
    out.put_bytes(f"{ADAPTER_FOLDER}/{ADAPTER_CONFIG}", json.dumps(config, indent=2, sort_keys=True).encode())


def _write_file(path: Path, tensors: list[_Source]) -> None:
    """One safetensors file of `tensors`, each read (and merged) only when its turn comes."""
    by_name = {t.name: t for t in tensors}
    with SafetensorsWriter(path, [t.spec for t in tensors], FILE_METADATA) as writer:
        for name in writer.order:
            writer.write(name, by_name[name].value())


def _write_hf_folder(
    out: _Output,
    meta: dict[str, Any],
    source: pretrained.ModelSource,
    tensors: list[_Source],
    max_shard_bytes: int,
) -> dict[str, Any]:
    """The weights (sharded above `max_shard_bytes`), config.json, generation_config.json and the
    base model's tokenizer files in `huggingface/`; return what the card says of the weights."""
    shards = [[tensors[i] for i in shard] for shard in shard_plan([t.spec.nbytes for t in tensors], max_shard_bytes)]
    names = (
        [pretrained.SINGLE_FILE]
        if len(shards) == 1
        else [SHARD_NAME.format(i + 1, len(shards)) for i in range(len(shards))]
    )
    with tempfile.TemporaryDirectory(prefix="kftrain-export-") as tmp:
        for name, shard in zip(names, shards, strict=True):
            path = Path(tmp) / name
            _write_file(path, shard)
            out.put_file(f"{HF_FOLDER}/{name}", path)
            os.unlink(path)  # one shard on local disk at a time
    total = sum(t.spec.nbytes for t in tensors)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t.name: name for name, shard in zip(names, shards, strict=True) for t in shard},
        }
        out.put_bytes(f"{HF_FOLDER}/{pretrained.INDEX_FILE}", json.dumps(index, indent=2, sort_keys=True).encode())
    dtype = _main_dtype(tensors)
    config = dict(meta["hf_config"])
    # What the files hold (full fine-tuning trains in float32 whatever the base was): loaders
    # that honour dtype "auto" then load what was trained.
    config["dtype"] = dtype
    if "torch_dtype" in config:  # the older name, still read by transformers 4
        config["torch_dtype"] = dtype
    out.put_bytes(f"{HF_FOLDER}/{pretrained.CONFIG}", json.dumps(config, indent=2, sort_keys=True).encode())
    out.put_bytes(f"{HF_FOLDER}/{pretrained.GENERATION_CONFIG}", _generation_config(source, config))
    copied = _copy_files(out, source, pretrained.TOKENIZER_FILES)
    if "tokenizer.json" not in copied:  # gone meanwhile
        raise _no_tokenizer(source)
    return {"dtype": dtype, "total_size": total, "tensors": len(tensors), "files": names}


def _no_tokenizer(source: pretrained.ModelSource) -> pretrained.PretrainedError:
    return pretrained.PretrainedError(
        f"the base model {source.origin!r} has no tokenizer.json any more (the model was trained with it); "
        "restore the folder and export again"
    )


def _main_dtype(tensors: list[_Source]) -> str:
    """The floating-point dtype holding most of the bytes (what config.json's dtype names)."""
    by_dtype: dict[torch.dtype, int] = {}
    for t in tensors:
        if t.entry.dtype.is_floating_point:
            by_dtype[t.entry.dtype] = by_dtype.get(t.entry.dtype, 0) + t.spec.nbytes
    best = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else torch.float32
    return str(best).removeprefix("torch.")


def _generation_config(source: pretrained.ModelSource, config: dict[str, Any]) -> bytes:
    """The base folder's generation_config.json (its sampling defaults and end tokens) as it is,
    else the one transformers derives from config.json."""
    uri = join_uri(source.uri, pretrained.GENERATION_CONFIG)
    if source.store.exists(uri):
        return source.store.get_bytes(uri)
    from transformers import AutoConfig, GenerationConfig

    return GenerationConfig.from_model_config(AutoConfig.for_model(**copy.deepcopy(config))).to_json_string().encode()


def _copy_files(out: _Output, source: pretrained.ModelSource, names: tuple[str, ...]) -> list[str]:
    """Copy the files of `names` the base folder has into the Hugging Face folder, unchanged
    (the chat template travels with them); return those copied."""
    copied = []
    for name in names:
        uri = join_uri(source.uri, name)
        if source.store.exists(uri):
            out.put_bytes(f"{HF_FOLDER}/{name}", source.store.get_bytes(uri))
            copied.append(name)
    return copied
