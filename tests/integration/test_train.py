"""The training loop (trainer/train.py) in real multi-process gloo jobs: ranks agree, errors end the job clearly."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.conftest import truncate
from tests.jobs import TWO_RANKS, shared_digits, two_rank_run
from tests.unit.test_train import TINY_GPT, poison_first_train_shard
from trainer.config import load_config
from trainer.distributed import DistEnv
from trainer.launch.backend import JobFailed, run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.model_io import load_model
from trainer.storage import LocalStore, join_uri
from trainer.tasks import get_task
from trainer.train import run_training

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def test_the_trainer_process_exits_with_a_message_not_a_traceback(dataset, tmp_path):
    import subprocess
    import sys

    from trainer.config import config_to_json

    truncate(join_uri(dataset, "train/rows-00000.npz"), 300)
    cfg = load_config(overrides={"checkpoint.enabled": False, "train.epochs": 1})
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--config-json", config_to_json(cfg)]
        + ["--dataset-uri", dataset, "--model-uri", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "training failed: " in out and join_uri(dataset, "train/rows-00000.npz") in out
    assert "Traceback" not in out


pytestmark = pytest.mark.timeout(240)


def test_nonfinite_loss_stops_the_job_naming_step_and_rank(shared, tmp_path):
    bad = str(tmp_path / "bad")
    poison_first_train_shard(shared_digits(shared), bad)
    cfg = load_config(overrides={"train.epochs": 1, "checkpoint.enabled": False})
    with pytest.raises(JobFailed) as info:
        run_job(
            LocalBackend(sink=lambda line: None),
            replace(training_job(cfg, "nan", bad, str(tmp_path / "m")), timeout_s=120),
        )
    message = str(info.value)
    assert "training failed: non-finite loss or gradients at optimizer step" in message
    # Only one rank's batch holds the NaN row; whichever replica is reported names that rank.
    assert re.search(r"the loss was non-finite on rank\(s\) \[[01]\]", message), message
    assert not LocalStore().exists(join_uri(str(tmp_path / "m"), "model.json"))  # no model marked complete


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpt_trains_in_bf16_on_cuda(tmp_path):
    cfg = load_config(overrides={**TINY_GPT, "train.max_steps": 20})
    store = LocalStore()
    get_task("causal_lm").prepare(cfg, store, str(tmp_path / "ds"))
    metrics = run_training(cfg, str(tmp_path / "ds"), str(tmp_path / "m"), DistEnv())
    assert math.isfinite(metrics["val_loss"])


pytestmark = pytest.mark.timeout(180)


def train(digits, model_uri, replicas, **overrides):
    cfg = load_config(overrides={"job.replicas": replicas, "train.epochs": 3, **overrides})
    lines = []
    run_job(
        LocalBackend(sink=lines.append), replace(training_job(cfg, f"t{replicas}", digits, model_uri), timeout_s=150)
    )
    return lines


def test_two_ranks_end_with_identical_parameters(shared):
    model, lines = two_rank_run(shared)
    digests = {
        m.group(1): m.group(2)
        for line in lines
        if (m := re.match(r"\[(master-0|worker-0)\] .*final parameter digest (\w+)", line))
    }
    assert set(digests) == {"master-0", "worker-0"}
    assert digests["master-0"] == digests["worker-0"]
    record = json.loads(LocalStore().get_bytes(join_uri(model, "training.json")))
    assert record["parameter_digest"] == digests["master-0"]
    assert record["metrics"]["world_size"] == 2
    assert any(line.startswith("[master-0] [rank 0]") and "loss" in line for line in lines)


def test_one_rank_and_two_ranks_learn_the_same_model(shared, tmp_path):
    """Same global batches (a fixed data.partitions), same seed: DDP's averaged gradients equal
    the single-process ones."""
    train(shared_digits(shared), str(tmp_path / "one"), replicas=1, **{**TWO_RANKS, "job.replicas": 1})
    uris = (str(tmp_path / "one"), two_rank_run(shared)[0])
    one, _ = load_model(LocalStore(), uris[0])
    two, _ = load_model(LocalStore(), uris[1])
    for p1, p2 in zip(one.parameters(), two.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, rtol=1e-4, atol=1e-5)
    # An epoch's train_loss is the whole job's, both ranks' halves of each batch (was: rank 0's half).
    one_h, two_h = (json.loads(LocalStore().get_bytes(join_uri(u, "training.json")))["history"] for u in uris)
    assert [h["train_loss"] for h in two_h] == pytest.approx([h["train_loss"] for h in one_h], rel=1e-5)


def test_two_ranks_keep_and_export_the_best_checkpoint(shared, tmp_path):
    """checkpoint.keep_best with DDP: only rank 0 validates, every rank loads the best at the end."""
    model = str(tmp_path / "model")
    lines = train(
        shared_digits(shared),
        model,
        replicas=2,
        **{"checkpoint.keep_last": 1, "checkpoint.keep_best": "min:val_accuracy", "checkpoint.export_best": True},
    )
    record = json.loads(LocalStore().get_bytes(join_uri(model, "training.json")))
    steps, best = record["metrics"]["steps"], record["metrics"]["best_step"]
    value, epoch = min((h["val_accuracy"], h["epoch"]) for h in record["history"])
    assert best == (epoch + 1) * steps // 3 and record["metrics"]["val_accuracy"] == value
    kept = {int(u.split("/step-")[1][:8]) for u in LocalStore().list(join_uri(model, "checkpoints")) if "/step-" in u}
    assert kept == {best, steps} and best < steps
    digests = {m.group(1) for line in lines if (m := re.search(r"final parameter digest (\w+)", line))}
    assert len(digests) == 1 and record["parameter_digest"] in digests  # both ranks hold the best's weights
