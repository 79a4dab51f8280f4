"""The batches each rank trains on: a streaming task is read shard by shard (StreamedData), any
other is sampled in memory (SampledData). Either way every rank takes the same number of steps,
the ranks' items are disjoint, an epoch resumed part-way gives the batches the uninterrupted run
would have, and each epoch has its own shuffle, the same in every process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.config import ConfigError, load_config
from trainer.distributed import DistEnv, micro_batch_size
from trainer.shards import DataError
from trainer.storage import LocalStore
from trainer.tasks import Task, get_task
from trainer.training_data import (
    ResumableSampler,
    SampledData,
    StreamedData,
    TrainingData,
    check_an_epoch_has_a_step,
    training_data,
)

CPU = torch.device("cpu")


class InMemoryTask(Task):
    """A task that does not stream: item i of its train split is the number i."""

    def __init__(self, items: int) -> None:
        self.items = items

    def datasets(self, cfg, store, dataset_uri, manifest):
        return TensorDataset(torch.arange(self.items)), TensorDataset(torch.arange(1000, 1003))


def config(world: int = 1, batch: int = 12, accum: int = 1, **overrides):
    return load_config(
        overrides={"job.replicas": world, "train.batch_size": batch, "train.grad_accum_steps": accum, **overrides}
    )


def build(cfg, task: Task, world: int, rank: int, dataset: tuple[str, dict] = ("", {})) -> TrainingData:
    env = DistEnv(rank=rank, world_size=world)
    micro = micro_batch_size(cfg.train.batch_size, env, cfg.train.grad_accum_steps)
    uri, manifest = dataset
    return training_data(cfg, task, LocalStore(), uri, manifest, env, micro, CPU)


def epoch(data: TrainingData, number: int, step: int = 0, left=None) -> tuple[int, list[tuple[torch.Tensor, ...]]]:
    """(the epoch's steps, the rank's micro-batches from `step` on)."""
    steps = data.begin_epoch(number, step, left)
    return steps, list(data.batches())


def ids(batches) -> list[int]:
    return [int(i) for (b,) in batches for i in b]


# --- which kind of data -------------------------------------------------------------------------


def test_a_task_that_streams_is_read_shard_by_shard_any_other_is_sampled(dataset):
    streamed = build(config(batch=8), get_task("classification"), 1, 0, dataset)
    assert isinstance(streamed, StreamedData) and streamed.streams
    assert streamed.left(0) == [(0, 80)]  # a checkpoint records what the epoch has still to give
    sampled = build(config(), InMemoryTask(40), 1, 0)
    assert isinstance(sampled, SampledData) and not sampled.streams
    assert sampled.left(0) is None
    assert ids(DataLoader(sampled.val)) == [1000, 1001, 1002]  # the task's own validation split


def test_a_batch_larger_than_the_training_split_is_refused_naming_the_field():
    with pytest.raises(ConfigError) as err:
        build(config(batch=12), InMemoryTask(10), 1, 0)
    assert str(err.value) == "train.batch_size: must not exceed the 10 training items, got 12"


# --- SampledData --------------------------------------------------------------------------------


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_sampled_every_rank_takes_the_same_steps_over_disjoint_items(world, accum):
    cfg = config(world, batch=12, accum=accum)
    ranks = [build(cfg, InMemoryTask(38), world, r) for r in range(world)]
    seen: list[int] = []
    for data in ranks:
        steps, batches = epoch(data, 0)
        # Full global batches only: 38 items make 3 steps of 12 on any world size.
        assert steps == data.steps_per_epoch == 3
        assert len(batches) == steps * accum
        seen += ids(batches)
    assert len(seen) == len(set(seen)) == 36


def test_sampled_resume_gives_the_rest_of_the_uninterrupted_epoch():
    cfg = config(2, batch=8, accum=2)
    whole = build(cfg, InMemoryTask(40), 2, 1)
    steps, full = epoch(whole, 3)
    resumed = build(cfg, InMemoryTask(40), 2, 1)  # a restarted process
    rest_steps, rest = epoch(resumed, 3, step=2)
    assert rest_steps == steps == 5  # the epoch's steps, counted from its start
    assert ids(rest) == ids(full[2 * 2 :])


def test_sampled_each_epoch_has_its_own_shuffle_the_same_in_every_process():
    a, b = build(config(), InMemoryTask(40), 1, 0), build(config(), InMemoryTask(40), 1, 0)
    e0, e1 = ids(epoch(a, 0)[1]), ids(epoch(a, 1)[1])
    assert e0 != e1 and sorted(e0) != list(range(36))  # shuffled, and reshuffled per epoch
    assert ids(epoch(b, 1)[1]) == e1 and ids(epoch(b, 0)[1]) == e0
    assert ids(epoch(a, 0)[1]) == e0  # the same epoch again, after another


@pytest.mark.parametrize("start", [0, 1, 5, 10])
def test_resumable_sampler_starts_part_way_and_counts_what_is_left(start):
    data = TensorDataset(torch.arange(23))
    full = ResumableSampler(data, num_replicas=2, rank=1, shuffle=True, seed=4, drop_last=True)
    full.set_epoch(2)
    sampler = ResumableSampler(data, num_replicas=2, rank=1, shuffle=True, seed=4, drop_last=True)
    sampler.set_epoch(2)
    sampler.start_index = start
    assert list(sampler) == list(full)[start:]
    assert len(sampler) == 11 - start
    loader = DataLoader(data, batch_size=2, sampler=sampler, drop_last=True)
    assert len(loader) == len(list(loader)) == (11 - start) // 2


# --- StreamedData -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[str, dict]:
    """A small classification dataset: 84 train rows in shards of 16, 12 val rows."""
    tmp = tmp_path_factory.mktemp("training-data")
    source = tmp / "source.csv"
    # Every row differs from every other (the pattern repeats after 154 rows).
    source.write_text("a,b,label\n" + "".join(f"{i % 7}.5,{(i * 3) % 11}.25,{'xy'[i % 2]}\n" for i in range(120)))
    uri = str(Path(tmp) / "dataset")
    cfg = load_config(overrides={"data.source": str(source), "data.shard_rows": 16})
    manifest = get_task("classification").prepare(cfg, LocalStore(), uri)
    assert manifest["splits"]["train"]["rows"] == 84 and manifest["splits"]["val"]["rows"] == 12
    return uri, manifest


def rows(batches) -> list[tuple[float, ...]]:
    """The items of classification batches, each as (features..., label)."""
    return [(*x.tolist(), int(y)) for xb, yb in batches for x, y in zip(xb, yb, strict=True)]


def streamed(dataset, world: int, rank: int, batch: int = 8, accum: int = 1, **overrides) -> StreamedData:
    data = build(config(world, batch, accum, **overrides), get_task("classification"), world, rank, dataset)
    assert isinstance(data, StreamedData)
    return data


@pytest.mark.parametrize(("world", "accum"), [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_streamed_every_rank_takes_the_same_steps_over_disjoint_items(dataset, world, accum):
    seen, micro_batches = [], set()
    for rank in range(world):
        data = streamed(dataset, world, rank, batch=8, accum=accum)
        steps, batches = epoch(data, 0)
        # 84 rows, 8 per optimizer step: 10 steps on every rank at any world size and accumulation.
        assert steps == data.steps_per_epoch == 10
        micro_batches.add(len(batches))
        assert len(batches) >= steps * accum
        assert all(len(y) == 8 // (world * accum) for _, y in batches)
        seen += rows(batches[: steps * accum])  # what the training loop takes
    assert len(micro_batches) == 1  # every rank yields as many
    assert len(seen) == len(set(seen)) == 80


def test_streamed_global_batches_do_not_depend_on_the_world_size_with_fixed_partitions(dataset):
    one = epoch(streamed(dataset, 1, 0, **{"data.partitions": 2}), 0)[1]
    two = [epoch(streamed(dataset, 2, r, **{"data.partitions": 2}), 0)[1] for r in range(2)]
    assert len(one) == len(two[0]) == len(two[1])
    for k, batch in enumerate(one):
        assert sorted(rows([batch])) == sorted(rows([two[0][k], two[1][k]]))


def test_streamed_resume_on_the_same_layout_goes_on_with_the_layout(dataset):
    steps, full = epoch(streamed(dataset, 2, 1, accum=2), 1)
    before = streamed(dataset, 2, 1, accum=2)
    before.begin_epoch(1)
    left = before.left(2)  # what a checkpoint after 2 steps records
    resumed = streamed(dataset, 2, 1, accum=2)
    rest_steps, rest = epoch(resumed, 1, step=2, left=left)
    assert resumed.split.left is None  # the layout's own plan, not a remainder
    assert rest_steps == steps
    assert rows(rest) == rows(full[2 * 2 :])


def test_streamed_resume_on_another_world_size_reads_exactly_what_was_left(dataset):
    """A checkpoint written by one rank after 3 steps, resumed by two: no item of the epoch is
    skipped or read twice, and both ranks take the same number of the remaining steps."""
    first = streamed(dataset, 1, 0)
    steps, full = epoch(first, 0)
    done, left = rows(full[:3]), first.left(3)
    assert sum(b - a for a, b in left) == len(rows(full)) - len(done)
    after = []
    for rank in range(2):
        data = streamed(dataset, 2, rank)
        total, batches = epoch(data, 0, step=3, left=left)
        assert data.split.left == left  # the remainder, cut for this layout
        assert total == 3 + len(batches) == steps  # the epoch keeps its length
        assert data.left(total) == []  # nothing left once those are read
        after += rows(batches)
    assert sorted(done + after) == sorted(rows(full))
    assert len(set(done + after)) == len(done + after)


def test_streamed_each_epoch_has_its_own_shuffle_the_same_in_every_process(dataset):
    a, b = streamed(dataset, 1, 0), streamed(dataset, 1, 0)
    e0, e1 = rows(epoch(a, 0)[1]), rows(epoch(a, 1)[1])
    assert e0 != e1
    assert rows(epoch(b, 1)[1]) == e1 and rows(epoch(b, 0)[1]) == e0


@pytest.mark.parametrize(("eval_items", "expected"), [(5, 5), (2048, 12)])
def test_streamed_validation_sample_is_the_first_eval_items_of_the_val_split(dataset, eval_items, expected):
    data = streamed(dataset, 1, 0, **{"data.eval_items": eval_items})
    x, y = data.val.tensors
    assert len(x) == len(y) == expected


@pytest.mark.parametrize(("batch", "accum"), [(128, 2), (96, 3)])
def test_streamed_data_without_one_whole_step_per_epoch_is_refused(dataset, batch, accum):
    """84 items hold one micro-batch of 64 (or two of 32), but not the 2 (or 3) a step takes: an
    epoch of no steps would train nothing, or loop forever under train.max_steps."""
    with pytest.raises(ConfigError) as err:
        streamed(dataset, 1, 0, batch=batch, accum=accum)
    assert str(err.value).startswith(f"train.batch_size: the 84 training items make no whole step of {batch} items")
    assert f"train.grad_accum_steps {accum}" in str(err.value)


def test_a_step_the_workers_leave_no_data_for_names_train_num_workers(dataset):
    """Was: "use a smaller train.batch_size ..., fewer data.partitions": the 64 partitions were
    the 64 workers' of the rank, a field the message never named."""
    uri, manifest = dataset
    cfg = config(1, 12, **{"train.num_workers": 64})
    with pytest.raises(ConfigError) as err:
        check_an_epoch_has_a_step(cfg, get_task("classification"), manifest, uri)
    assert "64 data partitions read by 64 readers: 1 rank(s) x train.num_workers 64" in str(err.value)
    assert str(err.value).endswith("train.grad_accum_steps, fewer train.num_workers, or more data")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            {},
            "train.grad_accum_steps 1, 1 data partitions); use a smaller train.batch_size or "
            "train.grad_accum_steps, or more data",
        ),
        (
            {"data.partitions": 4},
            "4 data partitions); use a smaller train.batch_size or train.grad_accum_steps, "
            "fewer data.partitions, or more data",
        ),
    ],
)
def test_a_step_with_no_data_names_only_the_settings_the_user_set(dataset, extra, said):
    """Was: "read by 1 readers: ... train.num_workers 0", and "fewer train.num_workers" at 0."""
    uri, manifest = dataset
    with pytest.raises(ConfigError) as err:
        check_an_epoch_has_a_step(config(1, 168, **extra), get_task("classification"), manifest, uri)
    assert str(err.value).endswith(said), err.value


