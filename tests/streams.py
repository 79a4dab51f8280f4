"""The uneven sharded dataset both tiers of the streaming tests read (tests/conftest.py's
`uneven_shards` fixture writes it), and helpers that read it through StreamingSplit."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from trainer.shards import ShardWriter
from trainer.storage import LocalStore
from trainer.streaming import StreamingSplit

#: Uneven shards on purpose: 7 of 40 items and a short last one.
SIZES = [40, 7, 40, 33, 40, 12]


class CountingStore(LocalStore):
    """A real local store that also records which objects were read."""

    reads: list[str] = []

    def get_bytes(self, uri: str, offset: int = 0, length: int = 0, version: str = "") -> bytes:
        CountingStore.reads.append(uri.rsplit("/", 1)[-1])
        return super().get_bytes(uri, offset, length, version)


def write_uneven_shards(uri: str):
    """Items 0..N-1 written to `uri` in shards of SIZES items; returns (uri, the shards' infos)."""
    writer = ShardWriter(LocalStore(), uri, "train", items_per_shard=40, kind="rows")
    next_id = 0
    for size in SIZES:  # a partial shard is closed early to make the sizes uneven
        ids = np.arange(next_id, next_id + size, dtype=np.int64)
        writer.add(x=ids.astype(np.float32)[:, None], y=ids)
        if writer._count:
            writer._flush()
        next_id += size
    return uri, writer.close()


def take(data, idx):
    return torch.from_numpy(data["x"][idx]), torch.from_numpy(data["y"][idx])


def split(dataset, rank=0, world=1, workers=0, micro=4, partitions=0, cache_bytes=2**30):
    uri, shards = dataset
    return StreamingSplit(
        CountingStore,
        uri,
        shards,
        lambda s: s.items,
        take,
        seed=3,
        rank=rank,
        world_size=world,
        workers=workers,
        micro_batch=micro,
        partitions=partitions,
        cache_bytes=cache_bytes,
    )


def batches(ds, epoch=0, start=0, left=None):
    ds.epoch, ds.start_batch, ds.left = epoch, start, left
    loader = DataLoader(ds, batch_size=None, num_workers=ds.workers if ds.workers > 1 else 0)
    return [b[1].tolist() for b in loader]
