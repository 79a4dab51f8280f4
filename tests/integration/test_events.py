"""TensorBoard event files with real processes and servers: TensorBoard reads them straight from
S3, and a killed and resumed job shows one continuous curve."""

from __future__ import annotations

import re
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from trainer.checkpoint import CheckpointManager
from trainer.config import load_config
from trainer.events import EventWriter
from trainer.launch.backend import run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.storage import LocalStore, join_uri, open_store


def scalars(logdir: str, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(logdir)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


# -- a real training job, SIGKILLed and resumed ------------------------------------------------


def file_steps(path: Path, tag: str) -> list[int]:
    """Steps of `tag` in one event file, read with TensorBoard's file loader (no purging)."""
    steps = []
    for event in EventFileLoader(str(path)).Load():
        if any(v.tag == tag for v in event.summary.value):
            steps.append(event.step)
    return steps


def test_tensorboard_reads_the_files_straight_from_s3(bucket, s3_env, monkeypatch):
    """What `tensorboard --logdir s3://...` (and Kubeflow's Tensorboard) does: boto3 with S3_ENDPOINT."""
    prefix = f"s3://{bucket}/run/model/tensorboard"
    writer = EventWriter(open_store(prefix), prefix, start_step=0)
    for step in (5, 10, 15):
        writer.scalars(step, {"train/loss": 1.0 / step})
        writer.flush()
    writer.close()
    monkeypatch.setenv("S3_ENDPOINT", s3_env.endpoint)
    assert [s for s, _ in scalars(prefix, "train/loss")] == [5, 10, 15]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_and_resumed_job_shows_one_continuous_curve(tmp_path, digits):
    steps_per_epoch, epochs = 19, 3  # digits: 1,259 train rows // global batch 64
    prefix, model = str(tmp_path / "ckpt"), str(tmp_path / "model")
    cfg = load_config(
        overrides={
            "train.epochs": epochs,
            "train.log_interval_steps": 1,
            "checkpoint.uri": prefix,
            "checkpoint.interval_steps": 7,
        }
    )
    spec = training_job(cfg, "tb-victim", digits, model)
    backend = LocalBackend(sink=lambda line: None)
    backend.submit(spec)
    logdir = Path(join_uri(model, "tensorboard"))
    mgr = CheckpointManager(LocalStore(), prefix)
    deadline = time.monotonic() + 120
    # Kill once rank 0 has logged steps past its latest checkpoint: those become orphans.
    while True:
        assert time.monotonic() < deadline, "no checkpoint and later steps appeared"
        committed = mgr.committed_steps()
        logged = [s for f in logdir.glob("*tfevents*") for s in file_steps(f, "train/loss")]
        if committed and logged and max(logged) > max(committed):
            break
        time.sleep(0.01)
    backend.kill(spec, signal.SIGKILL)
    killed_file = next(logdir.glob("*tfevents*"))
    lines: list[str] = []
    run_job(LocalBackend(sink=lines.append), replace(spec, timeout_s=240))
    resumed = [int(m.group(1)) for line in lines if (m := re.search(r"resumed at step (\d+)", line))]
    assert resumed, "the second start did not resume"
    assert max(file_steps(killed_file, "train/loss")) > resumed[0]  # there were orphaned steps

    total = epochs * steps_per_epoch
    assert [s for s, _ in scalars(str(logdir), "train/loss")] == list(range(1, total + 1))
    assert [s for s, _ in scalars(str(logdir), "val/accuracy")] == [steps_per_epoch * (e + 1) for e in range(epochs)]
    for tag in ("train/learning_rate", "train/grad_norm", "train/samples_per_second", "train/data_wait_share"):
        assert len(scalars(str(logdir), tag)) == total, tag
    assert scalars(str(logdir), "checkpoint/stage_seconds")
    assert len({f.name.rsplit("-", 2)[-2] for f in logdir.glob("*tfevents*")}) == 2  # two segments
