"""Progress lines of long work.

:class:`ProgressLine` is for any long operation that moves bytes (data prep reading its source,
a checkpoint downloaded on resume, consolidation, export): at most one line every few seconds,
then a final line. :class:`Progress` is rank 0's training progress every few steps: a log line
(loss, learning rate, throughput, ETA and, on GPUs, MFU), TensorBoard scalars (trainer/events.py),
and the curves the report draws. Each line comes from a :class:`Snapshot`, which is also what rank 0
reports to the job object (trainer/job_status.py: the TrainJob's `status.trainerStatus`, the
PyTorchJob's `kftrain.io/progress` annotation) and what the launcher and `kftrain job status` read
back from it: one source and one formatting function (:func:`format_progress`), so all agree.

The training loss and the gradient norm are accumulated on the device and read back only when a line is
printed, so logging adds no per-step host-device synchronisation; the event file is uploaded off
the training thread.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch only where training runs: the store's readers use ProgressLine too
    import torch

    from trainer.events import EventWriter

log = logging.getLogger("kftrain.train")
progress_log = logging.getLogger("kftrain.progress")
#: Seconds between two lines of one operation (the final line comes whenever it ends).
LINE_INTERVAL_S = 5.0
#: The PyTorchJob annotation rank 0 keeps its latest progress in (JSON: :meth:`Snapshot.annotation`).
PROGRESS_ANNOTATION = "kftrain.io/progress"
#: Limits of `status.trainerStatus.metrics` in the TrainJob CRD (Kubeflow Trainer v2.3.0): at most
#: 256 entries, names and values 1 to 64 characters.
MAX_METRICS, MAX_METRIC_CHARS = 256, 64
#: `progressPercentage` and `estimatedRemainingSeconds` are int32 in the CRD.
INT32_MAX = 2**31 - 1
#: The metrics every snapshot reports first, in this order (names as in `trainerStatus.metrics`).
CORE_METRICS = ("step", "total_steps", "epoch", "loss", "learning_rate", "mfu")
_RATE_SUFFIX = "_per_second"


def format_bytes(n: float) -> str:
    """`n` bytes in decimal units, as the store and network rates are quoted: `512 B`, `3.4 MB`."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_memory(n: float, decimals: int = 1) -> str:
    """`n` bytes of memory in binary units, as device memory is quoted: `512 B`, `3.2 MiB`, `71.5 GiB`."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.{decimals}f} {unit}"
    return f"{n:.0f} B"


def format_memories(a: float, b: float) -> tuple[str, str]:
    """`a` and `b` bytes as :func:`format_memory` writes them, with up to three decimals where one
    would read as the other (a need of 1.507 GiB against a device's 1.505 GiB is not `1.5 of 1.5`)."""
    for decimals in (1, 2, 3):
        pair = format_memory(a, decimals), format_memory(b, decimals)
        if pair[0] != pair[1] or a == b:
            break
    return pair


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


def stamp(unix: int) -> str:
    """RFC 3339 in UTC at whole seconds, as Kubernetes writes a `metav1.Time`."""
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _unix(stamp: str) -> int:
    return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())


