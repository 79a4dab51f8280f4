"""The pipeline steps (plan, data prep, training, evaluation, export) as plain functions over a config and URIs.

Components call these; so do tests and benchmarks. Each step reads its inputs from and writes
its outputs to the object store, and checks the store before doing any work, so a missing
bucket or a rejected key fails the step in a second, not after training.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.config import POD_SECTIONS, Config, ConfigError, from_dict, replica_config, to_dict
from trainer.errors import KftrainError, redact
from trainer.launch.backend import JobBackend, run_job
from trainer.launch.spec import job_name
from trainer.storage import ObjectStore, join_uri, open_store, parse_uri, same_place

if TYPE_CHECKING:  # trainer.plan builds models: the step imports it when it runs
    from trainer.plan import Plan, ProbeResult

LAUNCHERS = ("auto", "local", "kubernetes")


#: Steps the plan step and the report measure on the CPU before predicting a CPU run's step time.
CPU_PROBE_STEPS = 3


class PlanRefused(KftrainError):
    """`plan.strict` (or `kftrain plan --strict`): the plan predicts the run cannot fit or cannot finish in time."""


def plan_run(
    cfg: Config,
    probe: ProbeResult | None = None,
    nodes: tuple[int, ...] | None = None,
    dataset_uri: str = "",
    manifest: dict[str, Any] | None = None,
    probe_cpu: bool = False,
) -> Plan:
    """The plan of the run `cfg` describes (:func:`trainer.plan.make_plan`): for `plan.gpu` (or the
    CPU), `kubernetes.gpu_memory_gb` when set, the node counts `nodes` (default `plan.nodes`) and
    `plan.price_per_gpu_hour`; `probe`: measurements of a short run to start from. The prepared
    dataset (its `manifest`, or read from `dataset_uri`) gives the model's real shape and the
    epoch's length, so the ETA; without one the plan says what it assumed. With `probe_cpu` and
    no `probe`, a plan for the CPU (no GPU type or memory given) first measures
    :data:`CPU_PROBE_STEPS` steps in this process: the CPU has no FLOP rate to predict from."""
    from trainer.plan import make_plan, run_probe

    if manifest is None and dataset_uri:
        from trainer.shards import dataset_format, read_manifest

        manifest = read_manifest(store_for(cfg, dataset_uri), dataset_uri, dataset_format(cfg))

    pc = cfg.plan
    if probe is None and probe_cpu and not (pc.gpu or cfg.kubernetes.gpu_memory_gb):
        probe = run_probe(cfg, steps=CPU_PROBE_STEPS, manifest=manifest)
    return make_plan(
        cfg,
        gpu=pc.gpu or None,
        gpu_memory_gb=cfg.kubernetes.gpu_memory_gb or None,
        nodes=tuple(pc.nodes) if nodes is None else nodes,
        price_per_gpu_hour=pc.price_per_gpu_hour or None,
        probe=probe,
        manifest=manifest,
    )


#: The training record's key for the pods' settings, as the train step applied them.
POD_SETTINGS = "pod_settings"


def run_config(record: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """The whole config a training `record`'s weights trained under: the record's (what the
    replicas ran) with the pod settings replicas are never given (:data:`POD_SECTIONS`) as the
    train step recorded them, else from this step's `cfg` (was: their defaults, as a replica read
    them)."""
    ran, whole = record.get("config"), to_dict(cfg)
    return {**replica_config(ran), **_pods(record, whole)} if isinstance(ran, dict) else whole


def _set_field(config: dict[str, Any], field: str, value: Any) -> None:
    """Set the dotted `field` (`train.learning_rate`) of a config mapping, in place."""
    *sections, name = field.split(".")
    for section in sections:
        config = config.setdefault(section, {})
    config[name] = value


def with_recorded_pods(cfg: Config, record: dict[str, Any]) -> Config:
    """`cfg` with the pods' settings the train step recorded in its training `record` (a KFP task's
    resources included), where it did; else `cfg` as it is."""
    whole = to_dict(cfg)
    try:
        return from_dict(Config, {**whole, **_pods(record, whole)})
    except ConfigError:  # a record of another kftrain's fields: this step's own settings stand
        return cfg


def _pods(record: dict[str, Any], whole: dict[str, Any]) -> dict[str, Any]:
    """The pods' settings the train step recorded in `record`, else those of this step's config `whole`."""
    pods = record.get(POD_SETTINGS)
    return pods if isinstance(pods, dict) else _pod_sections(whole)


def _pod_sections(whole: dict[str, Any]) -> dict[str, Any]:
    """The pods' settings (:data:`POD_SECTIONS`) of a whole config as a dict."""
    return {k: whole[k] for k in POD_SECTIONS}


