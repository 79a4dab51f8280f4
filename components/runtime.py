"""Helpers the component functions call at run time (inside the project image).

Artifacts are addressed by URI, never by KFP's local mirror path: every step reads and writes
the object store itself, as the training replicas must. With `store` set, outputs go under
`<store>/<run_id>/<output name>` instead of KFP's pipeline root, and the artifact's URI says so.
"""

from __future__ import annotations

from typing import Any

from trainer.storage import join_uri


def output_uri(artifact: Any, store: str, run_id: str, name: str) -> str:
    """Where an output artifact's content goes; records it as the artifact's URI."""
    if store:
        artifact.uri = join_uri(store, run_id, name)
    return artifact.uri


def log_scalars(metrics_artifact: Any, values: dict[str, Any]) -> None:
    """Log every numeric value (not bools) as a KFP metric, which the UI shows per run."""
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics_artifact.log_metric(key, float(value))
