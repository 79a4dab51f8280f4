"""The batches each rank trains on, and the fixed validation sample, for any task.

A task that can stream (:meth:`Task.stream`) is read shard by shard (`trainer/streaming.py`):
each rank fetches only its shards, whatever the size of the dataset. A task that cannot
(:meth:`Task.datasets`) loads its splits in every rank and is sampled with a
DistributedSampler, as small user datasets may be.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import tempfile
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from trainer.config import Config, ConfigError
from trainer.distributed import DistEnv
from trainer.shards import split_shards
from trainer.storage import ObjectStore, open_store
from trainer.streaming import Layout, Ranges, StreamingSplit, first_items, merge_ranges
from trainer.tasks.base import Task
from trainer.tasks.contract import checked_datasets, streamed

log = logging.getLogger("kftrain.data")


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start part-way into an epoch (mid-epoch resume)."""

    start_index = 0

    def __iter__(self):
        indices = list(super().__iter__())
        return iter(indices[self.start_index :])

    def __len__(self) -> int:
        return self.num_samples - self.start_index


class TrainingData:
    """One rank's view of the data: its micro-batches of each epoch from any position, and the
    validation sample scored after each epoch."""

    streams = False
    """The task streams (:class:`StreamingSplit`): the position carries over to another world size."""

    def __init__(self, steps_per_epoch: int, val: Dataset, loader: DataLoader, accum: int) -> None:
        self.steps_per_epoch = steps_per_epoch
        """Optimizer steps per whole epoch (the same on every rank)."""
        self.val = val
        """The validation sample: at most `data.eval_items` items, the first ones in shard order."""
        self._loader, self._accum = loader, accum

    def begin_epoch(self, epoch: int, epoch_step: int = 0, left: Ranges | None = None) -> int:
        """Position the batches at optimizer step `epoch_step` of `epoch`; return the epoch's
        steps. `left`: the positions a checkpoint recorded as still to come."""
        raise NotImplementedError

    def batches(self) -> Iterator[tuple[torch.Tensor, ...]]:
        """The rank's micro-batches from the position of :meth:`begin_epoch` on."""
        return iter(self._loader)

    def left(self, epoch_step: int) -> Ranges | None:
        """The positions of the current epoch still to come after `epoch_step` steps (for a
        checkpoint), or None where the task does not stream."""
        return None


