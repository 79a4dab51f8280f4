"""Run the training pipeline on this machine through `kfp.local` (no cluster).

Each step runs as a subprocess of this Python environment (KFP's SubprocessRunner); the
training step starts its replicas as local process groups with the Training Operator's
environment. Artifacts go to the configured store, or to a local directory by default.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

from trainer.config import Config, config_to_json

DEFAULT_LOCAL_ROOT = "kftrain-outputs"


class PipelineFailed(RuntimeError):
    """A step of the local run failed; its log, printed above, says why."""


def preflight(cfg: Config) -> None:
    """Fail before any step starts when the store is unreachable, missing or refuses our keys."""
    if cfg.store.uri:
        from trainer.steps import store_for

        store_for(cfg, cfg.store.uri, check=True)


def run_local(
    cfg: Config, local_root: str = DEFAULT_LOCAL_ROOT, min_accuracy: float = 0.9, max_perplexity: float = 0.0
) -> dict[str, Any]:
    """Run the whole pipeline; return the artifact URIs, the test metrics and the gate's verdict.

    With ``cfg.store.uri`` set, every artifact goes there and KFP's own local bookkeeping lives
    in a temporary directory; otherwise KFP's pipeline root `local_root` is the store.
    """
    from kfp import local

    from pipelines.training import training_pipeline

    preflight(cfg)
    # kfp.local's notes that do not apply here: display names are UI-only, and the steps'
    # image (the project image) is this very Python environment.
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    with tempfile.TemporaryDirectory(prefix="kftrain-kfp-") as tmp:
        root = tmp if cfg.store.uri else str(Path(local_root).resolve())
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
        try:
            task = training_pipeline(
                config=config_to_json(cfg),
                launcher="local",
                min_accuracy=min_accuracy,
                max_perplexity=max_perplexity,
            )
        except RuntimeError as exc:  # how kfp.local reports a failed task
            raise PipelineFailed(str(exc)) from None
        outputs = task.outputs
        artifacts = {name: outputs[name].uri for name in ("dataset", "model", "metrics", "report")}
        metrics = {k: v for k, v in outputs["metrics"].metadata.items() if isinstance(v, int | float)}
        # Export sits behind the quality gate (dsl.If), so it is no pipeline output: read what
        # the export task recorded, if it ran.
        exported = _task_output(Path(root), "export", "exported")
        gate = _task_output(Path(root), "evaluate", "reason", parameter=True)
    if exported:
        artifacts["exported"] = exported
    return {"artifacts": artifacts, "metrics": metrics, "exported": bool(exported), "quality_gate": gate}


def _task_output(root: Path, task: str, name: str, parameter: bool = False) -> str | None:
    """An output recorded by one task of the newest run under `root` (kfp.local's layout)."""
    runs = sorted(root.glob(f"*/{task}/executor_output.json"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    out = json.loads(runs[-1].read_text())
    if parameter:
        return out.get("parameterValues", {}).get(name)
    artifacts = out.get("artifacts", {}).get(name, {}).get("artifacts", [])
    return artifacts[0]["uri"] if artifacts else None


def write_summary(summary: dict[str, Any], path: str) -> None:
    """The run summary as JSON (artifact URIs and final metrics)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
