"""Checkpoints: complete-only visibility, pruning, S3 round trip, and bitwise resume after SIGKILL."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import time
from dataclasses import replace

import pytest
import torch

from tests.jobs import shared_digits
from tests.unit.test_checkpoint import load, save
from tests.unit.test_checkpoint_owner import assert_pruning_stays_in_its_folder
from trainer.checkpoint import (
    COMMIT,
    METADATA,
    CheckpointError,
    CheckpointManager,
    rank_part,
)
from trainer.config import load_config
from trainer.launch.backend import run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.storage import LocalStore, join_uri, open_store

# -- resume after SIGKILL, bitwise ---------------------------------------------------------------

STEPS_PER_EPOCH = 19  # digits: 1,259 train rows // global batch 64


def resume_config(prefix: str, **overrides):
    return load_config(
        overrides={
            **overrides,
            "model.dropout": 0.1,  # exercises the per-rank RNG streams that a resume must restore
            # Killed mid-epoch 0 (after step 7), the resumed run still crosses epoch boundaries, and 50
            # steps are left for the kill to land before the run ends, however loaded the machine
            # (test_runs.py's reference is this run's DDP one).
            "train.epochs": 3,
            "train.log_interval_steps": 1000,
            "train.deterministic": True,
            "checkpoint.uri": prefix,
            "checkpoint.interval_steps": 7,  # not a multiple of 19: checkpoints fall mid-epoch
            "checkpoint.keep_last": 3,
        }
    )


def final_weights(model_uri: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(LocalStore().get_bytes(join_uri(model_uri, "model.safetensors")))


@pytest.mark.s3_servers("moto", "rgw")
def test_save_load_round_trip_through_s3(bucket):
    prefix = f"s3://{bucket}/run-1/checkpoints"
    mgr = CheckpointManager(open_store(prefix), prefix, keep_last=2)
    for step in (10, 20, 30):
        save(mgr, step)  # asynchronous: staged, then uploaded in the background
    mgr.close()
    assert mgr.committed_steps() == [20, 30]  # keep_last=2 pruned step 10
    reader = CheckpointManager(open_store(prefix), prefix)
    record, target, own = load(reader)
    assert record["step"] == 30 and record["note"] == "step 30" and record["world_size"] == 1
    assert {METADATA, rank_part(0), COMMIT} <= {*record["parts"], COMMIT}
    torch.testing.assert_close(target["weights"], torch.full((4,), 30.0))
    torch.testing.assert_close(target["nested"]["bias"], torch.arange(3.0) + 30)
    assert own == {"rng": b"\x01\x02"}
    assert set(reader.last_fetched) == set(record["parts"])  # one rank reads every part


@pytest.mark.s3_servers("moto", "rgw")
def test_pruning_on_s3_stays_in_the_prefix_s_own_folder(bucket):
    """S3 lists by letters, not folders: `ckpt/exp1` also matches `ckpt/exp10/...`."""
    assert_pruning_stays_in_its_folder(open_store(f"s3://{bucket}/ckpt"), f"s3://{bucket}/ckpt")


#: The strategies every kill-and-resume test runs under (a fixed partition count gives FSDP the
#: same global batches as DDP).
RESUME_STRATEGIES = pytest.mark.parametrize(
    "strategy",
    [
        {},  # DDP, one data partition per rank
        {"train.strategy": "fsdp", "data.partitions": 2, "train.grad_clip_norm": 1.0},
    ],
    ids=["ddp", "fsdp"],
)


def reference_run(shared, strategy: dict) -> tuple[str, str]:
    """The digits dataset and one uninterrupted run of `resume_config` under `strategy`: (dataset
    URI, model URI). Built once per test session: the SIGKILL and SIGTERM tests compare against
    the same run (read-only)."""
    dataset = shared_digits(shared)

    def build(folder) -> None:
        ref = resume_config(str(folder / "ref-ckpt"), **strategy)
        run_job(
            LocalBackend(sink=lambda line: None),
            replace(training_job(ref, "ref", dataset, str(folder / "ref")), timeout_s=240),
        )

    key = hashlib.sha256(json.dumps(strategy, sort_keys=True).encode()).hexdigest()[:12]
    return dataset, str(shared(f"test_checkpoint-reference-{key}", build) / "ref")


def start_until_mid_epoch_checkpoint(spec, prefix: str, sink) -> tuple[LocalBackend, CheckpointManager]:
    """Start the job `spec` and return once it has committed its first mid-epoch checkpoint."""
    backend = LocalBackend(sink=sink)
    backend.submit(spec)
    mgr = CheckpointManager(LocalStore(), prefix)
    deadline = time.monotonic() + 120
    try:
        while not [s for s in mgr.committed_steps() if s % STEPS_PER_EPOCH]:
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
    except BaseException:
        backend.cancel(spec)  # a job left running would load the machine for the tests after this one
        raise
    return backend, mgr


def assert_ends_as_uninterrupted(ref_uri: str, got_uri: str) -> dict:
    """The final weights equal bitwise and the record holds the same history; returns the record."""
    ref_w, got_w = final_weights(ref_uri), final_weights(got_uri)
    assert ref_w.keys() == got_w.keys()
    for name in ref_w:
        assert torch.equal(ref_w[name], got_w[name]), name  # bitwise, not approximately
    store = LocalStore()
    record = json.loads(store.get_bytes(join_uri(got_uri, "training.json")))
    ref_record = json.loads(store.get_bytes(join_uri(ref_uri, "training.json")))
    # The record covers the whole run, the epoch cut by the interruption included, and so do the
    # validation points the report draws against the step (was: only the last start's).
    assert record["history"] == ref_record["history"]
    assert record["progress"]["validation"] == ref_record["progress"]["validation"]
    # And the progress lines' losses: the interval cut by the interruption is the same steps' mean
    # (was: the steps since the resume alone).
    assert [(p["step"], p["loss"]) for p in record["loss_curve"]] == [
        (p["step"], p["loss"]) for p in ref_record["loss_curve"]
    ]
    return record


@pytest.mark.slow
@pytest.mark.timeout(300)
@RESUME_STRATEGIES
def test_sigkill_mid_epoch_then_resume_ends_bitwise_equal(shared, tmp_path, strategy):
    dataset, ref_uri = reference_run(shared, strategy)
    epochs = resume_config("unused").train.epochs

    # The same run, SIGKILLed (whole process groups) right after its first mid-epoch checkpoint...
    prefix = str(tmp_path / "ckpt")
    spec = training_job(resume_config(prefix, **strategy), "victim", dataset, str(tmp_path / "victim"))
    backend, mgr = start_until_mid_epoch_checkpoint(spec, prefix, sink=lambda line: None)
    backend.kill(spec, signal.SIGKILL)  # every process of the job, torchrun's workers included
    killed_at = max(mgr.committed_steps())
    assert killed_at < epochs * STEPS_PER_EPOCH, "the run finished before it was killed"

    # ... then started again: it resumes from the latest complete checkpoint by itself.
    lines: list[str] = []
    run_job(LocalBackend(sink=lines.append), replace(spec, timeout_s=240))
    resumed = [int(m.group(1)) for line in lines if (m := re.search(r"resumed at step (\d+)", line))]
    assert resumed and resumed[0] >= killed_at
    record = assert_ends_as_uninterrupted(ref_uri, str(tmp_path / "victim"))
    assert record["metrics"]["resumed_from_step"] == resumed[0]
    assert [h["epoch"] for h in record["history"]] == list(range(epochs))


def test_a_staging_folder_whose_disk_fills_says_so_and_leaves_nothing(tmp_path, monkeypatch, mounts):
    """TMPDIR on a disk too small for a rank's part (was: torch's "unexpected pos 704 vs 598" or
    DCP's CheckpointException, naming neither the folder nor the full disk). Needs a small tmpfs,
    where this machine allows one to be mounted."""
    import tempfile

    disk = tmp_path / "tmp"
    mounts.tmpfs(disk, "256k")
    monkeypatch.setattr(tempfile, "tempdir", str(disk))
    ckpt = CheckpointManager(LocalStore(), str(tmp_path / "ckpt"), 2, owner="r")
    ckpt.claim(resume=True)
    with pytest.raises(CheckpointError, match=rf"step 3 not staged: the disk of its staging folder {disk} is full"):
        ckpt.save(3, {"model": {"w": torch.zeros(1 << 20)}}, blocking=True)
    assert list(disk.iterdir()) == []
    assert ckpt.committed_steps() == []
