"""The model a config trains, seen without memory: its parameters and its activations.

The model comes from the task itself (:meth:`Task.build_model`, under the meta device), so a
custom task is planned from its own model. Its activations are traced, not estimated by a
formula: one forward pass and loss of a micro-batch run on fake tensors (torch's
``FakeTensorMode``: shapes, dtypes and the CPU kernels' choices, no storage), and every tensor
autograd saves for backward is recorded through ``torch.autograd.graph.saved_tensors_hooks``,
once per storage (views of one tensor share it) and without the parameters themselves. The
shard units' forward hooks say which unit saved what, and the size of each unit's input: what
activation checkpointing keeps instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainer.config import Config
from trainer.errors import KftrainError
from trainer.tasks import Task
from trainer.tasks.contract import checked_batch, checked_built


class PlanError(KftrainError, ValueError):
    """The plan cannot be made as asked (a model it cannot build, a value it cannot use)."""


#: What a classification plan assumes without a prepared dataset (the table's width and classes
#: are the data's); a handful of features change the MLP's size by little.
CLASSIFICATION_GUESS = {"num_features": 64, "classes": 10}


def planning_manifest(cfg: Config, task: Task, manifest: dict | None = None) -> tuple[dict, str]:
    """The data manifest the model is built from, and a sentence saying where it came from:
    `manifest` when data prep has run; else what the config determines (causal_lm's vocabulary
    from `data.tokenizer` or the pretrained model's config.json); else a stated guess."""
    if manifest is not None:
        return manifest, "model built from the prepared dataset's manifest"
    from trainer.tasks.causal_lm import CausalLMTask
    from trainer.tasks.classification import ClassificationTask

    # By what the task is, not the name it gives: a custom task built on a built-in one reads its
    # manifest; another that calls itself "classification" was planned as its guessed MLP, in silence.
    if isinstance(task, CausalLMTask):
        return _causal_manifest(cfg)
    if isinstance(task, ClassificationTask):
        guess = CLASSIFICATION_GUESS
        classes = [str(i) for i in range(guess["classes"])]
        made = {
            "num_features": guess["num_features"],
            "classes": classes,
            "feature_names": [f"f{i}" for i in range(guess["num_features"])],
            "normalization": {"mean": [0.0] * guess["num_features"], "std": [1.0] * guess["num_features"]},
        }
        return made, (
            f"no dataset yet: assumed {guess['num_features']} features and {guess['classes']} classes "
            "(give the prepared dataset for the real shape)"
        )
    return {}, "no dataset given: the task's build_model received an empty manifest"


def _causal_manifest(cfg: Config) -> tuple[dict, str]:
    from trainer.tokenizer import parse_spec

    if cfg.model.init_from:
        from trainer.pretrained import read_config, source_for

        vocab = int(read_config(source_for(cfg, weights=False), cfg.model.trust_remote_code)["vocab_size"])
        return {"vocab_size": vocab}, f"vocabulary of {vocab} from the pretrained model's config.json"
    try:
        spec = parse_spec(cfg.data.tokenizer)
    except ValueError as exc:
        raise PlanError(f"data.tokenizer: {exc}") from None
    if spec.kind in ("bytes", "bpe"):
        return {"vocab_size": spec.vocab_size}, f"vocabulary of {spec.vocab_size} from data.tokenizer"
    from trainer.storage import open_store
    from trainer.tokenizer import load_tokenizer

    s = cfg.store
    tokenizer = load_tokenizer(spec.uri, open_store(spec.uri, s.endpoint, s.region, s.policy()))
    return {"vocab_size": tokenizer.vocab_size}, f"vocabulary of {tokenizer.vocab_size} from {spec.uri}"


def build_on_meta(cfg: Config, task: Task, manifest: dict) -> nn.Module:
    """The task's model for `cfg`, its parameters on the meta device (no memory, no init)."""
    try:
        with torch.device("meta"):
            model, _meta = checked_built(task, task.build_model(cfg, manifest))
    except KeyError as exc:
        raise PlanError(
            f"task {cfg.task!r}: its build_model needs {exc} from the data manifest; run data prep first "
            "and plan with the prepared dataset"
        ) from None
    return model


@dataclass
class ModelShape:
    """Parameter counts of a model (tied weights once) and how they divide into shard units."""

    trainable: int
    frozen: int
    trainable_bytes: int
    frozen_bytes: int
    unit_params: list[int]  # per shard unit (FSDP's all-gather granularity)
    unit_bytes: list[int]
    root_params: int  # outside every unit (sharded with the root)
    root_bytes: int
    unit_trainable: list[int]  # the trainable ones per shard unit: what FSDP reduce-scatters (LoRA: adapters)
    root_trainable: int
    largest_param: int  # elements of the largest parameter tensor
    flops_per_item: float
    items_per_sample: int
    param_tensors: int = 0  # parameter tensors (tied once): each costs kernel launches every step

    @property
    def total(self) -> int:
        """All parameters."""
        return self.trainable + self.frozen

    def as_dict(self) -> dict[str, Any]:
        """Plain mapping (the plan's record)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def model_shape(model: nn.Module, task: Task, cfg: Config) -> ModelShape:
    """Count `model`'s parameters, trainable and frozen, in bytes as built, and per shard unit."""
    params = list(model.parameters())  # shared (tied) parameters once
    units = task.shard_units(model)
    in_unit: set[int] = set()
    unit_params, unit_bytes, unit_trainable = [], [], []
    for unit in units:
        own = [p for p in unit.parameters() if id(p) not in in_unit]
        in_unit.update(id(p) for p in own)
        unit_params.append(sum(p.numel() for p in own))
        unit_bytes.append(sum(p.numel() * p.element_size() for p in own))
        unit_trainable.append(sum(p.numel() for p in own if p.requires_grad))
    root = [p for p in params if id(p) not in in_unit]
    try:
        flops = float(task.flops_per_item(model, cfg))
    except Exception:  # a custom task's FLOP count may need real weights: unknown then
        flops = 0.0
    return ModelShape(
        trainable=sum(p.numel() for p in params if p.requires_grad),
        frozen=sum(p.numel() for p in params if not p.requires_grad),
        trainable_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        frozen_bytes=sum(p.numel() * p.element_size() for p in params if not p.requires_grad),
        unit_params=unit_params,
        unit_bytes=unit_bytes,
        root_params=sum(p.numel() for p in root),
        root_bytes=sum(p.numel() * p.element_size() for p in root),
        unit_trainable=unit_trainable,
        root_trainable=sum(p.numel() for p in root if p.requires_grad),
        largest_param=max((p.numel() for p in params), default=0),
        flops_per_item=flops,
        items_per_sample=int(task.items_per_sample(cfg)),
        param_tensors=len(params),
    )


@dataclass
class ActivationTrace:
    """Bytes autograd keeps for backward in one micro-batch's forward pass and loss."""

    micro_batch: int
    saved_bytes: int  # everything saved, once per storage, parameters excluded
    unit_saved: list[int] = field(default_factory=list)  # of it, saved inside each shard unit
    unit_input: list[int] = field(default_factory=list)  # each unit's input (what checkpointing keeps)
    largest_saved: int = 0  # the largest single saved storage (its gradient appears in backward)

    def bytes(self, checkpointing: bool) -> int:
        """Activation bytes at the end of forward: all of them; with activation checkpointing,
        the units' inputs in place of what they saved, plus one unit's worth recomputed in
        backward."""
        if not checkpointing or not self.unit_saved:
            return self.saved_bytes
        return self.saved_bytes - sum(self.unit_saved) + sum(self.unit_input) + max(self.unit_saved)

    def as_dict(self) -> dict[str, Any]:
        """Plain mapping (the plan's record)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _to_fake(model: nn.Module, mode, bf16: Callable[[nn.Parameter], bool] | None = None) -> None:
    """Give every parameter and buffer of `model` a fake CPU tensor of its shape and dtype (bf16
    for the floating parameters `bf16` picks; shared ones stay shared)."""
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store, make in ((module._parameters, True), (module._buffers, False)):
            for name, t in list(store.items()):
                if t is None:
                    continue
                if id(t) not in done:
                    dtype = t.dtype
                    if make and bf16 is not None and t.is_floating_point() and bf16(t):
                        dtype = torch.bfloat16
                    with mode:
                        fake = torch.empty(t.shape, dtype=dtype, device="cpu")
                    done[id(t)] = nn.Parameter(fake, requires_grad=t.requires_grad) if make else fake
                store[name] = done[id(t)]


def trace_activations(
    model: nn.Module,
    task: Task,
    cfg: Config,
    manifest: dict,
    micro_batch: int,
    bf16: bool,
    held_bf16: Callable[[nn.Parameter], bool] | None = None,
) -> ActivationTrace | None:
    """Trace the activations of `model` (on the meta device; it is changed to fake tensors) for
    a micro-batch of `micro_batch` items, under bf16 autocast when `bf16`, with the parameters
    `held_bf16` picks in bf16 (autocast copies the others: a copy the run has too); None when
    the task gives no synthetic batch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    _to_fake(model, mode, held_bf16)
    with mode:
        batch = checked_batch(task, task.synthetic_batch(cfg, manifest, micro_batch))
    if batch is None:
        return None
    param_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    units = task.shard_units(model)
    saved: dict[int, int] = {}
    owner: dict[int, int] = {}
    unit_input = [0] * len(units)
    current: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in param_storages and key not in saved:
            saved[key] = storage.nbytes()
            if current:
                owner[key] = current[-1]
        return t

    def enter(i):
        def hook(_module, args):
            current.append(i)
            unit_input[i] = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))

        return hook

    def leave(_module, _args, _out):
        current.pop()

    handles = []
    for i, unit in enumerate(units):
        handles.append(unit.register_forward_pre_hook(enter(i)))
        handles.append(unit.register_forward_hook(leave))
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    model.train()
    try:
        with mode, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
            task.loss(model, batch)
    finally:
        for h in handles:
            h.remove()
    unit_saved = [0] * len(units)
    for key, i in owner.items():
        unit_saved[i] += saved[key]
    return ActivationTrace(
        micro_batch=micro_batch,
        saved_bytes=sum(saved.values()),
        unit_saved=unit_saved,
        unit_input=unit_input,
        largest_saved=max(saved.values(), default=0),
    )


def gpt_activation_formula(
    micro_batch: int, block: int, n_embd: int, n_head: int, n_layer: int, bf16: bool, fused_attention: bool = True
) -> int:
    """Activation bytes of a GPT's transformer layers by the per-layer formula of Korthikanti et
    al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", eq. 1, no
    tensor parallelism): ``s b h (34 + 5 a s / h)`` bytes per layer with 16-bit activations
    (twice that in fp32). A fused (flash) attention kernel keeps no ``a s^2 b`` scores, which
    drops the second term. The cross-check for the trace; the embedding and the logits are
    outside it, and so are dropout masks' share when dropout is 0 (about 2 s b h of the 34)."""
    s, b, h, a = block, micro_batch, n_embd, n_head
    per_layer = s * b * h * 34 + (0 if fused_attention else 5 * a * s * s * b)
    return int(per_layer * n_layer * (1 if bf16 else 2))
