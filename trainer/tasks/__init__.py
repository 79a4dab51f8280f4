"""Tasks: what is trained. One interface (data, model, loss, metrics) shared by every task.

Built in: `classification` (an MLP over a table) and `causal_lm` (a GPT over bytes). Your own:
set `task: package.module:TaskClass` to a subclass of :class:`Task` importable in the image.
"""

from __future__ import annotations

import importlib

from trainer.config import ConfigError
from trainer.tasks.base import Task
from trainer.tasks.contract import unimplemented

__all__ = ["Task", "get_task", "task_for", "task_for_meta"]


def task_for(cfg) -> Task:
    """The task a config trains: `cfg.task`, the pretrained form of causal_lm with `model.init_from`."""
    return get_task(cfg.task, pretrained=bool(cfg.model.init_from))


def task_for_meta(meta: dict) -> Task:
    """The task that rebuilds a saved model from its metadata (`model.json`)."""
    return get_task(meta["task"], pretrained="base_model" in meta)


def get_task(name: str, pretrained: bool = False) -> Task:
    """A built-in task by name, or a user task class by import path `package.module:Class`.
    `pretrained`: causal_lm starting from a Hugging Face model (`model.init_from`)."""
    if name == "causal_lm" and pretrained:
        from trainer.tasks.pretrained_lm import PretrainedLMTask

        return PretrainedLMTask()
    if name == "classification":
        from trainer.tasks.classification.task import ClassificationTask

        return ClassificationTask()
    if name == "causal_lm":
        from trainer.tasks.causal_lm import CausalLMTask

        return CausalLMTask()
    module_name, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # the user's module: a missing name, or any error while it imports
        raise ConfigError(
            f"task: cannot import {name!r} ({type(exc).__name__}: {exc}); the module must be importable "
            "where kftrain runs (installed in the image, or on PYTHONPATH) and define that class"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"task: {name!r} is not a subclass of trainer.tasks.Task")
    if missing := unimplemented(cls):
        raise ConfigError(
            f"task: {name!r} does not implement {', '.join(missing)}; a task implements each of them "
            "(docs/data.md, 'Your own task')"
        )
    return cls()
