"""From a kftrain config to the one job description every backend runs."""

from __future__ import annotations

from typing import Any

from trainer import k8s_formats as k8s
from trainer.config import POD_SECTIONS, Config, ConfigError, config_to_json
from trainer.launch.spec import (
    UNBUFFERED_ENV,
    JobSpec,
    job_name,
    require_object_store,
    require_pod_paths,
    torchrun_command,
)
from trainer.stopping import GRACE_ENV
from trainer.storage import ENDPOINT_ENV, REGION_ENV, credential_pair_problem

TRAIN_MODULE = "trainer.train"


def training_job(cfg: Config, name: str, dataset_uri: str, model_uri: str) -> JobSpec:
    """The description of the training step of `cfg` (a PyTorchJob or TrainJob per `job.kind`)."""
    kc = cfg.kubernetes
    # What the Secret fills is what the replicas' store client reads (a custom image's, through the
    # pytorchjob component, may read other names): a half is refused now, not at the first request.
    filled = {*kc.store_secret_keys.values(), *(e.get("name") for e in kc.extra_env)}  # a pair from two Secrets too
    halves = credential_pair_problem(filled.__contains__)
    if kc.store_secret and halves is not None:
        raise ConfigError(
            f"kubernetes.store_secret_keys: must fill a key and its secret ({halves or 'it fills neither'}), e.g. "
            "{accesskey: AWS_ACCESS_KEY_ID, secretkey: AWS_SECRET_ACCESS_KEY}; or set kubernetes.store_secret: '' "
            f"where the pods get access otherwise, got {k8s.show(kc.store_secret_keys, limit=200)}"
        )
    # The replicas need no pod settings: the kubernetes section stays off their command line.
    replica_cfg = config_to_json(cfg, exclude=POD_SECTIONS)
    args = ["--config-json", replica_cfg, "--dataset-uri", dataset_uri, "--model-uri", model_uri]
    return JobSpec(
        name=name,
        image=cfg.job.image,
        command=torchrun_command(TRAIN_MODULE, args),
        replicas=cfg.job.replicas,
        nproc_per_node=cfg.job.nproc_per_node,
        env=job_env(cfg),
        timeout_s=cfg.job.timeout_seconds,
        kubernetes=cfg.kubernetes,
        kind=cfg.job.kind,
        resumes=(
            "checkpoint"
            if cfg.checkpoint.enabled and cfg.checkpoint.resume
            else "resume_from"
            if cfg.checkpoint.resume_from
            else "start"
        ),
        artifact_uris={
            "dataset URI": dataset_uri,
            "model URI": model_uri,
            **({"checkpoint.uri": cfg.checkpoint.uri} if cfg.checkpoint.enabled and cfg.checkpoint.uri else {}),
        },
    )


def job_env(cfg: Config) -> dict[str, str]:
    """Settings every training process needs and a user should not have to know, and
    `kubernetes.env`; a variable kftrain sets from a field is refused there, naming the field."""
    own = {name: value for name, (value, _) in _own_env(cfg).items() if value}
    for name in cfg.kubernetes.env:
        if name in own:
            raise ConfigError(
                f"kubernetes.env.{name}: kftrain sets it (to {own[name]!r}) {_own_env(cfg)[name][1]}; "
                "remove it from kubernetes.env"
            )
    for where, name, value in _given_env(cfg):
        if name == UNBUFFERED_ENV and value != "1":
            # The Training Operator appends its own after the pod's variables (the last one wins),
            # and a TrainJob gets kftrain's: another value would be overwritten, or named twice.
            raise ConfigError(
                f"{where}: {UNBUFFERED_ENV} is set to '1' in every replica (by the Training Operator, or by kftrain "
                "for a TrainJob), so that each log line reaches the pod's log at once; another value would be "
                "overwritten: remove it"
            )
    return {**own, **cfg.kubernetes.env}


def _given_env(cfg: Config) -> list[tuple[str, Any, Any]]:
    """The replicas' variables the config gives: (field, name, value; None for a `valueFrom`)."""
    given = [(f"kubernetes.env.{n}", n, v) for n, v in cfg.kubernetes.env.items()]
    return given + [
        (f"kubernetes.extra_env[{i}]", e.get("name"), e.get("value")) for i, e in enumerate(cfg.kubernetes.extra_env)
    ]


