"""Checkpoints (trainer/checkpoint.py) in one process: commit records, completeness, pruning, loading."""

from __future__ import annotations

import errno
import hashlib
import json
import logging

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint import (
    COMMIT,
    METADATA,
    CheckpointError,
    CheckpointManager,
    StoreReader,
    best_step,
    commit_record,
    step_dir,
)
from trainer.storage import LocalStore, join_uri

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "commit",
    [
        b'{"step": 9}',  # no parts
        b'{"step": 9, "parts": {}}',  # no entry for DCP's index
        b'{"step": 9, "parts": {".metadata": {"bytes": "12"}}}',  # no hash, size not a number
        b'{"step": 9, "par',  # truncated
        b"[]",
    ],
)
def test_a_commit_record_without_parts_is_an_incomplete_checkpoint(tmp_path, caplog, commit):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    mgr = CheckpointManager(store, prefix)
    mgr.save(5, {"w": torch.ones(2)}, blocking=True)
    store.put_bytes(join_uri(step_dir(prefix, 9), METADATA), b"whatever")
    store.put_bytes(join_uri(step_dir(prefix, 9), COMMIT), commit)
    with caplog.at_level(logging.WARNING, logger="kftrain.checkpoint"):
        assert mgr.latest()["step"] == 5  # never chosen
    assert step_dir(prefix, 9) in caplog.text and "incomplete" in caplog.text


def test_a_step_folder_copied_under_another_step_s_name_is_no_checkpoint(tmp_path, caplog):
    """A folder copied or renamed by hand (step-00000005 as step-00000009) was listed as step 9,
    resumed from step 5's folder and pruned as 9 (a probe): its record names the step it is."""
    import shutil

    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    mgr = CheckpointManager(store, prefix)
    mgr.save(5, {"w": torch.ones(2)}, blocking=True)
    shutil.copytree(step_dir(prefix, 5), step_dir(prefix, 9))
    with caplog.at_level(logging.WARNING, logger="kftrain.checkpoint"):
        assert mgr.latest()["step"] == 5
    assert step_dir(prefix, 9) in caplog.text and "is step 5's, not step 9's (copied or renamed?)" in caplog.text


def save(mgr: CheckpointManager, step: int, blocking: bool = False) -> None:
    mgr.save(
        step,
        {"weights": torch.full((4,), float(step)), "nested": {"bias": torch.arange(3.0) + step}},
        record={"note": f"step {step}"},
        local=lambda: {"rng": b"\x01\x02"},
        blocking=blocking,
    )


def load(mgr: CheckpointManager) -> tuple[dict, dict, object]:
    record = mgr.latest()
    target = {"weights": torch.zeros(4), "nested": {"bias": torch.zeros(3)}}
    own = mgr.load(record, target)
    return record, target, own


# -- block hashes and ranged reads ---------------------------------------------------------------

BLOCK = 4096