def run_prediction(cfg: Config, manifest: dict[str, Any], device: str | None = None) -> dict[str, Any]:
    """What the plan predicts for the run as `cfg` describes it (its `job.replicas` nodes; on the GPU
    type `plan.gpu` names for a GPU job, else on the CPU) from its dataset's `manifest`, in the
    report's terms: `peak_memory_bytes` per rank (the tensors, what the measurement counts: not
    the CUDA context), `step_seconds`, `eta_seconds` and a `source` note; or `problem`, why there
    is none. `device` is the type the job trained on (its record says; a local run of a GPU job's
    config may run on the CPU), else the config's GPUs decide."""
    import dataclasses

    on_gpu = device == "cuda" if device else cfg.kubernetes.gpus_per_node > 0
    if on_gpu and not (cfg.plan.gpu or cfg.kubernetes.gpu_memory_gb):
        # A local run takes the machine's GPU, and a TrainJob runtime may give some, whatever the pods ask for.
        if cfg.kubernetes.gpus_per_node:
            return {"problem": "a GPU job without plan.gpu: set it to the nodes' GPU type for a prediction"}
        return {"problem": "a job that trained on a GPU without plan.gpu: set it to that GPU's type for a prediction"}
    if not on_gpu:  # a GPU type or memory in the config is not what a CPU run ran on
        plan_cfg = dataclasses.replace(
            cfg,
            plan=dataclasses.replace(cfg.plan, gpu=""),
            kubernetes=dataclasses.replace(cfg.kubernetes, gpu_memory_gb=0.0),
        )
    else:
        plan_cfg = cfg
    try:
        plan = plan_run(plan_cfg, nodes=(cfg.job.replicas,), manifest=manifest, probe_cpu=not on_gpu)
    except KftrainError as exc:
        return {"problem": str(exc)}
    point = plan.point(cfg.job.replicas)
    if point is None:
        return {"problem": f"the plan has no prediction for {cfg.job.replicas} node(s)"}
    device = (cfg.plan.gpu or "GPUs") if on_gpu else "the CPU"
    return {
        "peak_memory_bytes": plan.memory.tensors,
        "step_seconds": point.step_seconds,
        "eta_seconds": point.eta_seconds,
        "source": f"The plan (trainer.plan.make_plan) for this config on {device}, {cfg.job.replicas} node(s) x "
        f"{cfg.job.nproc_per_node} process(es), made with this report; memory: the tensors (without the CUDA "
        "context); training time: the steps at the predicted step time (no evaluation or checkpoints)"
        + ("." if on_gpu else f"; compute per item from a {CPU_PROBE_STEPS}-step probe in one process here."),
    }


def refuse_if_strict(cfg: Config, plan: Plan, strict: bool, switch: str = "plan.strict") -> None:
    """With `strict`, :class:`PlanRefused` naming why when the plan says the run cannot fit in the
    GPU's memory or cannot finish within `job.timeout_seconds`; otherwise nothing. `switch` is what
    turned strictness on (the config field or the CLI flag), for the message."""
    reason = plan.refusal(cfg) if strict else None
    if reason:
        raise PlanRefused(f"the plan refuses this run ({switch}): {reason}")
    if strict and (gaps := plan.unchecked(cfg)):  # passed, but not on every count: a pass must say so
        print(f"kftrain: {switch} could not check {'; nor '.join(gaps)}", file=sys.stderr)


def store_for(cfg: Config, uri: str, check: bool = False) -> ObjectStore:
    """The store serving `uri` with the configured endpoint; with `check`, prove it is writable."""
    store = open_store(uri, cfg.store.endpoint, cfg.store.region, cfg.store.policy())
    if check:
        store.check(uri)
    return store


