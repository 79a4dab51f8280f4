"""The one configuration tree of kftrain, loaded 1:1 from YAML.

Every section is a dataclass; every field has a short docstring (the string literal below it),
from which docs/configuration.md is generated (`python -m trainer.config_docs`). Unknown keys,
wrong types and bad values raise :class:`ConfigError` naming the dotted field and the value,
before any process, pod or upload starts.

The bounds of single fields are declared in a table beside each dataclass (`_TRAIN_BOUNDS`, ...:
field name -> :class:`Bound`) and checked by one loop, :func:`check_bounds`; `__post_init__`
keeps only what a table cannot say (URIs, rules across fields, per-item checks of lists and maps).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer import k8s_formats as k8s
from trainer.credentials import credential_in, credential_path, looks_like_credential, url_has_userinfo
from trainer.errors import KftrainError, redact, redact_url, yaml_problem
from trainer.image import IMAGE
from trainer.launch.failures import DEFAULT_MAX_RESTARTS, budget_check
from trainer.partitions import partition_problem
from trainer.storage import (
    RetryPolicy,
    endpoint_problem,
    file_uri_problem,
    hidden_character_problem,
    region_problem,
    same_place,
    typed_location_problem,
)
from trainer.tokenizer import parse_spec as parse_tokenizer_spec
from trainer.yaml_scalars import unquoted_problem

#: `job.nccl_debug`: the levels NCCL's `ncclDebugInit` recognises (ignoring case; any other value
#: leaves NCCL's logging off without a word); empty: unset.
NCCL_DEBUG_LEVELS = ("", "VERSION", "WARN", "INFO", "ABORT", "TRACE")
BUILTIN_TASKS = ("classification", "causal_lm")
#: What every epoch's record holds for a built-in task (what `checkpoint.keep_best` may rank):
#: train_loss, and what the task's `validate` reports (tests/unit/test_train.py holds each task to it).
EPOCH_METRICS = {
    "classification": ("train_loss", "val_accuracy"),
    "causal_lm": ("train_loss", "val_loss", "val_perplexity"),
}
PRECISIONS = ("auto", "fp32", "bf16")
LR_SCHEDULES = ("constant", "cosine")
NONFINITE_POLICIES = ("stop", "skip")
#: `train.strategy`: replicate the model on every rank (DDP) or shard it (FSDP2, `fully_shard`).
STRATEGIES = ("ddp", "fsdp")
DATA_FORMATS = ("auto", "text", "jsonl", "chat")
TRAIN_METHODS = ("full", "lora")
#: The replica `restartPolicy`s a training job can end under: `Always` restarts a replica that
#: finished (exit 0) too, so the job never succeeds and resumes until its deadline.
RESTART_POLICIES = ("OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("None", "Running", "All")
#: `job.kind`: the Kubeflow job the launcher creates on a cluster (`auto`: whichever is served,
#: resolved by the backend: the cluster's API discovery, locally pytorchjob). The one list of them.
PYTORCHJOB, TRAINJOB, AUTO = "pytorchjob", "trainjob", "auto"
JOB_KINDS = (PYTORCHJOB, TRAINJOB, AUTO)
#: Default of `data.cache_bytes`, each reader's cache of prefetched shards (:class:`trainer.streaming.ShardCache`).
SHARD_CACHE_BYTES = 512 * 2**20
#: The memory-backed volume kftrain mounts at /dev/shm (`kubernetes.shm_size`).
SHM_VOLUME = "dshm"


#: KFP's own artifact-store Secret and the variables its keys fill: the default everywhere.
KFP_STORE_SECRET = "mlpipeline-minio-artifact"
KFP_STORE_SECRET_KEYS = {"accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}
#: The Hugging Face Hub token: the variable `hf://` models read, and its key in `kubernetes.hf_token_secret`.
HF_TOKEN = "HF_TOKEN"
#: The Secret with that token a pipeline's step pods mount (optionally) unless its `hf_token_secret` parameter
#: names another: a pipeline run's `kubernetes.hf_token_secret` when the user sets neither.
KFP_HF_TOKEN_SECRET = "hf-token"


class ConfigError(KftrainError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


#: Fields whose values may be credentials: an error about one of them (or anything inside it)
#: says what kind of value it got, never the value (`check_plain_env` names what to do instead).
_UNSHOWN_VALUES = ("kubernetes.env", "kubernetes.extra_env")
#: The longest duration any `*_seconds` field takes: a year. Longer is a slip of the keyboard, and
#: past it lie the limits of datetime, sleep and the operators' deadlines (an overflow far away).
MAX_SECONDS = 366 * 24 * 3600
#: Integers go to Kubernetes (int64 fields) and torch (int64 tensors): nothing wider fits.
_INT64_LIMIT = 2**63
#: The largest count a manifest takes (the API server's int32).
_INT32_MAX = 2**31 - 1


def _shown(path: str, value: Any) -> str:
    """`value` as an error shows it: its repr, or only its kind where it may be a credential."""
    if not path.startswith(_UNSHOWN_VALUES):
        return k8s.show(value, limit=100)
    if isinstance(value, dict):
        return f"a mapping with the keys {sorted(map(str, value))} (values not shown: they may be credentials)"
    return f"a value of type {type(value).__name__} (not shown: it may be a credential)"


def json_kind(value: Any) -> str:
    """The JSON name of `value`'s kind (`null`, `number`, `array`, ...), for messages about records
    and values that are not shown."""
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _require(ok: bool, path: str, value: Any, expectation: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: {expectation}, got {_shown(path, value)}")


@dataclass(frozen=True, slots=True)
class Bound:
    """A rule one field's value must meet, and how the error says so (`<field>: <expectation>, got <value>`)."""

    ok: Callable[[Any], bool]
    expectation: str


POSITIVE = Bound(lambda v: v > 0, "must be positive")
ABOVE_ZERO = Bound(lambda v: v > 0, "must be > 0")
NOT_NEGATIVE = Bound(lambda v: v >= 0, "must be >= 0")
AT_LEAST_ONE = Bound(lambda v: v >= 1, "must be >= 1")
NOT_EMPTY = Bound(bool, "must not be empty")
#: The least `kubernetes.ttl_seconds_after_finished`: time for the launcher to read the job's end.
MIN_TTL_SECONDS = 60
#: The most DataLoader worker processes per rank `train.num_workers` may ask for.
MAX_WORKERS = 128
#: The most processes data prep's one pool (`data.num_proc`) may ask for: more than a node's cores.
MAX_DATA_PROCS = 1024
#: The largest `train.bucket_cap_mb`: 64 GiB, more than a GPU holds.
MAX_BUCKET_MB = 65536
#: The largest `lora.rank`: wider than any layer of the supported families (past it, the adapters'
#: sizes overflow what torch can compute before the rank is compared with the layers).
MAX_LORA_RANK = 65536
#: The largest `kubernetes.gpu_memory_gb` (and `kftrain plan --gpu-memory`): far past any GPU.
MAX_GPU_MEMORY_GB = 100_000
#: A seed: numpy's generators take 0 to 2**32 - 1, and the trainer derives per-epoch and per-rank
#: seeds from it that must stay within torch's 64-bit seeds.
SEED = Bound(lambda v: 0 <= v < 2**32, "must be from 0 to 4294967295 (2**32 - 1), the seeds numpy and torch take")


#: The largest float32: a factor torch applies to float32 tensors must be within it (past it,
#: "value cannot be converted to type float without overflow", mid-run).
FLOAT32_MAX = 3.4028234663852886e38


def in_float32(bound: Bound) -> Bound:
    """`bound`, and within a float32's range (:data:`FLOAT32_MAX`)."""
    return Bound(
        lambda v: bound.ok(v) and abs(v) <= FLOAT32_MAX,
        f"{bound.expectation} and at most 3.4e38 (a float32's largest: torch applies it to float32 tensors)",
    )


def one_of(choices: tuple[str, ...]) -> Bound:
    """The value is one of `choices`."""
    return Bound(lambda v: v in choices, f"must be one of {choices}")


def check_bounds(cfg: Any, section: str, bounds: dict[str, Bound]) -> None:
    """Check the fields of `cfg` named in `bounds`, in order: one loop for every section's table;
    the first failure raises :class:`ConfigError` naming `section.field` and its value."""
    for name, bound in bounds.items():
        value = getattr(cfg, name)
        _require(bound.ok(value), f"{section}.{name}", value, bound.expectation)


def check_plain_env(env: dict[str, Any], path: str, secret_hint: str) -> None:
    """Refuse credentials in a plain (non-secret) environment mapping
    (:func:`trainer.credentials.credential_in` says what looks like one).

    The error names the variable, never the value, and says where credentials go instead
    (`secret_hint`).
    """
    for name, value in env.items():
        _require(isinstance(name, str) and bool(name), path, name, "variable names must be non-empty text")
        looks = credential_in(name, value)
        if looks:
            raise ConfigError(
                f"{path}.{k8s.plain(name)}: its {looks} looks like a credential, and plain environment is visible in "
                f"parameters, YAML and the job object; pass credentials from a Kubernetes Secret instead "
                f"({secret_hint})"
            )


#: Bounds of `store.*` fields (checked by :func:`check_bounds`).
_STORE_BOUNDS = {
    "retry_budget_seconds": NOT_NEGATIVE,
    "connect_timeout_seconds": ABOVE_ZERO,
    "read_timeout_seconds": ABOVE_ZERO,
}


@dataclass(kw_only=True, slots=True)
class StoreConfig:
    """Where artifacts live: an object store (S3, MinIO, SeaweedFS) or a local directory."""

    uri: str = ""
    """Root for run artifacts (`s3://bucket/prefix`, `minio://bucket/prefix`, a path); empty: KFP's pipeline root."""
    endpoint: str = ""
    """S3 endpoint URL (`http://host:9000`; `https://` for TLS); empty: env `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`,
    else KFP's in-cluster store (`http://seaweedfs.kubeflow:9000`) for `minio://` URIs and AWS S3 for `s3://`."""
    region: str = ""
    """S3 region; empty: env `AWS_REGION`, else the bucket's, asked of the server
    (`s3:GetBucketLocation`; us-east-1, MinIO's and Ceph's default, where the policy denies it)."""
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
        check_bounds(self, "store", _STORE_BOUNDS)
        if self.uri:
            check_uri("store.uri", self.uri)
        if self.endpoint and (problem := endpoint_problem(self.endpoint)):
            shown = k8s.show(self.endpoint) if looks_like_credential(self.endpoint) else repr(redact_url(self.endpoint))
            raise ConfigError(f"store.endpoint: {shown} {problem}")  # never a password
        if self.region and (problem := region_problem(self.region)):
            raise ConfigError(f"store.region: {problem}")  # was: found by the store check, under store.uri's name


