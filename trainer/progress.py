"""Progress lines of long work.

:class:`ProgressLine` is for any long operation that moves bytes (data prep reading its source,
a checkpoint downloaded on resume, consolidation, export): at most one line every few seconds,
then a final line. :class:`Progress` is rank 0's training progress every few steps: a log line
(loss, learning rate, throughput, ETA and, on GPUs, MFU), TensorBoard scalars (trainer/events.py),
and the curves the report draws.

The training loss and the gradient norm are accumulated on the device and read back only when a line is
printed, so logging adds no per-step host-device synchronisation; the event file is uploaded off
the training thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch only where training runs: the store's readers use ProgressLine too
    import torch

    from trainer.events import EventWriter

log = logging.getLogger("kftrain.train")
progress_log = logging.getLogger("kftrain.progress")
#: Seconds between two lines of one operation (the final line comes whenever it ends).
LINE_INTERVAL_S = 5.0


def format_bytes(n: float) -> str:
    """`n` bytes in decimal units, as the store and network rates are quoted: `512 B`, `3.4 MB`."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float) -> str:
    """A duration for people: `0.4s`, `42s`, `3m05s`, `1h02m`."""
    if s < 10:
        return f"{s:.1f}s"
    s = round(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class ProgressLine:
    """The progress of one long operation over bytes as log lines: `add(n)` as bytes arrive (or
    leave) logs at most one line every `interval_s` seconds (amount, of `total` with percent and
    ETA when the total is known, rate), `done()` the final line (amount, time, rate). An operation
    shorter than `interval_s` logs only its final line; one that fails logs none (its error says
    what happened)."""

    def __init__(
        self,
        what: str,
        *,
        total: int = 0,
        interval_s: float = LINE_INTERVAL_S,
        logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.interval_s = what, total, interval_s
        self.log = logger or progress_log
        self.clock = clock
        #: Bytes so far, and how many `add` calls named an item (files written, parts fetched).
        self.bytes, self.items = 0, 0
        self.start = self._last = clock()

    def add(self, n: int, item: str = "") -> None:
        """Count `n` more bytes (of `item`, when the work is a list of files); log if a line is due."""
        self.bytes += n
        self.items += bool(item)
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._last = now
            self.log.info("%s", self.line(now, item))

    def line(self, now: float, item: str = "") -> str:
        """The line `add` logs at clock time `now`."""
        elapsed = max(now - self.start, 1e-9)
        rate = self.bytes / elapsed
        text = f"{self.what}: {format_bytes(self.bytes)}"
        if self.total:
            text += f" of {format_bytes(self.total)} ({min(self.bytes / self.total, 1.0):.0%})"
        text += f", {format_bytes(rate)}/s"
        if self.total and rate > 0:
            text += f", eta {format_seconds(max(self.total - self.bytes, 0) / rate)}"
        return text + (f" ({item})" if item else "")

    def done(self, note: str = "") -> str:
        """Log and return the final line: what was moved, in how long, how fast (and `note`)."""
        elapsed = max(self.clock() - self.start, 1e-9)
        count = f"{self.items} files, " if self.items else ""
        text = (
            f"{self.what}: {count}{format_bytes(self.bytes)} in {format_seconds(elapsed)} "
            f"({format_bytes(self.bytes / elapsed)}/s)"
        )
        text += f"; {note}" if note else ""
        self.log.info("%s", text)
        return text

    def track(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """`chunks` unchanged, counted as they pass; the final line once they are all through."""
        for chunk in chunks:
            self.add(len(chunk))
            yield chunk
        self.done()


def epoch_scalars(record: dict[str, Any]) -> dict[str, float]:
    """TensorBoard tags for an epoch record: `val_accuracy` -> `val/accuracy`, `train_loss` ->
    `train/epoch_loss`; non-numeric values and the epoch number are left out."""
    out = {}
    for key, value in record.items():
        if key == "epoch" or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if key == "train_loss":
            out["train/epoch_loss"] = float(value)
        else:
            out["val/" + key.removeprefix("val_")] = float(value)
    return out


class Progress:
    """Accumulates per-step losses; `step()` logs every `interval` steps, keeps the curve for the
    report and, given an `events` writer, records and flushes TensorBoard scalars."""

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
        events: EventWriter | None = None,
    ) -> None:
        self.total_steps, self.items_per_step, self.item_name = total_steps, items_per_step, item_name
        self.flops_per_step, self.peak_flops, self.interval = flops_per_step, peak_flops, interval
        self.enabled = enabled
        self.events = events if enabled else None
        #: Every logged interval: step, mean loss, learning rate, throughput, wall time (for the report).
        self.curve: list[dict[str, float]] = []
        #: Every validation (end of epoch) with the step it happened at.
        self.validation: list[dict[str, float]] = []
        #: Every checkpoint this process wrote: step, wall time, staging seconds, size.
        self.checkpoints: list[dict[str, float]] = []
        import torch

        self._loss = torch.zeros((), device=device)
        self._grad_norm = torch.zeros((), device=device)
        self._steps = 0
        self._t = time.perf_counter()
        self._data_wait = 0.0

    def step(
        self,
        step: int,
        epoch: int,
        loss: torch.Tensor,
        lr: float,
        grad_norm: torch.Tensor | None = None,
        data_wait: float = 0.0,
    ) -> None:
        """Record one optimizer step's loss (and gradient norm); log when the interval (or the last
        step) is reached. `data_wait` is the running total of seconds spent waiting for batches."""
        self._loss += loss
        if grad_norm is not None:
            self._grad_norm += grad_norm.detach().float()
        self._steps += 1
        if not self.enabled or (step % self.interval and step != self.total_steps):
            return
        now = time.perf_counter()
        seconds = now - self._t
        seconds_per_step = seconds / self._steps
        mean_loss = float(self._loss) / self._steps
        rate = self.items_per_step / seconds_per_step
        line = (
            f"step {step}/{self.total_steps} epoch {epoch} loss {mean_loss:.4f} lr {lr:.2e} "
            f"{rate:,.0f} {self.item_name}/s eta {(self.total_steps - step) * seconds_per_step:,.0f}s"
        )
        scalars = {
            "train/loss": mean_loss,
            "train/learning_rate": lr,
            f"train/{self.item_name}_per_second": rate,
            "train/data_wait_share": min(1.0, max(0.0, data_wait - self._data_wait) / max(seconds, 1e-9)),
        }
        if grad_norm is not None:
            scalars["train/grad_norm"] = float(self._grad_norm) / self._steps
        if self.peak_flops and self.flops_per_step:
            scalars["train/mfu"] = self.flops_per_step / seconds_per_step / self.peak_flops
            line += f" mfu {scalars['train/mfu']:.1%}"
        log.info(line)
        wall = time.time()
        self.curve.append({"step": step, "loss": mean_loss, "lr": lr, "items_per_second": rate, "time": round(wall, 3)})
        if self.events is not None:
            self.events.scalars(step, {**scalars, "train/epoch": float(epoch)}, wall)
            self.events.flush()
        self._loss.zero_()
        self._grad_norm.zero_()
        self._t, self._steps, self._data_wait = now, 0, data_wait

    def epoch_end(self, step: int, record: dict[str, Any]) -> None:
        """Record an epoch's summary (`{"epoch", "train_loss", "val_*"...}`) at optimizer step `step`."""
        if not self.enabled:
            return
        self.validation.append({"step": step, **record})
        if self.events is not None:
            self.events.scalars(step, epoch_scalars(record))
            self.events.flush()

    def checkpoint(self, step: int, stage_seconds: float, size_bytes: int) -> None:
        """Record a checkpoint taken at `step`: how long training stalled to stage it, and its size."""
        if not self.enabled:
            return
        self.checkpoints.append(
            {"step": step, "time": round(time.time(), 3), "stage_seconds": stage_seconds, "bytes": size_bytes}
        )
        if self.events is not None:
            self.events.scalars(
                step, {"checkpoint/stage_seconds": stage_seconds, "checkpoint/megabytes": size_bytes / 1e6}
            )

    def summary(self) -> dict[str, Any]:
        """What the training record keeps of this: validation points, checkpoints, where the event
        files are and which process start (segment) of the run this was."""
        return {
            "validation": self.validation,
            "checkpoints": self.checkpoints,
            "tensorboard_uri": self.events.prefix if self.events is not None else "",
            "segment": self.events.segment if self.events is not None else 0,
        }

    def close(self) -> None:
        """Upload the last event file contents (waits for the store)."""
        if self.events is not None:
            self.events.close()
