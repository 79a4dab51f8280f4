"""The task interface: what the training loop, evaluation and export call on every task.

Built-in tasks import it from here, so no task module imports the package that loads it
(`trainer.tasks.get_task`); users subclass it as `trainer.tasks.Task` (re-exported there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the interface alone imports no torch: the up-front checks import tasks too
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from trainer.config import Config
    from trainer.storage import ObjectStore
    from trainer.streaming import ItemsOf, Take


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode for the duration (no dropout: validation, scoring and greedy
    generation give the same numbers and text every time), then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class Task:
    """The interface the training loop, evaluation and export call. Subclass and override."""

    #: The task's name in logs (a model's metadata records the config's `task`, which finds the class).
    name: str = "task"
    #: What throughput counts: `samples` or `tokens`.
    item_name: str = "samples"
    #: Names of the exported model's input and output, and the input's dynamic dimensions.
    serving_input: str = "features"
    serving_output: str = "logits"
    serving_dynamic_dims: tuple[int, ...] = (0,)

    def prepare(self, cfg: Config, store: ObjectStore, dataset_uri: str) -> dict[str, Any]:
        """Data prep: write the dataset (shards + manifest.json last) and return the manifest."""
        raise NotImplementedError

    def stream(self, cfg: Config, manifest: dict) -> tuple[ItemsOf, Take] | None:
        """How to stream the dataset's shards (`trainer/streaming.py`): the items in a shard, and a
        batch of tensors from a decoded shard and item indices. None: :meth:`datasets` loads the
        splits instead (whole, in every rank: fine for small data only)."""
        return None

    def datasets(self, cfg: Config, store: ObjectStore, dataset_uri: str, manifest: dict) -> tuple[Dataset, Dataset]:
        """The train and validation datasets (items are tuples of tensors), for tasks without :meth:`stream`."""
        raise NotImplementedError

    def build_model(self, cfg: Config, manifest: dict) -> tuple[nn.Module, dict[str, Any]]:
        """A freshly initialised model and its metadata (`architecture` and anything else needed to rebuild it)."""
        raise NotImplementedError

    def model_from_meta(self, meta: dict[str, Any]) -> nn.Module:
        """An uninitialised model of the architecture recorded in `meta` (for loading weights)."""
        raise NotImplementedError

    def materialize(self, model: nn.Module, device: torch.device) -> None:
        """Give a model built with parameters on the meta device (by :meth:`build_model`) its
        storage on `device` and its initial weights. The trainer calls it after sharding under
        FSDP (each rank fills only its shards) and before wrapping under DDP. Default: move it."""
        model.to(device)

    def load_weights(self, model: nn.Module, meta: dict[str, Any], store: ObjectStore, weights_uri: str) -> None:
        """Load the saved weights at `weights_uri` (a safetensors file) into `model` from
        :meth:`model_from_meta`. Default: the file holds the whole state dict (tied weights once)."""
        from safetensors.torch import load as load_safetensors

        from trainer.model_io import tied_names

        # strict=False only for tied weights (GPT's lm_head is wte): safetensors stores shared
        # tensors once; every other key must match.
        missing, unexpected = model.load_state_dict(load_safetensors(store.get_bytes(weights_uri)), strict=False)
        if unexpected or set(missing) - tied_names(model):
            raise ValueError(
                f"{weights_uri}: weights do not match the architecture (missing {missing}, unexpected {unexpected})"
            )

    def shard_units(self, model: nn.Module) -> list[nn.Module]:
        """The submodules that `train.strategy: fsdp` shards one by one before the root (each
        all-gathers its weights only while it runs) and `train.activation_checkpointing`
        recomputes in backward. Default: every module of every `nn.ModuleList` child (a GPT's
        blocks); none for a model without one, which is then sharded as one unit."""
        from torch import nn

        return [unit for child in model.children() if isinstance(child, nn.ModuleList) for unit in child]

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The scalar training loss of one (micro-)batch already on the device."""
        raise NotImplementedError

    def summed_loss(
        self, model: nn.Module, batch: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """For a loss that is a mean over units whose number varies from micro-batch to micro-batch
        (the assistant's tokens of chat data): the sum of the micro-batch's per-unit losses and the
        number of units. Training then takes the mean over every unit of the global batch, so that
        the world size and `train.grad_accum_steps` do not change what is learned. None (the
        default): the micro-batches weigh the same, and training averages their `loss`."""
        return None

    def synthetic_batch(self, cfg: Config, manifest: dict, size: int) -> tuple[torch.Tensor, ...] | None:
        """A training batch of `size` items with the shapes and dtypes of real ones (values do not
        matter), for `kftrain plan`: its activation trace and its probe run on it. None: the
        task cannot say; the plan then predicts no activations and runs no probe."""
        return None

    def items_per_sample(self, cfg: Config) -> int:
        """Throughput units per dataset item (1 sample, or block_size tokens)."""
        return 1

    def flops_per_item(self, model: nn.Module, cfg: Config) -> float:
        """Training FLOPs per throughput unit, for the MFU estimate; 0: unknown."""
        return 0.0

    def validate(self, model: nn.Module, dataset: Dataset, device: torch.device, batch_size: int) -> dict[str, float]:
        """Metrics on the validation split, computed by rank 0 after each epoch."""
        raise NotImplementedError

    def evaluate(
        self, model: nn.Module, meta: dict, store: ObjectStore, dataset_uri: str, max_items: int
    ) -> dict[str, Any]:
        """The test-split report of the evaluation step, on at most `max_items` items (the first ones)."""
        raise NotImplementedError

    def serving_module(self, model: nn.Module, meta: dict[str, Any]) -> tuple[nn.Module, torch.Tensor] | None:
        """The module to export and a sample input batch (traced, and used to verify every format);
        None: no TorchScript/ONNX export (the task's :meth:`extra_exports` is what serving loads)."""
        raise NotImplementedError

    def extra_exports(self, model: nn.Module, meta: dict[str, Any]) -> dict[str, bytes]:
        """Further files for the export folder, by relative path (e.g. a Hugging Face folder)."""
        return {}