@pytest.mark.parametrize(
    ("world", "batch", "accum", "extra"),
    [
        (1, 8, 1, {}),
        (2, 84, 1, {}),  # the whole split in one step
        (2, 88, 1, {}),  # past it
        (2, 1_000_000, 1, {}),  # as a UI user typed it
        (4, 80, 2, {}),
        (2, 88, 1, {"data.partitions": 8}),  # every partition too small
        (2, 8, 1, {"data.partitions": 8}),
        (2, 40, 1, {"train.num_workers": 2}),
        (1, 48, 2, {"train.num_workers": 2}),
    ],
)
def test_the_launcher_refuses_a_job_without_a_whole_step_exactly_when_its_ranks_would(
    dataset, world, batch, accum, extra
):
    """The training step checks the manifest before any replica starts (on a cluster, before
    they are scheduled), and agrees with what every rank computes from the same layout."""
    cfg = config(world, batch, accum, **extra)
    task = get_task("classification")
    try:
        for rank in range(world):
            assert build(cfg, task, world, rank, dataset).steps_per_epoch > 0
        ranks_refuse = False
    except (ConfigError, DataError):
        ranks_refuse = True
    uri, manifest = dataset
    if not ranks_refuse:
        check_an_epoch_has_a_step(cfg, task, manifest, uri)
        return
    with pytest.raises(ConfigError, match=r"^train\.batch_size: the 84 training items of .* make no whole step"):
        check_an_epoch_has_a_step(cfg, task, manifest, uri)


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        # 84 rows in steps of 12: 7 steps an epoch, 140 in the default 20 epochs.
        ({"train.warmup_steps": 140}, "train.warmup_steps: 140 is not below the run's 140 optimizer steps (20 epoch"),
        ({"train.warmup_steps": 139}, None),
        ({"train.epochs": 2, "train.warmup_steps": 50, "train.lr_schedule": "cosine"}, "the run's 14 optimizer steps"),
        (
            {"train.max_steps": 5, "checkpoint.keep_best": "val_accuracy"},
            "checkpoint.keep_best: the run ends at step 5 (train.max_steps 5), before its first epoch ends at step 7",
        ),
        ({"train.max_steps": 7, "checkpoint.keep_best": "val_accuracy"}, None),
    ],
)
def test_what_the_run_s_step_count_leaves_without_effect_is_refused_before_a_replica_starts(
    dataset, overrides, refused
):
    """Known once the data is prepared: a warm-up as long as the run never reached the learning
    rate (was: trained at a fraction of it, silently), a keep_best over less than an epoch had
    nothing to rank (was: the last step exported, said at the end)."""
    cfg, task = config(1, 12, 1, **overrides), get_task("classification")
    uri, manifest = dataset
    if refused is None:
        check_an_epoch_has_a_step(cfg, task, manifest, uri)
        return
    with pytest.raises(ConfigError) as err:
        check_an_epoch_has_a_step(cfg, task, manifest, uri)
    assert str(err.value).startswith(refused) or refused in str(err.value), err.value