def prepare_data(cfg: Config, dataset_uri: str) -> dict[str, Any]:
    """Data prep: the task's source -> shards + manifest at `dataset_uri`. The source is checked
    first (`trainer.data_rules.check_source`), so a wrong one fails before any work."""
    from trainer.data_rules import check_source
    from trainer.tasks import task_for
    from trainer.tasks.contract import checked_manifest

    check_source(cfg)
    task = task_for(cfg)
    return checked_manifest(task, task.prepare(cfg, store_for(cfg, dataset_uri, check=True), dataset_uri))


def resolve_launcher(launcher: str) -> str:
    """`local` or `kubernetes`: `auto` picks Kubernetes inside a pod (the service-account env is
    present), else local."""
    if launcher not in LAUNCHERS:
        raise ConfigError(f"launcher {launcher!r}: must be one of {', '.join(LAUNCHERS)}")
    if launcher == "auto":
        return "kubernetes" if os.environ.get("KUBERNETES_SERVICE_HOST") else "local"
    return launcher


def select_backend(launcher: str, log: Callable[[str], None] | None = None) -> JobBackend:
    """The job backend for `launcher` (see :func:`resolve_launcher`)."""
    launcher = resolve_launcher(launcher)
    if launcher == "local":
        from trainer.launch.local import LocalBackend, starting_process

        # A step's job goes with the process that started the step (a kfp.local script's, say).
        return LocalBackend(sink=log, stop_with=starting_process())
    from trainer.launch.kubernetes import KubernetesBackend

    return KubernetesBackend(log=log)


def train_model(
    cfg: Config,
    dataset_uri: str,
    model_uri: str,
    backend: JobBackend,
    identity: str = "local/train",
) -> dict[str, Any]:
    """Run the distributed training job to completion; return rank 0's training record.

    `identity` names the task (`components.runtime.task_identity`); the job's name derives from it.
    """
    from trainer.launch.job import training_job
    from trainer.runs import TRAINING_RECORD
    from trainer.shards import check_shards_present, dataset_format, read_manifest
    from trainer.tasks import task_for
    from trainer.training_data import check_an_epoch_has_a_step

    store = store_for(cfg, model_uri, check=True)
    # Fail now, not in every replica (on a cluster, after they were scheduled): a missing dataset,
    # one prepared for another task, or one that gives the job's ranks no whole step.
    data_store, layout = store_for(cfg, dataset_uri), dataset_format(cfg)
    manifest = read_manifest(data_store, dataset_uri, layout)
    if layout:  # a custom task's manifest is its own: it may name its shards anywhere
        check_shards_present(data_store, dataset_uri, manifest)
    check_an_epoch_has_a_step(cfg, task_for(cfg), manifest, dataset_uri)
    cfg = claim_checkpoints(cfg, model_uri, owner=identity)
    say_where_gpus_are_not(cfg.kubernetes.gpus_per_node, backend, "kubernetes.gpus_per_node")
    spec = training_job(cfg, job_name(identity), dataset_uri, model_uri)
    print(f"kftrain: training job {spec.name} for task {identity}", flush=True)
    run_job(backend, spec)
    uri = join_uri(model_uri, TRAINING_RECORD)
    record = json.loads(store.get_bytes(uri))
    # The pods' settings as this step applied them (a KFP task's own resources included): the
    # replicas never get them, so their record is told here, for the model card and the report.
    record[POD_SETTINGS] = _pod_sections(to_dict(cfg))
    store.put_bytes(uri, json.dumps(record, indent=2).encode())
    return record


def say_where_gpus_are_not(gpus: int, backend: JobBackend, field: str) -> None:
    """Warn when the job asks for `gpus` per replica (the setting `field`) and its replicas run as
    processes on this machine, which has none: they train on the CPU (was: said nowhere; for a
    command of the user's own, the pytorchjob component's, until later)."""
    from trainer.launch.local import LocalBackend

    if gpus and isinstance(backend, LocalBackend):
        import torch

        if not torch.cuda.is_available():
            logging.getLogger("kftrain").warning(
                "%s %d: the local launcher's replicas are processes on this machine, which has no GPU: they train on "
                "the CPU",
                field,
                gpus,
            )


