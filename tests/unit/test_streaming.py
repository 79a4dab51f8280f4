"""The streaming reader: exact partitioning over ranks x workers, position-based resume, only
the needed shards fetched, a bounded cache, and shards checked against the manifest."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from trainer.shards import ShardWriter, read_shard
from trainer.storage import CorruptObject, LocalStore, join_uri
from trainer.streaming import EpochOrder, Layout, StreamingSplit, merge_ranges, slice_ranges

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


def test_shards_are_uneven_as_intended(dataset):
    assert [s.items for s in dataset[1]] == SIZES


def test_each_epoch_has_its_own_order_and_the_same_seed_repeats_it(dataset):
    a, b = batches(split(dataset), epoch=0), batches(split(dataset), epoch=1)
    assert a != b and sorted(sum(a, [])) != [] and a == batches(split(dataset), epoch=0)


def test_with_fixed_partitions_one_and_two_ranks_see_the_same_global_batches(dataset):
    one = batches(split(dataset, micro=8, partitions=2))
    twos = [batches(split(dataset, rank=r, world=2, micro=4, partitions=2)) for r in range(2)]
    assert len(one) == len(twos[0])
    for step, global_batch in enumerate(one):
        assert sorted(global_batch) == sorted(twos[0][step] + twos[1][step])


def test_ranges_are_merged_and_sliced_end_to_end():
    assert merge_ranges([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert slice_ranges([(10, 14), (20, 22), (30, 40)], 3, 8) == [(13, 14), (20, 22), (30, 32)]
    assert slice_ranges([(10, 14)], 4, 9) == []


def test_a_reader_fetches_only_the_shards_its_partitions_cover(dataset):
    uri, shards = dataset
    order = EpochOrder([s.items for s in shards], seed=3, epoch=0)
    ds = split(dataset, rank=0, world=2, micro=4)
    CountingStore.reads = []
    batches(ds)
    layout = ds.layout
    needed = {
        shards[s].name.rsplit("/", 1)[-1]
        for p in layout.owned(0)
        for s, _, _ in order.spans(p * layout.partition_items, (p + 1) * layout.partition_items)
    }
    assert set(CountingStore.reads) == needed and len(CountingStore.reads) == len(needed)
    assert len(needed) < len(shards)


def test_a_resumed_reader_does_not_fetch_what_came_before(dataset):
    ds = split(dataset, micro=4)
    CountingStore.reads = []
    batches(ds, start=ds.batches_per_epoch - 1)
    assert len(CountingStore.reads) == 1


def test_the_cache_holds_at_most_its_budget_plus_what_the_reader_waits_for(dataset):
    uri, shards = dataset
    budget = max(s.bytes for s in shards) + 1  # room for one shard at a time
    ds = split(dataset, micro=4, cache_bytes=budget)
    assert sorted(sum(batches(ds), [])) == sorted(sum(batches(split(dataset, micro=4)), []))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: raw[:-10], "bytes, the manifest says"),
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "sha256 differs from the manifest"),
    ],
)
def test_a_damaged_shard_is_named_when_read(dataset, damage, message):
    uri, shards = dataset
    path = join_uri(uri, shards[2].name)
    LocalStore().put_bytes(path, damage(LocalStore().get_bytes(path)))
    with pytest.raises(CorruptObject, match=message) as info:
        read_shard(LocalStore(), uri, shards[2])
    assert shards[2].name in str(info.value) and "rerun data prep" in str(info.value)
    with pytest.raises(CorruptObject, match=message):
        for _ in batches(split(dataset, micro=4)):
            pass


@pytest.mark.parametrize(
    ("partitions", "readers", "micro", "message"),
    [
        (3, 2, 4, "is not a multiple of the 2 readers"),
        (4, 2, 3, "which the per-rank micro-batch of 3 items does not divide by"),
    ],
)
def test_layouts_that_cannot_be_exact_are_refused(partitions, readers, micro, message):
    with pytest.raises(ValueError, match=message):
        Layout(items=100, partitions=partitions, readers=readers, micro_batch=micro)
