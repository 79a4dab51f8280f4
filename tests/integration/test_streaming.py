"""The streaming reader: exact partitioning over ranks x workers, position-based resume, only
the needed shards fetched, a bounded cache, and shards checked against the manifest."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from trainer.shards import ShardWriter
from trainer.storage import LocalStore
from trainer.streaming import StreamingSplit

pytestmark = pytest.mark.timeout(120)
#: Uneven shards on purpose: 7 of 40 items and a short last one.
SIZES = [40, 7, 40, 33, 40, 12]


class CountingStore(LocalStore):
    """A real local store that also records which objects were read."""

    reads: list[str] = []

    def get_bytes(self, uri: str, offset: int = 0, length: int = 0) -> bytes:
        CountingStore.reads.append(uri.rsplit("/", 1)[-1])
        return super().get_bytes(uri, offset, length)


@pytest.fixture
def dataset(tmp_path):
    uri = str(tmp_path / "ds")
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


#: (world, workers, partitions, micro) before -> after, the global micro-batch kept (= world x
#: micro); the last case re-forms twice within the epoch.
RESHAPES = [
    [(2, 0, 0, 6), (3, 0, 0, 4)],
    [(2, 2, 0, 6), (3, 0, 0, 4)],
    [(3, 0, 0, 4), (2, 3, 0, 6)],
    [(2, 0, 4, 6), (1, 0, 0, 12)],
    [(1, 0, 0, 12), (4, 2, 8, 3)],
    [(2, 0, 0, 6), (3, 2, 0, 4), (4, 0, 0, 3)],
]


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (2, 0), (2, 2), (1, 3)])
def test_every_item_once_per_epoch_across_ranks_and_workers(dataset, world, workers):
    seen = []
    lengths = set()
    for rank in range(world):
        ds = split(dataset, rank, world, workers, micro=4)
        got = batches(ds, epoch=1)
        lengths.add(len(got))
        assert len(got) == ds.batches_per_epoch
        seen += [i for b in got for i in b]
    assert len(lengths) == 1  # every rank runs the same number of steps
    assert len(seen) == len(set(seen))  # nothing twice
    total = sum(SIZES)
    assert total - len(seen) < 4 * world * max(1, workers) * 2  # only each partition's remainder is left out


@pytest.mark.parametrize(("workers", "start"), [(0, 5), (2, 5), (2, 4), (3, 7)])
def test_resuming_at_a_position_gives_the_rest_of_the_epoch_exactly(dataset, workers, start):
    whole = batches(split(dataset, world=2, rank=1, workers=workers), epoch=2)
    assert batches(split(dataset, world=2, rank=1, workers=workers), epoch=2, start=start) == whole[start:]


@pytest.mark.parametrize("shapes", RESHAPES, ids=str)
@pytest.mark.parametrize("consumed", [1, 3])
def test_an_epoch_resumed_under_another_layout_reads_what_was_left_exactly_once(dataset, shapes, consumed):
    """Ranks of each shape read `consumed` micro-batches, then the next shape goes on from the
    positions left: over the whole epoch every item the first layout covers is read once."""
    world, workers, partitions, micro = shapes[0]
    covered = [
        i for r in range(world) for b in batches(split(dataset, r, world, workers, micro, partitions)) for i in b
    ]
    seen: list[int] = []
    left = None
    for n, (world, workers, partitions, micro) in enumerate(shapes):
        last = n == len(shapes) - 1
        ranks = [split(dataset, r, world, workers, micro, partitions) for r in range(world)]
        got = [batches(ds, left=left) for ds in ranks]
        assert len({len(g) for g in got}) == 1 and len(got[0]) == ranks[0].plan_batches  # equal steps
        for g in got:
            seen += [i for b in (g if last else g[:consumed]) for i in b]
        ranks[0].left = left
        left = ranks[0].unconsumed(consumed)
        # Whole global micro-batches are left, as a few ranges.
        assert sum(b - a for a, b in left) % (world * micro) == 0
    assert len(seen) == len(set(seen))  # nothing twice
    assert sorted(seen) == sorted(covered)  # nothing skipped
