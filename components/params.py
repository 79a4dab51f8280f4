"""Pipeline and component parameters <-> the trainer's config tree, in one table.

A component receives the whole config as YAML/JSON text (`config`) plus a few explicit
parameters that the KFP UI shows; the explicit ones win, except empty strings. The names here are the one spelling
of each concept in the UI, on the command line and in code.
"""

from __future__ import annotations

from typing import Any

from trainer.config import Config, parse_config

#: parameter name -> dotted config field
PARAM_FIELDS: dict[str, str] = {
    "data_source": "data.source",
    "replicas": "job.replicas",
    "nproc_per_node": "job.nproc_per_node",
    "epochs": "train.epochs",
    "batch_size": "train.batch_size",
    "learning_rate": "train.learning_rate",
    "image": "job.image",
    "timeout_seconds": "job.timeout_seconds",
    "gpus_per_node": "kubernetes.gpus_per_node",
    "queue": "kubernetes.queue",
    "store": "store.uri",
    "s3_endpoint": "store.endpoint",
}


def config_from_params(config: str = "", **params: Any) -> Config:
    """The validated config: `config` text with the explicit parameters applied on top.

    An empty-string parameter (`data_source=""`, `store=""`) leaves the config's value.
    """
    unknown = sorted(set(params) - set(PARAM_FIELDS))
    if unknown:
        raise TypeError(f"unknown parameter(s) {unknown}; known: {sorted(PARAM_FIELDS)}")
    overrides = {PARAM_FIELDS[k]: v for k, v in params.items() if v != ""}
    return parse_config(config, overrides, origin="config")


def params_from_config(cfg: Config) -> dict[str, Any]:
    """The explicit parameter values that reproduce `cfg` (inverse of :func:`config_from_params`)."""
    out: dict[str, Any] = {}
    for name, dotted in PARAM_FIELDS.items():
        node: Any = cfg
        for part in dotted.split("."):
            node = getattr(node, part)
        out[name] = node
    return out