# Above 0: evaluation and the quality gate read each held-out split, which may not be empty.
_FRACTION = Bound(lambda v: 0.0 < v < 0.5, "must be above 0 and below 0.5 (each split holds some rows)")
#: Bounds of `data.*` fields.
_DATA_BOUNDS = {
    "val_fraction": _FRACTION,
    "test_fraction": _FRACTION,
    "shard_rows": POSITIVE,
    "partitions": NOT_NEGATIVE,
    "cache_bytes": POSITIVE,
    "eval_items": POSITIVE,
    "eval_prompts": Bound(lambda v: all(isinstance(p, str) and p.strip() for p in v), "must list non-empty prompts"),
    "eval_generations": Bound(lambda v: 0 <= v <= 16, "must be between 0 and 16"),
    "eval_new_tokens": Bound(lambda v: 1 <= v <= 512, "must be between 1 and 512"),
    # Each is a process of data prep (one pool, on one node): past this, a typo.
    "num_proc": Bound(lambda v: 1 <= v <= MAX_DATA_PROCS, f"must be from 1 to {MAX_DATA_PROCS} data-prep processes"),
    "text_field": NOT_EMPTY,
    "label_column": NOT_EMPTY,
    "max_bytes": NOT_NEGATIVE,
    "tokenizer_sample_bytes": POSITIVE,
    "seed": SEED,
    "format": one_of(DATA_FORMATS),
    "messages_field": NOT_EMPTY,
}


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Data preparation: the source table, the split and the shard layout."""

    source: str = ""
    """Classification: `digits` (scikit-learn's handwritten digits, bundled) or a CSV URI; causal_lm: `python-stdlib`
    (Python's own library source), a text or JSON Lines object, or a prefix holding many (`s3://bucket/corpus/`); empty:
    the task's default."""
    source_version: str = ""
    """Set by the pipeline's configure step; leave it empty: a digest of what data prep reads from a store (the source's
    objects, a `data.tokenizer` file and a local or S3 base model's tokenizer files and config.json: their sizes and
    ETags, or a local file's modification time) when the run started; for causal_lm also the version of how data
    prep makes tokens of text. A source changed in place, or a kftrain whose data prep makes other tokens of it,
    changes it, so KFP's cache prepares the data again (was: a cached dataset of the old data, in silence). An
    `hf://` base is named by its `@revision`: without one, a cached dataset keeps the commit it was prepared with."""
    label_column: str = "label"
    """For a CSV source: the column holding the class label; every other column is a numeric feature (finite, within
    float32's range). Labels are stripped of surrounding whitespace and numbers compare as numbers: `1`, `1.0` and ` 1`
    are one class `1`; other labels are kept as written, case included. An empty label, or one that marks a missing
    value (`NaN`, `NA`, `N/A`, `NULL`, ...), is an error."""
    val_fraction: float = 0.1
    """Share of rows held out for validation during training (of a classification table's rows of
    each class, exactly; of a text source's bytes; of chat conversations, each drawn by a hash of its
    place and `data.seed`, so about this share); above 0 and below 0.5."""
    test_fraction: float = 0.2
    """Share of rows held out for the final evaluation (counted as for `data.val_fraction`); above 0 and below 0.5."""
    seed: int = 0
    """Seed of the stratified split, so the same source always gives the same shards."""
    partitions: int = 0
    """Parts each epoch's item order is cut into; 0: one per reader (world size x DataLoader workers).
    Fix it (a multiple of every world size) so any world size trains on the same global batches."""
    cache_bytes: int = SHARD_CACHE_BYTES
    """Each reader's cache of prefetched training shards, in bytes (consumed shards are dropped)."""
    eval_items: int = 2048
    """Validation and evaluation read at most this many items (rows, or windows of `model.block_size` tokens): the first
    ones in shard order."""
    eval_prompts: list[str] = field(default_factory=list)
    """`model.init_from`: prompts the evaluation report shows continued by the base model and by the fine-tuned one,
    side by side (greedy decoding: the same text every run); with `data.format: chat` each is one user message in the
    model's chat template. Empty: the test split's first prompts (text: its first 32 tokens of a window)."""
    eval_generations: int = 3
    """`model.init_from`: the evaluation generates for at most this many prompts (0: none; a full fine-tune then
    scores no base model either, holding one model in memory, not two)."""
    eval_new_tokens: int = 32
    """`model.init_from`: each generation is at most this many new tokens (it stops early at end of sequence, and
    is shorter where the prompt and this many would pass the model's context)."""
    text_field: str = "text"
    """causal_lm, JSON Lines sources: the field of each record that holds its text."""
    num_proc: int = 1
    """causal_lm data prep: processes that tokenize in parallel (a BPE, a tokenizer.json or chat data; `bytes` ignores
    it), 1 to 1024."""
    shard_rows: int = 512
    """Rows per shard file (causal_lm: `shard_rows` x 1024 tokens per shard; `data.format: chat`: conversations)."""
    max_bytes: int = 4_000_000
    """causal_lm: at most this many bytes of text are tokenised (0: all); for a pretrained model, whole records with
    their special tokens, and a text object as far as it fits."""
    tokenizer: str = "bytes"
    """causal_lm: `bytes` (id = byte value, no special token), `bpe:<vocab_size>` (a byte-level BPE of at most
    `vocab_size` tokens, 258..1048576, trained with Hugging Face `tokenizers` during data prep, `<|endoftext|>` its
    special token; fewer, with a warning, where the text holds fewer merges) or the URI of a Hugging Face
    `tokenizer.json`. The model's vocabulary follows the tokenizer."""
    tokenizer_sample_bytes: int = 20_000_000
    """causal_lm, `bpe:<vocab_size>`: BPE training reads at most this many bytes of the source."""
    format: str = "auto"
    """causal_lm: how the source reads. `text` (plain text), `jsonl` (the `text_field` of each JSON Lines record),
    `chat` (JSON Lines records of OpenAI-style `messages`, rendered with the model's chat template, the loss on
    assistant tokens only: needs `model.init_from`); `auto`: `jsonl` for `.jsonl`/`.json` objects, else `text`."""
    messages_field: str = "messages"
    """`data.format: chat`: the field of each record that holds its list of `{role, content}` messages."""

    def __post_init__(self) -> None:
        if self.source not in ("", "digits", "python-stdlib"):
            check_uri("data.source", self.source)
        check_bounds(self, "data", _DATA_BOUNDS)
        try:
            parse_tokenizer_spec(self.tokenizer)
        except ValueError as exc:
            raise ConfigError(f"data.tokenizer: {exc}") from None


#: Bounds of `model.*` fields.
def _up_to(top: int, scale: str) -> Bound:
    """Positive and at most `top`: past the largest models trained (`scale`), a value is a typo, and
    building or planning a model of it would run for hours or out of memory first."""
    return Bound(lambda v: 0 < v <= top, f"must be 1 to {top:,} ({scale})")


_MODEL_BOUNDS = {
    "n_layer": _up_to(1024, "the largest models have about 130 blocks"),
    "n_head": _up_to(1024, "the largest models have about 128 heads"),
    "n_embd": _up_to(65536, "the largest models are about 16,384 wide"),
    "block_size": _up_to(1 << 20, "a million tokens: the longest contexts models are built for"),
    "hidden_sizes": Bound(
        lambda v: 0 < len(v) <= 1024 and all(0 < h <= 1 << 20 for h in v),
        "must be a non-empty list of at most 1,024 widths, each 1 to 1,048,576",
    ),
    "dropout": Bound(lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
}
#: causal_lm fields a pretrained model (`model.init_from`) defines itself, with their defaults.
PRETRAINED_OWNS = ("n_layer", "n_head", "n_embd")


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
    """causal_lm: context length in tokens (GPT-2: 1024); with `init_from`, at most the model's own context length."""
    init_from: str = ""
    """causal_lm: start from a pretrained Hugging Face model instead of random weights: the URI of its folder
    (config.json, `*.safetensors`, tokenizer files) in the store (`s3://bucket/models/qwen3-0.6b/`, a local path), or
    `hf://org/name[@revision]` fetched from the Hugging Face Hub where the cluster has network (token: the `HF_TOKEN`
    environment variable, from the Secret `kubernetes.hf_token_secret`). Its architecture replaces
    `n_layer`/`n_head`/`n_embd` and its tokenizer replaces `data.tokenizer`; Llama, Qwen2/3, Mistral and GPT-2
    families."""
    trust_remote_code: bool = False
    """With `init_from`: allow a model whose config.json asks for its own Python code (`auto_map`); off, such a model
    is refused (the code would run in every training pod)."""

    def __post_init__(self) -> None:
        check_bounds(self, "model", _MODEL_BOUNDS)
        _no_whitespace_around("model.init_from", self.init_from)
        if self.init_from[:5].lower() == "hf://" and not self.init_from.startswith("hf://"):
            raise ConfigError(
                f"model.init_from: {self.init_from!r}: write the Hugging Face scheme in lower case, "
                f"hf://{self.init_from[5:]}"
            )
        if self.init_from.startswith("hf://"):
            from trainer.pretrained import PretrainedError, parse_hf_uri

            try:
                parse_hf_uri(self.init_from)
            except PretrainedError as exc:
                raise ConfigError(str(exc)) from None
        elif self.init_from:
            check_uri("model.init_from", self.init_from)
        if self.init_from:
            defaults = ModelConfig()
            for name in PRETRAINED_OWNS:
                _require(
                    getattr(self, name) == getattr(defaults, name),
                    f"model.{name}",
                    getattr(self, name),
                    f"is defined by the pretrained model (model.init_from {self.init_from!r}); remove it",
                )
        _require(
            self.n_embd % self.n_head == 0,
            "model.n_embd",
            self.n_embd,
            f"must divide by model.n_head ({self.n_head})",
        )


#: Bounds of `train.*` fields.
_TRAIN_BOUNDS = {
    "epochs": POSITIVE,
    "batch_size": POSITIVE,
    # AdamW divides the learning rate by 1 - beta1 (0.1 at the first step) and applies it in
    # float32: past 1e37 that overflowed mid-run ("value cannot be converted to type float").
    "learning_rate": Bound(
        lambda v: 0 < v <= 1e37,
        "must be positive and at most 1e37 (AdamW divides it by 1 - beta1, 0.1, and applies it in float32)",
    ),
    "weight_decay": in_float32(NOT_NEGATIVE),
    "max_steps": NOT_NEGATIVE,
    "warmup_steps": NOT_NEGATIVE,
    # Each is a process per rank, with its own share of the data: past this, a typo (1000 forks per rank).
    "num_workers": Bound(lambda v: 0 <= v <= MAX_WORKERS, f"must be from 0 to {MAX_WORKERS} worker processes per rank"),
    "grad_accum_steps": AT_LEAST_ONE,
    # DDP holds the buckets in GPU memory and its reducer takes their size in bytes as an int64.
    "bucket_cap_mb": Bound(
        lambda v: 1 <= v <= MAX_BUCKET_MB, f"must be from 1 to {MAX_BUCKET_MB} MiB (a bucket larger than any GPU)"
    ),
    "max_consecutive_skips": AT_LEAST_ONE,
    "grad_clip_norm": in_float32(NOT_NEGATIVE),
    "peak_tflops": NOT_NEGATIVE,
    "lr_schedule": one_of(LR_SCHEDULES),
    "precision": one_of(PRECISIONS),
    "on_nonfinite": one_of(NONFINITE_POLICIES),
    "strategy": one_of(STRATEGIES),
    "method": one_of(TRAIN_METHODS),
    "log_interval_steps": POSITIVE,
    "straggler_factor": Bound(lambda v: v == 0 or v > 1, "must be 0 (off) or above 1 (a multiple of the median)"),
    "divergence_check_steps": NOT_NEGATIVE,
    "seed": SEED,
}


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """The optimisation loop run by every rank."""

    epochs: int = 20
    """Passes over the training split; with `max_steps` above 0, that decides instead (a warning says so)."""
    batch_size: int = 64
    """Global batch size, split evenly over all ranks (and `grad_accum_steps` micro-batches), so it must divide by the
    world size; every optimizer step uses a full global batch."""
    learning_rate: float = 0.003
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay (decoupled), applied to every trainable parameter, biases and norm weights included, as
    `torch.optim.AdamW(model.parameters())` does; Hugging Face's Trainer leaves those two out, so a recipe's value
    written for it decays them here too."""
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
    """`constant` or `cosine` (after the warm-up, a cosine from `learning_rate` down to 10% of it, the
    rate after the last step)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many steps."""
    precision: str = "auto"
    """`auto` (bf16 autocast on CUDA, fp32 on CPU), `bf16` or `fp32`."""
    compile: bool = False
    """Wrap the model in `torch.compile`."""
    num_workers: int = 0
    """DataLoader worker processes per rank (pinned memory and `non_blocking` copies on CUDA), at most 128. Each hands
    batches back through a Unix socket in the temporary folder, or, where that is too deep for a socket's path, in a
    folder of its own under /tmp."""
    bucket_cap_mb: int = 25
    """DDP gradient bucket size in MiB (`gradient_as_bucket_view` is on), 1 to 65536."""
    on_nonfinite: str = "stop"
    """A NaN/inf loss or gradient: `stop` the job naming the step and rank, or `skip` the update."""
    max_consecutive_skips: int = 10
    """With `on_nonfinite: skip`: this many skipped updates in a row stop the job naming the step and rank (the run has
    diverged)."""
    peak_tflops: float = 0.0
    """Peak TFLOP/s of one GPU for the MFU estimate; 0: the GPU type of the device's name, as `plan.gpu` knows them,
    at the run's precision (bf16 or fp32)."""
    deterministic: bool = False
    """`torch.use_deterministic_algorithms(True)`: bitwise-reproducible runs, at some speed cost on GPUs."""
    tensorboard: bool = True
    """Rank 0 writes TensorBoard event files (loss, LR, grad norm, throughput, data-wait share, MFU, validation,
    checkpoint stalls) to `<model URI>/tensorboard/`, uploaded every log interval off the training thread."""
    strategy: str = "ddp"
    """`ddp` (a full model replica per rank) or `fsdp` (FSDP2: parameters, gradients and optimizer state sharded)."""
    activation_checkpointing: bool = False
    """Recompute each shard unit's activations (the GPT blocks) in backward: less memory, ~1/3 more compute."""
    straggler_factor: float = 1.5
    """At every log interval the ranks share their step, data-wait and gradient-sync times; rank 0 names a rank (its
    pod and node) whose own time per step exceeds the median rank's by this factor; 0: off (docs/reliability.md)."""
    divergence_check_steps: int = 100
    """Every this many optimizer steps the DDP ranks compare a digest of their parameters and stop naming the step and
    the ranks that differ (replicas must stay equal); 0: off; not done under FSDP (each rank holds other shards)."""
    method: str = "full"
    """With `model.init_from`: `full` (every weight trains) or `lora` (the pretrained weights stay frozen and low-rank
    adapters train, see `lora`; checkpoints hold only the adapters and their optimizer state)."""

    def __post_init__(self) -> None:
        check_bounds(self, "train", _TRAIN_BOUNDS)
        _require(
            self.learning_rate * self.weight_decay < 1,
            "train.weight_decay",
            self.weight_decay,
            f"times train.learning_rate ({self.learning_rate:g}) must be below 1: AdamW multiplies every weight by "
            "1 - learning_rate * weight_decay at each step, so at 1 or more it zeroes or flips them",
        )


#: Bounds of `lora.*` fields.
_LORA_BOUNDS = {
    "rank": Bound(
        lambda v: 1 <= v <= MAX_LORA_RANK,
        f"must be from 1 to {MAX_LORA_RANK} (and at most the smaller side of each layer it adapts)",
    ),
    "alpha": in_float32(POSITIVE),
    "dropout": Bound(lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
    "target_modules": Bound(lambda v: all(isinstance(m, str) and m for m in v), "must list non-empty module names"),
}


@dataclass(kw_only=True, slots=True)
class LoraConfig:
    """Low-rank adapters (`train.method: lora`, with peft): `W x + (alpha / rank) B A x` on each target module."""

    rank: int = 8
    """Rank r of each adapter (A is r x in, B is out x r): at most the smaller side of each layer it adapts, and
    65536."""
    alpha: float = 16.0
    """Scale numerator: the adapter's output is multiplied by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=list)
    """Names (last path component) of the layers that get adapters, linear ones or the embeddings, e.g. `[q_proj,
    v_proj]`; empty: peft's default for the architecture (Llama/Qwen/Mistral: `q_proj`, `v_proj`; GPT-2: `c_attn`).
    peft's `all-linear` is not taken: list the layers."""

    def __post_init__(self) -> None:
        check_bounds(self, "lora", _LORA_BOUNDS)


#: Bounds of `export.*` fields.
_EXPORT_BOUNDS = {"max_shard_bytes": POSITIVE}


@dataclass(kw_only=True, slots=True)
class ExportConfig:
    """The export step's Hugging Face output of a fine-tuned pretrained model (`model.init_from`)."""

    max_shard_bytes: int = 5_000_000_000
    """Largest weights file of the exported Hugging Face folder: above it the weights are split into
    `model-00001-of-0000N.safetensors` files and `model.safetensors.index.json`, as `save_pretrained` does (5 GB,
    its default); a tensor larger than this gets a file of its own."""
    merge_lora: bool = False
    """With `train.method: lora`: also write the merged model (each adapted weight W + (alpha / rank) B A) as a full
    Hugging Face folder in `huggingface/`, for servers without LoRA support. Off: only the adapter (`adapter/`, a
    few MB) is written, served on the base model (deploy/serving/inferenceservice-vllm-lora.yaml)."""

    def __post_init__(self) -> None:
        check_bounds(self, "export", _EXPORT_BOUNDS)


#: The most nodes a plan predicts for, and the highest price per GPU-hour it takes: past them a
#: number is a typo, and the predictions would overflow (an infinite cost is not JSON).
MAX_PLAN_NODES = 100_000
MAX_GPU_HOUR_PRICE = 1e6
#: Bounds of `plan.*` fields.
_PLAN_BOUNDS = {
    "gpu": Bound(lambda v: v == v.strip(), "must be a GPU type without surrounding spaces, e.g. H100"),
    "nodes": Bound(
        lambda v: all(1 <= n <= MAX_PLAN_NODES for n in v) and len(set(v)) == len(v),
        f"must be a list of positive node counts up to {MAX_PLAN_NODES}, each given once, e.g. [1, 2, 4]",
    ),
    "price_per_gpu_hour": Bound(
        lambda v: 0 <= v <= MAX_GPU_HOUR_PRICE, f"must be >= 0 and <= {MAX_GPU_HOUR_PRICE:g} (0: no cost column)"
    ),
    "network_gbits": Bound(lambda v: 0 < v <= 100_000, "must be > 0 and <= 100000 Gb/s, e.g. 400 or 3200"),
}


@dataclass(kw_only=True, slots=True)
class PlanConfig:
    """The plan step (`kftrain plan`): memory per rank, step time, ETA, scaling and cost, predicted before training."""

    enabled: bool = False
    """Run the plan step before training: a Markdown and HTML plan of the run (memory per rank against the GPU's,
    step time, ETA, scaling over `nodes`, cost) and its numbers as KFP metrics. Off: the step only says so."""
    strict: bool = False
    """With `enabled`: stop the pipeline before training, with the reason, when the plan predicts the run does not
    fit in the GPU's memory or does not finish within `job.timeout_seconds`."""
    gpu: str = ""
    """GPU type to plan for (`H100-80GB`, `H100-PCIe-80GB`, `H100-NVL-94GB`, `H200-141GB`, `H200-NVL-141GB`,
    `A100-40GB`, `A100-80GB`, `A100-PCIe-40GB`, `A100-PCIe-80GB`, `L40S`, `L4`, `A10G`; `H100`,
    `H200` for short, any case, or the name nvidia-smi prints): its memory is the limit, unless
    `kubernetes.gpu_memory_gb` is set. Empty: the CPU."""
    nodes: list[int] = field(default_factory=list)
    """Node counts (replicas of `job.nproc_per_node` ranks) to predict scaling at, e.g. `[1, 2, 4, 8]`; empty:
    the job's `job.replicas` and the planner's default comparison points."""
    price_per_gpu_hour: float = 0.0
    """Price of one GPU for an hour, in any currency, for the cost column; 0: no cost."""
    network_gbits: float = 400.0
    """Network bandwidth of one node to the others, in Gb/s, its NICs together: 400 for one ConnectX-7, 3200 for a
    DGX/HGX H100 or H200 node's eight. Sets the time of collectives between nodes."""

    def __post_init__(self) -> None:
        check_bounds(self, "plan", _PLAN_BOUNDS)
        _require(
            self.enabled or not self.strict,
            "plan.strict",
            self.strict,
            "needs plan.enabled: true (the plan step is what refuses the run)",
        )


#: Bounds of `checkpoint.*` fields.
_CHECKPOINT_BOUNDS = {"interval_steps": NOT_NEGATIVE, "keep_last": AT_LEAST_ONE}
#: A run id, or a task's folder in a run (`checkpoint.resume_from: RUN/TASK`).
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def is_uri(value: str) -> bool:
    """Whether `checkpoint.resume_from` `value` is a URI or path (`s3://...`, `/...`, `./...`,
    `~/...`), not a run id: a run id never has `://` and never starts with `/`, `.` or `~`."""
    return "://" in value or value.startswith(("/", ".", "~"))


def check_uri(field: str, value: str) -> None:
    """ConfigError naming `field` when the store URI `value` is malformed, or starts or ends with
    whitespace: a space pasted along (`s3://bucket/runs `) would put everything under another
    prefix, or in a relative folder named ' ' instead of the absolute path typed; or when it holds
    a character or a name no store takes as typed (:func:`typed_location_problem`)."""
    _no_whitespace_around(field, value)
    try:
        problem = typed_location_problem(value) or file_uri_problem(value)
    except ValueError as exc:
        raise ConfigError(f"{field}: {exc}") from None
    if problem:
        raise ConfigError(f"{field} {k8s.show(redact_url(value), limit=200)} {problem}")


def _no_whitespace_around(field: str, value: str) -> None:
    if value != value.strip():
        raise ConfigError(f"{field}: {redact_url(value)!r} starts or ends with whitespace: remove it")


def check_resume_from(value: str) -> None:
    """ConfigError naming checkpoint.resume_from when `value` is neither a URI nor `RUN[/TASK]`."""
    _no_whitespace_around("checkpoint.resume_from", value)
    if is_uri(value):
        check_uri("checkpoint.resume_from", value)
        return
    parts = value.split("/")
    if len(parts) > 2 or not all(_RUN_NAME.fullmatch(p) for p in parts):
        raise ConfigError(
            f"checkpoint.resume_from {k8s.show(value)}: expected a run id (RUN, or RUN/TASK; letters, digits, '.', "
            "'_', '-'), a model URI or a checkpoint URI (s3://..., or a path starting with /, . or ~)"
        )


#: Metric-name endings whose direction `checkpoint.keep_best` knows without a `min:`/`max:` prefix.
LOWER_IS_BETTER = ("loss", "perplexity", "error")
HIGHER_IS_BETTER = ("accuracy", "f1", "precision", "recall")


def best_metric(spec: str) -> tuple[str, str] | None:
    """`checkpoint.keep_best` as `(direction, metric)`, direction `min` or `max`; None when empty.
    `min:NAME` / `max:NAME` say the direction; a bare name must end in a known one."""
    if not spec:
        return None
    direction, sep, name = spec.partition(":")
    if not sep:
        direction, name = "", spec
    name = name.strip()
    if sep and direction not in ("min", "max"):
        raise ConfigError(f"checkpoint.keep_best: the prefix must be `min:` or `max:`, got {k8s.show(spec)}")
    if not name:
        raise ConfigError(f"checkpoint.keep_best: name a validation metric, e.g. val_loss, got {k8s.show(spec)}")
    if not direction:
        if name.endswith(LOWER_IS_BETTER):
            direction = "min"
        elif name.endswith(HIGHER_IS_BETTER):
            direction = "max"
        else:
            raise ConfigError(
                f"checkpoint.keep_best: the direction of {k8s.show(name)} is unknown; write min:<metric> or "
                "max:<metric>"
            )
    return direction, name


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
    """Complete checkpoints of this run kept; its older ones, and partial ones left by killed writers, are deleted."""
    resume: bool = True
    """Resume from the latest complete checkpoint under `uri` when one exists (another run's: take the prefix over)."""
    owner: str = ""
    """The run that owns the prefix; empty: the training step's identity (`kftrain run --local`: the run id)."""
    resume_from: str = ""
    """Start from another run's latest committed checkpoint, read only: a run id (`RUN`, or `RUN/TASK` where the run
    trained several times) under `store.uri` (or the local output folder), a model URI, or a checkpoint URI (a prefix
    or one `step-N` folder); `kftrain runs` lists them. Used when this run's own prefix has no checkpoint yet."""
    keep_best: str = ""
    """Also keep the epoch-end checkpoint with the best value of this validation metric (e.g. `val_loss`,
    `val_accuracy`), whatever `keep_last` prunes; `min:NAME` / `max:NAME` give the direction, a bare name ending in
    loss/perplexity/error is minimised and in accuracy/f1/precision/recall maximised; empty: off."""
    export_best: bool = False
    """With `keep_best`: the model the run writes (which evaluation and export read) holds the best checkpoint's
    weights instead of the last step's. A run begun from another run's checkpoint (`resume_from`) ranks that run's
    checkpoints up to the one it began from with its own."""

    def __post_init__(self) -> None:
        best_metric(self.keep_best)
        if self.export_best and not self.keep_best:
            raise ConfigError("checkpoint.export_best: needs checkpoint.keep_best, the metric that picks the best")
        if self.uri:
            check_uri("checkpoint.uri", self.uri)
        if self.resume_from:
            check_resume_from(self.resume_from)
        if problem := hidden_character_problem(self.owner):
            raise ConfigError(f"checkpoint.owner {self.owner!r} {problem}")
        if self.resume_from and not self.enabled:
            raise ConfigError(
                "checkpoint.resume_from needs checkpoint.enabled: true (the run continues from a checkpoint)"
            )
        check_bounds(self, "checkpoint", _CHECKPOINT_BOUNDS)


#: Bounds of `job.*` fields.
_JOB_BOUNDS = {
    "kind": one_of(JOB_KINDS),
    # The manifests hold counts as the API server's int32.
    "replicas": Bound(lambda v: 1 <= v <= _INT32_MAX, f"must be from 1 (the Master) to {_INT32_MAX}"),
    "nproc_per_node": Bound(lambda v: 1 <= v <= _INT32_MAX, f"must be from 1 to {_INT32_MAX}"),
    "timeout_seconds": ABOVE_ZERO,
    "omp_num_threads": AT_LEAST_ONE,
    "collective_timeout_seconds": ABOVE_ZERO,
    "nccl_heartbeat_timeout_seconds": ABOVE_ZERO,
    "nccl_debug": Bound(
        lambda v: v.upper() in NCCL_DEBUG_LEVELS,
        f"must be one of {NCCL_DEBUG_LEVELS} (in any case, as NCCL reads it)",
    ),
}


@dataclass(kw_only=True, slots=True)
class JobConfig:
    """The distributed job: one Master and `replicas - 1` Workers, like a PyTorchJob."""

    replicas: int = 2
    """Replicas in total: 1 Master + (replicas - 1) Workers (pods on a cluster, process groups locally)."""
    nproc_per_node: int = 1
    """Training processes per replica (GPUs per node on a cluster)."""
    image: str = IMAGE
    """Container image of the training replicas (it has kftrain installed); the default, and every other step's
    image, is set in `trainer/image.py`."""
    timeout_seconds: int = 3600
    """Wall-clock limit of the training job; past it the job is cancelled and the step fails."""
    omp_num_threads: int = 1
    """`OMP_NUM_THREADS` of each training process (CPU threads for intra-op parallelism)."""
    collective_timeout_seconds: int = 1800
    """A collective (all-reduce, barrier) that waits longer than this fails the job instead of hanging."""
    nccl_heartbeat_timeout_seconds: int = 600
    """`TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`: a rank whose NCCL watchdog is stuck this long is aborted."""
    nccl_debug: str = ""
    """`NCCL_DEBUG` of every process (`VERSION`, `WARN`, `INFO`, `ABORT`, `TRACE`, any case); empty: NCCL's default."""
    kind: str = "pytorchjob"
    """`pytorchjob` (Training Operator v1), `trainjob` (Kubeflow Trainer v2), or `auto`: a TrainJob where the cluster
    serves one, else a PyTorchJob (locally: the PyTorchJob contract)."""

    def __post_init__(self) -> None:
        check_bounds(self, "job", _JOB_BOUNDS)
        if problem := k8s.image_problem(self.image):
            raise ConfigError(f"job.image: {problem}")

    @property
    def world_size(self) -> int:
        """Training processes in the whole job."""
        return self.replicas * self.nproc_per_node


#: Bounds of `kubernetes.elastic.*` fields.
_ELASTIC_BOUNDS = {
    "min_replicas": AT_LEAST_ONE,
    "max_replicas": Bound(lambda v: v <= _INT32_MAX, f"must be at most {_INT32_MAX} (job.replicas' bound)"),
    "max_restarts": NOT_NEGATIVE,
}


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
        check_bounds(self, "kubernetes.elastic", _ELASTIC_BOUNDS)
        _require(
            self.max_replicas >= self.min_replicas,
            "kubernetes.elastic.max_replicas",
            self.max_replicas,
            f"must be >= min_replicas ({self.min_replicas})",
        )


#: Bounds of `kubernetes.*` fields.
_KUBERNETES_BOUNDS = {
    "gpus_per_node": NOT_NEGATIVE,
    "gpu_memory_gb": Bound(
        lambda v: 0 <= v <= MAX_GPU_MEMORY_GB,
        f"must be from 0 (unknown, no memory check) to {MAX_GPU_MEMORY_GB:g} GiB",
    ),
    "clean_pod_policy": one_of(CLEAN_POD_POLICIES),
    "restart_policy": Bound(
        lambda v: v in RESTART_POLICIES,
        f"must be one of {RESTART_POLICIES} (not Always: it restarts a replica that finished, so the job "
        "never succeeds)",
    ),
    "min_available": NOT_NEGATIVE,
    "schedule_timeout_seconds": NOT_NEGATIVE,
    "active_deadline_seconds": NOT_NEGATIVE,
    "backoff_limit": NOT_NEGATIVE,
    "pending_timeout_seconds": ABOVE_ZERO,
    "poll_seconds": ABOVE_ZERO,
    "termination_grace_seconds": ABOVE_ZERO,
    "api_retry_budget_seconds": ABOVE_ZERO,
    "queue_timeout_seconds": Bound(lambda v: v >= 0, "must be >= 0 (0: no limit)"),
    "store_secret_keys": NOT_EMPTY,
}


def _replica_quantity_problem(value: Any, resource: str, what: str, example: str, empty: str) -> str | None:
    """Why `value` is not a replica's `resource` (:func:`trainer.k8s_formats.quantity_problem`), or
    None. Zero is valid to the API server and never what was meant: the field's way to say "none"
    is to leave it empty."""
    # Zero first: '0m' of memory is zero, not "thousandths of a byte: write 0Mi", which is zero too.
    if k8s.quantity_problem(value) is None and k8s.quantity_value(str(value)) == 0:
        return (
            f"{k8s.show(value)} gives each replica no {what}: give what it needs (e.g. {example}), or leave it "
            f"empty ({empty})"
        )
    return k8s.quantity_problem(value, resource)


#: `kubernetes.*` fields that become one name or value of the job, and why the API server would
#: refuse a value (:mod:`trainer.k8s_formats`, the formats the preflight checks the manifest with);
#: empty is unset, except for `runtime`.
_KUBERNETES_FORMATS: dict[str, Callable[[Any], str | None]] = {
    "namespace": k8s.namespace_problem,
    "runtime": k8s.runtime_name_problem,
    "cpu": lambda v: _replica_quantity_problem(v, "cpu", "CPU", "8 or 7500m", "no request or limit"),
    "memory": lambda v: _replica_quantity_problem(v, "memory", "memory", "64Gi", "no request or limit"),
    "shm_size": lambda v: _replica_quantity_problem(v, "shm_size", "/dev/shm", "2Gi", "the runtime's own 64M"),
    "priority_class": lambda v: k8s.object_name_problem(v, "a valid priorityClassName"),
    "service_account": lambda v: k8s.object_name_problem(v, "a valid serviceAccountName"),
    "queue": k8s.kueue_queue_problem,
    "scheduling_queue": k8s.queue_name_problem,
    "store_secret": k8s.secret_name_problem,
    "hf_token_secret": k8s.secret_name_problem,
}


@dataclass(kw_only=True, slots=True)
class KubernetesConfig:
    """How the training job's pods run on a cluster, as a PyTorchJob or a TrainJob. The local launcher starts no
    pods, but the section is checked as it is written (its GPUs per pod against `job.nproc_per_node`, its elastic
    range against the batch): a config that runs locally is one the cluster takes."""

    namespace: str = ""
    """Namespace of the job; empty: the launcher pod's own, read at run time (never frozen at compile time)."""
    gpus_per_node: int = 0
    """`nvidia.com/gpu` limit of each replica; when set it must equal `job.nproc_per_node`."""
    gpu_memory_gb: float = 0.0
    """Memory of one GPU in GiB, as nvidia-smi's MiB / 1024 (an 80 GB A100: 80; an 80 GB H100: 79.6). A run whose
    weights, gradients and optimizer state cannot fit on each rank's GPU (a pretrained model's, or at least what
    `model.*` builds) is refused before any step; 0: unknown, no check (at most 100000)."""
    cpu: str = ""
    """CPU request and limit of each replica (a Kubernetes quantity, e.g. `8` or `7500m`); empty: none."""
    memory: str = ""
    """Memory request and limit of each replica (e.g. `64Gi`); empty: none."""
    shm_size: str = "2Gi"
    """Size of the memory-backed `/dev/shm` volume (DataLoader workers and NCCL need more than 64M); empty: none."""
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    """Pod tolerations, as in a pod spec (`key`, `operator`, `value`, `effect`). In this and the other pod-spec fields
    (`affinity`, `volumes`, `volume_mounts`), a key or text that looks like a credential is refused: the job object
    carries them as written."""
    node_selector: dict[str, str] = field(default_factory=dict)
    """Pod nodeSelector labels; a key or value that looks like a credential is refused."""
    affinity: dict[str, Any] = field(default_factory=dict)
    """Pod affinity, as in a pod spec."""
    priority_class: str = ""
    """`priorityClassName` of the replica pods (and of the gang-scheduling policy when one is set)."""
    service_account: str = ""
    """`serviceAccountName` of the replica pods; empty: the namespace's `default`."""
    image_pull_secrets: list[str] = field(default_factory=list)
    """Names of Secrets used to pull the image."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels on the job (PyTorchJob or TrainJob) and its pods; a key or value that looks like a credential is
    refused (anyone who can list the job reads them)."""
    annotations: dict[str, str] = field(default_factory=dict)
    """Annotations on the job (PyTorchJob or TrainJob) and its pods; a key or value that looks like a credential is
    refused (names such as Vault's `agent-inject-secret-*` are fine)."""
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
    """The job object is deleted this long after it finished (PyTorchJob); at least 60 and 3 x `poll_seconds`, so the
    launcher reads how the job ended before it goes."""
    active_deadline_seconds: int = 0
    """Server-side deadline of the job, counted by the operator from its start (a job it ended is not
    re-created), at most `job.timeout_seconds`; 0: `job.timeout_seconds`, so a job outliving its launcher still
    stops."""
    backoff_limit: int = 3
    """Pod restarts before the job is marked Failed."""
    restart_policy: str = "OnFailure"
    """Replica `restartPolicy`: `OnFailure`, `ExitCode` (exit 1-127 permanent, 128-255 retried) or `Never` (not
    `Always`, which restarts a replica that finished, so the job never succeeds)."""
    termination_grace_seconds: int = 120
    """`terminationGracePeriodSeconds` of the replica pods: on SIGTERM (preemption, eviction, drain) the ranks stop at
    the next step boundary and commit a checkpoint, which must fit in this time before the SIGKILL; rank 0 warns when
    a measured checkpoint would not."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Elastic training settings."""
    store_secret: str = KFP_STORE_SECRET
    """Secret with the object-store keys, given to every replica as environment variables through `secretKeyRef`."""
    store_secret_keys: dict[str, str] = field(default_factory=lambda: dict(KFP_STORE_SECRET_KEYS))
    """Key in `store_secret` -> the environment variable it fills."""
    hf_token_secret: str = ""
    """Secret whose key `HF_TOKEN` every replica gets as the variable `HF_TOKEN` (a gated or private `hf://` model),
    through an optional `secretKeyRef` (no such Secret or key: the variable is unset); empty: none. A pipeline run
    sets it from its `hf_token_secret` parameter, the Secret its step pods mount."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra non-secret environment of the replicas; credential-looking names (`*SECRET*`, `*_TOKEN`,
    `*PASSWORD*`, `*_KEY`, `*_PWD`, ..., or a token pasted as a name; not `*_FILE`, `*_PATH`, `*_NAME`, `*_MODE`,
    ..., nor one whose value is a path or a switch) and values are refused, and so are the store's variables
    (`AWS_ENDPOINT_URL*`, `AWS_REGION`, `AWS_DEFAULT_REGION`: the pipeline's other steps would not get them; set
    `store.endpoint`, `store.region`). Values reach the process as written (`$(NAME)` is not expanded; `extra_env`
    is passed to Kubernetes as it is)."""
    extra_env: list[dict[str, Any]] = field(default_factory=list)
    """Extra environment entries of the replicas in pod-spec form (`name` plus `value` or `valueFrom`: `secretKeyRef`,
    `configMapKeyRef`, ...), e.g. a Secret's key; the KFP training task's own environment is added here
    (docs/components.md, "Task settings")."""
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
    max_restarts_by_cause: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_MAX_RESTARTS))
    """Times a failed job is deleted and re-created (resuming from its latest checkpoint), per cause of the failure:
    `preempted`, `node_lost`, `oom`, `image_pull`, `collective_timeout`, `nonfinite`, `user_error`, `unknown`;
    -1: unlimited until `job.timeout_seconds`. A cause left out keeps its default (docs/reliability.md)."""
    runtime: str = "torch-distributed"
    """The ClusterTrainingRuntime a TrainJob runs on (`job.kind: trainjob`); ignored by PyTorchJobs."""

    def __post_init__(self) -> None:
        p = "kubernetes"
        check_bounds(self, p, _KUBERNETES_BOUNDS)
        for i, tol in enumerate(self.tolerations):
            _require(isinstance(tol, dict), f"{p}.tolerations[{i}]", tol, "must be a mapping")
        check_plain_env(
            self.env,
            f"{p}.env",
            f"{p}.store_secret and {p}.store_secret_keys map Secret keys to variables; {p}.hf_token_secret "
            f"gives {HF_TOKEN}",
        )
        # What the job object carries as written, judged by shape: names such as Vault's
        # `agent-inject-secret-*` or a volume's `secretName` are fine.
        for name in ("labels", "annotations", "node_selector", "tolerations", "affinity", "volumes", "volume_mounts"):
            if found := credential_path(getattr(self, name), f"{p}.{name}"):
                where, what = found
                raise ConfigError(
                    f"{where}: its {what} looks like a credential, and {p}.{name} is in the job object, readable "
                    "by anyone who can list the job; keep credentials in a Kubernetes Secret (mount a `secret` "
                    "volume, or give a CSI driver its `nodePublishSecretRef`)"
                )
        self._check_formats()
        _require(
            not (self.hf_token_secret and self.store_secret and HF_TOKEN in self.store_secret_keys.values()),
            f"{p}.store_secret_keys",
            self.store_secret_keys,
            f"must not fill {HF_TOKEN}, which {p}.hf_token_secret gives",
        )
        self._check_volumes()
        self._check_extra_env()
        try:
            budget_check(self.max_restarts_by_cause, f"{p}.max_restarts_by_cause")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _check_formats(self) -> None:
        """Refuse what the API server would refuse in the job built from these fields, in the words
        the preflight uses for the same value in the manifest (:mod:`trainer.k8s_formats`)."""
        p = "kubernetes"
        problems: list[tuple[str, str | None]] = [
            (f"{p}.{name}", problem(value))
            for name, problem in _KUBERNETES_FORMATS.items()
            if (value := getattr(self, name)) or name == "runtime"
        ]
        problems += [(f"{p}.image_pull_secrets", k8s.secret_name_problem(n)) for n in self.image_pull_secrets]
        for name in ("labels", "node_selector"):
            problems += [(f"{p}.{name}", k8s.label_problem(k, v)) for k, v in getattr(self, name).items()]
        problems += [(f"{p}.labels", k8s.own_label_problem(k)) for k in self.labels]
        problems += [
            (f"{p}.annotations", k8s.annotation_key_problem(k) or k8s.own_annotation_problem(k))
            for k in self.annotations
        ]
        problems.append((f"{p}.annotations", k8s.annotations_size_problem(self.annotations)))
        problems += [(f"{p}.tolerations[{i}]", k8s.toleration_problem(t)) for i, t in enumerate(self.tolerations)]
        problems += [(f"{p}.env.{k8s.plain(n)}", k8s.env_name_problem(n)) for n in self.env]
        if self.store_secret:  # the keys are read only from the Secret
            for key, var in self.store_secret_keys.items():
                problems.append((f"{p}.store_secret_keys", k8s.secret_key_problem(key) or k8s.env_name_problem(var)))
        where, problem = next(((f, why) for f, why in problems if why), ("", None))
        if problem:
            raise ConfigError(f"{where}: {problem}")

    def _check_extra_env(self) -> None:
        """Each entry is one pod-spec variable, named once, and not also a plain `kubernetes.env` one."""
        p = "kubernetes.extra_env"
        names: list[str] = []
        for i, entry in enumerate(self.extra_env):
            _require(
                isinstance(entry, dict) and bool(entry.get("name")) and ("value" in entry or "valueFrom" in entry),
                f"{p}[{i}]",
                entry,
                "must be a mapping with `name` and `value` or `valueFrom` (pod-spec spelling)",
            )
            name = entry["name"]
            # A name is no credential: said (the values of this field are not shown).
            if name in names or name in self.env:
                where = "earlier in kubernetes.extra_env" if name in names else "by kubernetes.env"
                raise ConfigError(f"{p}[{i}].name: {name!r} is also set {where}; set each variable once")
            if "value" in entry and not isinstance(entry["value"], str):
                raise ConfigError(
                    f"{p}[{i}].value: must be text, as a pod's variables are (quote it in YAML), got a JSON "
                    f"{json_kind(entry['value'])}"
                )
            names.append(name)
        check_plain_env(
            {e["name"]: e["value"] for e in self.extra_env if "value" in e},
            p,
            "an entry with `valueFrom: {secretKeyRef: {name, key}}`",
        )
        if not self.extra_env:
            return
        # The manifest's own rules (a variable's name, a Secret's name and key), named by entry here:
        # in the built job an entry would be indistinguishable from kubernetes.env or store_secret's.
        # (Imported only when needed: fieldrules builds a default KubernetesConfig as it loads.)
        from trainer.launch.fieldrules import field_problems
        from trainer.launch.preflight import env_var_problem

        for i, entry in enumerate(self.extra_env):
            if found := env_var_problem(entry):  # an unknown key: the job's `env` could not say whose
                raise ConfigError(f"{p}[{i}]{found[0]}: {redact(found[1])}")  # an unknown key may be a token
            for path, _, problem in field_problems({"env": [entry]}):
                where = "".join(f".{key}" for key in path[2:])  # below env[i]: plain keys
                raise ConfigError(f"{p}[{i}]{where}: {problem}")

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
            sources = sorted(k for k in vol if k != "name")
            _require(
                len(sources) <= 1,
                f"{p}.volumes[{i}]",
                sources,
                "must have one source (`persistentVolumeClaim`, `secret`, `emptyDir`, ...): Kubernetes refuses more",
            )
            names.append(vol["name"])
        paths: list[str] = []
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
            path = str(mount["mountPath"]).rstrip("/") or "/"
            _require(
                path not in paths, f"{where}.mountPath", path, "must be unique: a container mounts one volume at a path"
            )
            _require(
                not (self.shm_size and path == "/dev/shm"),
                f"{where}.mountPath",
                path,
                "is where kftrain mounts its shared memory (kubernetes.shm_size): choose another path, or set "
                "shm_size: ''",
            )
            _require(
                ".." not in str(mount.get("subPath", "")).split("/"),
                f"{where}.subPath",
                mount.get("subPath"),
                "must not hold a '..' segment (Kubernetes refuses it)",
            )
            paths.append(path)
        if not self.volumes:
            return
        # The manifest's rules for a volume (its name, a Secret's name, a size), named by entry here.
        from trainer.launch.fieldrules import field_problems

        for i, vol in enumerate(self.volumes):
            for path, _, problem in field_problems({"volumes": [vol]}):
                where = "".join(f".{key}" for key in path[2:])  # below volumes[i]
                raise ConfigError(f"{p}.volumes[{i}]{where}: {problem}")


#: The settings given in pod-spec form: their values reach the manifest as YAML typed them,
#: checked there against the cluster's schema.
POD_SPEC_FIELDS = frozenset(
    f"kubernetes.{name}" for name in ("tolerations", "affinity", "extra_env", "volumes", "volume_mounts")
)

#: A custom task's import path: a dotted module and a class, each a Python name.
_TASK_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


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
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters (`train.method: lora`)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing and resume."""
    export: ExportConfig = field(default_factory=ExportConfig)
    """The export step (the Hugging Face folder and adapter of a fine-tuned pretrained model)."""
    job: JobConfig = field(default_factory=JobConfig)
    """Distributed job shape and limits."""
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """Cluster settings of the training job (PyTorchJob or TrainJob)."""
    plan: PlanConfig = field(default_factory=PlanConfig)
    """The plan step: predicted memory, time, scaling and cost of the run, before it starts."""

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
        _check_no_credential(self)
        _require(
            self.task in BUILTIN_TASKS or bool(_TASK_PATH.fullmatch(self.task)),
            "task",
            self.task,
            f"must be one of {BUILTIN_TASKS} or an import path `package.module:TaskClass` (Python names, dotted)",
        )
        _require(
            self.checkpoint.enabled or not self.checkpoint.keep_best,
            "checkpoint.keep_best",
            self.checkpoint.keep_best,
            "needs checkpoint.enabled: the best step is kept among the run's checkpoints",
        )
        if self.checkpoint.keep_best and self.task in EPOCH_METRICS:  # a custom task's: known once it ran
            metric = best_metric(self.checkpoint.keep_best)[1]
            _require(
                metric in EPOCH_METRICS[self.task],
                "checkpoint.keep_best",
                self.checkpoint.keep_best,
                f"task {self.task!r} reports no metric {metric!r} each epoch; name one of "
                f"{', '.join(EPOCH_METRICS[self.task])}",
            )
        _require(
            not self.train.max_steps or self.train.warmup_steps < self.train.max_steps,
            "train.warmup_steps",
            self.train.warmup_steps,
            f"must be below train.max_steps ({self.train.max_steps}): the learning rate would never reach "
            "train.learning_rate",
        )
        _require(
            self.checkpoint.at_epoch_end or not self.checkpoint.keep_best,
            "checkpoint.keep_best",
            self.checkpoint.keep_best,
            "ranks the checkpoints taken at epoch ends, with the epoch's metrics: set checkpoint.at_epoch_end: true",
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
        _require(
            self.data.format not in ("jsonl", "chat")
            or self.task != "causal_lm"
            or self.data.source not in ("", "python-stdlib"),
            "data.format",
            self.data.format,
            "reads JSON Lines records, and the built-in 'python-stdlib' source (data.source empty or "
            "'python-stdlib') is plain text: set data.source to a .jsonl object (or a folder of them), or leave "
            "data.format at auto",
        )
        if self.job.kind != "trainjob":  # a PyTorchJob's (a TrainJob has no such field)
            # The launcher learns how the job ended at its next status check: a job deleted before
            # that failed the step as "deleted while the launcher waited for it", a success included.
            k = self.kubernetes
            least = max(MIN_TTL_SECONDS, math.ceil(3 * k.poll_seconds))
            _require(
                k.ttl_seconds_after_finished >= least,
                "kubernetes.ttl_seconds_after_finished",
                k.ttl_seconds_after_finished,
                f"must be >= {least}{', or kubernetes.poll_seconds lower' if least > MIN_TTL_SECONDS else ''} (the "
                "launcher reads how the job ended at its "
                f"next status check, every kubernetes.poll_seconds={k.poll_seconds:g}s; a finished job the operator "
                "deletes sooner fails the step, a success included)",
            )
        _require(
            self.kubernetes.active_deadline_seconds <= self.job.timeout_seconds,
            "kubernetes.active_deadline_seconds",
            self.kubernetes.active_deadline_seconds,
            f"must be at most job.timeout_seconds ({self.job.timeout_seconds}): the launcher deletes the job then, "
            "and gives the job what is left of it as its deadline; 0: the same",
        )
        _require(
            self.kubernetes.min_available <= self.job.replicas,
            "kubernetes.min_available",
            self.kubernetes.min_available,
            f"must be at most the job's pods (job.replicas: {self.job.replicas}): a gang scheduler never admits "
            "a job that waits for more pods than it has",
        )
        if self.job.kind == "trainjob":  # its runtime patch keys a container's mounts by volume name
            mounted = [m.get("name") for m in self.kubernetes.volume_mounts]
            again = next((i for i, name in enumerate(mounted) if name in mounted[:i]), None)
            _require(
                again is None,
                f"kubernetes.volume_mounts[{again}].name",
                mounted[again] if again is not None else None,
                "mounts a volume a second time, which a TrainJob's runtime patch cannot (it keys mounts by volume "
                "name): mount it once, at a parent folder, or use job.kind: pytorchjob",
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
            nproc, accum = self.job.nproc_per_node, self.train.grad_accum_steps
            sizes = range(elastic.min_replicas * nproc, (elastic.max_replicas + 1) * nproc, nproc)
            bad = list(itertools.islice((w for w in sizes if self.train.batch_size % (w * accum)), 5))
            if bad:
                unit = accum
                for w in sizes:  # the smallest batch that fits them all, unless no batch a job uses does
                    unit = math.lcm(unit, w * accum)
                    if unit > _INT32_MAX:
                        break
                fix = (
                    f"use a multiple of {unit}"
                    if unit <= _INT32_MAX
                    else "no batch size divides by them all: narrow kubernetes.elastic's min_replicas..max_replicas"
                )
                shown = ", ".join(map(str, sizes)) if len(sizes) <= 8 else f"{sizes[0]}..{sizes[-1]}"
                per = f" x train.grad_accum_steps {accum}" if accum > 1 else ""
                _require(
                    False,
                    "train.batch_size",
                    self.train.batch_size,
                    f"must divide by every world size the elastic range allows ({shown} ranks{per}), but not by "
                    f"{', '.join(map(str, bad))}{', ...' if len(bad) == 5 else ''}: {fix}",
                )
        self._check_partitions()
        self._check_pretrained()

    def _check_pretrained(self) -> None:
        """Fields that only mean something with, or conflict with, a pretrained model."""
        pretrained = bool(self.model.init_from)
        if pretrained:
            _require(
                self.task == "causal_lm",
                "model.init_from",
                self.model.init_from,
                "needs task: causal_lm (a pretrained model is fine-tuned as a language model): set it in the config",
            )
            _require(
                self.data.tokenizer == "bytes",
                "data.tokenizer",
                self.data.tokenizer,
                "is replaced by the pretrained model's own tokenizer (model.init_from); remove it",
            )
            return
        for path, value, default in (
            ("data.format", self.data.format, "chat"),
            ("train.method", self.train.method, "lora"),
        ):
            _require(value != default, path, value, "needs a pretrained model: set model.init_from")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


#: A number in exponent notation that PyYAML (YAML 1.1) reads as a string: `1e-3`, `.5e-3`, `1.0e3`
#: (its float needs a '.' and a signed exponent).
_EXPONENT_FLOAT = re.compile(r"[-+]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+")


def _convert(value: Any, tp: Any, path: str) -> Any:
    """Check `value` against the annotation `tp` and build nested dataclasses."""
    origin = typing.get_origin(tp)
    if tp is Any:  # free-form Kubernetes structures (affinity, tolerations): the schema checks them
        return value
    optional = origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
    if value is None and tp is not str and not optional:  # str fields say it their way (write '')
        leaf = path.rsplit(".", 1)[-1]
        raise ConfigError(
            f"{path}: has no value (nothing after `{leaf}:`, which YAML reads as null): write one, or remove the line"
        )
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
        for k, v in value.items():
            if val_t is str and isinstance(v, dict) and len(v) == 1 and not path.startswith(_UNSHOWN_VALUES):
                # `--set kubernetes.node_selector.kubernetes.io/arch=amd64` splits the key at its dots.
                (_, inner), whole = next(iter(v.items())), f"{k}.{next(iter(v))}"
                _require(
                    False,
                    f"{path}.{k}",
                    v,
                    f"must be a string; a key with dots ({whole!r}) is one key: in YAML write `{whole}: {inner}` "
                    f"under `{path.rsplit('.', 1)[-1]}:`, or with --set give the whole mapping, which replaces the "
                    f"config's: --set '{path}={{{whole}: {inner}}}' (its other keys too)",
                )
        return {_convert(k, key_t, f"{path} key"): _convert(v, val_t, f"{path}.{k}") for k, v in value.items()}
    if tp is float:
        # YAML reads `1e-3` as a string and `1` as an int: both are meant as floats. Only that
        # notation: `010`, `1_0` or ` 7 ` stay text, refused as every number field does.
        if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value):
            text, value = value, float(value)
            if problem := underflow_problem(text, value):
                raise ConfigError(f"{path}: {problem}")
        _require(
            isinstance(value, int | float) and not isinstance(value, bool),
            path,
            value,
            "must be a number",
        )
        # NaN passes every `>= 0` check (all comparisons are false only for `<`), and inf
        # crashes far away from the config: refuse both here, for every float field at once.
        _require(_finite(value), path, value, "must be a finite number (not nan, inf or past 1.8e308)")
        return _duration(float(value), path)
    if tp is int:
        _require(
            isinstance(value, int) and not isinstance(value, bool),
            path,
            value,
            "must be an integer",
        )
        _require(abs(value) < _INT64_LIMIT, path, value, "must fit in an int64 (|value| < 2**63)")
        return _duration(value, path)
    if tp is bool:
        _require(isinstance(value, bool), path, value, "must be true or false")
        return value
    if tp is str:
        if why := unquoted_problem(value, show_value=not path.startswith(_UNSHOWN_VALUES)):
            _require(False, path, value, why)
        if isinstance(value, dict) and len(value) == 1 and None in value.values():
            # `max:` or `--set keep_best=max:`: a key with no value, where text ending in ':' was meant.
            _require(False, path, value, f"must be a string (YAML reads `{next(iter(value))}:` as a mapping: quote it)")
        if value is None:  # `field:` or `--set field=`, where empty text was meant
            _require(
                False, path, value, "must be a string (YAML reads an empty value as null: write '' for empty text)"
            )
        _require(isinstance(value, str), path, value, "must be a string")
        return value
    raise TypeError(f"{path}: unsupported annotation {_type_name(tp)}")  # a bug in this module


def _finite(value: int | float) -> bool:
    """Whether `value` is a finite float, or an integer a float can hold (not 10**400)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _duration(value: int | float, path: str) -> int | float:
    """`value`, checked against :data:`MAX_SECONDS` where the field is a `*_seconds` one."""
    if path.endswith("_seconds"):
        _require(value <= MAX_SECONDS, path, value, f"must be at most {MAX_SECONDS} seconds (366 days)")
    return value


#: The fields that take a URL and refuse one with a user or password themselves.
_URL_FIELDS = (
    ("store", "uri"),
    ("store", "endpoint"),
    ("data", "source"),
    ("model", "init_from"),
    ("checkpoint", "uri"),
    ("checkpoint", "resume_from"),
)


def _check_no_credential(cfg: Config) -> None:
    """Refuse a config whose keys or values hold a credential, after each field's own check (whose
    refusal says better where the credential goes, and shows none): none of its fields holds one
    (credentials come from Secrets and the environment), and what is pasted into any travels in
    pipeline parameters, compiled YAML, run records and the job object. `data.eval_prompts` are
    free text (code, JSON, addresses); a URL with a password is its field's to refuse."""
    values = dataclasses.asdict(cfg)
    del values["data"]["eval_prompts"]
    for section, name in _URL_FIELDS:  # each refuses a password in its URL itself, saying where it goes
        if url_has_userinfo(str(values[section][name])):
            del values[section][name]
    if found := credential_path(values, ""):
        where, what = found
        raise ConfigError(
            f"{where}: its {what} looks like a credential, and the config travels in pipeline parameters, "
            "compiled YAML, run records and the job object; give credentials through a Kubernetes Secret "
            "or the environment (docs/cluster.md)"
        )


def from_dict(cls: type, data: dict[str, Any], path: str = "") -> Any:
    """Build the dataclass `cls` from a plain mapping; unknown keys are errors."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    unknown = sorted((k for k in data if k not in names), key=lambda k: (not isinstance(k, str), str(k)))
    if unknown:
        key = unknown[0] if isinstance(unknown[0], str) else f"{unknown[0]!r} (not text)"
        head, dot, rest = key.partition(".")
        if dot and head in names:  # `train.epochs: 3` at the top: YAML keys do not nest by dots
            raise ConfigError(
                f"{prefix}{k8s.plain(key)}: unknown key; a dotted key is not nested in YAML: write {head}: and "
                f"under it, indented, {k8s.plain(rest)}:"
            )
        raise ConfigError(
            f"{prefix}{k8s.plain(key)}: unknown key{_unknown_key_hint(key, names, path)} (valid keys in "
            f"{path or 'the top level'}: {', '.join(sorted(names))})"
        )
    kwargs = {k: _convert(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{path or 'config'}: {exc}") from None


def _sections(cls: type, path: str = "") -> Iterator[tuple[str, type]]:
    """`cls` and every config section below it, by dotted path ("" for `cls`)."""
    yield path, cls
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            yield from _sections(hint, f"{path}.{name}" if path else name)


def _unknown_key_hint(key: str, names: set[str], path: str) -> str:
    """What an unknown `key` in the section at `path` (whose keys are `names`) was likely meant
    as: the same key of another section (`learning_rate` at the top, not under `train`), else a
    key of this section spelt alike (a typo, another case, a stray space) or cut short, else one
    of another section spelt alike (`data.batchsize`: train.batch_size); "" when none."""
    elsewhere: dict[str, list[str]] = {}  # a key of another section -> the sections it is in
    for p, cls in _sections(Config):
        for f in dataclasses.fields(cls):
            if p != path:
                elsewhere.setdefault(f.name, []).append(p)
    if key in elsewhere:
        where = " and ".join(p or "the top level" for p in elsewhere[key])
        return f"; {k8s.plain(key)} is a key of {where}: write it there"
    spaced = " (no spaces around it)" if key != key.strip() else ""
    typed = key.strip().lower()
    alike = difflib.get_close_matches(typed, sorted(names), n=1, cutoff=0.75)
    if alike:
        return f"; did you mean {alike[0]}{spaced}?"
    # Cut short at a word's end: `gpus` for gpus_per_node, `keep` for keep_best or keep_last.
    if started := sorted(n for n in names if n.startswith(f"{typed}_")):
        if len(started) > 4:
            return f"; did you mean one of the {len(started)} keys starting with {typed}_?"
        return f"; did you mean {' or '.join(started)}?"
    alike = difflib.get_close_matches(typed, sorted(elsewhere), n=1, cutoff=0.8)
    if alike:
        return f"; did you mean {' or '.join(f'{p}.{alike[0]}' if p else alike[0] for p in elsewhere[alike[0]])}?"
    return ""


def to_dict(cfg: Any) -> dict[str, Any]:
    """The plain-mapping form of a config (the inverse of :func:`from_dict`)."""
    return dataclasses.asdict(cfg)


#: The config sections a training replica is not given (the pods' settings stay off its command
#: line, trainer/launch/job.py): it would read them as their defaults, so its training record and
#: every comparison with that record leave them out.
POD_SECTIONS = ("kubernetes",)


def replica_config(tree: dict[str, Any]) -> dict[str, Any]:
    """A config's plain mapping (:func:`to_dict`) as a replica has it: without :data:`POD_SECTIONS`."""
    return {k: v for k, v in tree.items() if k not in POD_SECTIONS}


#: Fields that name a place: one place written two ways (`data.csv`, `./data.csv`, its absolute
#: path; `s3://b/x` and `s3://b/x/`) is the same setting.
LOCATION_FIELDS = ("data.source", "model.init_from", "data.tokenizer", "store.uri", "checkpoint.uri")
#: Fields whose lists are sets: peft adapts the layers named in any order (its own
#: `adapter_config.json`, which kftrain exports, lists them sorted).
SET_FIELDS = ("lora.target_modules",)


def same_setting(field: str, old: Any, new: Any) -> bool:
    """Whether a resumed checkpoint's `old` value of config `field` is the `new` one: equal, for a
    :data:`SET_FIELDS` list the same names in any order, or for a :data:`LOCATION_FIELDS` path the
    same place (:func:`trainer.storage.same_place`; a built-in source name or an `hf://` id as
    written), for `store.endpoint` the same server (in any case, a trailing '/' aside)."""
    if old == new:
        return True
    if field in SET_FIELDS and isinstance(old, list) and isinstance(new, list):
        return set(old) == set(new)
    if not (isinstance(old, str) and isinstance(new, str)):
        return False
    if field == "store.endpoint":
        return old.rstrip("/").lower() == new.rstrip("/").lower()
    from trainer.data_rules import BUILTIN_SOURCES

    def named(value: str) -> bool:  # a built-in source (`digits`) or tokenizer (`bytes`, `bpe:512`), or unset
        return value in BUILTIN_SOURCES or value == "bytes" or value.startswith("bpe:") or not value.strip()

    if field not in LOCATION_FIELDS or named(old) or named(new):
        return False  # as written
    return same_place(old, new)


def flatten_config(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's plain mapping (:func:`to_dict`) by dotted field name (`train.max_steps`)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


#: Largest config text kftrain reads: a config is a few kilobytes; this bounds parsing time and memory.
MAX_CONFIG_BYTES = 1 << 20
#: Deepest nesting of mappings and lists in a config (free-form affinity needs about ten levels).
MAX_CONFIG_DEPTH = 64


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded for config files: no anchors or aliases (nine nested
    aliases expand to a billion nodes, which `dataclasses.asdict` then copies), no duplicate
    keys (YAML's last-one-wins would silently drop a setting), no nesting past
    :data:`MAX_CONFIG_DEPTH` (the composer recurses per level)."""

    origin = "config"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str] = []  # the dotted key of the node being composed

    def _fail(self, mark: Any, what: str) -> None:
        raise ConfigError(f"{self.origin}: line {mark.line + 1}: {what}")

    def construct_yaml_str(self, node: Any) -> str:
        """A text scalar, with an escaped UTF-16 surrogate pair (`"\ud83d\ude42"`, as JSON writes
        a character past U+FFFF) read as its one character (was: two lone surrogates, which no
        file name or tokenizer takes); a lone surrogate is refused naming the line."""
        value = super().construct_yaml_str(node)
        if any("\ud800" <= c <= "\udfff" for c in value):
            try:
                value = value.encode("utf-16", "surrogatepass").decode("utf-16")
            except UnicodeDecodeError:
                self._fail(
                    node.start_mark, "a lone UTF-16 surrogate escape (\\ud800-\\udfff); write the character itself"
                )
        return value

    def _where(self) -> str:
        parts = (k8s.plain(s) for s in self._path)  # stays one line, and shows no key that is a token
        return "".join(s if s.startswith("[") else f".{s}" for s in parts).lstrip(".") or "(top level)"

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            self._fail(
                event.start_mark,
                f"YAML anchors and aliases (a value starting with {sign!r}) are not allowed in a config; write the "
                "value out, or quote it",
            )
        if len(self._path) >= MAX_CONFIG_DEPTH:
            self._fail(event.start_mark, f"nested deeper than {MAX_CONFIG_DEPTH} levels")
        # `index` is the key node of a mapping value, the position of a list item, None for a key
        # (and for the document itself, which has no parent and adds no segment).
        segment = (
            index.value if isinstance(index, yaml.ScalarNode) else f"[{index}]" if isinstance(index, int) else "[?]"
        )
        segments = [str(segment)] if parent is not None else []
        self._path += segments
        try:
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.MappingNode):
                self._check_unique(node)
            return node
        finally:
            del self._path[len(self._path) - len(segments) :]

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        """Any value, but one its explicit tag cannot make (`!!bool maybe`, `!!timestamp 2024-13-45`)
        is one line naming it (was: PyYAML's KeyError or AttributeError, a traceback)."""
        try:
            return super().construct_object(node, deep)
        except ConfigError:
            raise
        except (ValueError, KeyError, AttributeError, TypeError, OverflowError) as exc:
            tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
            what = "a date (YAML's timestamp)" if tag == "!!timestamp" else tag
            # Not the value (it may be a password), nor a message quoting it; the others are PyYAML's insides.
            detail = f" ({exc})" if type(exc) is ValueError and not re.search("['\"]", str(exc)) else ""
            self._fail(
                node.start_mark, f"a value that reads as {what} is not one{detail}; write one, or quote it for text"
            )

    def construct_yaml_float(self, node: Any) -> float:
        """YAML 1.2's floats, also under an explicit `!!float` (PyYAML's reads `1:30` as 90 and
        `1_0.5` as 10.5), but not one too small for a float that would read as 0 (`1e-400`): a typo
        for a small value, which a check for a positive number would then blame on 0.0."""
        if not _YAML_1_2_TAGGED_FLOAT.fullmatch(self.construct_scalar(node)):
            self._fail(node.start_mark, "!!float takes a number: digits, an optional . and exponent, .inf or .nan")
        value = super().construct_yaml_float(node)
        if problem := underflow_problem(str(node.value), value):
            self._fail(node.start_mark, problem)
        return value

    def construct_yaml_bool(self, node: Any) -> bool:
        """YAML 1.2's booleans, also under an explicit `!!bool` (PyYAML's reads `yes`, `on`, ...)."""
        value = self.construct_scalar(node)
        if not _YAML_1_2_BOOL.fullmatch(value):
            self._fail(node.start_mark, "!!bool takes true or false")
        return value.lower() == "true"

    def construct_yaml_int(self, node: Any) -> int:
        """YAML 1.2's integers, also under an explicit `!!int` (PyYAML's reads `010` as 8, `1:30` as
        90, `1_0` as 10, `0b11` as 3). The value is not shown: it may be a PIN under `kubernetes.env`."""
        value = self.construct_scalar(node)
        if not _YAML_1_2_INT.fullmatch(value):
            self._fail(
                node.start_mark,
                "!!int takes an integer: digits without a leading 0 (YAML 1.2 has no octal there), 0o octal or 0x hex",
            )
        return int(value, 0)

    def _check_unique(self, node: Any) -> None:
        seen: dict[tuple[str, str], Any] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            if key_node.value == "<<" and key_node.style is None:
                # YAML 1.1's merge key (not in 1.2): its copies are aliases, and its precedence was
                # taken the wrong way round by PyYAML's loader (the last mapping won) past the
                # duplicate-key check.
                self._fail(
                    key_node.start_mark,
                    "YAML merge keys (<<) are not allowed in a config; write the fields out",
                )
            key = (key_node.tag, key_node.value)
            if key in seen:
                self._path.append(key_node.value)
                field = self._where()
                self._path.pop()
                raise ConfigError(
                    f"{self.origin}: {field}: duplicate key, on lines {seen[key].line + 1} and "
                    f"{key_node.start_mark.line + 1} (YAML would silently keep only the last); keep one"
                )
            seen[key] = key_node.start_mark


# YAML 1.2's core schema for plain scalars, not PyYAML's YAML 1.1: `yes`, `no`, `on` and `off`
# stay text (1.1 reads them as booleans, so `on: true` became the key True), and so do `010`
# (1.1: octal 8; 1.2: 10) and `1:30` (1.1: base 60, 90), which a type check then refuses by
# name instead of a number the user may not have meant.
_YAML_1_1_ONLY = {
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:merge",
}
_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _YAML_1_1_ONLY]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_YAML_1_2_BOOL = re.compile(r"true|True|TRUE|false|False|FALSE")
_YAML_1_2_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)|0x[0-9a-fA-F]+|0o[0-7]+")
_YAML_1_2_FLOAT = re.compile(
    r"[-+]?(?:\.[0-9]+|(?:0|[1-9][0-9]*)(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
# Under an explicit `!!float`, YAML 1.2's own pattern, leading zeros included (`!!float 01.5`):
# no octal to mistake it for. Untagged, `010` stays text (above), for the type check to name.
_YAML_1_2_TAGGED_FLOAT = re.compile(_YAML_1_2_FLOAT.pattern.replace("(?:0|[1-9][0-9]*)", "[0-9]+"))
_ConfigLoader.add_constructor("tag:yaml.org,2002:str", _ConfigLoader.construct_yaml_str)
_ConfigLoader.add_constructor("tag:yaml.org,2002:float", _ConfigLoader.construct_yaml_float)
_ConfigLoader.add_constructor("tag:yaml.org,2002:bool", _ConfigLoader.construct_yaml_bool)
_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(f"^(?:{_YAML_1_2_BOOL.pattern})$"), list("tTfF")
)
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(f"^(?:{_YAML_1_2_INT.pattern})$"), list("-+0123456789")
)
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(f"^(?:{_YAML_1_2_FLOAT.pattern})$"), list("-+0123456789.")
)


def underflow_problem(text: str, value: float) -> str | None:
    """Why `text`, read as the float `value`, is not what it says: too small for a float, so 0,
    or so small that it keeps only some of its digits (a subnormal float, below 2.2e-308: 1 / it
    is no longer a number)."""
    if value == 0.0 and re.search(r"[1-9]", re.split(r"[eE]", text)[0]):
        return f"{text} is too small for a float (it would read as 0); write 0 or a larger number"
    if 0.0 < abs(value) < sys.float_info.min:
        return (
            f"{text} is too small for a float to hold exactly (below {sys.float_info.min:.1e}); write 0 or a larger "
            "number"
        )
    return None


def load_yaml(text: str, origin: str = "config") -> Any:
    """Parse config text (YAML or JSON) with the bounds of :class:`_ConfigLoader` and
    :data:`MAX_CONFIG_BYTES`; every refusal is a one-line :class:`ConfigError` naming `origin`."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{origin}: {size} bytes is larger than a config may be ({MAX_CONFIG_BYTES} bytes = 1 MiB)")
    loader = None
    try:
        loader = _ConfigLoader(text)  # its reader refuses a control character at once
        loader.origin = origin
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        tabs = " (YAML takes no tab between tokens, a JSON config's too: use spaces)" if "'\\t'" in str(exc) else ""
        raise ConfigError(f"{origin}: not valid YAML: {yaml_problem(exc)}{tabs}") from None
    except ValueError as exc:  # an integer beyond Python's digit limit, a bad timestamp
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{origin}: not a usable value: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_config(text: str, overrides: dict[str, Any] | None = None, origin: str = "config") -> Config:
    """Build a :class:`Config` from YAML (or JSON) text and dotted overrides.

    `overrides` maps dotted keys to values, e.g. ``{"job.replicas": 3}``; they win over the text.
    """
    # A KFP step's `config` parameter holds what the pipeline wired to it (kfp.local 2.17 hands a
    # `dsl.ParallelFor` item on in its place): was an AttributeError naming no parameter.
    if not isinstance(text, str):
        raise ConfigError(f"{origin}: must be the config's YAML or JSON text, not a {type(text).__name__}")
    loaded = load_yaml(text, origin) if text.strip() else None
    if loaded is None and text.strip():  # as an empty file is: a mistake, not a wish for the defaults
        raise ConfigError(
            f"{origin}: holds no settings (only comments, or null); write the fields to change, or give no config "
            "at all (no --config, an empty `config` parameter) for the built-in defaults"
        )
    if loaded is None:
        loaded = {}
    _require(
        isinstance(loaded, dict),
        origin,
        type(loaded).__name__,
        'must hold a mapping of sections, as YAML (train: {epochs: 3}) or JSON ({"train": {"epochs": 3}})',
    )
    data: dict[str, Any] = loaded
    # A mapping given for a section (`--set 'kubernetes={queue: a}'`) sets the fields it names, as
    # the same fields written under the section would (was: it replaced the section, every field it
    # left out back at its default); a field's value, a mapping or not, replaces the field's.
    fields = {k: v for dotted, value in (overrides or {}).items() for k, v in dotted_fields(dotted, value).items()}
    for dotted, value in fields.items():
        node = data
        *parents, leaf = dotted.split(".")
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            _require(isinstance(node, dict), ".".join(parents[: i + 1]), node, "must be a mapping")
        node[leaf] = value
    return from_dict(Config, data)


def dotted_fields(dotted: str, value: Any) -> dict[str, Any]:
    """An override as the fields it sets: a mapping given for a section (`kubernetes`, `{queue: a}`)
    is its fields (`kubernetes.queue: a`), at any depth; anything else is the one field. What two
    overrides set is compared field by field so (`--set 'kubernetes={queue: a}'` beside `-n ns`)."""
    section: type | None = Config
    for name in dotted.split("."):
        section = _section_of(section, name)
    if section is None or not isinstance(value, dict):
        return {dotted: value}
    return {k: v for name, item in value.items() for k, v in dotted_fields(f"{dotted}.{name}", item).items()}


def _section_of(parent: type | None, name: Any) -> type | None:
    """The config section (a dataclass) field `name` of section `parent` holds; None for a value."""
    hint = typing.get_type_hints(parent).get(name) if parent is not None and isinstance(name, str) else None
    return hint if dataclasses.is_dataclass(hint) else None


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load a YAML config file (the defaults when `path` is None) and apply dotted overrides."""
    text = "" if path is None else read_config_file(path)
    return parse_config(text, overrides, origin=str(path or "config"))


def read_config_file(path: str | Path) -> str:
    """The text of the config file `path` (`--config`), refused in one line when it cannot be
    read, is not UTF-8, is empty or is larger than a config may be."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # never more: a config past the bound is refused unread
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"--config {path}: cannot read the config file ({reason}); pass a YAML file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"--config {path}: line {line}: byte {raw[exc.start]:#04x} is not UTF-8 text (a file saved in another "
            "encoding, e.g. Latin-1 or UTF-16); save it as UTF-8"
        ) from None
    if not raw.strip():  # an empty file is a mistake (a failed `> file`), not a wish for the defaults
        raise ConfigError(
            f"--config {path}: the file is empty; write the fields to change, or leave out --config for the "
            "built-in defaults"
        )
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"--config {path}: larger than a config may be ({MAX_CONFIG_BYTES} bytes = 1 MiB); is it the right file?"
        )
    return text


def config_to_json(cfg: Config, exclude: tuple[str, ...] = ()) -> str:
    """A compact JSON form (without the `exclude` sections, which then take their defaults)."""
    data = {k: v for k, v in to_dict(cfg).items() if k not in exclude}
    # Characters as they are: the steps read this text as YAML, which took `\ud83d\ude42` (JSON's
    # escape of a character past U+FFFF) as two lone surrogates (see _ConfigLoader.construct_yaml_str).
    return json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def config_from_json(text: str) -> Config:
    """Inverse of :func:`config_to_json`, with the same validation as YAML."""
    return from_dict(Config, json.loads(text))
