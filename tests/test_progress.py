import logging

import torch

from trainer.progress import Progress


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
    assert p.curve == [{"step": 2, "loss": 3.0}, {"step": 4, "loss": 2.0}, {"step": 5, "loss": 0.5}]
    assert all("tokens/s" in line and "eta" in line and "mfu" in line for line in lines)


def test_only_rank_0_logs(caplog):
    p = Progress(
        total_steps=2, items_per_step=1, item_name="samples", flops_per_step=0, peak_flops=0,
        interval=1, device=torch.device("cpu"), enabled=False,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        p.step(1, 0, torch.tensor(1.0), 0.1)
    assert not caplog.records and not p.curve
