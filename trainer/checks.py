"""What a run checks before its first step: whatever can be known wrong without doing any work.

`kftrain run --local` calls :func:`check_before_steps` before the pipeline starts; on a cluster
the `configure` step does, so a wrong value fails the run in its first seconds, naming the field,
instead of in the step that first uses it. Nothing is left behind: a store's write check removes
its probe, and a local folder is not created.
"""

from __future__ import annotations

import math

from trainer.config import BUILTIN_TASKS, Config
from trainer.storage import StoreError


def gate_problem(name: str, value: float) -> str:
    """Why `value` cannot be the quality gate's `min_accuracy` or `max_perplexity`, or ''; the one
    rule behind `kftrain run`'s flags and `kftrain submit`'s parameters."""
    if name == "min_accuracy":
        return "" if 0.0 <= value <= 1.0 else "must be a number in [0, 1]"  # nan fails
    return "" if value == 0.0 or 0.0 < value < math.inf else "must be 0 (no bar) or a positive number"


def check_writable(cfg: Config, uri: str, field: str) -> None:
    """`uri` (the value of config field `field`) can be written under; else :class:`StoreError`
    naming the field, within the store check's time limit."""
    from trainer.pipeline_steps import store_for

    try:
        store_for(cfg, uri, check=True)
    except StoreError as exc:
        raise type(exc)(f"{field}: {exc}" if uri in str(exc) else f"{field} {uri}: {exc}") from None


def check_before_steps(cfg: Config) -> None:
    """The job the config describes passes the API server's and the operator's checks
    (:func:`trainer.launch.job.check_job_manifests`: the config runs on a cluster unchanged), the
    store and checkpoint prefixes are writable, a custom task imports, and `data.source` (and a
    tokenizer file) is there and readable (:func:`trainer.data_rules.check_source`)."""
    from trainer.data_rules import check_source
    from trainer.launch.job import check_job_manifests

    check_job_manifests(cfg)
    if cfg.store.uri:
        check_writable(cfg, cfg.store.uri, "store.uri")
    if cfg.checkpoint.enabled and cfg.checkpoint.uri:
        check_writable(cfg, cfg.checkpoint.uri, "checkpoint.uri")
    if cfg.task not in BUILTIN_TASKS:
        from trainer.tasks import get_task

        get_task(cfg.task)  # a ConfigError naming `task` when it does not import
    check_source(cfg)