@pytest.mark.parametrize(
    ("workers", "length", "moved"), [(0, 200, False), (2, 75, False), (2, 76, True), (1, 150, True)]
)
def test_workers_sockets_go_to_a_short_folder_where_the_temporary_folder_is_too_deep(
    monkeypatch, workers, length, moved
):
    """Was: every `kftrain run --local` with train.num_workers hung until its timeout, each worker
    dying of "AF_UNIX path too long" in the run's nested temporary folders."""
    import multiprocessing
    import shutil

    from trainer import training_data

    assert training_data.SUN_PATH_MAX - training_data.WORKER_SOCKET_SUFFIX == 75
    config = multiprocessing.current_process()._config
    monkeypatch.setitem(config, "tempdir", "unchanged")
    training_data.worker_sockets_fit(workers, "/" + "t" * (length - 1))
    if not moved:
        assert config["tempdir"] == "unchanged"
        return
    short = config["tempdir"]
    try:
        assert short.startswith("/tmp/kftrain-mp-") and os.path.isdir(short)
        assert len(short) + training_data.WORKER_SOCKET_SUFFIX <= training_data.SUN_PATH_MAX
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_with_no_short_folder_to_move_to_the_workers_are_refused_naming_tmpdir(monkeypatch, tmp_path):
    from trainer import training_data

    monkeypatch.setattr(training_data, "SHORT_TEMP_BASES", (str(tmp_path / "none"),))
    with pytest.raises(ConfigError) as err:
        training_data.worker_sockets_fit(2, "/" + "t" * 99)
    assert str(err.value) == (
        f"train.num_workers 2: each DataLoader worker makes a Unix socket in the temporary folder /{'t' * 99}, a path "
        f"25 byte(s) too long for one (107 at most, with 32 of the socket's own), and none of {tmp_path / 'none'} is "
        "writable; set TMPDIR to a folder at least 25 byte(s) shorter, or train.num_workers: 0"
    )
