"""The streaming reader (trainer/streaming.py) in one process: the epoch order, partitioning over
ranks, position-based resume, only the needed shards fetched, a bounded cache, and shards checked
against the manifest. The data is tests/streams.py's uneven shards."""

from __future__ import annotations

import pytest

from tests.streams import SIZES, CountingStore, batches, split
from trainer.shards import read_shard
from trainer.storage import CorruptObject, LocalStore, join_uri
from trainer.streaming import EpochOrder, Layout, merge_ranges, slice_ranges

pytestmark = pytest.mark.timeout(120)


def test_shards_are_uneven_as_intended(uneven_shards):
    assert [s.items for s in uneven_shards[1]] == SIZES


def test_each_epoch_has_its_own_order_and_the_same_seed_repeats_it(uneven_shards):
    a, b = batches(split(uneven_shards), epoch=0), batches(split(uneven_shards), epoch=1)
    assert a != b and sorted(sum(a, [])) != [] and a == batches(split(uneven_shards), epoch=0)


def test_with_fixed_partitions_one_and_two_ranks_see_the_same_global_batches(uneven_shards):
    one = batches(split(uneven_shards, micro=8, partitions=2))
    twos = [batches(split(uneven_shards, rank=r, world=2, micro=4, partitions=2)) for r in range(2)]
    assert len(one) == len(twos[0])
    for step, global_batch in enumerate(one):
        assert sorted(global_batch) == sorted(twos[0][step] + twos[1][step])


def test_ranges_are_merged_and_sliced_end_to_end():
    assert merge_ranges([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4)]) == [(0, 3), (5, 9)]
    assert slice_ranges([(10, 14), (20, 22), (30, 40)], 3, 8) == [(13, 14), (20, 22), (30, 32)]
    assert slice_ranges([(10, 14)], 4, 9) == []


def test_a_reader_fetches_only_the_shards_its_partitions_cover(uneven_shards):
    uri, shards = uneven_shards
    order = EpochOrder([s.items for s in shards], seed=3, epoch=0)
    ds = split(uneven_shards, rank=0, world=2, micro=4)
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


def test_a_resumed_reader_does_not_fetch_what_came_before(uneven_shards):
    ds = split(uneven_shards, micro=4)
    CountingStore.reads = []
    batches(ds, start=ds.batches_per_epoch - 1)
    assert len(CountingStore.reads) == 1


def test_the_cache_holds_at_most_its_budget_plus_what_the_reader_waits_for(uneven_shards):
    uri, shards = uneven_shards
    budget = max(s.bytes for s in shards) + 1  # room for one shard at a time
    ds = split(uneven_shards, micro=4, cache_bytes=budget)
    assert sorted(sum(batches(ds), [])) == sorted(sum(batches(split(uneven_shards, micro=4)), []))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: raw[:-10], "bytes, the manifest says"),
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "sha256 differs from the manifest"),
    ],
)
def test_a_damaged_shard_is_named_when_read(uneven_shards, damage, message):
    uri, shards = uneven_shards
    path = join_uri(uri, shards[2].name)
    LocalStore().put_bytes(path, damage(LocalStore().get_bytes(path)))
    with pytest.raises(CorruptObject, match=message) as info:
        read_shard(LocalStore(), uri, shards[2])
    assert shards[2].name in str(info.value) and "rerun data prep" in str(info.value)
    with pytest.raises(CorruptObject, match=message):
        for _ in batches(split(uneven_shards, micro=4)):
            pass


@pytest.mark.parametrize(
    ("partitions", "readers", "micro", "message"),
    [
        (3, 2, 4, r"is not a multiple of the 2 readers .*: 2, 4, 8 fit at this world size, or 0 \(one per reader\)"),
        # What fits is said (was: only what does not; docs/strategies.md promised it).
        (4, 2, 3, r"micro-batch of 3 items \(train.batch_size / \(world size x .*\) does not divide by: 2, 6 fit"),
    ],
)
def test_layouts_that_cannot_be_exact_are_refused(partitions, readers, micro, message):
    with pytest.raises(ValueError, match=message):
        Layout(items=100, partitions=partitions, readers=readers, micro_batch=micro)
