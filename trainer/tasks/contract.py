"""What a task must implement and return, checked where kftrain calls it.

A custom task (`task: package.module:Class`) is the user's code; what it gets wrong must come
back as one line naming the task, the method and what it should have done, at the first place
that can tell: the methods left to the base class when the task is loaded (the configure step),
and each value a method returns where kftrain first uses it (was: a bare NotImplementedError or
KeyError as "a bug in kftrain", a tensor metric blamed on the checkpoint upload, torch's words
for a loss that is no scalar).
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainer.errors import KftrainError
from trainer.tasks.base import Task

if TYPE_CHECKING:
    import torch
    from torch import nn

#: The methods every task implements (the base class's raise NotImplementedError); it also
#: implements :meth:`Task.stream` or :meth:`Task.datasets`.
REQUIRED = ("prepare", "build_model", "model_from_meta", "loss", "validate", "evaluate", "serving_module")


class TaskError(KftrainError):
    """A task's method is missing or returned what kftrain cannot use; the message names both."""


def task_name(task: Task | type[Task]) -> str:
    """`package.module:Class`, as a config names the task."""
    cls = task if isinstance(task, type) else type(task)
    return f"{cls.__module__}:{cls.__qualname__}"


def unimplemented(cls: type[Task]) -> list[str]:
    """The methods `cls` must implement and leaves to the base class, as `name()`."""
    missing = [f"{name}()" for name in REQUIRED if getattr(cls, name) is getattr(Task, name)]
    if cls.stream is Task.stream and cls.datasets is Task.datasets:
        missing.append("stream() or datasets()")
    return missing


def streamed(task: Task, cfg: Any, manifest: dict) -> Any:
    """:meth:`Task.stream`'s answer, or None where the task's own class overrides `datasets()`
    nearer than `stream()`: a built-in task's subclass that loads its data whole (was: its
    `datasets()` never called, the built-in stream trained on in silence)."""
    mro = type(task).__mro__
    nearest = {name: next(i for i, cls in enumerate(mro) if name in vars(cls)) for name in ("stream", "datasets")}
    if nearest["datasets"] < nearest["stream"]:
        return None
    return task.stream(cfg, manifest)