def check_store_env(cfg: Config) -> None:
    """ConfigError for a store variable the config gives the replicas: the steps that write what
    training reads (data prep) and read what it writes (evaluation, export) never get
    `kubernetes.env`, so the replicas would use another store. (A KFP task's own variables, which
    its launcher has too, are passed on to the replicas: see :mod:`trainer.launch.taskconfig`.)"""
    for where, name, _ in _given_env(cfg):
        if name in ENDPOINT_ENV or name in REGION_ENV:
            setting = "store.endpoint" if name in ENDPOINT_ENV else "store.region"
            raise ConfigError(
                f"{where}: {name} would choose the training replicas' object store alone (the pipeline's other "
                f"steps do not get kubernetes.env): set {setting}, which every step uses, and remove it here"
            )


_GRACE_FIELD = "from kubernetes.termination_grace_seconds: set that instead"


def _own_env(cfg: Config) -> dict[str, tuple[str, str]]:
    """The variables kftrain sets in every replica: name -> (value, the field it comes from)."""
    grace = str(cfg.kubernetes.termination_grace_seconds)
    return {
        "OMP_NUM_THREADS": (str(cfg.job.omp_num_threads), "from job.omp_num_threads: set that instead"),
        # A failed or timed-out NCCL collective aborts the process (and so the job) instead of
        # leaving every other rank blocked forever: never off.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1", "always, so that a failed collective ends the job"),
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": (
            str(cfg.job.nccl_heartbeat_timeout_seconds),
            "from job.nccl_heartbeat_timeout_seconds: set that instead",
        ),
        # On SIGTERM torchrun passes it on and SIGKILLs workers still there after this long (30s by
        # default): the pod's grace period, so their checkpoint may take all of it.
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": (grace, _GRACE_FIELD),
        GRACE_ENV: (grace, _GRACE_FIELD),
        "NCCL_DEBUG": (cfg.job.nccl_debug, "from job.nccl_debug: set that instead"),
    }


#: What :func:`check_job_manifests` builds with: a name as long as the launcher's (`job_name`),
#: so the name-length rules hold as they will, and placeholder object-store URIs.
PREFLIGHT_NAME = job_name("preflight")
PREFLIGHT_URIS = ("s3://preflight/dataset", "s3://preflight/model")


def check_job_manifests(cfg: Config) -> None:
    """Build the job `cfg` would create on a cluster (each kind `job.kind` may become) and preflight
    it, so that a value the API server, the operator or NCCL would refuse fails before any step,
    pod or upload starts, naming its config field (:class:`~trainer.launch.preflight.ManifestError`)."""
    from trainer.config import ConfigError
    from trainer.launch.jobkind import kinds_it_may_become

    check_store_env(cfg)
    try:
        spec = training_job(cfg, PREFLIGHT_NAME, *PREFLIGHT_URIS)
    except ValueError as exc:  # the job spec's own rules (a TrainJob's unfit settings): the config's error
        raise ConfigError(str(exc)) from None
    for kind in kinds_it_may_become(cfg.job.kind):
        kind.validate(kind.build(spec, cfg.kubernetes.namespace, None))


def pod_read_paths(cfg: Config) -> dict[str, str]:
    """The config's locations that a cluster's pods read but never write, by field: the data
    source, the base model and a tokenizer file (the built-in sources and tokenizers are none);
    what :func:`trainer.launch.spec.require_pod_paths` checks."""
    from trainer.data_rules import BUILTIN_SOURCES

    paths = {"data.source": cfg.data.source, "model.init_from": cfg.model.init_from}
    if cfg.data.tokenizer != "bytes" and not cfg.data.tokenizer.startswith("bpe:"):
        paths["data.tokenizer"] = cfg.data.tokenizer
    return {field: value for field, value in paths.items() if value and value not in BUILTIN_SOURCES}


def check_cluster_locations(cfg: Config) -> None:
    """ConfigError naming the field whose location a cluster's pods could not share: what the
    steps and replicas write and the next one reads must be in the object store (no two pods
    share a disk; an empty `store.uri` is KFP's own store; checkpoints count only when written),
    and what they only read an object or an absolute path inside their image."""
    shared = {"store.uri": cfg.store.uri}
    if cfg.checkpoint.enabled:
        shared["checkpoint.uri"] = cfg.checkpoint.uri
    require_object_store({field: uri for field, uri in shared.items() if uri})
    require_pod_paths(pod_read_paths(cfg))
