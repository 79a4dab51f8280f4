"""Streaming a split from the object store: every reader fetches only the shards it needs.

The order of one epoch is a function of the seed, the epoch and the number of partitions:

1. the shards in a seeded random order, the items of each shard shuffled (a bounded shuffle:
   one shard at a time), concatenated into one sequence of N items;
2. cut into `partitions` contiguous, equal ranges of `N // partitions` items (the remainder is
   left out of that epoch, so every rank runs the same number of steps however uneven the
   shards are);
3. each reader (one rank, or one DataLoader worker of a rank) owns `partitions / readers` of
   them, and its k-th batch is the k-th chunk of each of its partitions.

The global batch of micro-step b is the b-th chunk of every partition, whatever the world size,
so with a fixed `data.partitions` one process and N processes take the same steps, and an
elastic job that re-forms at another size keeps its place. By default there is one partition
per reader. A reader's shards are fetched ahead on a background thread into a cache bounded in
bytes, and dropped once consumed. A position is (epoch, micro-batches consumed by the rank):
a resumed reader starts at the right shard and item without reading what came before.

A checkpoint also records which positions of the epoch are still to come (a few ranges). When
a run resumes under another layout (another world size, number of DataLoader workers or
`data.partitions`), the rest of that epoch is those positions, cut into one contiguous share
per rank and per worker (a :class:`Remainder`): no item of the epoch is skipped or seen twice,
and from the next epoch on the new layout applies.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from trainer.config import SHARD_CACHE_BYTES
from trainer.partitions import partition_problem
from trainer.shards import DataError, ShardInfo, read_shard
from trainer.storage import ObjectStore

#: What a task supplies to stream a split: items in a shard, and a batch from decoded shard data.
ItemsOf = Callable[[ShardInfo], int]
Take = Callable[[Any, np.ndarray], tuple[torch.Tensor, ...]]
#: Half-open ranges [start, stop) of positions in an epoch's sequence.
Ranges = list[tuple[int, int]]


def merge_ranges(ranges: Ranges) -> Ranges:
    """`ranges` sorted, with touching and overlapping ones joined (one canonical form)."""
    out: Ranges = []
    for start, stop in sorted((int(a), int(b)) for a, b in ranges if b > a):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def slice_ranges(ranges: Ranges, start: int, stop: int) -> Ranges:
    """Positions `start <= i < stop` of the sequence that `ranges` make end to end, as ranges."""
    out: Ranges = []
    offset = 0
    for a, b in ranges:
        lo, hi = max(start, offset), min(stop, offset + b - a)
        if lo < hi:
            out.append((a + lo - offset, a + hi - offset))
        offset += b - a
        if offset >= stop:
            break
    return out


@dataclass(frozen=True, slots=True)
class Stream:
    """One reader's walk along part of an epoch: `ranges` of positions, in this order, taken
    `chunk` items per batch for `batches` batches."""

    ranges: tuple[tuple[int, int], ...]
    chunk: int
    batches: int

    def positions(self, first: int, stop: int) -> Ranges:
        """The positions of batches `first <= k < stop`."""
        return slice_ranges(list(self.ranges), first * self.chunk, stop * self.chunk)


class EpochOrder:
    """Where each position of one epoch's sequence lives: (shard, item in shard)."""

    def __init__(self, counts: list[int], seed: int, epoch: int) -> None:
        self.seed, self.epoch, self.counts = seed, epoch, counts
        self.shard_order = np.random.default_rng([seed, epoch]).permutation(len(counts))
        sizes = np.array([counts[s] for s in self.shard_order], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])

    @property
    def total(self) -> int:
        """Items in the epoch's sequence."""
        return int(self.offsets[-1])

    def item_permutation(self, shard: int) -> np.ndarray:
        """The shuffled order of one shard's items in this epoch."""
        return np.random.default_rng([self.seed, self.epoch, 1 + shard]).permutation(self.counts[shard])

    def spans(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """Positions [start, stop) as (shard, first, last) ranges of the shard's permuted items."""
        out = []
        j = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pos = start
        while pos < stop:
            base, end = int(self.offsets[j]), int(self.offsets[j + 1])
            take = min(stop, end) - pos
            if take > 0:
                out.append((int(self.shard_order[j]), pos - base, pos - base + take))
                pos += take
            j += 1
        return out


@dataclass(frozen=True, slots=True)
class Layout:
    """How one epoch is cut: partitions, readers, and the chunk each partition gives a batch."""

    items: int
    """Items in the epoch's sequence."""
    partitions: int
    """Contiguous, equal ranges of the sequence."""
    readers: int
    """world size x DataLoader workers per rank (at least 1 worker)."""
    micro_batch: int
    """Items per rank per micro-step."""

    def __post_init__(self) -> None:
        problem = partition_problem(self.partitions, self.readers, self.micro_batch)
        if problem:
            raise ValueError(f"data.partitions {self.partitions} {problem}")

    @property
    def per_reader(self) -> int:
        """Partitions each reader owns."""
        return self.partitions // self.readers

    @property
    def chunk(self) -> int:
        """Items each partition contributes to one batch."""
        return self.micro_batch // self.per_reader

    @property
    def partition_items(self) -> int:
        """Items in each partition."""
        return self.items // self.partitions

    @property
    def batches_per_reader(self) -> int:
        """Full batches each reader yields in an epoch."""
        return self.partition_items // self.chunk

    def owned(self, reader: int) -> list[int]:
        """The partitions of one reader."""
        return list(range(reader, self.partitions, self.readers))

    def streams(self, reader: int) -> list[Stream]:
        """One stream per partition of the reader: its k-th batch is the k-th chunk of each."""
        span = self.batches_per_reader * self.chunk
        return [
            Stream(((p * self.partition_items, p * self.partition_items + span),), self.chunk, self.batches_per_reader)
            for p in self.owned(reader)
        ]


@dataclass(frozen=True, slots=True)
class Remainder:
    """The rest of an epoch that began under another layout: the `left` positions (as a
    checkpoint recorded them) cut into one contiguous share per rank, and each rank's share into
    one contiguous part per DataLoader worker, `micro_batch` items per batch."""

    left: tuple[tuple[int, int], ...]
    world_size: int
    workers: int
    micro_batch: int

    def __post_init__(self) -> None:
        items = sum(b - a for a, b in self.left)
        if items % (self.world_size * self.micro_batch):
            raise ValueError(
                f"{items} items left in the epoch do not make whole micro-batches of {self.micro_batch} items "
                f"on {self.world_size} ranks"
            )

    @property
    def rank_batches(self) -> int:
        """Micro-batches every rank yields."""
        return sum(b - a for a, b in self.left) // (self.world_size * self.micro_batch)

    def streams(self, reader: int) -> list[Stream]:
        """Reader (rank, worker v) serves the rank's batches v, v + workers, ... from its part."""
        rank, v = divmod(reader, self.workers)
        counts = [(self.rank_batches - u + self.workers - 1) // self.workers for u in range(self.workers)]
        start = (rank * self.rank_batches + sum(counts[:v])) * self.micro_batch
        part = slice_ranges(list(self.left), start, start + counts[v] * self.micro_batch)
        return [Stream(tuple(part), self.micro_batch, counts[v])]


#: How a (part of an) epoch is cut among readers: the whole epoch, or what was left of it.
Plan = Layout | Remainder


def unconsumed(plan: Plan, readers: int, workers: int, rank_batches: int) -> Ranges:
    """The positions of `plan` no rank has read after each consumed `rank_batches` micro-batches
    (every rank's, computed locally: the plan is the same everywhere)."""
    left: Ranges = []
    for reader in range(readers):
        v = reader % workers  # the rank's batches v, v + workers, ... come from this reader
        done = max(0, -(-(rank_batches - v) // workers))
        for stream in plan.streams(reader):
            left += stream.positions(done, stream.batches)
    return merge_ranges(left)


class ShardCache:
    """Fetches a planned sequence of shards on a background thread, ahead of use, holding at
    most `cache_bytes` of them (more only when the reader waits for a shard that does not fit)."""

    def __init__(
        self, store: ObjectStore, dataset_uri: str, plan: list[ShardInfo], cache_bytes: int, decode: Callable | None
    ) -> None:
        self._store, self._uri, self._plan, self._cache_bytes = store, dataset_uri, plan, cache_bytes
        self._decode = decode or (lambda data: data)
        self._ready: dict[int, Any] = {}
        self._used = 0
        self._wanted = 0
        self._error: BaseException | None = None
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="kftrain-shard-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for i, info in enumerate(self._plan):
            with self._cond:
                while (
                    not self._stop and self._used and self._used + info.bytes > self._cache_bytes and self._wanted < i
                ):
                    self._cond.wait()
                if self._stop:
                    return
            try:
                data = self._decode(read_shard(self._store, self._uri, info))
            except BaseException as exc:  # surfaces in the training process, naming the shard
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready[i] = data
                self._used += info.bytes
                self._cond.notify_all()

    def get(self, i: int) -> Any:
        """Shard `i` of the plan, waiting for it if it is still on its way."""
        with self._cond:
            self._wanted = max(self._wanted, i)
            self._cond.notify_all()
            while i not in self._ready:
                if self._error is not None:
                    raise self._error
                self._cond.wait()
            return self._ready[i]

    def release(self, i: int) -> None:
        """Shard `i` is consumed: drop it and make room for the next."""
        with self._cond:
            if self._ready.pop(i, None) is not None:
                self._used -= self._plan[i].bytes
            self._cond.notify_all()

    def close(self) -> None:
        """Stop prefetching (the thread finishes its current fetch and exits)."""
        with self._cond:
            self._stop = True
            self._ready.clear()
            self._cond.notify_all()


def reader_batches(
    store: ObjectStore,
    dataset_uri: str,
    shards: list[ShardInfo],
    streams: list[Stream],
    order: EpochOrder,
    first_batch: int,
    take: Take,
    cache_bytes: int,
    decode: Callable | None = None,
) -> Iterator[tuple[torch.Tensor, ...]]:
    """Batches `k >= first_batch` of one reader (the k-th chunk of each of its streams),
    fetching only the shards they cover."""
    stop_batch = streams[0].batches if streams else 0
    # Which batches touch each shard, from the streams' whole remaining ranges (a few spans
    # each), so the plan costs nothing per batch.
    first_use: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for stream in streams:
        c, pos = stream.chunk, first_batch * stream.chunk
        for start, stop in stream.positions(first_batch, stop_batch):
            for shard, lo, hi in order.spans(start, stop):
                k_first, k_last = pos // c, (pos + hi - lo - 1) // c
                first_use[shard] = min(first_use.get(shard, k_first), k_first)
                last_use[shard] = max(last_use.get(shard, k_last), k_last)
                pos += hi - lo
    plan_shards = sorted(first_use, key=lambda s: (first_use[s], s))
    index = {s: i for i, s in enumerate(plan_shards)}
    releases: dict[int, list[int]] = {}
    for shard, k in last_use.items():
        releases.setdefault(k, []).append(shard)
    cache = ShardCache(store, dataset_uri, [shards[s] for s in plan_shards], cache_bytes, decode)
    perms: dict[int, np.ndarray] = {}
    try:
        for k in range(first_batch, stop_batch):
            pieces: list[tuple[torch.Tensor, ...]] = []
            for stream in streams:
                for start, stop in stream.positions(k, k + 1):
                    for shard, lo, hi in order.spans(start, stop):
                        if shard not in perms:
                            perms[shard] = order.item_permutation(shard)
                        pieces.append(take(cache.get(index[shard]), perms[shard][lo:hi]))
            yield tuple(torch.cat(columns, dim=0) for columns in zip(*pieces, strict=True))
            for shard in releases.pop(k, []):
                cache.release(index[shard])
                perms.pop(shard, None)
    finally:
        cache.close()


class StreamingSplit(IterableDataset):
    """One rank's stream of micro-batches of a split (use with `DataLoader(batch_size=None)`).

    Set `epoch`, `start_batch` (micro-batches this rank already consumed of the epoch's plan)
    and `left` (None: the whole epoch under :attr:`layout`; else the positions a checkpoint
    recorded as still to come, see :class:`Remainder`) before iterating; each DataLoader worker
    then yields its share, and the DataLoader's round-robin over workers gives back exactly the
    rank's batches in order.
    """

    def __init__(
        self,
        store_factory: Callable[[], ObjectStore],
        dataset_uri: str,
        shards: list[ShardInfo],
        items_of: ItemsOf,
        take: Take,
        *,
        seed: int,
        rank: int,
        world_size: int,
        workers: int,
        micro_batch: int,
        partitions: int = 0,
        cache_bytes: int = SHARD_CACHE_BYTES,
        decode: Callable | None = None,
    ) -> None:
        super().__init__()
        self._store_factory, self.dataset_uri, self.shards = store_factory, dataset_uri, shards
        self.counts = [items_of(s) for s in shards]
        self._take, self._decode = take, decode
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.workers = max(1, workers)
        self.cache_bytes = cache_bytes
        readers = world_size * self.workers
        self.layout = Layout(sum(self.counts), partitions or readers, readers, micro_batch)
        if self.layout.batches_per_reader == 0:
            raise DataError(
                f"{dataset_uri}: {self.layout.items} items make no full batch for each of "
                f"{self.layout.partitions} partitions (micro-batch {micro_batch}); use more data, a smaller "
                "train.batch_size or fewer data.partitions"
            )
        self.micro_batch = micro_batch
        self.epoch = 0
        self.start_batch = 0
        self.left: Ranges | None = None

    @property
    def batches_per_epoch(self) -> int:
        """Micro-batches this rank yields per whole epoch (the same on every rank)."""
        return self.layout.batches_per_reader * self.workers

    @property
    def plan(self) -> Plan:
        """How the epoch being read is cut: the layout, or the remainder of a resumed epoch."""
        if self.left is None:
            return self.layout
        return Remainder(tuple(self.left), self.world_size, self.workers, self.micro_batch)

    @property
    def plan_batches(self) -> int:
        """Micro-batches this rank yields under :attr:`plan` (the same on every rank)."""
        plan = self.plan
        return plan.rank_batches if isinstance(plan, Remainder) else self.batches_per_epoch

    def unconsumed(self, rank_batches: int) -> Ranges:
        """The positions of the epoch no rank has read once each consumed `rank_batches` of the plan."""
        return unconsumed(self.plan, self.world_size * self.workers, self.workers, rank_batches)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        if info is not None and info.num_workers != self.workers:
            raise RuntimeError(f"StreamingSplit was built for {self.workers} workers, runs with {info.num_workers}")
        K = self.workers
        # The DataLoader asks workers 0, 1, ... in turn from the start of *this* iteration, so
        # worker w serves the rank batches b = start + w, start + w + K, ...: those of the
        # virtual reader (start + w) mod K. The batches a position maps to never depend on
        # where the iteration began.
        virtual = (self.start_batch + worker) % K
        first = (self.start_batch + worker) // K  # this reader's batches already consumed
        reader = self.rank * K + virtual
        order = EpochOrder(self.counts, self.seed, self.epoch)
        yield from reader_batches(
            self._store_factory(),
            self.dataset_uri,
            self.shards,
            self.plan.streams(reader),
            order,
            first,
            self._take,
            self.cache_bytes,
            self._decode,
        )


def first_items(
    store: ObjectStore, dataset_uri: str, shards: list[ShardInfo], items_of: ItemsOf, take: Take, limit: int
) -> tuple[torch.Tensor, ...]:
    """The first `limit` items of a split in shard order (a fixed sample for validation and
    evaluation); only the shards that hold them are read."""
    pieces, count = [], 0
    for info in shards:
        if count >= limit:
            break
        n = min(items_of(info), limit - count)
        if n > 0:
            pieces.append(take(read_shard(store, dataset_uri, info), np.arange(n)))
            count += n
    if not pieces:
        raise DataError(f"{dataset_uri}: the split holds no complete item; rerun data prep with more data")
    return tuple(torch.cat(columns, dim=0) for columns in zip(*pieces, strict=True))
