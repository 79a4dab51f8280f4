import logging

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.events import EventWriter
from trainer.progress import Progress, epoch_scalars
from trainer.storage import LocalStore


def test_logs_every_interval_and_at_the_last_step_with_mfu(caplog):
    p = Progress(
        total_steps=5, items_per_step=1000, item_name="tokens", flops_per_step=1e9, peak_flops=1e12,
        interval=2, device=torch.device("cpu"), enabled=True,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        for step, loss in enumerate([4.0, 2.0, 3.0, 1.0, 0.5], start=1):
            p.step(step, 0, torch.tensor(loss), 1e-3)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split()[1] for line in lines] == ["2/5", "4/5", "5/5"]
    assert [(c["step"], c["loss"]) for c in p.curve] == [(2, 3.0), (4, 2.0), (5, 0.5)]
    assert all(c["lr"] == 1e-3 and c["items_per_second"] > 0 and c["time"] > 1.7e9 for c in p.curve)
    assert all("tokens/s" in line and "eta" in line and "mfu" in line for line in lines)


def test_only_rank_0_logs(caplog):
    p = Progress(
        total_steps=2, items_per_step=1, item_name="samples", flops_per_step=0, peak_flops=0,
        interval=1, device=torch.device("cpu"), enabled=False,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        p.step(1, 0, torch.tensor(1.0), 0.1)
    assert not caplog.records and not p.curve


def test_scalars_reach_tensorboard_at_every_interval(tmp_path):
    logdir = str(tmp_path / "tb")
    p = Progress(
        total_steps=4, items_per_step=64, item_name="samples", flops_per_step=1e9, peak_flops=1e12,
        interval=2, device=torch.device("cpu"), enabled=True, events=EventWriter(LocalStore(), logdir, 0),
    )  # fmt: skip
    waited = 0.0
    for step, (loss, norm) in enumerate([(4.0, 1.0), (2.0, 3.0), (1.0, 5.0), (1.0, 7.0)], start=1):
        waited += 0.0 if step < 3 else 1e6  # an absurd wait: the share is capped at 100%
        p.step(step, 0, torch.tensor(loss), 0.01 * step, grad_norm=torch.tensor(norm), data_wait=waited)
    p.epoch_end(4, {"epoch": 0, "train_loss": 2.0, "val_accuracy": 0.75, "val_loss": 0.5})
    p.checkpoint(4, 0.25, 3_000_000)
    p.close()
    acc = EventAccumulator(logdir)
    acc.Reload()

    def series(tag):
        return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]

    assert series("train/loss") == [(2, 3.0), (4, 1.0)]
    assert series("train/learning_rate") == [(2, 0.02), (4, 0.04)]
    assert series("train/grad_norm") == [(2, 2.0), (4, 6.0)]  # the mean over the interval
    assert series("train/data_wait_share") == [(2, 0.0), (4, 1.0)]
    assert [s for s, _ in series("train/samples_per_second")] == [2, 4]
    assert [s for s, _ in series("train/mfu")] == [2, 4]
    assert series("val/accuracy") == [(4, 0.75)] and series("val/loss") == [(4, 0.5)]
    assert series("train/epoch_loss") == [(4, 2.0)]
    assert series("checkpoint/stage_seconds") == [(4, 0.25)] and series("checkpoint/megabytes") == [(4, 3.0)]
    summary = p.summary()
    assert summary["validation"] == [{"step": 4, "epoch": 0, "train_loss": 2.0, "val_accuracy": 0.75, "val_loss": 0.5}]
    assert summary["checkpoints"][0]["step"] == 4 and summary["tensorboard_uri"] == logdir


def test_epoch_records_map_onto_readable_tags():
    record = {"epoch": 3, "train_loss": 1.5, "val_perplexity": 9.0, "note": "x", "ok": True}
    assert epoch_scalars(record) == {"train/epoch_loss": 1.5, "val/perplexity": 9.0}
