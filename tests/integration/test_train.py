"""The training loop (trainer/train.py) in real multi-process gloo jobs: ranks agree, errors end the job clearly."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors

from tests.conftest import truncate
from tests.jobs import TWO_RANKS, record_of, shared_digits, two_rank_run, weights_of
from tests.unit.test_train import TINY_GPT, poison_first_train_shard
from trainer.config import load_config
from trainer.consolidate import consolidate
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


def trainer_process(cfg, dataset: str, model_uri: str):
    """`python -m trainer.train` as a replica runs it, on one process; its completed process."""
    import os
    import subprocess
    import sys

    from trainer.config import config_to_json

    return subprocess.run(
        [sys.executable, "-m", "trainer.train", "--config-json", config_to_json(cfg)]
        + ["--dataset-uri", dataset, "--model-uri", model_uri],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_the_trainer_process_exits_with_a_message_not_a_traceback(dataset, tmp_path):
    truncate(join_uri(dataset, "train/rows-00000.npz"), 300)
    cfg = load_config(overrides={"checkpoint.enabled": False, "train.epochs": 1})
    proc = trainer_process(cfg, dataset, str(tmp_path / "m"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "training failed: " in out and join_uri(dataset, "train/rows-00000.npz") in out
    assert "Traceback" not in out


def test_a_loss_that_diverges_in_the_measured_step_exits_with_its_own_code_not_a_crash(shared, tmp_path):
    """Divergence shows at step 2, the step whose memory the CPU measures with torch's profiler:
    the error raised inside its window left the profiler running, and the process crashed at exit
    (SIGSEGV, read as a signal, not the non-finite loss it was)."""
    from trainer.exit_codes import NONFINITE_LOSS

    cfg = load_config(overrides={"checkpoint.enabled": False, "train.epochs": 1, "train.learning_rate": 1e30})
    proc = trainer_process(cfg, shared_digits(shared), str(tmp_path / "m"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == NONFINITE_LOSS, out
    assert "non-finite loss or gradients at optimizer step 2 " in out


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


def test_fsdp_exports_the_best_checkpoint_and_so_does_a_run_resumed_from_it(shared, tmp_path):
    """checkpoint.export_best under FSDP: the model file is consolidated from the best step's
    shards, not the last's. A run resumed from the last checkpoint ranks the first run's
    checkpoints up to that step with its own (was: only its own epochs): its further epoch (a
    higher accuracy) loses to the first run's best, whose shards it consolidates."""
    best_of = {"checkpoint.keep_best": "min:val_accuracy", "checkpoint.export_best": True, "train.strategy": "fsdp"}
    first, later = str(tmp_path / "first"), str(tmp_path / "later")
    train(shared_digits(shared), first, replicas=2, **{"checkpoint.keep_last": 1, **best_of})
    record = record_of(first)
    steps, best = record["metrics"]["steps"], record["metrics"]["best_step"]
    value = min(h["val_accuracy"] for h in record["history"])
    assert best < steps and record["metrics"]["val_accuracy"] == value
    checkpoints = join_uri(first, "checkpoints")
    consolidate(LocalStore(), join_uri(checkpoints, f"step-{best:08d}"), tmp_path / "best.safetensors")
    from_best = load_safetensors((tmp_path / "best.safetensors").read_bytes())
    exported = weights_of(first)
    assert exported.keys() == from_best.keys()
    assert all(torch.equal(exported[k], from_best[k]) for k in exported)  # the best's weights, not the last's
    overrides = {"train.epochs": 4, "checkpoint.resume_from": join_uri(checkpoints, f"step-{steps:08d}"), **best_of}
    lines = train(shared_digits(shared), later, replicas=2, **overrides)
    resumed = record_of(later)
    assert resumed["metrics"]["steps"] > steps and resumed["history"][-1]["val_accuracy"] > value
    assert resumed["metrics"]["best_step"] == best and resumed["metrics"]["val_accuracy"] == value
    assert resumed["parameter_digest"] == record["parameter_digest"]
    assert any(f"from {checkpoints}, which this run resumed from" in line for line in lines)
    # A restart of that run (a retried pod) resumes from its own last checkpoint, whose record
    # keeps where the run began: the same choice.
    lines = train(shared_digits(shared), later, replicas=2, **overrides)
    assert any(f"resumed at step {resumed['metrics']['steps']} " in line for line in lines)
    assert record_of(later)["metrics"]["best_step"] == best


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
    one_r, two_r = (json.loads(LocalStore().get_bytes(join_uri(u, "training.json"))) for u in uris)
    assert [h["train_loss"] for h in two_r["history"]] == pytest.approx(
        [h["train_loss"] for h in one_r["history"]], rel=1e-5
    )
    # And so is the loss curve the progress lines and TensorBoard show (was: rank 0's half).
    assert len(one_r["loss_curve"]) > 1
    assert [(p["step"], p["loss"]) for p in two_r["loss_curve"]] == [
        (p["step"], pytest.approx(p["loss"], rel=1e-5)) for p in one_r["loss_curve"]
    ]


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
