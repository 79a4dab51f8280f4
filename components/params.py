"""The typed knobs of the KFP UI <-> the trainer's config tree, in one table.

The config text is the base of every run; a typed parameter overrides its field only when the
user set it. Unset is a value no field accepts: `-1` for numbers, empty text, `{}` and `[]`
(KFP's local runner cannot pass a missing optional parameter, so `None` is not an option).

This table generates the pipeline's signature and its parameter docs
(`pipelines/training.py`), the `configure` component's docs, and the table in docs/pipeline.md is checked
against it. The `configure` component's signature is written out, because KFP embeds the
function's source in the compiled YAML; a test holds it to this table.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from trainer import k8s_formats as k8s
from trainer.config import (
    KFP_HF_TOKEN_SECRET,
    KFP_STORE_SECRET,
    KFP_STORE_SECRET_KEYS,
    Config,
    ConfigError,
    parse_config,
)

#: The Secret KFP itself uses for its artifact store; the step pods mount it by default.
DEFAULT_STORE_SECRET = KFP_STORE_SECRET
#: The Secret with the Hugging Face token (key `HF_TOKEN`) the step pods mount, optionally, by default.
DEFAULT_HF_TOKEN_SECRET = KFP_HF_TOKEN_SECRET
#: The pipeline's parameters that name a Secret the step pods mount (the `kubernetes.*` field of each name).
SECRET_PARAMS = ("store_secret", "hf_token_secret")
UNSET: dict[type, Any] = {int: -1, float: -1.0, str: "", dict: {}, list: []}


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
    """One typed pipeline parameter that sets one config field."""

    name: str
    """The parameter's name in the UI, the CLI (`--param NAME=...`) and the code."""
    field: str
    """The dotted config field it sets."""
    type: type
    """Its KFP type: int, float, str, dict or list."""
    help: str
    """What it is, in one line (the effective default is appended from the config's defaults)."""

    @property
    def unset(self) -> Any:
        """The default that means "take the config's value"."""
        return UNSET[self.type]

    @property
    def unset_shown(self) -> str:
        """:attr:`unset` as the docs and messages write it."""
        return {int: "-1", float: "-1", str: "empty", dict: "{}", list: "[]"}[self.type]


PARAMS: tuple[Param, ...] = (
    Param(
        "data_source", "data.source", str, "`digits`/CSV URI (classification), `python-stdlib`/text URI (causal_lm)."
    ),
    Param("replicas", "job.replicas", int, "Training replicas in total: 1 Master + (replicas - 1) Workers."),
    Param("nproc_per_node", "job.nproc_per_node", int, "Training processes (GPUs) per replica."),
    Param(
        "epochs", "train.epochs", int, "Passes over the training split (train.max_steps, when set, decides instead)."
    ),
    Param("batch_size", "train.batch_size", int, "Global batch size; must divide by replicas x nproc_per_node."),
    Param("learning_rate", "train.learning_rate", float, "AdamW learning rate."),
    Param("image", "job.image", str, "Image of the training replicas."),
    Param("timeout_seconds", "job.timeout_seconds", int, "Wall-clock limit of the training job."),
    Param(
        "job_kind",
        "job.kind",
        str,
        "`pytorchjob`, `trainjob` (Kubeflow Trainer v2) or `auto` (what the cluster serves).",
    ),
    Param("gpus_per_node", "kubernetes.gpus_per_node", int, "GPUs per replica (0: CPU); equals nproc_per_node."),
    Param("queue", "kubernetes.queue", str, "Kueue LocalQueue of the training job."),
    Param("node_selector", "kubernetes.node_selector", dict, "nodeSelector labels of the replica pods."),
    Param("tolerations", "kubernetes.tolerations", list, "Tolerations of the replica pods, as in a pod spec."),
    Param(
        "base_model",
        "model.init_from",
        str,
        "Pretrained model to fine-tune (causal_lm): its folder's URI, or `hf://org/name[@revision]`.",
    ),
    Param("train_method", "train.method", str, "With base_model: `full` (every weight trains) or `lora` (adapters)."),
    Param("store", "store.uri", str, "Artifact root (`s3://bucket/prefix`); empty everywhere: KFP's pipeline root."),
    Param("s3_endpoint", "store.endpoint", str, "S3 endpoint URL of the store (`http://host:9000`)."),
    Param(
        "resume_from",
        "checkpoint.resume_from",
        str,
        "Continue from a previous run's latest committed checkpoint: its run id (`RUN` or `RUN/TASK`, under "
        "`store`), model URI or checkpoint URI (`kftrain runs` lists them).",
    ),
)
BY_NAME = {p.name: p for p in PARAMS}


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def effective_default(param: Param) -> Any:
    """The value a run gets when neither the config text nor the parameter sets the field."""
    return _get(Config(), param.field)


def param_help(param: Param) -> str:
    """The parameter's doc line: what it is, and what its unset value means."""
    shown = "empty" if effective_default(param) in ("", {}, []) else repr(effective_default(param))
    return f"{param.help} {param.unset_shown}: the config's value (by default {shown})."


def signature(
    leading: list[inspect.Parameter], trailing: list[inspect.Parameter], return_annotation: Any
) -> inspect.Signature:
    """A function signature with every knob of the table, unset by default, between two groups."""
    knobs = [
        inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.unset, annotation=p.type)
        for p in PARAMS
    ]
    return inspect.Signature([*leading, *knobs, *trailing], return_annotation=return_annotation)


def with_knob_docs(func: Any) -> Any:
    """Fill the `{knobs}` line of `func`'s docstring with an `Args:` entry per knob, indented
    like that line (KFP shows these descriptions in its UI)."""
    doc = func.__doc__
    line_start = doc.rindex("\n", 0, doc.index("{knobs}")) + 1
    indent = doc[line_start : doc.index("{knobs}")]
    func.__doc__ = doc.replace("{knobs}", f"\n{indent}".join(f"{p.name}: {param_help(p)}" for p in PARAMS))
    return func