def model_and_optimizer(n: int = 3) -> dict:
    """A model of n tensors of 6 blocks each, and AdamW-like state twice its size."""
    g = torch.Generator().manual_seed(0)
    model = {f"w{i}": torch.randn(6 * BLOCK // 4, generator=g) for i in range(n)}
    optim = {name: {"exp_avg": torch.randn_like(w), "exp_avg_sq": torch.rand_like(w)} for name, w in model.items()}
    return {"model": model, "optimizer": optim}


def save_blocked(store, prefix: str, state: dict) -> dict:
    CheckpointManager(store, prefix, block_bytes=BLOCK).save(1, state, blocking=True)
    return commit_record(store, step_dir(prefix, 1))


def load_model_only(store, prefix: str, record: dict) -> tuple[CheckpointManager, dict]:
    mgr = CheckpointManager(store, prefix)
    model = {f"w{i}": torch.zeros(6 * BLOCK // 4) for i in range(3)}
    mgr.load(record, {"model": model})
    return mgr, model


def distcp_bytes(record: dict) -> int:
    return sum(p["bytes"] for name, p in record["parts"].items() if name.endswith(".distcp"))


def assert_model_equal(model: dict, state: dict) -> None:
    for name, tensor in state["model"].items():
        assert torch.equal(model[name], tensor), name


def flip_byte(path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(raw))


def test_one_process_saves_and_loads_without_dcp_s_single_process_warning(tmp_path):
    """`job.replicas: 1` printed torch's "torch.distributed is disabled ... assuming the intent is
    to save in a single process" at every checkpoint, on the terminal: what `no_dist` says."""
    import warnings

    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    mgr = CheckpointManager(store, prefix)
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", append=True)  # below the filters in place: what they let through
        save(mgr, 3, blocking=True)
        state = {"weights": torch.zeros(4), "nested": {"bias": torch.zeros(3)}}
        mgr.load(mgr.latest(), state)
    assert torch.equal(state["weights"], torch.full((4,), 3.0))
    assert not [w for w in caught if "torch.distributed is disabled" in str(w.message)]


def test_a_partial_checkpoint_is_never_chosen(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    mgr = CheckpointManager(store, prefix, keep_last=5)
    save(mgr, 5, blocking=True)
    # A writer killed mid-upload: parts of step 9 exist, its commit record does not.
    store.put_bytes(join_uri(step_dir(prefix, 9), METADATA), b"\x80truncated")
    assert load(mgr)[0]["step"] == 5
    # A commit record whose part does not match (a torn write) is skipped too.
    store.put_bytes(join_uri(step_dir(prefix, 12), METADATA), b"garbage")
    record = {"step": 12, "parts": {METADATA: {"bytes": 999, "sha256": "0" * 64}}}
    store.put_bytes(join_uri(step_dir(prefix, 12), COMMIT), json.dumps(record).encode())
    assert load(mgr)[0]["step"] == 5


def test_a_checkpoint_missing_one_ranks_part_is_never_chosen(tmp_path, caplog):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    mgr = CheckpointManager(store, prefix, keep_last=5)
    save(mgr, 5, blocking=True)
    save(mgr, 10, blocking=True)
    # Step 10's commit record also lists a second rank's shard file, which never arrived.
    commit_uri = join_uri(step_dir(prefix, 10), COMMIT)
    record = json.loads(store.get_bytes(commit_uri))
    record["parts"]["__1_0.distcp"] = {"bytes": 10, "sha256": "0" * 64}
    store.put_bytes(commit_uri, json.dumps(record).encode())
    with caplog.at_level("WARNING", logger="kftrain.checkpoint"):
        record, target, _ = load(mgr)
    assert record["step"] == 5
    torch.testing.assert_close(target["weights"], torch.full((4,), 5.0))
    assert "__1_0.distcp" in caplog.text and step_dir(prefix, 10) in caplog.text


def test_pruning_removes_old_and_partial_checkpoints(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    store.put_bytes(join_uri(step_dir(prefix, 1), METADATA), b"partial")
    mgr = CheckpointManager(store, prefix, keep_last=1)
    save(mgr, 2, blocking=True)
    save(mgr, 3, blocking=True)
    assert {uri.rsplit("/", 2)[-2] for uri in store.list(prefix)} == {"step-00000003"}
    assert join_uri(step_dir(prefix, 3), COMMIT) in store.list(prefix)
    # No empty folder outlives its checkpoint (an object store has none either).
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.is_dir()] == ["step-00000003"]


def test_an_upload_failure_surfaces_on_the_next_save(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint folder should go")
    mgr = CheckpointManager(LocalStore(), str(blocker / "ckpt"))
    save(mgr, 1)
    with pytest.raises(CheckpointError, match="checkpoint upload to .* failed"):
        mgr.wait()


def test_the_commit_record_holds_each_block_s_sha256_of_every_distcp(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    record = save_blocked(store, prefix, model_and_optimizer())
    folder = tmp_path / "ckpt" / "step-00000001"
    for name, part in record["parts"].items():
        raw = (folder / name).read_bytes()
        assert part["sha256"] == hashlib.sha256(raw).hexdigest()
        if not name.endswith(".distcp"):  # read whole: no blocks
            assert "blocks" not in part and "block_bytes" not in part
            continue
        assert part["block_bytes"] == BLOCK and len(raw) % BLOCK  # a short last block too
        want = [hashlib.sha256(raw[i : i + BLOCK]).hexdigest() for i in range(0, len(raw), BLOCK)]
        assert part["blocks"] == want


def test_loading_the_model_alone_fetches_only_its_blocks_exactly(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    state = model_and_optimizer()
    record = save_blocked(store, prefix, state)
    mgr, model = load_model_only(store, prefix, record)
    assert_model_equal(model, state)
    # The model is a third of the state; the optimizer's entries are never fetched.
    assert mgr.last_fetched_bytes - record["parts"][METADATA]["bytes"] < 0.6 * distcp_bytes(record)
    assert "__0_0.distcp" in mgr.last_fetched


def test_a_changed_block_is_an_error_where_it_is_read_and_harmless_where_it_is_not(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    state = model_and_optimizer()
    record = save_blocked(store, prefix, state)
    folder = step_dir(prefix, 1)
    reader = StoreReader(store, folder, tmp_path / "probe", record["parts"])
    (tmp_path / "probe").mkdir()
    spans = {i.fqn: info for i, info in reader.read_metadata().storage_data.items()}
    shard = tmp_path / "ckpt" / "step-00000001" / "__0_0.distcp"
    # A byte in the middle of an optimizer tensor: a block no model tensor shares.
    exp_avg = spans["optimizer.w1.exp_avg"]
    flip_byte(shard, exp_avg.offset + exp_avg.length // 2)
    _, model = load_model_only(store, prefix, record)
    assert_model_equal(model, state)
    # A byte inside a model tensor: the block holding it is read, and refused.
    w2 = spans["model.w2"]
    at = w2.offset + w2.length // 2
    flip_byte(shard, at)
    with pytest.raises(
        CheckpointError, match=rf"__0_0\.distcp block {at // BLOCK} .*changed after it was committed"
    ) as err:
        load_model_only(store, prefix, record)
    # The way back: a retry reads the same bytes (was: the same failure on every resume, and no word of it).
    assert str(err.value).endswith(
        f"delete {prefix}/step-00000001, and a resume starts from the complete checkpoint before it "
        "(from the start where there is none)"
    )


def test_a_block_is_fetched_in_pieces_and_a_short_object_is_refused(tmp_path, monkeypatch):
    import trainer.checkpoint

    monkeypatch.setattr(trainer.checkpoint, "_GET_BYTES", 1000)  # not a divisor of the block
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    state = model_and_optimizer()
    record = save_blocked(store, prefix, state)
    _, model = load_model_only(store, prefix, record)
    assert_model_equal(model, state)
    folder = tmp_path / "ckpt" / "step-00000001"
    w2 = {i.fqn: info for i, info in FileSystemReader(folder).read_metadata().storage_data.items()}["model.w2"]
    end = w2.offset + w2.length // 2  # the object ends inside model.w2
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:end])
    with pytest.raises(CheckpointError, match=rf"__0_0\.distcp block {end // BLOCK} .*does not match"):
        load_model_only(store, prefix, record)


def test_a_commit_record_without_block_hashes_loads_whole_files(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    state = model_and_optimizer()
    record = save_blocked(store, prefix, state)
    for part in record["parts"].values():  # as written before block hashes
        part.pop("blocks", None)
        part.pop("block_bytes", None)
    store.put_bytes(join_uri(step_dir(prefix, 1), COMMIT), json.dumps(record).encode())
    mgr = CheckpointManager(store, prefix)
    record = mgr.latest()
    assert record["step"] == 1
    _, model = load_model_only(store, prefix, record)
    assert_model_equal(model, state)


def test_malformed_block_hashes_are_refused(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    record = save_blocked(store, prefix, model_and_optimizer())
    uri = join_uri(step_dir(prefix, 1), COMMIT)
    for change, message in [
        (lambda p: p["blocks"].pop(), r"lists \d+ block hashes for __0_0\.distcp, expected \d+"),
        (lambda p: p.update(block_bytes=0), "without a positive block_bytes"),
        (lambda p: p.pop("block_bytes"), "without a positive block_bytes"),
        (lambda p: p["blocks"].__setitem__(0, "xyz"), "expected .* sha256 hex digests"),
    ]:
        bad = json.loads(json.dumps(record))
        change(bad["parts"]["__0_0.distcp"])
        store.put_bytes(uri, json.dumps(bad).encode())
        with pytest.raises(CheckpointError, match=message):
            commit_record(store, step_dir(prefix, 1))
        assert CheckpointManager(store, prefix).latest() is None  # never chosen


def test_a_partly_fetched_part_is_released_then_fetched_again(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    record = save_blocked(store, prefix, model_and_optimizer())
    cache = tmp_path / "cache"
    cache.mkdir()
    reader = StoreReader(store, step_dir(prefix, 1), cache, record["parts"])
    path = reader.fetch("__0_0.distcp", [(BLOCK + 10, 20)])
    assert reader.fetched_bytes == BLOCK and path.stat().st_size == record["parts"]["__0_0.distcp"]["bytes"]
    assert reader.fetch("__0_0.distcp", [(BLOCK, BLOCK)]) == path and reader.fetched_bytes == BLOCK  # local
    reader.release("__0_0.distcp")
    assert not path.exists()
    reader.fetch("__0_0.distcp", [(BLOCK + 10, BLOCK)])  # two blocks now
    assert reader.fetched_bytes == 3 * BLOCK and reader.fetched == ["__0_0.distcp"]
    # A whole fetch over a partial copy replaces it with the verified whole file.
    whole = reader.fetch("__0_0.distcp")
    assert whole.read_bytes() == (tmp_path / "ckpt" / "step-00000001" / "__0_0.distcp").read_bytes()


# -- keep_best -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("direction", "expected"),
    [("min", 4), ("max", 6)],
)
def test_best_step_by_direction_ignores_steps_without_a_finite_value(direction, expected):
    metrics = {
        2: {"val_loss": 0.9},
        4: {"val_loss": 0.2},
        5: {},  # a mid-epoch checkpoint: no validation
        6: {"val_loss": 1.5},
        7: {"val_loss": float("nan")},
        8: {"val_loss": True},
        9: {"val_loss": "0.1"},
    }
    assert best_step(metrics, direction, "val_loss") == expected
    assert best_step(metrics, direction, "val_accuracy") is None
    assert best_step({3: {"m": 1.0}, 1: {"m": 1.0}}, direction, "m") == 1  # equal values: the earliest


def save_scored(mgr: CheckpointManager, step: int, value: float | None) -> None:
    mgr.save(
        step,
        {"weights": torch.full((4,), float(step))},
        record={} if value is None else {"metrics": {"epoch": step, "val_loss": value}},
        blocking=True,
    )


def steps_in(store, prefix) -> set[int]:
    return {int(uri.rsplit("/", 2)[-2].split("-")[1]) for uri in store.list(prefix) if "/step-" in uri}


def test_a_store_failing_the_best_lookup_raises_a_store_error(tmp_path):
    """Rank 0's failed listing is broadcast as an error (here one process): the caller decides,
    on every rank alike, not rank 0 alone while the others wait in the broadcast."""
    from trainer.storage import StoreError

    class Failing(LocalStore):
        def list(self, prefix):
            raise StoreError("cannot reach the object store")

    mgr = CheckpointManager(Failing(), str(tmp_path / "ckpt"), keep_best=("min", "val_loss"))
    with pytest.raises(StoreError, match="cannot reach the object store"):
        mgr.best(up_to=5)


def test_pruning_keeps_the_best_checkpoint_beside_the_last_and_across_restarts(tmp_path):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    mgr = CheckpointManager(store, prefix, keep_last=1, keep_best=("min", "val_loss"))
    for step, value in [(1, 0.8), (2, 0.3), (3, None), (4, 0.5)]:
        save_scored(mgr, step, value)
    assert steps_in(store, prefix) == {2, 4}
    # A restarted run (a new manager, nothing in memory) finds it again in the commit records.
    again = CheckpointManager(store, prefix, keep_last=1, keep_best=("min", "val_loss"))
    save_scored(again, 5, 0.4)
    assert steps_in(store, prefix) == {2, 5}
    assert again.best()["step"] == 2
    # Up to a step (what a run resumed from this one ranks): only the steps at or before it.
    assert [(again.best(up_to=n) or {}).get("step") for n in (1, 2, 4, 5)] == [None, 2, 2, 2]
    target = {"weights": torch.zeros(4)}
    again.load(again.best(), target)
    torch.testing.assert_close(target["weights"], torch.full((4,), 2.0))
    save_scored(again, 6, 0.1)  # a new best: the old one goes
    assert steps_in(store, prefix) == {6}
    assert again.best(up_to=5) is None and again.best(up_to=6)["step"] == 6
    # Without keep_best the plain rule applies, and no best is chosen.
    plain = CheckpointManager(store, prefix, keep_last=1)
    assert plain.best() is None


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),  # a quota, with bytes free on the disk
        (_chained(RuntimeError("unexpected pos 704 vs 598"), OSError(errno.ENOSPC, "full")), True),
        # DCP's: each rank's (exception, traceback); only this rank's (0) counts
        (CheckpointException("save", {0: (OSError(errno.ENOSPC, "full"), None)}), True),
        (CheckpointException("save", {1: (OSError(errno.ENOSPC, "full"), None)}), False),
        (RuntimeError("unexpected pos 704 vs 598"), False),  # the disk has room: something else
        (OSError(errno.EACCES, "Permission denied"), False),
    ],
)
def test_a_staging_failure_is_told_a_full_disk_by_this_rank_s_own_error(tmp_path, exc, full):
    from trainer.checkpoint import _staging_full

    folder = tmp_path / "kftrain-ckpt-rank0-step00000003-x"
    said = _staging_full(folder, exc, rank=0)  # the folder gone already: nothing staged
    assert bool(said) is full
    if full:
        assert said.startswith(f"the disk of its staging folder {tmp_path} is full (0 B of this rank's part written")
