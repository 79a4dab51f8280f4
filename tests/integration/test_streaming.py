"""The streaming reader (trainer/streaming.py) with DataLoader worker processes: every item read
exactly once over ranks x workers, resume at a position, and resume under another layout. The
in-process behaviour is tested in tests/unit/test_streaming.py; the data is tests/streams.py's
uneven shards."""

from __future__ import annotations

import pytest

from tests.streams import SIZES, batches, split

pytestmark = pytest.mark.timeout(120)

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
def test_every_item_once_per_epoch_across_ranks_and_workers(uneven_shards, world, workers):
    seen = []
    lengths = set()
    for rank in range(world):
        ds = split(uneven_shards, rank, world, workers, micro=4)
        got = batches(ds, epoch=1)
        lengths.add(len(got))
        assert len(got) == ds.batches_per_epoch
        seen += [i for b in got for i in b]
    assert len(lengths) == 1  # every rank runs the same number of steps
    assert len(seen) == len(set(seen))  # nothing twice
    total = sum(SIZES)
    assert total - len(seen) < 4 * world * max(1, workers) * 2  # only each partition's remainder is left out


@pytest.mark.parametrize(("workers", "start"), [(0, 5), (2, 5), (2, 4), (3, 7)])
def test_resuming_at_a_position_gives_the_rest_of_the_epoch_exactly(uneven_shards, workers, start):
    whole = batches(split(uneven_shards, world=2, rank=1, workers=workers), epoch=2)
    assert batches(split(uneven_shards, world=2, rank=1, workers=workers), epoch=2, start=start) == whole[start:]


@pytest.mark.parametrize("shapes", RESHAPES, ids=str)
@pytest.mark.parametrize("consumed", [1, 3])
def test_an_epoch_resumed_under_another_layout_reads_what_was_left_exactly_once(uneven_shards, shapes, consumed):
    """Ranks of each shape read `consumed` micro-batches, then the next shape goes on from the
    positions left: over the whole epoch every item the first layout covers is read once."""
    world, workers, partitions, micro = shapes[0]
    covered = [
        i for r in range(world) for b in batches(split(uneven_shards, r, world, workers, micro, partitions)) for i in b
    ]
    seen: list[int] = []
    left = None
    for n, (world, workers, partitions, micro) in enumerate(shapes):
        last = n == len(shapes) - 1
        ranks = [split(uneven_shards, r, world, workers, micro, partitions) for r in range(world)]
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