class StreamedData(TrainingData):
    """Batches read shard by shard (each rank fetches only its own) from a :class:`StreamingSplit`."""

    streams = True

    def __init__(self, split: StreamingSplit, val: Dataset, loader: DataLoader, accum: int, seed: int) -> None:
        super().__init__(split.batches_per_epoch // accum, val, loader, accum)
        self.split, self._seed = split, seed
        self._plan_start = 0  # the epoch step at which the split's plan begins

    def begin_epoch(self, epoch: int, epoch_step: int = 0, left: Ranges | None = None) -> int:
        split, accum = self.split, self._accum
        split.epoch, split.left, self._plan_start = epoch, None, 0
        split.start_batch = epoch_step * accum
        # The same items still to come as this layout leaves at this step: go on with the layout
        # (the run is then the same as one never interrupted); else read exactly what is left.
        if epoch_step and left is not None and merge_ranges(left) != split.unconsumed(split.start_batch):
            split.left, split.start_batch, self._plan_start = merge_ranges(left), 0, epoch_step
            log.info(
                "epoch %d goes on with the %d items its checkpoint left, cut for this layout",
                epoch,
                sum(b - a for a, b in split.left),
            )
        # A DataLoader iterator draws its base seed from this generator, never from the global RNG.
        self._loader.generator.manual_seed(self._seed * 100_003 + epoch)
        return self._plan_start + split.plan_batches // accum

    def left(self, epoch_step: int) -> Ranges:
        return self.split.unconsumed((epoch_step - self._plan_start) * self._accum)


class SampledData(TrainingData):
    """A task's in-memory datasets sampled with a :class:`ResumableSampler` (small user data)."""

    def __init__(self, sampler: ResumableSampler, val: Dataset, loader: DataLoader, accum: int, micro: int) -> None:
        super().__init__(sampler.num_samples // micro // accum, val, loader, accum)
        self._sampler, self._micro = sampler, micro

    def begin_epoch(self, epoch: int, epoch_step: int = 0, left: Ranges | None = None) -> int:
        self._sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        self._sampler.start_index = epoch_step * self._accum * self._micro
        self._loader.generator.manual_seed(self._sampler.seed * 100_003 + epoch)
        return self.steps_per_epoch


def check_an_epoch_has_a_step(cfg: Config, task: Task, manifest: dict, dataset_uri: str) -> None:
    """ConfigError, before any replica starts, when the job's ranks (`job.replicas` x
    `job.nproc_per_node`) would find no whole optimizer step in an epoch of the prepared
    training split (the same layout each rank computes, :class:`StreamingSplit`, from the
    manifest's counts), or the run's steps leave a setting without effect: a warm-up as long as
    the run, `checkpoint.keep_best` over a run shorter than an epoch. A task that does not stream
    is checked by its ranks, which read the data."""
    streaming = streamed(task, cfg, manifest)
    if streaming is None:
        return
    tc, world = cfg.train, cfg.job.world_size
    shards = split_shards(manifest, "train", dataset_uri)
    items = sum(streaming[0](info) for info in shards)
    tokens = manifest["splits"]["train"].get("tokens")
    if cfg.task == "causal_lm" and tokens:
        # A shard's tail shorter than a window is never read: shards barely longer than one lose half.
        unused = 1 - items * cfg.model.block_size / tokens
        if unused > 0.1:
            log.warning(
                "data: %.0f%% of the training split's %d tokens are in no window of model.block_size + 1 = %d (a "
                "shard's tail shorter than a window is not read; its %d shards hold %d tokens each, at most): a "
                "larger data.shard_rows loses less",
                100 * unused,
                tokens,
                cfg.model.block_size + 1,
                len(shards),
                max(info.items for info in shards),
            )
    micro = tc.batch_size // (world * tc.grad_accum_steps)
    workers = max(1, tc.num_workers)
    layout = Layout(items, cfg.data.partitions or world * workers, world * workers, micro)
    per_epoch = layout.batches_per_reader * workers // tc.grad_accum_steps
    if per_epoch == 0:
        # What sets the partitions, where the user did (was: "fewer train.num_workers" at 0 workers).
        readers = (
            f" read by {world * workers} readers: {world} rank(s) x train.num_workers {workers}" if workers > 1 else ""
        )
        knobs = [k for k, v in (("train.num_workers", workers > 1), ("data.partitions", cfg.data.partitions)) if v]
        fewer = f"fewer {' or '.join(knobs)}, or " if knobs else "or "
        raise ConfigError(
            f"train.batch_size: the {items} training items of {dataset_uri} make no whole step of "
            f"{tc.batch_size} items on {world} ranks (micro-batches of {micro}, train.grad_accum_steps "
            f"{tc.grad_accum_steps}, {layout.partitions} data partitions{readers}); use a smaller train.batch_size "
            f"or train.grad_accum_steps, {fewer}more data"
        )
    # What only the step count says (the config alone checks them against train.max_steps).
    total = tc.max_steps or tc.epochs * per_epoch
    length = f"train.max_steps {tc.max_steps}" if tc.max_steps else f"{tc.epochs} epoch(s) of {per_epoch} steps"
    if tc.warmup_steps >= total:
        raise ConfigError(
            f"train.warmup_steps: {tc.warmup_steps} is not below the run's {total} optimizer steps ({length}): the "
            "learning rate would never reach train.learning_rate; use fewer warm-up steps"
        )
    if cfg.checkpoint.keep_best and total < per_epoch:
        raise ConfigError(
            f"checkpoint.keep_best: the run ends at step {total} ({length}), before its first epoch ends at step "
            f"{per_epoch}: no checkpoint with the epoch's metrics to rank; train at least an epoch, or drop keep_best"
        )


#: The longest path of a Unix socket (`sun_path`, 108 bytes on Linux, its NUL included).
SUN_PATH_MAX = 107
#: What Python's multiprocessing adds to its temporary folder for the Unix socket a DataLoader
#: worker makes to hand back batches: `/pymp-XXXXXXXX/listener-XXXXXXXX`.
WORKER_SOCKET_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
#: Short folders a worker's socket may go in instead, as Python 3.13's multiprocessing does.
SHORT_TEMP_BASES = ("/tmp", "/var/tmp", "/usr/tmp")


def worker_sockets_fit(num_workers: int, tempdir: str | None = None) -> None:
    """Make the Unix socket each DataLoader worker makes fit a socket's path: where the temporary
    folder (`tempdir`, else the process's) is too deep for it, multiprocessing's folder becomes a
    short one of its own in :data:`SHORT_TEMP_BASES`, removed at exit (workers inherit it); with
    none writable, ConfigError naming TMPDIR. Was: the worker's thread that hands back batches
    died of "AF_UNIX path too long" and the rank waited for it forever (every `kftrain run
    --local` with train.num_workers hung until its timeout: the run's folders nest)."""
    tempdir = tempdir or tempfile.gettempdir()
    over = len(os.fsencode(tempdir)) + WORKER_SOCKET_SUFFIX - SUN_PATH_MAX
    if not num_workers or over <= 0:
        return
    for base in SHORT_TEMP_BASES:
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            short = tempfile.mkdtemp(prefix="kftrain-mp-", dir=base)
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(short, True), exitpriority=-100)
            multiprocessing.current_process()._config["tempdir"] = short  # what multiprocessing.util reads
            return
    raise ConfigError(
        f"train.num_workers {num_workers}: each DataLoader worker makes a Unix socket in the temporary folder "
        f"{tempdir}, a path {over} byte(s) too long for one ({SUN_PATH_MAX} at most, with {WORKER_SOCKET_SUFFIX} of "
        f"the socket's own), and none of {', '.join(SHORT_TEMP_BASES)} is writable; set TMPDIR to a folder at least "
        f"{over} byte(s) shorter, or train.num_workers: 0"
    )


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
    worker_sockets_fit(tc.num_workers)
    pin = device.type == "cuda"
    # Every DataLoader iterator draws a base seed; from its own generator, never from the global
    # RNG, so restoring the RNG state on resume reproduces the uninterrupted run exactly.
    loader_rng = torch.Generator()
    streaming = streamed(task, cfg, manifest)
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
        data = StreamedData(split, val, loader, tc.grad_accum_steps, tc.seed)
        # The split refuses data without one micro-batch per reader; with accumulation an epoch can
        # still hold no whole step, which would train nothing (or, with train.max_steps, loop forever).
        if data.steps_per_epoch == 0:
            raise ConfigError(
                f"train.batch_size: the {split.layout.items} training items make no whole step of {tc.batch_size} "
                f"items (an epoch gives each rank {split.batches_per_epoch} micro-batches of {micro}, a step takes "
                f"train.grad_accum_steps {tc.grad_accum_steps}); use a smaller train.batch_size or "
                "train.grad_accum_steps, or more data"
            )
        return data

    train_ds, val = checked_datasets(task, task.datasets(cfg, store, dataset_uri, manifest))
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
    return SampledData(sampler, val, loader, tc.grad_accum_steps, micro)