def _described(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def _refuse(task: Task, method: str, got: str, wanted: str) -> TaskError:
    return TaskError(f"task {task_name(task)}: {method}() returned {got}; it must return {wanted} (see docs/data.md)")


def checked_manifest(task: Task, manifest: Any) -> dict:
    """`prepare()`'s result: the dataset's manifest, a mapping with `splits`."""
    if not isinstance(manifest, Mapping) or not isinstance(manifest.get("splits"), Mapping):
        got = "a mapping with no 'splits'" if isinstance(manifest, Mapping) else _described(manifest)
        raise _refuse(
            task, "prepare", got, "the manifest it wrote (a mapping with 'splits', as trainer.shards makes it)"
        )
    return dict(manifest)


def checked_built(task: Task, built: Any) -> tuple[nn.Module, dict]:
    """`build_model()`'s result: the model and the metadata that rebuilds it."""
    from torch import nn

    if not (isinstance(built, tuple | list) and len(built) == 2):
        raise _refuse(task, "build_model", _described(built), "(the model, its metadata as a mapping)")
    model, meta = built
    if not isinstance(model, nn.Module) or not isinstance(meta, Mapping):
        got = f"({_described(model)}, {_described(meta)})"
        raise _refuse(task, "build_model", got, "(the model, its metadata as a mapping)")
    return model, dict(meta)


def checked_model(task: Task, model: Any) -> nn.Module:
    """`model_from_meta()`'s result: the model."""
    from torch import nn

    if not isinstance(model, nn.Module):
        raise _refuse(task, "model_from_meta", _described(model), "the model (a torch.nn.Module)")
    return model


#: What the evaluation step adds to a task's report itself.
REPORT_NAMES = ("task", "model_uri", "dataset_uri")


def checked_report(task: Task, report: Any) -> dict:
    """`evaluate()`'s result: the test report, a mapping that JSON can write once tensors and
    numpy values, at any depth, are Python numbers and lists (was: "not JSON serializable", after
    training); none of its names the step's own (:data:`REPORT_NAMES`, was: overwritten)."""
    if not isinstance(report, Mapping):
        raise _refuse(task, "evaluate", _described(report), "the test report, a mapping of names to values")
    out = {}
    for key, value in report.items():
        if key in REPORT_NAMES:
            raise _refuse(
                task, "evaluate", f"a value named {key!r}", f"values named other than {', '.join(REPORT_NAMES)}"
            )
        out[key] = plain(value)
        try:
            json.dumps(out[key], allow_nan=True)
        except (TypeError, ValueError):
            raise _refuse(task, "evaluate", f"{key!r}: {_described(value)}", "values JSON can write") from None
    return out


def plain(value: Any) -> Any:
    """`value` with tensors and numpy values, inside mappings and lists too, as Python numbers and
    lists; anything else as it is."""
    import torch

    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()  # a numpy number's is its Python number
    return value


def checked_batch(task: Task, batch: Any) -> tuple | None:
    """`synthetic_batch()`'s result: None, or a batch as `loss()` takes one (a tuple of tensors)."""
    import torch

    if batch is None:
        return None
    if not isinstance(batch, tuple | list) or not all(isinstance(t, torch.Tensor) for t in batch):
        raise _refuse(
            task, "synthetic_batch", _described(batch), "None or a batch as loss() takes one (a tuple of tensors)"
        )
    return tuple(batch)


def checked_serving(task: Task, serving: Any) -> tuple | None:
    """`serving_module()`'s result: None, or (the module to export, a sample input)."""
    from torch import nn

    if serving is None:
        return None
    if not (isinstance(serving, tuple | list) and len(serving) == 2 and isinstance(serving[0], nn.Module)):
        raise _refuse(task, "serving_module", _described(serving), "None or (the module to export, a sample input)")
    return tuple(serving)


def checked_datasets(task: Task, pair: Any) -> tuple:
    """`datasets()`'s result: the train and validation datasets."""
    if not isinstance(pair, tuple | list) or len(pair) != 2:
        raise _refuse(task, "datasets", _described(pair), "two datasets, (train, validation)")
    return tuple(pair)


def checked_loss(task: Task, loss: Any, method: str = "loss") -> torch.Tensor:
    """A loss: one number as a tensor that carries its gradient."""
    import torch

    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise _refuse(task, method, _described(loss), "the batch's loss as a tensor of one value (a mean or a sum)")
    if not loss.requires_grad:
        raise _refuse(task, method, "a loss with no gradient", "a loss computed from the model's output")
    return loss if loss.dim() == 0 else loss.reshape(())


def checked_summed_loss(task: Task, summed: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`summed_loss()`'s result: the summed loss and the number of units it sums (a tensor or a number)."""
    import torch

    if not isinstance(summed, tuple | list) or len(summed) != 2:
        raise _refuse(task, "summed_loss", _described(summed), "(the sum of the batch's losses, their count) or None")
    total, count = summed
    total = checked_loss(task, total, "summed_loss")
    if isinstance(count, numbers.Real) and not isinstance(count, bool):
        count = torch.tensor(count, device=total.device)
    if not isinstance(count, torch.Tensor) or count.numel() != 1:
        raise _refuse(task, "summed_loss", f"a count that is {_described(count)}", "the count as one number")
    return total, count if count.dim() == 0 else count.reshape(())


def checked_metrics(task: Task, metrics: Any, reserved: tuple[str, ...] = ()) -> dict[str, float]:
    """`validate()`'s result: a mapping of metric names to numbers; a tensor of one value or a numpy
    number becomes a Python number (a tensor's record could not be written: was "checkpoint upload
    ... failed"); a name in `reserved` (the trainer's own in the same record) is refused (was: it
    overwrote them)."""
    if not isinstance(metrics, Mapping):
        raise _refuse(task, "validate", _described(metrics), "a mapping of metric names to numbers")
    out = {}
    for key, given in metrics.items():
        value = plain(given)
        if key in reserved:
            raise _refuse(
                task, "validate", f"a metric named {key!r}", f"metrics named other than {', '.join(reserved)}"
            )
        if not isinstance(key, str) or not isinstance(value, int | float):
            raise _refuse(task, "validate", f"{key!r}: {_described(given)}", "a mapping of metric names to numbers")
        out[key] = int(value) if isinstance(value, bool) else value  # a flag, logged and recorded as 0 or 1
    return out