def plain_values(value: Any) -> Any:
    """Undo protobuf's numbers: KFP passes every number in a dict or list parameter as a float,
    but Kubernetes wants `tolerationSeconds: 300`, not `300.0`."""
    if isinstance(value, dict):
        return {k: plain_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_values(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def as_text(value: Any) -> Any:
    """A parameter's JSON scalar as the text a pod's env, label or argument holds: `true`, `5`,
    `2.5` (JSON's spelling, not Python's `True`); text as it is; an object or a list unchanged, for
    the builder to refuse (it has no one text)."""
    value = plain_values(value)
    return json.dumps(value) if isinstance(value, bool | int | float) else value


def overrides_from_params(**params: Any) -> dict[str, Any]:
    """Dotted config overrides for the parameters that are set (not at their unset value)."""
    unknown = sorted(set(params) - set(BY_NAME))
    if unknown:
        raise TypeError(f"unknown parameter(s) {unknown}; known: {sorted(BY_NAME)}")
    out = {}
    for name, value in params.items():
        param = BY_NAME[name]
        if value is None or value == param.unset:
            continue
        out[param.field] = plain_values(value) if param.type in (dict, list) else value
    return out


def parameter_named_by(message: str, given: Iterable[str]) -> tuple[str, str] | None:
    """The parameter among `given` whose config field an error `message` starts with, else the
    first one whose field it names at all (`model.n_layer: is defined by the pretrained model
    (model.init_from ...)` is base_model's doing), and what to append for it (a number's unset
    value, which nobody guesses: `-1 keeps the config's value`); None where the message is about
    no such parameter. The trainer names the field (`train.epochs`), but the user set a
    parameter (`epochs`)."""
    fields = {**{n: p.field for n, p in BY_NAME.items()}, **{n: f"kubernetes.{n}" for n in SECRET_PARAMS}}
    given = [name for name in given if name in fields]
    starts = [name for name in given if re.match(rf"{re.escape(fields[name])}[:.\[ ]", message)]
    # Named later in the line: the first named, of those a user sets (not the Secret parameters,
    # which are always given and which hints name).
    later = {
        found.start(): name
        for name in given
        if name not in SECRET_PARAMS and (found := re.search(rf"(?<![\w.]){re.escape(fields[name])}(?![\w])", message))
    }
    for name in starts or [later[i] for i in sorted(later)][:1]:
        numeric = name in BY_NAME and BY_NAME[name].type in (int, float)
        return name, f" ({BY_NAME[name].unset_shown} keeps the config's value)" if numeric else ""
    return None


def config_from_params(
    config: str = "",
    store_secret: str | None = None,
    hf_token_secret: str | None = None,
    step_pods: bool = True,
    **params: Any,
) -> Config:
    """The validated config: `config` text, with the parameters that are set applied on top.

    `store_secret` and `hf_token_secret` are the Secrets the KFP step pods mount (fixed when the
    pod is created, so they cannot come from the config text): the replicas must use the same
    ones. A config that names another Secret is an error rather than a run whose steps and
    replicas disagree. None: not given (a later step's; the config's value stands); empty: refused,
    as the step pods mount each by its name. With `step_pods` (a cluster's run), the Secret's keys
    must be the ones the step pods read; kfp.local starts no pods.
    """
    overrides = overrides_from_params(**params)
    cfg = parse_config(config, overrides, origin="config")
    raw = _raw_kubernetes(config)
    secrets = {}
    for name, given in zip(SECRET_PARAMS, (store_secret, hf_token_secret), strict=True):
        if given is not None and not given.strip():
            # An empty name is a step pod the API server refuses, naming no parameter.
            optional = " (it is optional: none by that name is fine)" if name == "hf_token_secret" else ""
            raise ConfigError(f"kubernetes.{name}: must name a Secret, got {given!r}{optional}")
        named = getattr(cfg.kubernetes, name)
        if given is None or given == named:
            continue
        # An empty hf_token_secret in the config is "none"; the steps offer theirs anyway (optional).
        if name in raw and (named or name == "store_secret"):
            raise ConfigError(
                f"kubernetes.{name}: the config names {named!r} but the pipeline's {name} parameter, which the "
                f"step pods mount, is {given!r}: set the parameter to {named!r} (or drop the field from the config)"
            )
        secrets[f"kubernetes.{name}"] = given
    cfg = parse_config(config, {**overrides, **secrets}) if secrets else cfg
    keys = cfg.kubernetes.store_secret_keys
    if step_pods and store_secret is not None and cfg.kubernetes.store_secret and keys != KFP_STORE_SECRET_KEYS:
        # The step pods' secretKeyRefs are compiled into the pipeline with KFP's own keys, and not
        # optional: a Secret without them keeps every step pod from starting.
        wanted = ", ".join(f"{key} ({var})" for key, var in KFP_STORE_SECRET_KEYS.items())
        raise ConfigError(
            f"kubernetes.store_secret_keys: the pipeline's step pods read the keys {wanted} of the Secret "
            f"{cfg.kubernetes.store_secret!r}, and its training replicas read the same; got other keys "
            f"({k8s.show(keys, limit=200)}): put the store's keys in the Secret under those names and drop "
            "store_secret_keys from the config"
        )
    return cfg


def _raw_kubernetes(config: str) -> dict[str, Any]:
    from trainer.config import load_yaml

    loaded = load_yaml(config) if config.strip() else None
    section = loaded.get("kubernetes") if isinstance(loaded, dict) else None
    return section if isinstance(section, dict) else {}
