"""The batches each rank trains on, and the fixed validation sample, for any task.

A task that can stream (:meth:`Task.stream`) is read shard by shard (`trainer/streaming.py`):
each rank fetches only its shards, whatever the size of the dataset. A task that cannot
(:meth:`Task.datasets`) loads its splits in every rank and is sampled with a
DistributedSampler, as small user datasets may be.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from trainer.config import Config, ConfigError
from trainer.distributed import DistEnv
from trainer.shards import split_shards
from trainer.storage import ObjectStore, open_store
from trainer.streaming import StreamingSplit, first_items
from trainer.tasks import Task


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start part-way into an epoch (mid-epoch resume)."""

    start_index = 0

    def __iter__(self):
        indices = list(super().__iter__())
        return iter(indices[self.start_index :])

    def __len__(self) -> int:
        return self.num_samples - self.start_index


@dataclass
class TrainingData:
    """One rank's view of the data: its micro-batches per epoch from any position, and the
    validation sample rank 0 scores after each epoch."""

    steps_per_epoch: int
    """Optimizer steps per epoch (the same on every rank)."""
    val: Dataset
    """The validation sample: at most `data.eval_items` items, the first ones in shard order."""
    _loader: DataLoader
    _position: Any
    streams: bool = True
    """Read by :class:`StreamingSplit`: with a fixed `data.partitions` the batches do not depend on the world size."""

    def epoch_batches(self, epoch: int, epoch_step: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """The rank's micro-batches of `epoch`, from optimizer step `epoch_step` on."""
        self._position(epoch, epoch_step)
        return iter(self._loader)


def training_data(
    cfg: Config,
    task: Task,
    store: ObjectStore,
    dataset_uri: str,
    manifest: dict,
    env: DistEnv,
    micro: int,
    device: torch.device,
) -> TrainingData:
    """The training batches and the validation sample of this rank."""
    tc = cfg.train
    accum = tc.grad_accum_steps
    pin = device.type == "cuda"
    # Every DataLoader iterator draws a base seed; from its own generator, never from the global
    # RNG, so restoring the RNG state on resume reproduces the uninterrupted run exactly.
    loader_rng = torch.Generator()
    streaming = task.stream(cfg, manifest)
    if streaming is not None:
        items_of, take = streaming
        split = StreamingSplit(
            # Each DataLoader worker opens its own store client.
            functools.partial(open_store, dataset_uri, cfg.store.endpoint, cfg.store.region, cfg.store.policy()),
            dataset_uri,
            split_shards(manifest, "train", dataset_uri),
            items_of,
            take,
            seed=tc.seed,
            rank=env.rank,
            world_size=env.world_size,
            workers=tc.num_workers,
            micro_batch=micro,
            partitions=cfg.data.partitions,
            cache_bytes=cfg.data.cache_bytes,
        )
        val_shards = split_shards(manifest, "val", dataset_uri)
        val = TensorDataset(*first_items(store, dataset_uri, val_shards, items_of, take, cfg.data.eval_items))
        loader = DataLoader(split, batch_size=None, num_workers=tc.num_workers, pin_memory=pin, generator=loader_rng)

        def position(epoch: int, epoch_step: int) -> None:
            split.epoch, split.start_batch = epoch, epoch_step * accum
            loader_rng.manual_seed(tc.seed * 100_003 + epoch)

        return TrainingData(split.batches_per_epoch // accum, val, loader, position)

    train_ds, val = task.datasets(cfg, store, dataset_uri, manifest)
    if len(train_ds) < tc.batch_size:
        raise ConfigError(f"train.batch_size: must not exceed the {len(train_ds)} training items, got {tc.batch_size}")
    # Full global batches only: every optimizer step sees exactly batch_size items on any world
    # size, so one process and N processes take the same steps.
    sampler = ResumableSampler(
        train_ds, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=tc.seed, drop_last=True
    )
    loader = DataLoader(
        train_ds,
        batch_size=micro,
        sampler=sampler,
        drop_last=True,
        num_workers=tc.num_workers,
        pin_memory=pin,
        generator=loader_rng,
    )

    def seek(epoch: int, epoch_step: int) -> None:
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        sampler.start_index = epoch_step * accum * micro
        loader_rng.manual_seed(tc.seed * 100_003 + epoch)

    return TrainingData(sampler.num_samples // micro // accum, val, loader, seek, streams=False)
