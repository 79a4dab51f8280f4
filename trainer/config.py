"""The one configuration tree of kftrain, loaded 1:1 from YAML.

Every section is a dataclass; every field has a short docstring (the string literal below it),
from which docs/configuration.md is generated (`python -m trainer.config_docs`). Unknown keys,
wrong types and bad values raise :class:`ConfigError` naming the dotted field and the value,
before any process, pod or upload starts.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import KftrainError
from trainer.storage import RetryPolicy, parse_uri
from trainer.tokenizer import parse_spec as parse_tokenizer_spec

NCCL_DEBUG_LEVELS = ("", "VERSION", "WARN", "INFO", "TRACE")
BUILTIN_TASKS = ("classification", "causal_lm")
PRECISIONS = ("auto", "fp32", "bf16")
LR_SCHEDULES = ("constant", "cosine")
NONFINITE_POLICIES = ("stop", "skip")
#: `train.strategy`: replicate the model on every rank (DDP) or shard it (FSDP2, `fully_shard`).
STRATEGIES = ("ddp", "fsdp")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("None", "Running", "All")
#: `job.kind`: the Kubeflow job the launcher creates on a cluster (`auto`: whichever is served).
JOB_KINDS = ("pytorchjob", "trainjob", "auto")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
#: The memory-backed volume kftrain mounts at /dev/shm (`kubernetes.shm_size`).
SHM_VOLUME = "dshm"
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


#: KFP's own artifact-store Secret and the variables its keys fill: the default everywhere.
KFP_STORE_SECRET = "mlpipeline-minio-artifact"
KFP_STORE_SECRET_KEYS = {"accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}


class ConfigError(KftrainError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


def _require(ok: bool, path: str, value: Any, expectation: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {expectation}, got {value!r}")


#: Words of an environment variable's name that mark a credential (`HF_TOKEN`, `DB_PASSWORD`);
#: whole words, so `TOKENIZERS_PARALLELISM` stays allowed.
_CREDENTIAL_WORDS = frozenset({"TOKEN", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "APIKEY"})
_CREDENTIAL_PAIRS = frozenset(
    {("ACCESS", "KEY"), ("API", "KEY"), ("PRIVATE", "KEY"), ("SESSION", "KEY"), ("SSH", "KEY"), ("SIGNING", "KEY")}
)
#: Values that are credentials whatever the variable is called.
_CREDENTIAL_VALUES = (
    re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"),  # an AWS access key id
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\b(ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}"),  # GitHub tokens
    re.compile(r"\bhf_[A-Za-z0-9]{30,}"),  # Hugging Face tokens
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack tokens
    re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),  # OpenAI-style API keys
    re.compile(r"^[a-z][a-z0-9+.-]*://[^/@:\s]+:[^/@\s]+@"),  # a URL with user:password
)


def check_plain_env(env: dict[str, Any], path: str, secret_hint: str) -> None:
    """Refuse credentials in a plain (non-secret) environment mapping.

    Plain environment ends up in pipeline parameters, compiled YAML, the PyTorchJob object and
    `kubectl describe`: a key there is a leaked key. A variable is refused when its name looks like
    a credential (`*SECRET*`, `*_TOKEN`, `*_PASSWORD`, `*_ACCESS_KEY*`, ...) or its value does (an
    AWS key id, a private key, a known token format, a URL with a password). The error names the
    variable, never the value, and says where credentials go instead (`secret_hint`).
    """
    for name, value in env.items():
        _require(isinstance(name, str) and bool(name), path, name, "variable names must be non-empty text")
        words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
        pairs = set(zip(words, words[1:], strict=False))
        by_name = "SECRET" in name.upper() or bool(_CREDENTIAL_WORDS & set(words)) or bool(_CREDENTIAL_PAIRS & pairs)
        by_value = isinstance(value, str) and any(p.search(value) for p in _CREDENTIAL_VALUES)
        if by_name or by_value:
            looks = "name" if by_name else "value"
            raise ConfigError(
                f"{path}.{name}: its {looks} looks like a credential, and plain environment is visible in "
                f"parameters, YAML and the job object; pass credentials from a Kubernetes Secret instead "
                f"({secret_hint})"
            )


@dataclass(kw_only=True, slots=True)
class StoreConfig:
    """Where artifacts live: an object store (S3, MinIO, SeaweedFS) or a local directory."""

    uri: str = ""
    """Root for run artifacts (`s3://bucket/prefix`, `minio://bucket/prefix`, a path); empty: KFP's pipeline root."""
    endpoint: str = ""
    """S3 endpoint URL (`http://host:9000`; `https://` for TLS); empty: env `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`,
    else KFP's in-cluster store (`http://seaweedfs.kubeflow:9000`) for `minio://` URIs and AWS S3 for `s3://`."""
    region: str = ""
    """S3 region; empty: env `AWS_REGION`, else the server's default."""
    retry_budget_seconds: float = 120.0
    """How long one store operation retries transient failures (refused or reset connections, timeouts, 5xx, SlowDown)
    before the step fails naming the object and the cause."""
    connect_timeout_seconds: float = 10.0
    """A TCP connection to the store not established within this fails the attempt (then retried)."""
    read_timeout_seconds: float = 60.0
    """No bytes from the store for this long fails the attempt: a hung connection is cut (then retried)."""

    def policy(self) -> RetryPolicy:
        """The S3 store's timeouts and retry budget."""
        return RetryPolicy(
            budget_s=self.retry_budget_seconds,
            connect_timeout_s=self.connect_timeout_seconds,
            read_timeout_s=self.read_timeout_seconds,
        )

    def __post_init__(self) -> None:
        _require(
            self.retry_budget_seconds >= 0, "store.retry_budget_seconds", self.retry_budget_seconds, "must be >= 0"
        )
        for name in ("connect_timeout_seconds", "read_timeout_seconds"):
            _require(getattr(self, name) > 0, f"store.{name}", getattr(self, name), "must be > 0")
        if self.uri:
            try:
                parse_uri(self.uri)
            except ValueError as exc:
                raise ConfigError(f"store.uri: {exc}") from None
        if self.endpoint:
            _require(
                self.endpoint.startswith(("http://", "https://")),
                "store.endpoint",
                self.endpoint,
                "must be a URL starting with http:// (no TLS) or https:// (TLS)",
            )
            if "@" in self.endpoint.split("://", 1)[1].split("/", 1)[0]:  # the value is not repeated: a password
                raise ConfigError(
                    "store.endpoint: a user or password in the URL is not used (and would be printed); remove it "
                    "(from the config or --s3-endpoint) and set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (on a "
                    "cluster, from the store Secret)"
                )


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Data preparation: the source table, the split and the shard layout."""

    source: str = ""
    """Classification: `digits` (scikit-learn's handwritten digits, bundled) or a CSV URI; causal_lm: `python-stdlib`
    (Python's own library source), a text or JSON Lines object, or a prefix holding many (`s3://bucket/corpus/`); empty:
    the task's default."""
    label_column: str = "label"
    """For a CSV source: the column holding the class label; every other column is a numeric feature (finite, within
    float32's range). Labels are stripped of surrounding whitespace and numbers compare as numbers: `1`, `1.0` and ` 1`
    are one class `1`; other labels are kept as written, case included. An empty label is an error."""
    val_fraction: float = 0.1
    """Share of rows held out for validation during training."""
    test_fraction: float = 0.2
    """Share of rows held out for the final evaluation."""
    seed: int = 0
    """Seed of the stratified split, so the same source always gives the same shards."""
    partitions: int = 0
    """Parts each epoch's item order is cut into; 0: one per reader (world size x DataLoader workers).
    Fix it (a multiple of every world size) so any world size trains on the same global batches."""
    cache_bytes: int = 512 * 2**20
    """Each reader's cache of prefetched training shards, in bytes (consumed shards are dropped)."""
    eval_items: int = 2048
    """Validation and evaluation read at most this many items (rows, or windows of `model.block_size` tokens): the first
    ones in shard order."""
    text_field: str = "text"
    """causal_lm, JSON Lines sources: the field of each record that holds its text."""
    num_proc: int = 1
    """causal_lm data prep: processes that tokenize in parallel (a BPE or tokenizer.json; `bytes` ignores it)."""
    shard_rows: int = 512
    """Rows per shard file (causal_lm: `shard_rows` x 1024 tokens per shard)."""
    max_bytes: int = 4_000_000
    """causal_lm: at most this many bytes of text are tokenised (0: all)."""
    tokenizer: str = "bytes"
    """causal_lm: `bytes` (id = byte value, no special token), `bpe:<vocab_size>` (a byte-level BPE of 258..1048576
    tokens, trained with Hugging Face `tokenizers` during data prep, `<|endoftext|>` its special token) or the URI of a
    Hugging Face `tokenizer.json`. The model's vocabulary follows the tokenizer."""
    tokenizer_sample_bytes: int = 20_000_000
    """causal_lm, `bpe:<vocab_size>`: BPE training reads at most this many bytes of the source."""

    def __post_init__(self) -> None:
        if self.source not in ("", "digits", "python-stdlib"):
            try:
                parse_uri(self.source)
            except ValueError as exc:
                raise ConfigError(f"data.source: {exc}") from None
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            _require(0.0 < value < 0.5, f"data.{name}", value, "must be between 0 and 0.5")
        _require(self.shard_rows > 0, "data.shard_rows", self.shard_rows, "must be positive")
        for name in ("partitions",):
            _require(getattr(self, name) >= 0, f"data.{name}", getattr(self, name), "must be >= 0")
        for name in ("cache_bytes", "eval_items", "num_proc"):
            _require(getattr(self, name) > 0, f"data.{name}", getattr(self, name), "must be positive")
        _require(bool(self.text_field), "data.text_field", self.text_field, "must not be empty")
        _require(self.max_bytes >= 0, "data.max_bytes", self.max_bytes, "must be >= 0")
        _require(self.seed >= 0, "data.seed", self.seed, "must be >= 0")
        try:
            parse_tokenizer_spec(self.tokenizer)
        except ValueError as exc:
            raise ConfigError(f"data.tokenizer: {exc}") from None
        _require(
            self.tokenizer_sample_bytes > 0,
            "data.tokenizer_sample_bytes",
            self.tokenizer_sample_bytes,
            "must be positive",
        )


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """The model's shape: the classifier's MLP, or the GPT of causal_lm."""

    hidden_sizes: list[int] = field(default_factory=lambda: [128, 64])
    """classification: widths of the hidden layers of the MLP."""
    dropout: float = 0.0
    """Dropout probability (after each MLP hidden layer; in attention and MLP blocks of the GPT)."""
    n_layer: int = 12
    """causal_lm: transformer blocks (GPT-2 small: 12)."""
    n_head: int = 12
    """causal_lm: attention heads; must divide `n_embd` (GPT-2 small: 12)."""
    n_embd: int = 768
    """causal_lm: embedding width (GPT-2 small: 768)."""
    block_size: int = 1024
    """causal_lm: context length in tokens (GPT-2: 1024)."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size"):
            _require(getattr(self, name) > 0, f"model.{name}", getattr(self, name), "must be positive")
        _require(
            self.n_embd % self.n_head == 0,
            "model.n_embd",
            self.n_embd,
            f"must divide by model.n_head ({self.n_head})",
        )
        _require(
            len(self.hidden_sizes) > 0 and all(h > 0 for h in self.hidden_sizes),
            "model.hidden_sizes",
            self.hidden_sizes,
            "must be a non-empty list of positive integers",
        )
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "must be in [0, 1)")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """The optimisation loop run by every rank."""

    epochs: int = 20
    """Passes over the training split."""
    batch_size: int = 64
    """Global batch size, split evenly over all ranks (and `grad_accum_steps` micro-batches), so it must divide by the
    world size; every optimizer step uses a full global batch."""
    learning_rate: float = 0.003
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    seed: int = 0
    """Base seed: initial weights and data order are the same on every rank; per-step randomness (dropout) differs by
    rank (the seed plus the rank)."""
    log_interval_steps: int = 20
    """Rank 0 logs loss, learning rate, samples/s or tokens/s, ETA (and MFU on CUDA) every this many optimizer steps."""
    max_steps: int = 0
    """Stop after this many optimizer steps; 0: train for `epochs`."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; gradients are reduced only on the last one (DDP `no_sync`; FSDP likewise)."""
    grad_clip_norm: float = 0.0
    """Clip the global gradient norm to this; 0: no clipping (the norm is still checked for NaN/inf)."""
    lr_schedule: str = "constant"
    """`constant` or `cosine` (decay to 10% of `learning_rate` by the last step)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many steps."""
    precision: str = "auto"
    """`auto` (bf16 autocast on CUDA, fp32 on CPU), `bf16` or `fp32`."""
    compile: bool = False
    """Wrap the model in `torch.compile`."""
    num_workers: int = 0
    """DataLoader worker processes per rank (pinned memory and `non_blocking` copies on CUDA)."""
    bucket_cap_mb: int = 25
    """DDP gradient bucket size in MiB (`gradient_as_bucket_view` is on)."""
    on_nonfinite: str = "stop"
    """A NaN/inf loss or gradient: `stop` the job naming the step and rank, or `skip` the update."""
    max_consecutive_skips: int = 10
    """With `on_nonfinite: skip`: this many skipped updates in a row stop the job naming the step and rank (the run has
    diverged)."""
    peak_tflops: float = 0.0
    """Peak bf16 TFLOP/s of one GPU for the MFU estimate; 0: looked up from the device name (H100/H200, A100, L40S,
    A10G, L4)."""
    deterministic: bool = False
    """`torch.use_deterministic_algorithms(True)`: bitwise-reproducible runs, at some speed cost on GPUs."""
    tensorboard: bool = True
    """Rank 0 writes TensorBoard event files (loss, LR, grad norm, throughput, data-wait share, MFU, validation,
    checkpoint stalls) to `<model URI>/tensorboard/`, uploaded every log interval off the training thread."""
    strategy: str = "ddp"
    """`ddp` (a full model replica per rank) or `fsdp` (FSDP2: parameters, gradients and optimizer state sharded)."""
    activation_checkpointing: bool = False
    """Recompute each shard unit's activations (the GPT blocks) in backward: less memory, ~1/3 more compute."""

    def __post_init__(self) -> None:
        _require(self.epochs > 0, "train.epochs", self.epochs, "must be positive")
        _require(self.batch_size > 0, "train.batch_size", self.batch_size, "must be positive")
        _require(self.learning_rate > 0, "train.learning_rate", self.learning_rate, "must be positive")
        _require(self.weight_decay >= 0, "train.weight_decay", self.weight_decay, "must be >= 0")
        for name in ("max_steps", "warmup_steps", "num_workers"):
            _require(getattr(self, name) >= 0, f"train.{name}", getattr(self, name), "must be >= 0")
        for name in ("grad_accum_steps", "bucket_cap_mb", "max_consecutive_skips"):
            _require(getattr(self, name) >= 1, f"train.{name}", getattr(self, name), "must be >= 1")
        _require(self.grad_clip_norm >= 0, "train.grad_clip_norm", self.grad_clip_norm, "must be >= 0")
        _require(self.peak_tflops >= 0, "train.peak_tflops", self.peak_tflops, "must be >= 0")
        _require(
            self.seed >= 0,
            "train.seed",
            self.seed,
            "must be >= 0 (numpy's and torch's generators take no negative seed)",
        )
        for name, allowed in (
            ("lr_schedule", LR_SCHEDULES),
            ("precision", PRECISIONS),
            ("on_nonfinite", NONFINITE_POLICIES),
            ("strategy", STRATEGIES),
        ):
            _require(getattr(self, name) in allowed, f"train.{name}", getattr(self, name), f"must be one of {allowed}")
        _require(
            self.log_interval_steps > 0,
            "train.log_interval_steps",
            self.log_interval_steps,
            "must be positive",
        )


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    """Checkpoints in the object store, and automatic resume from the latest complete one."""

    enabled: bool = True
    """Write checkpoints (and resume from them)."""
    uri: str = ""
    """Run-scoped checkpoint prefix; empty: `<model URI>/checkpoints` (a retried step finds it again)."""
    interval_steps: int = 0
    """Also checkpoint every this many optimizer steps; 0: no step-based checkpoints (only `at_epoch_end`)."""
    at_epoch_end: bool = True
    """Checkpoint at the end of every epoch."""
    keep_last: int = 2
    """Complete checkpoints kept; older ones, and partial ones left by killed writers, are deleted."""
    resume: bool = True
    """At start, resume from the latest complete checkpoint under the prefix (`uri`) when one exists."""

    def __post_init__(self) -> None:
        if self.uri:
            try:
                parse_uri(self.uri)
            except ValueError as exc:
                raise ConfigError(f"checkpoint.uri: {exc}") from None
        _require(self.interval_steps >= 0, "checkpoint.interval_steps", self.interval_steps, "must be >= 0")
        _require(self.keep_last >= 1, "checkpoint.keep_last", self.keep_last, "must be >= 1")


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """The distributed job: one Master and `replicas - 1` Workers, like a PyTorchJob."""

    replicas: int = 2
    """Replicas in total: 1 Master + (replicas - 1) Workers (pods on a cluster, process groups locally)."""
    nproc_per_node: int = 1
    """Training processes per replica (GPUs per node on a cluster)."""
    image: str = "ghcr.io/kftrain/kftrain:0.1.0"
    """Container image of the training replicas (it has kftrain installed); the other steps run the image set in
    `components/image.py`."""
    timeout_seconds: int = 3600
    """Wall-clock limit of the training job; past it the job is cancelled and the step fails."""
    omp_num_threads: int = 1
    """`OMP_NUM_THREADS` of each training process (CPU threads for intra-op parallelism)."""
    collective_timeout_seconds: int = 1800
    """A collective (all-reduce, barrier) that waits longer than this fails the job instead of hanging."""
    nccl_heartbeat_timeout_seconds: int = 600
    """`TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`: a rank whose NCCL watchdog is stuck this long is aborted."""
    nccl_debug: str = ""
    """`NCCL_DEBUG` of every process (`VERSION`, `WARN`, `INFO`, `TRACE`); empty: NCCL's default."""
    kind: str = "pytorchjob"
    """`pytorchjob` (Training Operator v1), `trainjob` (Kubeflow Trainer v2), or `auto`: a TrainJob where the cluster
    serves one, else a PyTorchJob (locally: the PyTorchJob contract)."""

    def __post_init__(self) -> None:
        _require(self.kind in JOB_KINDS, "job.kind", self.kind, f"must be one of {JOB_KINDS}")
        _require(self.replicas >= 1, "job.replicas", self.replicas, "must be at least 1 (the Master)")
        _require(self.nproc_per_node >= 1, "job.nproc_per_node", self.nproc_per_node, "must be >= 1")
        _require(bool(self.image.strip()), "job.image", self.image, "must not be empty")
        _require(self.timeout_seconds > 0, "job.timeout_seconds", self.timeout_seconds, "must be > 0")
        _require(self.omp_num_threads >= 1, "job.omp_num_threads", self.omp_num_threads, "must be >= 1")
        for name in ("collective_timeout_seconds", "nccl_heartbeat_timeout_seconds"):
            _require(getattr(self, name) > 0, f"job.{name}", getattr(self, name), "must be > 0")

    @property
    def world_size(self) -> int:
        """Training processes in the whole job."""
        return self.replicas * self.nproc_per_node


@dataclass(kw_only=True, slots=True)
class ElasticConfig:
    """Elastic training (torchrun c10d rendezvous): Workers only, between min and max replicas."""

    enabled: bool = False
    """Run an elastic job: Worker replicas only (no Master), torchrun c10d rendezvous; the local launcher runs
    `job.replicas` statically."""
    min_replicas: int = 1
    """Fewest replicas the job keeps running with."""
    max_replicas: int = 1
    """Most replicas the job scales to."""
    max_restarts: int = 3
    """torchrun restarts of the worker group before the job fails."""

    def __post_init__(self) -> None:
        _require(self.min_replicas >= 1, "kubernetes.elastic.min_replicas", self.min_replicas, "must be >= 1")
        _require(
            self.max_replicas >= self.min_replicas,
            "kubernetes.elastic.max_replicas",
            self.max_replicas,
            f"must be >= min_replicas ({self.min_replicas})",
        )
        _require(self.max_restarts >= 0, "kubernetes.elastic.max_restarts", self.max_restarts, "must be >= 0")


@dataclass(kw_only=True, slots=True)
class KubernetesConfig:
    """How the training job runs on a cluster, as a PyTorchJob or a TrainJob (ignored by the local launcher)."""

    namespace: str = ""
    """Namespace of the job; empty: the launcher pod's own, read at run time (never frozen at compile time)."""
    gpus_per_node: int = 0
    """`nvidia.com/gpu` limit of each replica; when set it must equal `job.nproc_per_node`."""
    cpu: str = ""
    """CPU request and limit of each replica (a Kubernetes quantity, e.g. `8` or `7500m`)."""
    memory: str = ""
    """Memory request and limit of each replica (e.g. `64Gi`)."""
    shm_size: str = "2Gi"
    """Size of the memory-backed `/dev/shm` volume (DataLoader workers and NCCL need more than 64M); empty: none."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """Pod tolerations, as in a pod spec (`key`, `operator`, `value`, `effect`)."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Pod nodeSelector labels."""
    affinity: dict[str, Any] = field(default_factory=dict)
    """Pod affinity, as in a pod spec."""
    priority_class: str = ""
    """`priorityClassName` of the replica pods (and of the gang-scheduling policy when one is set)."""
    service_account: str = ""
    """`serviceAccountName` of the replica pods; empty: the namespace's `default`."""
    image_pull_secrets: list[str] = field(default_factory=list)
    """Names of Secrets used to pull the image."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels on the job (PyTorchJob or TrainJob) and its pods."""
    annotations: dict[str, str] = field(default_factory=dict)
    """Annotations on the job (PyTorchJob or TrainJob) and its pods."""
    queue: str = ""
    """Kueue LocalQueue: sets the `kueue.x-k8s.io/queue-name` label on the job."""
    min_available: int = 0
    """Gang scheduling (`schedulingPolicy.minAvailable`; Volcano / scheduler-plugins): pods that must start together; 0:
    not set."""
    scheduling_queue: str = ""
    """Gang-scheduler queue (`schedulingPolicy.queue`), e.g. a Volcano queue."""
    schedule_timeout_seconds: int = 0
    """Gang-scheduling timeout (`schedulingPolicy.scheduleTimeoutSeconds`); 0: not set."""
    clean_pod_policy: str = "Running"
    """Pods deleted when the job ends: `Running` (frees GPUs, keeps logs of failures), `All`, `None`."""
    ttl_seconds_after_finished: int = 86400
    """The job object is deleted this long after it finished."""
    active_deadline_seconds: int = 0
    """Server-side deadline of the job; 0: `job.timeout_seconds`, so a job outliving its launcher still stops."""
    backoff_limit: int = 3
    """Pod restarts before the job is marked Failed."""
    restart_policy: str = "OnFailure"
    """Replica `restartPolicy`: `OnFailure`, `ExitCode` (exit 1-127 permanent, 128-255 retried), `Never`, `Always`."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Elastic training settings."""
    store_secret: str = KFP_STORE_SECRET
    """Secret with the object-store keys, given to every replica as environment variables through `secretKeyRef`."""
    store_secret_keys: dict[str, str] = field(default_factory=lambda: dict(KFP_STORE_SECRET_KEYS))
    """Key in `store_secret` -> the environment variable it fills."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra non-secret environment of the replicas; credential-looking names (`*SECRET*`, `*_TOKEN`, `*_PASSWORD`, ...)
    and values are refused."""
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """Extra pod volumes, as in a pod spec (`name` plus one source: `persistentVolumeClaim`, `secret`, ...)."""
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    """Mounts of `volumes` in the training container, as in a pod spec (`name`, `mountPath`, `readOnly`)."""
    pending_timeout_seconds: int = 900
    """A replica pod Pending longer than this fails the step with its events (quota, image pull)."""
    poll_seconds: float = 5.0
    """How often the launcher checks the job's status."""
    api_retry_budget_seconds: float = 300.0
    """How long one Kubernetes API call retries transient errors (5xx, 429, connection) before the step fails."""
    queue_timeout_seconds: int = 0
    """Longest a job may wait in a queue (Kueue, gang scheduler) before admission; 0: no limit."""
    runtime: str = "torch-distributed"
    """The ClusterTrainingRuntime a TrainJob runs on (`job.kind: trainjob`); ignored by PyTorchJobs."""

    def __post_init__(self) -> None:
        p = "kubernetes"
        _require(
            len(self.runtime) <= 253 and bool(_DNS_1123.match(self.runtime)),
            f"{p}.runtime",
            self.runtime,
            "must name a ClusterTrainingRuntime (a DNS-1123 subdomain of at most 253 characters)",
        )
        if self.namespace:
            _require(
                bool(_DNS_1123.match(self.namespace)),
                f"{p}.namespace",
                self.namespace,
                "must be a DNS-1123 label",
            )
        _require(self.gpus_per_node >= 0, f"{p}.gpus_per_node", self.gpus_per_node, "must be >= 0")
        for name in ("cpu", "memory", "shm_size"):
            value = getattr(self, name)
            _require(
                not value or bool(_QUANTITY.match(value)),
                f"{p}.{name}",
                value,
                "must be a Kubernetes quantity such as 8, 500m, 64Gi",
            )
        for i, tol in enumerate(self.tolerations):
            _require(isinstance(tol, dict), f"{p}.tolerations[{i}]", tol, "must be a mapping")
        for name in ("labels", "node_selector"):
            for key, value in getattr(self, name).items():
                _require(
                    len(value) <= 63 and bool(_LABEL_VALUE.match(value)),
                    f"{p}.{name}.{key}",
                    value,
                    "must be a label value (<= 63 alphanumerics, '-', '_', '.')",
                )
        _require(
            self.clean_pod_policy in CLEAN_POD_POLICIES,
            f"{p}.clean_pod_policy",
            self.clean_pod_policy,
            f"must be one of {CLEAN_POD_POLICIES}",
        )
        _require(
            self.restart_policy in RESTART_POLICIES,
            f"{p}.restart_policy",
            self.restart_policy,
            f"must be one of {RESTART_POLICIES}",
        )
        for name in (
            "min_available",
            "schedule_timeout_seconds",
            "ttl_seconds_after_finished",
            "active_deadline_seconds",
            "backoff_limit",
        ):
            _require(getattr(self, name) >= 0, f"{p}.{name}", getattr(self, name), "must be >= 0")
        _require(
            self.pending_timeout_seconds > 0,
            f"{p}.pending_timeout_seconds",
            self.pending_timeout_seconds,
            "must be > 0",
        )
        _require(self.poll_seconds > 0, f"{p}.poll_seconds", self.poll_seconds, "must be > 0")
        _require(
            self.api_retry_budget_seconds > 0,
            f"{p}.api_retry_budget_seconds",
            self.api_retry_budget_seconds,
            "must be > 0",
        )
        _require(
            self.queue_timeout_seconds >= 0,
            f"{p}.queue_timeout_seconds",
            self.queue_timeout_seconds,
            "must be >= 0 (0: no limit)",
        )
        _require(
            bool(self.store_secret_keys),
            f"{p}.store_secret_keys",
            self.store_secret_keys,
            "must not be empty",
        )
        check_plain_env(
            self.env, f"{p}.env", f"{p}.store_secret and {p}.store_secret_keys map Secret keys to variables"
        )
        self._check_volumes()

    def _check_volumes(self) -> None:
        """Names the API server would reject only after the job was created (a mount of an unknown
        volume, a duplicate name, a clash with our `/dev/shm` volume) fail here instead."""
        p = "kubernetes"
        names: list[str] = []
        for i, vol in enumerate(self.volumes):
            _require(
                isinstance(vol, dict) and bool(vol.get("name")),
                f"{p}.volumes[{i}]",
                vol,
                "must be a mapping with a name",
            )
            _require(
                vol["name"] not in names, f"{p}.volumes[{i}].name", vol["name"], "must be unique among the volumes"
            )
            _require(
                not (self.shm_size and vol["name"] == SHM_VOLUME),
                f"{p}.volumes[{i}].name",
                vol["name"],
                "is the name of kftrain's /dev/shm volume (kubernetes.shm_size); choose another",
            )
            names.append(vol["name"])
        for i, mount in enumerate(self.volume_mounts):
            where = f"{p}.volume_mounts[{i}]"
            _require(
                isinstance(mount, dict) and bool(mount.get("name")) and bool(mount.get("mountPath")),
                where,
                mount,
                "must be a mapping with `name` and `mountPath` (pod-spec spelling)",
            )
            _require(
                mount["name"] in names, f"{where}.name", mount["name"], f"must name one of kubernetes.volumes {names}"
            )


@dataclass(kw_only=True, slots=True)
class Config:
    """The whole kftrain configuration: one YAML file, one section per concern."""

    task: str = "classification"
    """`classification`, `causal_lm` (a GPT over bytes), or your own as `package.module:TaskClass`."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Object store for every artifact."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data preparation."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model architecture."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Training loop."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and resume."""
    job: JobConfig = field(default_factory=JobConfig)
    """Distributed job shape and limits."""
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """Cluster settings of the training job (PyTorchJob or TrainJob)."""

    def _check_partitions(self) -> None:
        """A fixed data.partitions must cut every epoch exactly at each world size the job can have."""
        elastic = self.kubernetes.elastic
        nodes = range(elastic.min_replicas, elastic.max_replicas + 1) if elastic.enabled else [self.job.replicas]
        worlds = [n * self.job.nproc_per_node for n in nodes]
        workers = max(1, self.train.num_workers)
        if self.data.partitions:
            for world in worlds:
                micro = self.train.batch_size // (world * self.train.grad_accum_steps)
                problem = partition_problem(self.data.partitions, world * workers, micro)
                _require(not problem, "data.partitions", self.data.partitions, problem)

    def __post_init__(self) -> None:
        _require(
            self.task in BUILTIN_TASKS or ":" in self.task,
            "task",
            self.task,
            f"must be one of {BUILTIN_TASKS} or an import path `package.module:TaskClass`",
        )
        per_step = self.job.world_size * self.train.grad_accum_steps
        _require(
            self.train.batch_size % per_step == 0,
            "train.batch_size",
            self.train.batch_size,
            f"must divide by the world size {self.job.world_size} "
            f"(job.replicas {self.job.replicas} x job.nproc_per_node {self.job.nproc_per_node})"
            + (f" x train.grad_accum_steps {self.train.grad_accum_steps}" if self.train.grad_accum_steps > 1 else ""),
        )
        if self.data.source in ("digits", "python-stdlib"):
            expected = "digits" if self.task == "classification" else "python-stdlib"
            _require(
                self.data.source == expected or self.task not in BUILTIN_TASKS,
                "data.source",
                self.data.source,
                f"is not a {self.task} source; use {expected!r} or a file URI",
            )
        gpus = self.kubernetes.gpus_per_node
        _require(
            gpus in (0, self.job.nproc_per_node),
            "kubernetes.gpus_per_node",
            gpus,
            f"must equal job.nproc_per_node ({self.job.nproc_per_node}): one training process per GPU",
        )
        elastic = self.kubernetes.elastic
        if elastic.enabled:
            _require(
                elastic.min_replicas <= self.job.replicas <= elastic.max_replicas,
                "job.replicas",
                self.job.replicas,
                f"must lie within kubernetes.elastic min_replicas..max_replicas "
                f"({elastic.min_replicas}..{elastic.max_replicas}) for an elastic job",
            )
            # The job re-forms at any size in the range, and the global batch stays exact at each.
            sizes = [n * self.job.nproc_per_node for n in range(elastic.min_replicas, elastic.max_replicas + 1)]
            bad = [w for w in sizes if self.train.batch_size % (w * self.train.grad_accum_steps)]
            unit = math.lcm(*sizes) * self.train.grad_accum_steps
            _require(
                not bad,
                "train.batch_size",
                self.train.batch_size,
                f"must divide by every world size the elastic range allows ({', '.join(map(str, sizes))} ranks"
                + (
                    f" x train.grad_accum_steps {self.train.grad_accum_steps}"
                    if self.train.grad_accum_steps > 1
                    else ""
                )
                + f"), but not by {', '.join(map(str, bad))}: use a multiple of {unit}",
            )
        self._check_partitions()


def partition_problem(partitions: int, readers: int, micro_batch: int) -> str:
    """Why `partitions` cannot cut an epoch exactly among `readers` (world size x DataLoader
    workers) at `micro_batch` items per rank and micro-step, or ''. The streaming reader and the
    config check share this rule."""
    if partitions % readers:
        return f"is not a multiple of the {readers} readers (world size x DataLoader workers)"
    if micro_batch % (partitions // readers):
        return (
            f"gives each of the {readers} readers {partitions // readers} partitions, which the per-rank "
            f"micro-batch of {micro_batch} items does not divide by"
        )
    return ""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the annotation `tp` and build nested dataclasses."""
    origin = typing.get_origin(tp)
    if tp is Any:  # free-form Kubernetes structures (affinity, tolerations): the schema checks them
        return value
    if dataclasses.is_dataclass(tp):
        _require(isinstance(value, dict), path, value, "must be a mapping")
        return from_dict(tp, value, path)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(value, inner, path)
    if origin is list:
        _require(isinstance(value, list), path, value, "must be a list")
        (inner,) = typing.get_args(tp)
        return [_convert(v, inner, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _require(isinstance(value, dict), path, value, "must be a mapping")
        key_t, val_t = typing.get_args(tp)
        return {_convert(k, key_t, f"{path} key"): _convert(v, val_t, f"{path}.{k}") for k, v in value.items()}
    if tp is float:
        # YAML reads `1e-3` as a string and `1` as an int: both are meant as floats.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        _require(
            isinstance(value, int | float) and not isinstance(value, bool),
            path,
            value,
            "must be a number",
        )
        # NaN passes every `>= 0` check (all comparisons are false only for `<`), and inf
        # crashes far away from the config: refuse both here, for every float field at once.
        _require(math.isfinite(value), path, value, "must be a finite number (not nan or inf)")
        return float(value)
    if tp is int:
        _require(
            isinstance(value, int) and not isinstance(value, bool),
            path,
            value,
            "must be an integer",
        )
        return value
    if tp is bool:
        _require(isinstance(value, bool), path, value, "must be true or false")
        return value
    if tp is str:
        _require(isinstance(value, str), path, value, "must be a string")
        return value
    raise TypeError(f"{path}: unsupported annotation {_type_name(tp)}")  # a bug in this module


def from_dict(cls: type, data: dict[str, Any], path: str = "") -> Any:
    """Build the dataclass `cls` from a plain mapping; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"{prefix}{unknown[0]}: unknown key (valid keys in {path or 'the top level'}: {', '.join(sorted(names))})"
        )
    kwargs = {k: _convert(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{path or 'config'}: {exc}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """The plain-mapping form of a config (the inverse of :func:`from_dict`)."""
    return dataclasses.asdict(cfg)


def parse_config(text: str, overrides: dict[str, Any] | None = None, origin: str = "config") -> Config:
    """Build a :class:`Config` from YAML (or JSON) text and dotted overrides.

    `overrides` maps dotted keys to values, e.g. ``{"job.replicas": 3}``; they win over the text.
    """
    try:
        loaded = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML: {exc}") from None
    if loaded is None:
        loaded = {}
    _require(isinstance(loaded, dict), origin, type(loaded).__name__, "must hold a mapping")
    data: dict[str, Any] = loaded
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            _require(isinstance(node, dict), p, node, "must be a mapping")
        node[leaf] = value
    return from_dict(Config, data)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load a YAML config file (the defaults when `path` is None) and apply dotted overrides."""
    text = ""
    if path is not None:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"--config {path}: cannot read the config file ({reason}); pass a YAML file") from None
    return parse_config(text, overrides, origin=str(path or "config"))


def config_to_json(cfg: Config, exclude: tuple[str, ...] = ()) -> str:
    """A compact JSON form (without the `exclude` sections, which then take their defaults)."""
    data = {k: v for k, v in to_dict(cfg).items() if k not in exclude}
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def config_from_json(text: str) -> Config:
    """Inverse of :func:`config_to_json`, with the same validation as YAML."""
    return from_dict(Config, json.loads(text))