def _number(value: float) -> str:
    """A float as a metric value: the shortest text that reads back as the same float."""
    return repr(float(value))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where training stands at one log interval: what the progress line shows and what rank 0
    reports to the job object. Unknown parts are None (a TrainJob status another reporter wrote
    may carry only a percentage)."""

    step: int | None = None
    """Optimizer steps done."""
    total_steps: int | None = None
    """Optimizer steps the run ends at."""
    epoch: int | None = None
    """The epoch the step belongs to (0-based)."""
    percent: int | None = None
    """Progress in whole percent, 0 to 100 (from `step` and `total_steps` when both are known)."""
    eta_seconds: int | None = None
    """Estimated seconds to the last step."""
    loss: float | None = None
    """Mean training loss over the interval."""
    learning_rate: float | None = None
    """Learning rate at the step."""
    rate: float | None = None
    """Throughput: `item_name` per second over the interval."""
    item_name: str = "items"
    """What `rate` counts: `tokens` or `samples`."""
    mfu: float | None = None
    """Model FLOPs utilisation over the interval, on GPUs."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """The latest validation metrics (`val_loss`, `val_accuracy`, ...), names cut to 64 characters and
    as many as fit the TrainJob's 256 metrics."""
    time: int = 0
    """When it was taken (Unix seconds; Kubernetes timestamps have whole seconds)."""

    def __post_init__(self) -> None:
        if self.percent is None and self.step is not None and self.total_steps:
            object.__setattr__(self, "percent", max(0, min(100, self.step * 100 // self.total_steps)))
        if self.eta_seconds is not None:
            object.__setattr__(self, "eta_seconds", max(0, min(INT32_MAX, int(self.eta_seconds))))
        # The TrainJob's limits apply to every rendering, so all of them show the same metrics.
        room = MAX_METRICS - len(CORE_METRICS) - 1
        fitted = {name[:MAX_METRIC_CHARS]: float(v) for name, v in list(self.metrics.items()) if name}
        object.__setattr__(self, "metrics", dict(list(fitted.items())[:room]))

    def line(self) -> str:
        """The progress line (:func:`format_progress`)."""
        return format_progress(self)

    def annotation(self) -> str:
        """The JSON of the PyTorchJob's `kftrain.io/progress` annotation (non-finite numbers as
        strings: JSON has no NaN)."""

        def num(v: float) -> float | str:
            return v if math.isfinite(v) else _number(v)

        doc: dict[str, Any] = {k: getattr(self, k) for k in ("step", "total_steps", "epoch", "percent", "eta_seconds")}
        for k in ("loss", "learning_rate", "rate", "mfu"):
            doc[k] = None if getattr(self, k) is None else num(getattr(self, k))
        doc["item_name"] = self.item_name
        doc["metrics"] = {k: num(v) for k, v in self.metrics.items()}
        doc["time"] = stamp(self.time)
        return json.dumps({k: v for k, v in doc.items() if v is not None}, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, text: str) -> Snapshot:
        """The snapshot :meth:`annotation` wrote (ValueError, KeyError or TypeError if it is not one)."""
        doc = json.loads(text)
        ints = {k: int(doc[k]) for k in ("step", "total_steps", "epoch", "percent", "eta_seconds") if k in doc}
        floats = {k: float(doc[k]) for k in ("loss", "learning_rate", "rate", "mfu") if k in doc}
        return cls(
            **ints,
            **floats,
            item_name=str(doc.get("item_name", "items")),
            metrics={str(k): float(v) for k, v in (doc.get("metrics") or {}).items()},
            time=_unix(doc["time"]),
        )

    def trainer_status(self) -> dict[str, Any]:
        """`status.trainerStatus` of a TrainJob (Kubeflow Trainer v2.3.0): percentage, remaining
        seconds, the metrics as `{name, value}` strings of at most 64 characters (at most 256 of
        them), and `lastUpdatedTime`, which the CRD requires whenever the field is present."""
        out: dict[str, Any] = {}
        if self.percent is not None:
            out["progressPercentage"] = self.percent
        if self.eta_seconds is not None:
            out["estimatedRemainingSeconds"] = self.eta_seconds
        values: dict[str, str] = {}
        for name in ("step", "total_steps", "epoch"):
            if getattr(self, name) is not None:
                values[name] = str(getattr(self, name))
        for name in ("loss", "learning_rate", "mfu"):
            if getattr(self, name) is not None:
                values[name] = _number(getattr(self, name))
        if self.rate is not None:
            values[(self.item_name + _RATE_SUFFIX)[:MAX_METRIC_CHARS]] = _number(self.rate)
        for name, value in self.metrics.items():
            values.setdefault(name, _number(value))
        metrics = [{"name": k, "value": v[:MAX_METRIC_CHARS]} for k, v in values.items()][:MAX_METRICS]
        if metrics:
            out["metrics"] = metrics
        out["lastUpdatedTime"] = stamp(self.time)
        return out

    @classmethod
    def from_trainer_status(cls, status: Mapping[str, Any]) -> Snapshot:
        """The snapshot of a TrainJob's `status.trainerStatus`: kftrain's own metrics back into their
        fields, any other numeric metric into `metrics` (ValueError or KeyError if it is malformed)."""
        values: dict[str, str] = {m["name"]: m["value"] for m in status.get("metrics") or []}
        kwargs: dict[str, Any] = {}
        for name in ("step", "total_steps", "epoch"):
            if name in values:
                kwargs[name] = int(values.pop(name))
        for name in ("loss", "learning_rate", "mfu"):
            if name in values:
                kwargs[name] = float(values.pop(name))
        rate_name = next((k for k in values if k.endswith(_RATE_SUFFIX)), None)
        if rate_name is not None:
            kwargs["rate"] = float(values.pop(rate_name))
            kwargs["item_name"] = rate_name.removesuffix(_RATE_SUFFIX)
        metrics = {}
        for name, value in values.items():
            try:
                metrics[name] = float(value)
            except ValueError:
                continue  # another reporter's text metric: the line shows numbers only
        return cls(
            **kwargs,
            percent=status.get("progressPercentage"),
            eta_seconds=status.get("estimatedRemainingSeconds"),
            metrics=metrics,
            time=_unix(status["lastUpdatedTime"]),
        )


def format_progress(s: Snapshot) -> str:
    """The one progress line: rank 0's log, the launcher's step log and `kftrain job status` all
    print this, e.g. `step 40/100 (40%) epoch 1 loss 2.3456 lr 1.00e-03 1,234 tokens/s eta 2m00s`."""
    parts = []
    if s.step is not None:
        parts.append(f"step {s.step}/{s.total_steps}" if s.total_steps else f"step {s.step}")
    if s.percent is not None:
        parts.append(f"({s.percent}%)" if parts else f"{s.percent}%")
    labelled = (("epoch", s.epoch, ""), ("loss", s.loss, ".4f"), ("lr", s.learning_rate, ".2e"))
    parts += [f"{label} {value:{spec}}" for label, value, spec in labelled if value is not None]
    if s.rate is not None:
        parts.append(f"{s.rate:,.0f} {s.item_name}/s")
    if s.eta_seconds is not None:
        parts.append(f"eta {format_seconds(s.eta_seconds) if s.eta_seconds >= 10 else f'{s.eta_seconds}s'}")
    if s.mfu is not None:
        parts.append(f"mfu {s.mfu:.1%}")
    parts += [f"{name} {value:.4f}" for name, value in s.metrics.items()]
    return " ".join(parts) or "no progress yet"


def progress_of(job: Mapping[str, Any]) -> Snapshot | None:
    """The progress a job object carries: a TrainJob's `status.trainerStatus`, else a PyTorchJob's
    `kftrain.io/progress` annotation; None when there is none or it cannot be read (a reader of
    progress never fails on it)."""
    status = (job.get("status") or {}).get("trainerStatus")
    annotation = ((job.get("metadata") or {}).get("annotations") or {}).get(PROGRESS_ANNOTATION)
    try:
        if status:
            return Snapshot.from_trainer_status(status)
        if annotation:
            return Snapshot.from_annotation(annotation)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


class ProgressSink(Protocol):
    """Where :class:`Progress` hands each snapshot (trainer/job_status.py's `Reporter`): it must
    return at once and never raise."""

    def submit(self, snapshot: Snapshot) -> None: ...

    def close(self) -> None: ...


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
    report and, given an `events` writer, records and flushes TensorBoard scalars; given a
    `reporter`, hands it each interval's :class:`Snapshot` (it reports off the training thread)."""

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
        reporter: ProgressSink | None = None,
    ) -> None:
        self.total_steps, self.items_per_step, self.item_name = total_steps, items_per_step, item_name
        self.flops_per_step, self.peak_flops, self.interval = flops_per_step, peak_flops, interval
        self.enabled = enabled
        self.events = events if enabled else None
        self.reporter = reporter if enabled else None
        #: The latest interval's snapshot (None before the first line).
        self.last: Snapshot | None = None
        #: Every logged interval: step, mean loss, learning rate, throughput, wall time (for the report),
        #: and `start` on the first one of each start after the first (a resume).
        self.curve: list[dict[str, float]] = []
        self._logged = False  # whether this process logged an interval yet
        #: Every validation (end of epoch) with the step it happened at.
        self.validation: list[dict[str, float]] = []
        #: Every checkpoint this process wrote: step, wall time, staging seconds, size.
        self.checkpoints: list[dict[str, float]] = []
        import torch

        self._loss = torch.zeros((), device=device)
        self._grad_norm = torch.zeros((), device=device)
        self._steps = 0  # in the interval's loss and gradient norm (a resumed interval: its earlier steps too)
        self._timed = 0  # since `_t`: the steps the rate is of
        self._t = self._last_step = time.perf_counter()
        self._untimed = 0.0  # seconds since `_t` of steps the rate leaves out (the profiled one)
        self._untimed_wait, self._last_wait = 0.0, 0.0  # their data wait; the running total at the last step
        self._data_wait = 0.0

    def window(self) -> dict[str, float | int]:
        """The interval in progress, as a checkpoint keeps it: its length, summed loss and gradient
        norm, and steps (so that a resumed run's next line is the mean of the same steps)."""
        return {
            "interval": self.interval,
            "loss": float(self._loss),
            "grad_norm": float(self._grad_norm),
            "steps": self._steps,
        }

    def resume_window(self, window: dict[str, float | int] | None, step: int) -> None:
        """At optimizer step `step`, continue the interval a checkpoint's :meth:`window` kept; not
        one of another `train.log_interval_steps` (its steps would cross this run's intervals), nor
        a checkpoint's from before windows were kept."""
        if window and window.get("interval") == self.interval and window["steps"] == step % self.interval:
            self._loss.fill_(float(window["loss"]))
            self._grad_norm.fill_(float(window["grad_norm"]))
            self._steps = int(window["steps"])

    def step(
        self,
        step: int,
        epoch: int,
        loss: torch.Tensor,
        lr: float,
        grad_norm: torch.Tensor | None = None,
        data_wait: float = 0.0,
        timed: bool = True,
    ) -> None:
        """Record one optimizer step's loss (and gradient norm); log when the interval (or the last
        step) is reached. `data_wait` is the running total of seconds spent waiting for batches.
        A step not `timed` (the one the memory profiler slowed) is left out of the rate and the
        ETA, unless the interval has no other."""
        self._loss += loss
        if grad_norm is not None:
            self._grad_norm += grad_norm.detach().float()
        self._steps += 1
        now = time.perf_counter()
        if timed:
            self._timed += 1
        else:
            self._untimed += now - self._last_step
            self._untimed_wait += data_wait - self._last_wait
        self._last_step, self._last_wait = now, data_wait
        if not self.enabled or (step % self.interval and step != self.total_steps):
            return
        seconds, waited = now - self._t, data_wait - self._data_wait
        if self._timed:
            seconds, waited = seconds - self._untimed, waited - self._untimed_wait
        seconds_per_step = seconds / max(self._timed, 1)
        mean_loss = float(self._loss) / self._steps
        rate = self.items_per_step / seconds_per_step
        scalars = {
            "train/loss": mean_loss,
            "train/learning_rate": lr,
            f"train/{self.item_name}_per_second": rate,
            "train/data_wait_share": min(1.0, max(0.0, waited) / max(seconds, 1e-9)),
        }
        if grad_norm is not None:
            scalars["train/grad_norm"] = float(self._grad_norm) / self._steps
        if self.peak_flops and self.flops_per_step:
            scalars["train/mfu"] = self.flops_per_step / seconds_per_step / self.peak_flops
        wall = time.time()
        self.last = Snapshot(
            step=step,
            total_steps=self.total_steps,
            epoch=epoch,
            eta_seconds=round((self.total_steps - step) * seconds_per_step),
            loss=mean_loss,
            learning_rate=lr,
            rate=rate,
            item_name=self.item_name,
            mfu=scalars.get("train/mfu"),
            metrics=self.last.metrics if self.last is not None else {},
            time=int(wall),
        )
        log.info("%s", self.last.line())
        if self.reporter is not None:
            self.reporter.submit(self.last)
        point = {"step": step, "loss": mean_loss, "lr": lr, "items_per_second": rate, "time": round(wall, 3)}
        if self.curve and not self._logged:  # the first of a resumed start: the report's time chart breaks here
            point["start"] = True
        self._logged = True
        self.curve.append(point)
        if self.events is not None:
            self.events.scalars(step, {**scalars, "train/epoch": float(epoch)}, wall)
            self.events.flush()
        self._loss.zero_()
        self._grad_norm.zero_()
        self._t, self._steps, self._timed, self._data_wait = now, 0, 0, data_wait
        self._untimed = self._untimed_wait = 0.0

    def epoch_end(self, step: int, record: dict[str, Any]) -> None:
        """Record an epoch's summary (`{"epoch", "train_loss", "val_*"...}`) at optimizer step `step`."""
        if not self.enabled:
            return
        self.validation.append({"step": step, **record})
        if self.last is not None:
            # The next snapshot carries the epoch's validation; the job's status shows it now.
            val = {k: float(v) for k, v in record.items() if k.startswith("val_") and isinstance(v, int | float)}
            self.last = dataclasses.replace(self.last, metrics=val, time=int(time.time()))
            if self.reporter is not None:
                self.reporter.submit(self.last)
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
        """Upload the last event file contents (waits for the store) and send the last report."""
        if self.events is not None:
            self.events.close()
        if self.reporter is not None:
            self.reporter.close()