def claim_checkpoints(cfg: Config, model_uri: str, owner: str) -> Config:
    """Claim the run's checkpoint prefix for `owner` (unless checkpoint.owner names one) before
    any training process starts; return `cfg` with checkpoint.owner set, so the replicas write
    as that owner. CheckpointError naming the owner when the prefix is another run's
    (:func:`trainer.checkpoint.claim_prefix`)."""
    import dataclasses

    if not cfg.checkpoint.enabled:
        return cfg
    from trainer.checkpoint_owner import checkpoint_prefix, claim_prefix
    from trainer.launch.local import RUN_MARKER_ENV

    prefix = checkpoint_prefix(cfg, model_uri)
    # `kftrain run --local` names its run id the owner (and refuses any other); elsewhere another
    # owner is deliberate (a run continued by hand) or a config copied from a run's records: said.
    if cfg.checkpoint.owner and cfg.checkpoint.owner != owner and not os.environ.get(RUN_MARKER_ENV):
        logging.getLogger("kftrain").warning(
            "checkpoint.owner %r: this task (%s) trains as that run, owning its checkpoints at %s (it continues and "
            "prunes them); drop checkpoint.owner for a run of its own (a config copied from a run's records holds it)",
            cfg.checkpoint.owner,
            owner,
            redact(prefix),
        )
    owner = cfg.checkpoint.owner or owner
    claim_prefix(store_for(cfg, prefix), prefix, owner, resume=cfg.checkpoint.resume, can_continue=continues(cfg))
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, owner=owner))


def continues(cfg: Config) -> Callable[[dict[str, Any]], None]:
    """The check that `cfg` can continue another run's checkpoint it takes a prefix over from,
    given that checkpoint's commit record (:func:`trainer.checks.check_continues`): refused before
    the prefix is claimed, not when training starts, after data prep."""
    from trainer.checks import check_continues

    def check(record: dict[str, Any]) -> None:
        if isinstance(record.get("config"), dict):  # a record that does not say: the trainer's check
            check_continues(cfg, record, "point checkpoint.uri at a new prefix")

    return check


def evaluate(
    cfg: Config,
    model_uri: str,
    dataset_uri: str,
    output_uri: str,
    report_uri: str,
    min_accuracy: float = 0.0,
    max_perplexity: float = 0.0,
    run_id: str = "",
) -> tuple[dict[str, Any], bool, str]:
    """Test-split metrics (also `output_uri`/metrics.json), the quality gate's verdict and reason,
    and the HTML report (run header, curves, confusion matrix, tables) written to `report_uri`;
    `run_id` names the run in the report's header."""
    from trainer.checks import check_gates
    from trainer.evaluate import evaluate_model, quality_gate
    from trainer.generations import GenerationSettings
    from trainer.model_io import read_model_meta
    from trainer.pretrained import bases_through
    from trainer.report import html_report
    from trainer.runs import TRAINING_RECORD
    from trainer.shards import read_manifest

    check_gates(min_accuracy, max_perplexity, cfg.task)  # before the test split is scored, not after
    store = store_for(cfg, output_uri, check=True)
    check_evaluation_inputs(cfg, store, model_uri, dataset_uri)
    training = read_model_meta(store, model_uri, TRAINING_RECORD)  # before the test split is scored
    with bases_through(cfg.store):  # a fine-tuned model's base is in the configured store, as training read it
        report = evaluate_model(
            store, model_uri, dataset_uri, output_uri, cfg.data.eval_items, GenerationSettings.from_config(cfg)
        )
    passed, reason = quality_gate(report, min_accuracy, max_perplexity)
    training["config"] = run_config(training, cfg)
    manifest = read_manifest(store_for(cfg, dataset_uri), dataset_uri)
    splits = manifest["splits"]
    from trainer.launch.local import local_run_id

    context = {
        "run_id": local_run_id() or run_id,  # `kftrain run --local`: its own id, not kfp.local's
        "dataset_uri": dataset_uri,
        "dataset_size": {
            name: {unit: split[unit] for unit in ("rows", "tokens") if unit in split} for name, split in splits.items()
        },
    }
    context["prediction"] = run_prediction(with_recorded_pods(cfg, training), manifest, training.get("device"))
    store.put_bytes(report_uri, html_report(training, report, (passed, reason), context).encode())
    return report, passed, reason


