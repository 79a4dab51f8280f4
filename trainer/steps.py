"""The old name of :mod:`trainer.pipeline_steps`, kept only for compiled component YAML.

Component bodies are compiled into `compiled/components/*.yaml` verbatim, and those published
files import `trainer.steps`; an image must keep serving them. New code imports
:mod:`trainer.pipeline_steps` ("step" elsewhere means an optimizer step). Delete this module
together with a recompile that changes the components' imports.
"""

from trainer.pipeline_steps import (
    LAUNCHERS,
    evaluate,
    export,
    prepare_data,
    resolve_launcher,
    select_backend,
    store_for,
    train_model,
)

__all__ = [
    "LAUNCHERS",
    "evaluate",
    "export",
    "prepare_data",
    "resolve_launcher",
    "select_backend",
    "store_for",
    "train_model",
]
