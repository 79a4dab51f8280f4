"""The training pipeline: configure -> data prep -> plan -> distributed training -> evaluation -> export.

Its signature is generated from the one parameter table (`components/params.py`): `config`,
then every typed knob (unset by default: the config text decides), then the pipeline's own
settings below.
"""

import inspect
from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import HTML, Dataset, Markdown, Metrics, Model

from components.configure import configure
from components.data_prep import data_prep
from components.evaluate import evaluate
from components.export import export
from components.gate import quality_gate_failed
from components.params import DEFAULT_HF_TOKEN_SECRET, DEFAULT_STORE_SECRET, PARAMS, signature, with_knob_docs
from components.plan import plan
from components.task_options import launcher_task_options
from components.train import train
from trainer.checks import GATE_DEFAULTS
from trainer.config import HF_TOKEN, KFP_STORE_SECRET_KEYS

#: Resolved by KFP's driver per task: together they name a task exactly (components/runtime.py).
TASK_IDENTITY = {
    "run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    "task_name": dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    "dag_execution_id": dsl.PIPELINE_TASK_ID_PLACEHOLDER,
}


class TrainingOutputs(NamedTuple):
    """What a run produces, for callers of the pipeline (the local runner reads these)."""

    dataset: Dataset
    model: Model
    metrics: Metrics
    report: HTML
    plan: Markdown


def _pipeline(
    config: str,
    store_secret: str,
    hf_token_secret: str,
    launcher: str,
    min_accuracy: float,
    max_perplexity: float,
    **knobs,
) -> TrainingOutputs:
    """Train a model with DDP across `replicas` x `nproc_per_node` processes, evaluate it, and
    export it when it passes the quality gate; with `plan.enabled` in the config, predict its
    memory, time and cost first (and with `plan.strict`, refuse a run that cannot fit or finish).

    The config text is the base of the run; every other parameter left at its unset value
    (-1, empty, {} or []) takes the config's value.

    Args:
        config: The kftrain config as YAML/JSON text (paste a file from `configs/`).
        {knobs}
        store_secret: The Secret with the object-store keys (`accesskey`, `secretkey`) that every
            step and training replica mounts.
        hf_token_secret: The Secret whose key `HF_TOKEN` every step after configure and every
            training replica gets as `HF_TOKEN`, for a gated or private `hf://` base_model;
            optional: without that Secret the variable is unset.
        launcher: `auto` (Kubernetes inside a pod, else local processes), `kubernetes` or `local`.
        min_accuracy: Quality gate (classification): export only at or above this test accuracy.
        max_perplexity: Quality gate (causal_lm): export only at or below this perplexity; 0: no bar.
    """

    def with_secrets(task: dsl.PipelineTask, hub_token: bool = True) -> dsl.PipelineTask:
        kubernetes.use_secret_as_env(task, secret_name=store_secret, secret_key_to_env=KFP_STORE_SECRET_KEYS)
        if hub_token:  # an hf:// base model: the tokenizer (data prep) and the weights (the rest)
            kubernetes.use_secret_as_env(
                task, secret_name=hf_token_secret, secret_key_to_env={HF_TOKEN: HF_TOKEN}, optional=True
            )
        return task

    # configure reads the store (its prefixes, data.source, a base model's folder), never the Hub;
    # it also checks the run's own settings, which only later steps use.
    run_settings = {"launcher": launcher, "min_accuracy": min_accuracy, "max_perplexity": max_perplexity}
    secrets = {"store_secret": store_secret, "hf_token_secret": hf_token_secret}
    conf = with_secrets(configure(config=config, **secrets, **run_settings, **knobs), hub_token=False)
    conf.set_display_name("configure")
    # Never cached: its checks, the checkpoint it pins resume_from to and the version of the source
    # it records (data prep's cache key) are the store's now, not an earlier run's with this config.
    conf.set_caching_options(False)
    effective = conf.output
    prep = with_secrets(data_prep(config=effective))
    prep.set_display_name("data prep")
    # Always there (KFP cannot wait on a task inside a dsl.If): with plan.enabled off it only says so.
    # After data prep, whose manifest gives the model's shape and the epoch's length (the ETA).
    planned = with_secrets(plan(dataset=prep.outputs["dataset"], config=effective, **TASK_IDENTITY))
    planned.set_display_name("plan")
    fit = with_secrets(train(dataset=prep.outputs["dataset"], config=effective, launcher=launcher, **TASK_IDENTITY))
    fit.after(planned)  # plan.strict: a run the plan refuses never starts training
    launcher_task_options(fit)
    fit.set_display_name("distributed training")
    ev = with_secrets(
        evaluate(
            dataset=prep.outputs["dataset"],
            model=fit.outputs["model"],
            config=effective,
            min_accuracy=min_accuracy,
            max_perplexity=max_perplexity,
            **TASK_IDENTITY,
        )
    )
    ev.set_display_name("evaluation")
    with dsl.If(ev.outputs["passed"] == True, name="quality-gate-passed"):  # noqa: E712 (a KFP condition)
        ex = with_secrets(
            export(model=fit.outputs["model"], metrics=ev.outputs["metrics"], config=effective, **TASK_IDENTITY)
        )
        ex.set_display_name("model export")
    with dsl.Else(name="quality-gate-failed"):
        stop = quality_gate_failed(reason=ev.outputs["reason"])
        stop.set_display_name("quality gate failed")
    return TrainingOutputs(
        dataset=prep.outputs["dataset"],
        model=fit.outputs["model"],
        metrics=ev.outputs["metrics"],
        report=ev.outputs["report"],
        plan=planned.outputs["markdown"],
    )


def _param(name: str, annotation: type, default: object) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation)


SIGNATURE = signature(
    [_param("config", str, "")],
    [
        _param("store_secret", str, DEFAULT_STORE_SECRET),
        _param("hf_token_secret", str, DEFAULT_HF_TOKEN_SECRET),
        _param("launcher", str, "auto"),
        _param("min_accuracy", float, GATE_DEFAULTS["min_accuracy"]),
        _param("max_perplexity", float, 0.0),
    ],
    return_annotation=TrainingOutputs,
)


def _bind(*args, **kwargs) -> TrainingOutputs:
    bound = SIGNATURE.bind(*args, **kwargs)  # KFP calls a pipeline with its channels by position
    bound.apply_defaults()
    knobs = {p.name: bound.arguments[p.name] for p in PARAMS}
    rest = {k: v for k, v in bound.arguments.items() if k not in knobs}
    return _pipeline(**rest, **knobs)


_bind.__signature__ = SIGNATURE
_bind.__doc__ = _pipeline.__doc__
training_pipeline = dsl.pipeline(
    name="kftrain-training",
    description="Data prep, distributed PyTorch training (PyTorchJob), evaluation and export.",
)(with_knob_docs(_bind))
