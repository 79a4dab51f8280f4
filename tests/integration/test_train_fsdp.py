"""train.strategy fsdp against ddp, and a 2-rank checkpoint resumed on 3 ranks exactly: real gloo
processes on CPU through the local backend."""

from __future__ import annotations

import json

import pytest
import torch

from tests.jobs import FSDP_CKPT, TINY_GPT, fsdp_runs, record_of, shared_digits, train, weights_of
from trainer.checkpoint import CheckpointManager, step_dir
from trainer.config import load_config
from trainer.model_io import load_model
from trainer.storage import LocalStore, join_uri
from trainer.tasks import get_task

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


RESHARD = {
    "train.strategy": "fsdp",
    "train.batch_size": 60,  # divides by 2 and 3 ranks
    "data.partitions": 6,  # a multiple of both world sizes: the same batches at either
    "train.epochs": 2,
    "train.log_interval_steps": 1000,
    "checkpoint.interval_steps": 7,
    "checkpoint.keep_last": 5,
}


def test_fsdp_learns_what_ddp_learns_on_the_same_batches(shared, tmp_path):
    """GPT blocks sharded one by one then the root, tied embeddings, activation checkpointing,
    accumulation and clipping: the same model as DDP up to the order of float sums. The FSDP run
    is tests/jobs.py's FSDP_CKPT run without checkpoints (test_consolidate's too)."""
    root, _, _ = fsdp_runs(shared)
    fsdp_uri = str(root / "gathered")
    assert record_of(fsdp_uri)["config"]["train"]["activation_checkpointing"] is True
    ddp_cfg = load_config(overrides={**TINY_GPT, "train.max_steps": FSDP_CKPT["train.max_steps"]})
    train(ddp_cfg, "ddp", str(root / "ds"), str(tmp_path / "ddp"))
    ddp, _ = load_model(LocalStore(), str(tmp_path / "ddp"))
    fsdp, _ = load_model(LocalStore(), fsdp_uri)
    initial, _ = get_task("causal_lm").build_model(ddp_cfg, {"vocab_size": 256})
    moved = 0.0
    with torch.no_grad():
        for (name, p1), p2, p0 in zip(ddp.named_parameters(), fsdp.parameters(), initial.parameters(), strict=True):
            # Reduce-scatter sums in another order than all-reduce, and Adam's normalised update
            # turns that noise on near-zero gradients into up to ~1e-4 here; a missed sync or a
            # wrong average moves weights by ~lr (3e-3) per step.
            torch.testing.assert_close(p1, p2, rtol=1e-3, atol=2e-4, msg=lambda m, name=name: f"{name}: {m}")
            moved = max(moved, float((p1 - p0).abs().max()))
    assert moved > 1e-2  # it trained: equal because both learned the same, not because neither moved
    ddp_rec, fsdp_rec = record_of(str(tmp_path / "ddp")), record_of(fsdp_uri)
    assert fsdp_rec["metrics"]["val_loss"] == pytest.approx(ddp_rec["metrics"]["val_loss"], rel=1e-4)


def test_a_two_rank_checkpoint_resumes_on_three_ranks_exactly(shared, tmp_path):
    digits = shared_digits(shared)
    prefix = str(tmp_path / "ref-ckpt")
    # The reference: 2 ranks, uninterrupted, keeping every checkpoint; its checkpoint of step 14
    # (mid-epoch 0: 20 steps per epoch) is what 3 ranks resume from.
    ref = load_config(overrides={**RESHARD, "job.replicas": 2, "checkpoint.uri": prefix, "checkpoint.keep_last": 10})
    train(ref, "ref", digits, str(tmp_path / "ref"))
    step14 = step_dir(prefix, 14)
    # 3 ranks load it and stop at once: their consolidated weights are the checkpoint's, exactly.
    three = load_config(
        overrides={
            **RESHARD,
            "job.replicas": 3,
            "train.max_steps": 14,
            "checkpoint.uri": str(tmp_path / "load-ckpt"),
            "checkpoint.resume_from": step14,
        }
    )
    lines = train(three, "three-load", digits, str(tmp_path / "loaded"))
    assert any(f"resumed at step 14 (epoch 0, after 14 of its steps) from {step14}" in line for line in lines)
    assert any("changed job.replicas: 2 -> 3" in line for line in lines)
    mgr = CheckpointManager(LocalStore(), prefix)
    record = mgr.latest(only=14)
    assert record["step"] == 14 and record["world_size"] == 2
    assert sum(name.endswith(".distcp") for name in record["parts"]) == 2  # one shard file per rank
    loaded = weights_of(str(tmp_path / "loaded"))
    # The checkpoint consolidated in one process, straight from the DCP shards.
    consolidated = {"model": {k: torch.zeros_like(v) for k, v in loaded.items()}}
    mgr.load(record, consolidated)
    assert loaded.keys() == consolidated["model"].keys()
    for name, tensor in loaded.items():
        assert torch.equal(tensor, consolidated["model"][name]), name
    # 3 ranks train on from there to the end: the data position and the optimizer state carried
    # over, so they end where the uninterrupted 2-rank run ended (up to the order of float sums).
    rest = load_config(
        overrides={
            **RESHARD,
            "job.replicas": 3,
            "checkpoint.uri": str(tmp_path / "rest-ckpt"),
            "checkpoint.resume_from": step14,
        }
    )
    train(rest, "three-rest", digits, str(tmp_path / "rest"))
    ref_w, rest_w = weights_of(str(tmp_path / "ref")), weights_of(str(tmp_path / "rest"))
    for name in ref_w:
        torch.testing.assert_close(rest_w[name], ref_w[name], rtol=1e-4, atol=1e-5, msg=name)
    history = record_of(str(tmp_path / "rest"))["history"]
    assert [h["epoch"] for h in history] == [0, 1]  # the whole run, not only what ran on 3 ranks
    ref_history = record_of(str(tmp_path / "ref"))["history"]
    for got, want in zip(history, ref_history, strict=True):
        assert got["val_accuracy"] == pytest.approx(want["val_accuracy"], abs=0.01)


def test_a_two_rank_run_resumes_mid_epoch_on_three_ranks_with_the_items_it_left(shared, tmp_path):
    """No fixed data.partitions: 3 ranks read exactly what the 2 ranks left of the epoch, then
    whole epochs of their own layout; the record covers the whole run."""
    digits = shared_digits(shared)
    prefix = str(tmp_path / "ckpt")
    shape = {**RESHARD, "train.strategy": "ddp", "data.partitions": 0, "checkpoint.uri": prefix}
    train(
        load_config(overrides={**shape, "job.replicas": 2, "train.max_steps": 14}), "two", digits, str(tmp_path / "a")
    )
    record = CheckpointManager(LocalStore(), prefix).latest()
    left = sum(b - a for a, b in record["position"]["left"])
    assert record["step"] == 14 and left % 60 == 0 and left > 0
    lines = train(load_config(overrides={**shape, "job.replicas": 3}), "three", digits, str(tmp_path / "b"))
    assert any(f"epoch 0 goes on with the {left} items its checkpoint left" in line for line in lines)
    rows = json.loads(LocalStore().get_bytes(join_uri(digits, "manifest.json")))["splits"]["train"]["rows"]
    per_epoch_on_three = rows // 3 // 20  # one partition per rank, 20 items per rank per step
    done = record_of(str(tmp_path / "b"))
    assert done["metrics"]["steps"] == 14 + left // 60 + per_epoch_on_three
    assert [h["epoch"] for h in done["history"]] == [0, 1]
    assert done["history"][-1]["val_accuracy"] > 0.8