def check_evaluation_inputs(cfg: Config, store: ObjectStore, model_uri: str, dataset_uri: str) -> None:
    """ConfigError, before the test split is scored, when the evaluate step's inputs are not one
    run's: a config of another task than the model's (its gate and report would follow the
    config), or a prepared dataset other than the one the model trained on (its test split may
    hold the model's training rows: the score would be inflated, and a gate pass with it)."""
    from trainer.model_io import read_model_meta

    meta = read_model_meta(store, model_uri)
    task = meta.get("task")
    if isinstance(task, str) and task != cfg.task:
        raise ConfigError(
            f"config: task {cfg.task!r}, but the model at {model_uri} is a {task!r} model; pass the config it "
            "trained with (its training step's effective config)"
        )
    trained_on = meta.get("dataset_uri")
    if isinstance(trained_on, str) and trained_on and not _same_artifact(trained_on, dataset_uri):
        raise ConfigError(
            f"dataset: {dataset_uri} is not the dataset the model at {model_uri} trained on ({trained_on}): another "
            "prepared dataset's test split may hold the model's training rows; pass the data-prep output it "
            "trained on"
        )


def _same_artifact(a: str, b: str) -> bool:
    """Whether two URIs name one artifact: one place, where `minio://` and `s3://` are the same
    bucket (KFP's pipeline root writes the one, a user the other)."""
    if same_place(a, b):
        return True
    try:
        la, lb = parse_uri(a), parse_uri(b)
    except ValueError:
        return False
    return la.is_remote and lb.is_remote and (la.bucket, la.key.rstrip("/")) == (lb.bucket, lb.key.rstrip("/"))


def evaluation_of(cfg: Config, metrics_uri: str, model_uri: str) -> dict[str, Any]:
    """The numbers of the evaluation at `metrics_uri` (its `metrics.json`), for the model card of
    the model at `model_uri`; ConfigError naming `metrics` when it is no evaluation's output (a
    training step's Metrics, a user's own) or it scored another model (its numbers would go into
    this model's card)."""
    from trainer.evaluate import EVAL_RECORD

    store, record = store_for(cfg, metrics_uri), join_uri(metrics_uri, EVAL_RECORD)
    if not store.exists(record):
        raise ConfigError(
            f"metrics: no {EVAL_RECORD} at {metrics_uri}: pass the evaluate step's `metrics` output, whose "
            "record export reads (a training step's metrics are not one)"
        )
    report = json.loads(store.get_bytes(record))
    scored = report.get("model_uri")
    if isinstance(scored, str) and scored and not _same_artifact(scored, model_uri):
        raise ConfigError(
            f"metrics: the evaluation at {metrics_uri} scored the model at {scored}, not {model_uri}: its numbers "
            "would go into this model's card; pass the evaluate step's `metrics` of this model"
        )
    return {k: v for k, v in report.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def export(cfg: Config, model_uri: str, output_uri: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """Serving formats and model card of the trained model under `output_uri`."""
    from trainer.export import export_model
    from trainer.model_io import read_model_meta
    from trainer.pretrained import bases_through
    from trainer.runs import TRAINING_RECORD

    store = store_for(cfg, output_uri, check=True)
    # The card tells of the weights: the config they trained under and how many steps they had
    # (a run resumed from another one's checkpoint says so; `export_best`: the best step's weights).
    model_store = store_for(cfg, model_uri)
    read_model_meta(model_store, model_uri)  # a model kftrain wrote, named first as evaluate does
    record = read_model_meta(model_store, model_uri, TRAINING_RECORD)
    done = record.get("metrics", {})
    # The changes the exported weights trained under: with checkpoint.export_best, those made before
    # its step (a change at a resume from step s applies to the steps after s); the config, the last
    # start's with each later change undone (was: the last start's, a change it never had shown).
    best = done.get("best_step")
    changes = [c for c in record.get("config_changes") or [] if isinstance(c, dict) and "field" in c]
    later = [c for c in changes if best is not None and not (isinstance(c.get("at_step"), int) and c["at_step"] < best)]
    changes = [c for c in changes if c not in later]
    config = run_config(record, cfg)
    for change in reversed(later):
        _set_field(config, change["field"], change.get("from"))
    with bases_through(cfg.store):
        return export_model(
            store,
            model_uri,
            output_uri,
            metrics=metrics,
            training_config=config,
            max_shard_bytes=cfg.export.max_shard_bytes,
            merge_lora=cfg.export.merge_lora,
            training={
                **{k: done[k] for k in ("steps", "resumed_from_step", "best_step") if k in done},
                **({"config_changes": changes} if changes else {}),
            },
        )
