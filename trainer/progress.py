"""Rank 0's progress line every few steps: loss, learning rate, throughput, ETA and (on GPUs) MFU.

The loss is accumulated on the device and read back only when a line is printed, so logging adds
no per-step host-device synchronisation.
"""

from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger("kftrain.train")


class Progress:
    """Accumulates per-step losses; `step()` logs a line every `interval` steps and keeps the curve."""

    def __init__(
        self,
        *,
        total_steps: int,
        items_per_step: int,
        item_name: str,
        flops_per_step: float,
        peak_flops: float,
        interval: int,
        device: torch.device,
        enabled: bool,
    ) -> None:
        self.total_steps, self.items_per_step, self.item_name = total_steps, items_per_step, item_name
        self.flops_per_step, self.peak_flops, self.interval = flops_per_step, peak_flops, interval
        self.enabled = enabled
        self.curve: list[dict[str, float]] = []  # the loss at every logged step, for the report
        self._loss = torch.zeros((), device=device)
        self._steps = 0
        self._t = time.perf_counter()

    def step(self, step: int, epoch: int, loss: torch.Tensor, lr: float) -> None:
        """Record one optimizer step's loss; log when the interval (or the last step) is reached."""
        self._loss += loss
        self._steps += 1
        if not self.enabled or (step % self.interval and step != self.total_steps):
            return
        now = time.perf_counter()
        seconds_per_step = (now - self._t) / self._steps
        mean_loss = float(self._loss) / self._steps
        line = (
            f"step {step}/{self.total_steps} epoch {epoch} loss {mean_loss:.4f} lr {lr:.2e} "
            f"{self.items_per_step / seconds_per_step:,.0f} {self.item_name}/s "
            f"eta {(self.total_steps - step) * seconds_per_step:,.0f}s"
        )
        if self.peak_flops and self.flops_per_step:
            line += f" mfu {self.flops_per_step / seconds_per_step / self.peak_flops:.1%}"
        log.info(line)
        self.curve.append({"step": step, "loss": mean_loss})
        self._loss.zero_()
        self._t, self._steps = now, 0
