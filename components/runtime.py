"""Helpers the component functions call at run time (inside the project image).

Artifacts are addressed by URI, never by KFP's local mirror path: every step reads and writes
the object store itself, as the training replicas must. With `store.uri` set (in the config or
as the `store` parameter), outputs go under `<store>/<task identity>/<output name>` instead of
KFP's pipeline root, and the artifact's URI says so.
"""

from __future__ import annotations

import hashlib
import math
import sys
import traceback
from types import TracebackType
from typing import Any

from trainer.errors import KftrainError, error_line, redact
from trainer.storage import join_uri


def end_with_one_line(step: str) -> None:
    """Make a kftrain error that ends this step's process end its log with one line.

    Called first thing in a component's body: an uncaught :class:`~trainer.errors.KftrainError`
    still prints its traceback (the step log keeps where it came from), then
    ``kftrain-error: <step>: <message>`` as the log's last line; the process exits 1 as before,
    so KFP shows the step failed, and `kftrain run --local` makes that line its own last word.
    Any other exception is a bug and ends with its traceback alone. (A hook, not a ``try``
    around the body: KFP runs the body's source as written, and the hook needs no re-indenting.)
    """

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        sys.stdout.flush()
        # Redacted as the line after it is: a cluster's step log reaches no console that redacts.
        for line in traceback.format_exception(kind, exc, tb):
            sys.stderr.write(redact(line))
        if isinstance(exc, KftrainError):
            print(error_line(step, exc), file=sys.stderr, flush=True)

    sys.excepthook = hook


def task_identity(run_id: str, task_name: str, dag_execution_id: str, artifact_uri: str) -> str:
    """Who this task is: unique within its run and the same when KFP retries the task.

    KFP's driver replaces a parameter whose whole constant value is a placeholder
    (kubeflow/pipelines backend/src/v2/driver/resolve.go, the `RuntimeValue` case of input
    parameter resolution: an exact `switch`, so placeholders inside longer strings stay as
    they are): `{{$.pipeline_job_uuid}}` -> the run id, `{{$.pipeline_task_name}}` -> the
    task's name in its DAG, and `{{$.pipeline_task_uuid}}` -> the id of the *enclosing DAG's*
    execution (`opts.DAGExecutionID`), not the task's own. Two tasks of one DAG differ by name;
    the iterations of a ParallelFor share the name but each is its own DAG execution; a retried
    task keeps all three. So together they name a task exactly.

    A component wired by hand without them falls back to its output artifact's URI: the driver
    salts it with a fresh uuid per task execution (driver.go, `provisionOutputs`) and a retried
    pod reuses it.
    """
    if run_id and task_name:
        return f"{run_id}/{task_name}-{dag_execution_id}" if dag_execution_id else f"{run_id}/{task_name}"
    return "task-" + hashlib.sha256(artifact_uri.encode()).hexdigest()[:16]


def output_uri(artifact: Any, store: str, identity: str, name: str) -> str:
    """Where an output artifact's content goes; records it as the artifact's URI."""
    if store:
        artifact.uri = join_uri(store, identity, name)
    return artifact.uri


def log_scalars(metrics_artifact: Any, values: dict[str, Any]) -> None:
    """Log every numeric value (not bools) as a KFP metric, which the UI shows per run. A value
    that is not finite (a loss of NaN) is left out, said: KFP's executor output cannot hold one,
    and failed the step after its work was done (was: a protobuf traceback, the run unable to
    finish); the step's own records keep it."""
    for key, value in values.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                metrics_artifact.log_metric(key, float(value))
            else:
                print(f"kftrain: metric {key} is {value}: not shown in the KFP UI, which takes only finite numbers")


def task_settings(task_config: Any) -> dict[str, Any]:
    """A `dsl.TaskConfig` back in the driver's JSON form (camelCase keys, as `kfp.dsl.executor`
    reads it: `nodeSelector` -> `node_selector`, `volumeMounts` -> `volume_mounts`), unset keys left out."""
    names = {
        "affinity": "affinity",
        "tolerations": "tolerations",
        "nodeSelector": "node_selector",
        "env": "env",
        "volumes": "volumes",
        "volumeMounts": "volume_mounts",
        "resources": "resources",
    }
    values = {key: getattr(task_config, attr, None) for key, attr in names.items()}
    return {key: value for key, value in values.items() if value}


def train_step(
    dataset: Any,
    model: Any,
    metrics: Any,
    config: str,
    launcher: str,
    run_id: str,
    task_name: str,
    dag_execution_id: str,
    settings: dict[str, Any],
) -> None:
    """The `train` component's work (components/train.py): `settings` are the task's pod settings
    (`task_settings`), merged into the replicas' `kubernetes` section before the job is built."""
    from components.params import config_from_params
    from trainer.launch.taskconfig import apply_task_config
    from trainer.pipeline_steps import select_backend, train_model

    end_with_one_line("train")
    cfg, overridden = apply_task_config(config_from_params(config), settings)
    for note in overridden:
        print(f"kftrain: task setting not used, the config wins: {note}", flush=True)
    identity = task_identity(run_id, task_name, dag_execution_id, model.uri)
    record = train_model(
        cfg,
        dataset.uri,
        output_uri(model, cfg.store.uri, identity, "model"),
        select_backend(launcher),
        identity=identity,
    )
    log_scalars(metrics, record["metrics"])
    model.metadata["framework"] = "pytorch"
    model.metadata["parameter_digest"] = record["parameter_digest"]
