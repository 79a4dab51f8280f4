"""What a run checks before its first step: whatever can be known wrong without doing any work.

`kftrain run --local` calls :func:`check_before_steps` before the pipeline starts; on a cluster
the `configure` step does, so a wrong value fails the run in its first seconds, naming the field,
instead of in the step that first uses it. Nothing is left behind: a store's write check removes
its probe, and a local folder is not created.

A pretrained base model (`model.init_from`) is checked from its folder's small files and its
safetensors headers alone (:func:`check_base_model`): no weight is read, and the model is built
on the meta device, which takes no memory.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.config import BUILTIN_TASKS, Config, ConfigError, config_to_json, to_dict
from trainer.errors import KftrainError
from trainer.k8s_formats import quantity_value
from trainer.storage import (
    LocalStore,
    StoreError,
    check_deadline,
    file_place,
    join_uri,
    parse_uri,
    place_of,
    under_setting,
)

log = logging.getLogger("kftrain.checks")

if TYPE_CHECKING:
    from trainer.pretrained import ModelSource, TensorEntry

#: Bytes a trained parameter keeps on its rank: fp32 weights and gradients, AdamW's two fp32 moments.
TRAINED_BYTES = 16
#: Seconds the base model's check may take against the store (a few small reads per weight file),
#: and the lookup of the checkpoint `checkpoint.resume_from` names (a few listings and records).
MODEL_CHECK_BUDGET_S = 15.0


def gate_problem(name: str, value: float) -> str:
    """Why `value` cannot be the quality gate's `min_accuracy` or `max_perplexity`, or ''; the one
    rule behind `kftrain run`'s flags and `kftrain submit`'s parameters."""
    if name == "min_accuracy":
        return "" if 0.0 <= value <= 1.0 else "must be a number in [0, 1]"  # nan fails
    # exp(mean cross-entropy): never below 1, so a bar under 1 could never pass.
    return "" if value == 0.0 or 1.0 <= value < math.inf else "must be 0 (no bar) or a number of at least 1"


#: The pipeline's and `kftrain run`'s quality gates when none is given (0: no bar).
GATE_DEFAULTS = {"min_accuracy": 0.9, "max_perplexity": 0.0}


def check_gates(min_accuracy: float, max_perplexity: float, task: str = "") -> None:
    """ConfigError naming the quality gate whose value cannot work: out of its range (a
    percentage for the fraction, a negative bar), or a bar set (not the default) that `task`, a
    built-in task, never reports."""
    for name, value in (("min_accuracy", min_accuracy), ("max_perplexity", max_perplexity)):
        ignored = "" if value == GATE_DEFAULTS[name] else gate_ignored(name, value, task)
        if problem := gate_problem(name, value) or ignored:
            raise ConfigError(f"{name} {value:g}: {problem}")


def check_run_settings(cfg: Config, launcher: str, min_accuracy: float, max_perplexity: float) -> None:
    """The pipeline's own parameters, beside the config, checked in its first step: a value that
    would otherwise fail the training step after data prep, or pass the quality gate whatever
    the model, is a ConfigError naming the parameter. On a cluster every location the steps and
    replicas share must be in the object store (pods share no disk)."""
    from trainer.launch.job import check_cluster_locations
    from trainer.pipeline_steps import resolve_launcher

    check_gates(min_accuracy, max_perplexity, cfg.task)
    if resolve_launcher(launcher) == "kubernetes":
        check_cluster_locations(cfg)


#: What each quality gate reads, as a built-in task's epoch record names it (EPOCH_METRICS).
GATE_METRICS = {"min_accuracy": "val_accuracy", "max_perplexity": "val_perplexity"}


def gate_ignored(name: str, value: float, task: str, spell: Callable[[str], str] = str) -> str:
    """Why quality gate `name` at `value` would be ignored by `task` (a built-in task that never
    reports its metric; the other gate, named by `spell`, is its own), or ''."""
    from trainer.config import EPOCH_METRICS

    metric = GATE_METRICS[name]
    if not value or task not in EPOCH_METRICS or metric in EPOCH_METRICS[task]:
        return ""
    other = next(n for n in GATE_METRICS if n != name)
    return (
        f"task {task!r} reports no {metric.removeprefix('val_')}, so the gate would be ignored; its gate is "
        f"{spell(other)}"
    )


def check_writable(cfg: Config, uri: str, field: str) -> None:
    """`uri` (the value of config field `field`) can be written under; else :class:`StoreError`
    naming the field, within the store check's time limit."""
    from trainer.pipeline_steps import store_for

    try:
        store_for(cfg, uri, check=True)
    except StoreError as exc:
        raise under_setting(field if uri in str(exc) else f"{field} {uri}", exc) from None


def run_writes(cfg: Config, output_dir: str = "", output_flag: str = "--output-dir") -> dict[str, str]:
    """The places a run writes, by the setting that names each: `store.uri`, `checkpoint.uri` (when
    enabled) and `output_dir` (a local run's `--output-dir`, as `output_flag` names it), those set."""
    writes = {"store.uri": cfg.store.uri, output_flag: output_dir}
    writes["checkpoint.uri"] = cfg.checkpoint.uri if cfg.checkpoint.enabled else ""
    return {field: uri for field, uri in writes.items() if uri}


def check_writes_outside_inputs(cfg: Config, writes: dict[str, str]) -> None:
    """ConfigError naming the first place of `writes` (setting or flag -> path or URI; see
    :func:`run_writes`) that lies inside an input the config names: the `data.source` folder or
    prefix (data prep would read the run's own files as training data) or a `model.init_from`
    folder (the run's files would be mixed into the base model's, and carried wherever it is
    copied)."""
    from trainer.data_rules import BUILTIN_SOURCES

    def place(uri: str) -> str:  # `bucket/key` (s3:// and minio:// name one store), or an absolute path
        spelled = place_of(uri) or os.path.realpath(uri)  # a file a flag names is a path, whatever it reads as
        return spelled.split("://", 1)[1] if "://" in spelled else spelled

    inputs = {
        "data.source": (
            cfg.data.source,
            "data prep would read the run's own files as training data",
        ),
        "model.init_from": (cfg.model.init_from, "the run's files would be mixed into the base model's"),
    }
    for name, (uri, harm) in inputs.items():
        if uri and uri not in BUILTIN_SOURCES and not uri.startswith("hf://"):
            _refuse_writes_inside(name, uri, place, writes, harm)


def _refuse_writes_inside(
    name: str, source: str, place: Callable[[str], str], writes: dict[str, str], harm: str
) -> None:
    """ConfigError naming the first of `writes` (field -> place) inside input `name` (`source`)."""
    folder = place(source)
    # A local input is read through its links to folders outside it too: a local place inside one of them.
    local = {field: os.path.realpath(place(uri)) for field, uri in writes.items() if not _is_remote(uri)}
    source_is_local = not parse_uri(source).is_remote and os.path.isdir(folder)
    linked = LocalStore().linked_folders(folder) if local and source_is_local else []
    # And a local input seen at a second path (a bind mount, one host folder in a container twice).
    mounted = file_place(folder) if source_is_local else ""
    for field, uri in writes.items():
        key = place(uri)
        inside = key == folder or key.startswith(f"{folder}/")
        real = local.get(field)
        if real and mounted:
            at = file_place(real)
            inside |= at == mounted or at.startswith(f"{mounted.rstrip('/')}/")
        via = next((f for f in linked if real and (real == f or real.startswith(f"{f}/"))), None)
        if inside or via:
            how = f" through its link to {via}" if via and not inside else ""
            raise ConfigError(f"{field} {uri!r} is inside {name} {source!r}{how}: {harm}; write it outside {name}")


def _is_remote(uri: str) -> bool:
    """Whether `uri` names an object store's place (a path a flag names that reads as no URI does not)."""
    try:
        return parse_uri(uri).is_remote
    except ValueError:
        return False


#: Set by `kftrain run` for its steps' processes: the digest (:func:`checked_digest`) of the config
#: its pre-flight has just checked with :func:`check_before_steps`, so that the configure step does
#: not check the same config again (reading the source's first record and a base model's headers
#: costs seconds). Any other config, or a pipeline on a cluster, is checked by the configure step.
CHECKED_CONFIG_ENV = "KFTRAIN_CHECKED_CONFIG"


def checked_digest(cfg: Config) -> str:
    """What :data:`CHECKED_CONFIG_ENV` holds for `cfg`: a digest of its whole effective config."""
    import hashlib

    return hashlib.sha256(config_to_json(cfg).encode()).hexdigest()


def checked_before(cfg: Config) -> bool:
    """Whether this process runs a step of `kftrain run`, whose pre-flight checked `cfg` itself."""
    return os.environ.get(CHECKED_CONFIG_ENV) == checked_digest(cfg)


def check_before_steps(
    cfg: Config, runs_root: str = "", hub: bool = False, output_flag: str = "--output-dir"
) -> Config:
    """The job the config describes passes the API server's and the operator's checks
    (:func:`trainer.launch.job.check_job_manifests`: the config runs on a cluster unchanged), the
    store and checkpoint prefixes are writable, `checkpoint.resume_from` names a checkpoint this
    config can continue (:func:`check_resume_from`), a custom task imports, `data.source` (and a
    tokenizer file) is there and readable (:func:`trainer.data_rules.check_source`), and a base
    model is one kftrain can fine-tune within the configured memory (:func:`check_base_model`), and
    `plan.gpu` is a GPU type the planner knows.

    Return `cfg` with `checkpoint.resume_from` pinned to the checkpoint it names now: the store
    root of a run id is `runs_root`, else `store.uri`. With `hub` (where the steps run on this
    machine, with its network and `HF_TOKEN`), an `hf://` base model's small files are fetched and
    checked too. `output_flag`: how an error names `runs_root` as the place a local run writes."""
    from trainer.data_rules import check_source
    from trainer.launch.job import check_job_manifests

    check_job_manifests(cfg)
    check_writes_outside_inputs(cfg, run_writes(cfg, "" if cfg.store.uri else runs_root, output_flag))
    if cfg.store.uri:
        check_writable(cfg, cfg.store.uri, "store.uri")
    if cfg.checkpoint.enabled and cfg.checkpoint.uri:
        check_writable(cfg, cfg.checkpoint.uri, "checkpoint.uri")
    if cfg.checkpoint.resume_from:
        cfg = check_resume_from(cfg, runs_root or cfg.store.uri)
    if cfg.task not in BUILTIN_TASKS:
        from trainer.tasks import get_task

        get_task(cfg.task)  # a ConfigError naming `task` when it does not import
    check_source(cfg)
    check_base_model(cfg, hub)
    check_scratch_model(cfg, here=hub)
    check_plan_gpu(cfg)
    return cfg


#: Fields only one built-in task reads: set for the other, they change nothing.
_TASK_ONLY_FIELDS = {
    "classification": ("data.label_column", "model.hidden_sizes"),
    "causal_lm": (
        "data.text_field",
        "data.max_bytes",
        "data.tokenizer",
        "data.tokenizer_sample_bytes",
        "data.format",
        "data.messages_field",
        "data.eval_prompts",
        "data.eval_generations",
        "data.eval_new_tokens",
        "model.n_layer",
        "model.n_head",
        "model.n_embd",
        "model.block_size",
        "model.init_from",
        "model.trust_remote_code",
    ),
}


def unread_by(task: str, field: str) -> bool:
    """Whether the built-in `task` never reads `field` (another built-in task's own); a custom
    task may read any."""
    return task in BUILTIN_TASKS and any(field in fields for t, fields in _TASK_ONLY_FIELDS.items() if t != task)


#: Fields another setting leaves unread: the fields, whether `cfg` leaves them unread, and why.
_SHADOWED: tuple[tuple[tuple[str, ...], Callable[[Config], bool], Callable[[Config], str]], ...] = (
    (
        ("train.epochs",),
        lambda cfg: cfg.train.max_steps > 0,
        lambda cfg: f"train.max_steps ({cfg.train.max_steps}) decides how long training runs (0: epochs do)",
    ),
    (
        ("train.max_consecutive_skips",),
        lambda cfg: cfg.train.on_nonfinite != "skip",
        lambda cfg: f"it counts skipped updates, and train.on_nonfinite is {cfg.train.on_nonfinite!r}",
    ),
    (
        ("train.bucket_cap_mb",),
        lambda cfg: cfg.train.strategy != "ddp",
        lambda cfg: f"DDP's gradient buckets only, and train.strategy is {cfg.train.strategy!r}",
    ),
    (
        ("train.divergence_check_steps",),
        lambda cfg: cfg.train.strategy == "fsdp",
        lambda cfg: "it compares DDP replicas, and train.strategy is 'fsdp' (no replicas)",
    ),
    (
        ("train.activation_checkpointing",),
        lambda cfg: cfg.task == "classification",
        lambda cfg: "the classifier's MLP has no blocks to recompute",
    ),
    (
        # Not checkpoint.uri: a local run fills it in whatever checkpoint.enabled says.
        ("checkpoint.interval_steps", "checkpoint.at_epoch_end", "checkpoint.keep_last"),
        lambda cfg: not cfg.checkpoint.enabled,
        lambda cfg: "checkpoint.enabled is false",
    ),
    (
        ("data.eval_prompts", "data.eval_generations", "data.eval_new_tokens", "model.trust_remote_code"),
        lambda cfg: cfg.task == "causal_lm" and not cfg.model.init_from,
        lambda cfg: "only a pretrained model's run reads it (model.init_from is empty)",
    ),
    (
        ("model.dropout",),
        lambda cfg: bool(cfg.model.init_from),
        lambda cfg: "the pretrained model's config.json sets its dropout (model.init_from)",
    ),
    (
        ("data.tokenizer_sample_bytes",),
        lambda cfg: (
            cfg.task == "causal_lm" and (bool(cfg.model.init_from) or not cfg.data.tokenizer.startswith("bpe:"))
        ),
        lambda cfg: (
            "it bounds the text a bpe: tokenizer trains on, and data.tokenizer is "
            + ("the pretrained model's" if cfg.model.init_from else repr(cfg.data.tokenizer))
        ),
    ),
    (
        ("data.label_column",),
        lambda cfg: cfg.task == "classification" and cfg.data.source in ("", "digits"),
        lambda cfg: "the built-in 'digits' source has its own labels",
    ),
    (
        ("data.format", "data.text_field", "data.messages_field"),
        lambda cfg: cfg.task == "causal_lm" and cfg.data.source in ("", "python-stdlib"),
        lambda cfg: "the built-in 'python-stdlib' source is plain text",
    ),
    (
        ("data.text_field",),
        lambda cfg: cfg.task == "causal_lm" and cfg.data.format in ("text", "chat"),
        lambda cfg: f"data.format is {cfg.data.format!r}, which reads no text field",
    ),
    (
        ("data.messages_field",),
        lambda cfg: cfg.task == "causal_lm" and cfg.data.format != "chat",
        lambda cfg: f"only chat data reads it (data.format is {cfg.data.format!r})",
    ),
    (
        ("data.num_proc",),
        lambda cfg: cfg.task == "causal_lm" and cfg.data.tokenizer == "bytes" and not cfg.model.init_from,
        lambda cfg: "the bytes tokenizer makes its tokens in one process",
    ),
    (
        ("kubernetes.elastic.min_replicas", "kubernetes.elastic.max_replicas", "kubernetes.elastic.max_restarts"),
        lambda cfg: not cfg.kubernetes.elastic.enabled,
        lambda cfg: "kubernetes.elastic.enabled is false (the job runs job.replicas replicas)",
    ),
    (
        ("kubernetes.runtime",),
        lambda cfg: cfg.job.kind == "pytorchjob",
        lambda cfg: "only a TrainJob runs on a ClusterTrainingRuntime, and job.kind is 'pytorchjob'",
    ),
    (
        ("export.max_shard_bytes",),
        lambda cfg: not cfg.model.init_from,
        lambda cfg: "only a fine-tuned pretrained model's Hugging Face folder is split (model.init_from is empty)",
    ),
)


def ignored_settings(cfg: Config) -> list[str]:
    """A line for each field set away from its default that this run never reads: another
    built-in task's field, a `lora.*` field (or `export.merge_lora`) without `train.method:
    lora`, or a field another setting leaves unread (`train.epochs` with `train.max_steps`: a
    pipeline's `epochs` parameter over such a config; `model.dropout` with `model.init_from`).
    Not errors (a config is often switched between tasks or methods), but never silent."""
    from trainer.report import config_changes

    changed = [field for field, _, _ in config_changes(to_dict(cfg))]
    lines = []
    for task, fields in _TASK_ONLY_FIELDS.items():
        lines += [
            f"{f}: set, but only task {task!r} reads it (task is {cfg.task!r}): no effect"
            for f in fields
            if f in changed and unread_by(cfg.task, f)
        ]
    if cfg.train.method != "lora":
        # `export.merge_lora` too: a LoRA config switched to `train.method: full` (a pipeline's
        # train_method parameter) exports the whole model, which is what merging would give.
        lines += [
            f"{f}: set, but LoRA is off (train.method {cfg.train.method!r}): no effect"
            for f in changed
            if f.startswith("lora.") or f == "export.merge_lora"
        ]
    said = {line.split(":", 1)[0] for line in lines}
    for fields, unread, why in _SHADOWED:
        for f in fields:
            if f in changed and f not in said and unread(cfg):  # one reason a field, the first
                said.add(f)
                lines.append(f"{f}: set, but {why(cfg)}: no effect")
    return lines


def unused_endpoint(cfg: Config) -> str:
    """A line when `store.endpoint` is set and a local run (`kftrain run --local` without a store)
    reads nothing with it, else ''. Not on a cluster: there the steps' own files are in KFP's
    pipeline root, an object store read with it."""
    uris = {
        "store.uri": cfg.store.uri,
        "data.source": cfg.data.source,
        "data.tokenizer": cfg.data.tokenizer,
        "model.init_from": cfg.model.init_from,
        "checkpoint.uri": cfg.checkpoint.uri,
        "checkpoint.resume_from": cfg.checkpoint.resume_from,
    }

    def remote(uri: str) -> bool:
        try:
            return "://" in uri and parse_uri(uri).is_remote
        except ValueError:  # not a store URI (hf://, a tokenizer spec)
            return False

    if not cfg.store.endpoint or any(remote(uri) for uri in uris.values()):
        return ""
    return (
        f"store.endpoint (--s3-endpoint) is set, but this local run reads and writes nothing in an object store "
        f"({', '.join(uris)} are local or empty): it has no effect; give --store s3://bucket/prefix for one"
    )


def check_plan_gpu(cfg: Config) -> None:
    """`plan.gpu` is a GPU type the planner knows (else ConfigError listing them), so that the plan
    step does not fail on it after the run started."""
    if not cfg.plan.gpu:
        return
    from trainer.plan.hardware import GPUS, AmbiguousGpu, HardwareError, MigSlice, gpu_spec

    try:
        spec = gpu_spec(cfg.plan.gpu)
    except AmbiguousGpu as exc:
        raise ConfigError(f"plan.gpu: {exc}") from None
    except MigSlice as exc:
        example = f" (e.g. {exc.gib})" if exc.gib else ""
        raise ConfigError(
            f"plan.gpu: {exc}; leave plan.gpu empty and set kubernetes.gpu_memory_gb to its memory{example}"
        ) from None
    except HardwareError:
        raise ConfigError(
            f"plan.gpu: not a GPU type the plan knows, got {cfg.plan.gpu!r}; use one of {', '.join(GPUS)}, "
            "or leave it empty and set kubernetes.gpu_memory_gb"
        ) from None
    # Less is a share of it (a MIG slice); more is not this GPU. The name's figure (80, 141) is
    # what people write for the driver's 79.6 and 140.4 GiB: within 2%.
    if cfg.kubernetes.gpu_memory_gb > spec.memory_gib * 1.02:
        raise ConfigError(
            f"kubernetes.gpu_memory_gb: {cfg.kubernetes.gpu_memory_gb:g} GiB is more than the {spec.name} has "
            f"({spec.memory_gib:g} GiB, plan.gpu {cfg.plan.gpu!r}): name the GPU you have, or give less"
        )


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: a file name's bytes that are not UTF-8
        return False
    return True


def with_absolute_paths(cfg: Config) -> Config:
    """`cfg` with each relative local path among the places a run reads (`data.source`,
    `model.init_from`, a `data.tokenizer` file) and writes (`store.uri`, `checkpoint.uri`) made
    absolute against the working directory, as `checkpoint.resume_from` is (:func:`check_resume_from`):
    the run's records, its model card and a `--run-id` continuation from another folder then name the
    same files (was: kept relative, the card naming `kftrain-outputs/...`, and a continuation from
    elsewhere refused with "no object there")."""
    from trainer.launch.job import pod_read_paths

    places = {**pod_read_paths(cfg), "store.uri": cfg.store.uri, "checkpoint.uri": cfg.checkpoint.uri}
    for field, value in places.items():
        if not value or "://" in value or os.path.isabs(value):
            continue
        section, name = field.split(".")
        pinned = os.path.abspath(os.path.expanduser(value))
        if not pinned.isprintable() or not _utf8(pinned):  # a folder named in bytes no config can hold: as given
            continue
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: pinned})})
    return cfg


def check_resume_from(cfg: Config, root: str) -> Config:
    """`checkpoint.resume_from` names a complete checkpoint (:func:`trainer.runs.resolve_resume_from`,
    a run id under store root `root`) written under a config this one can continue: the fields
    that change what the weights or the data position mean are the same
    (:func:`trainer.train.check_resumable`; the world size is checked when training starts, as
    whether it may change depends on the task's data). Return `cfg` with it pinned to that
    checkpoint's step folder, so a retried step reads the same one."""
    from trainer.runs import resolve_resume_from

    with check_deadline(MODEL_CHECK_BUDGET_S):  # a few listings and reads, as the base model's check
        folder, record = resolve_resume_from(cfg, root)
    if "://" not in folder:
        # Pinned as an absolute path: a relative one, read again from another working directory (a
        # `--run-id` continuation, its lineage, export_best's candidates), named another place.
        folder = os.path.abspath(os.path.expanduser(folder))
    try:
        check_continues(cfg, record, "start without resume_from")
    except KftrainError as exc:
        raise ConfigError(f"checkpoint.resume_from {cfg.checkpoint.resume_from!r} ({folder}): {exc}") from None
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, resume_from=folder))


def check_continues(cfg: Config, record: dict[str, Any], other: str) -> None:
    """`cfg` can continue the checkpoint whose commit record is `record`, before any step:
    :func:`trainer.train.check_resumable` at the checkpoint's own world size (whether that may
    change depends on the task's data, checked when training starts), a step limit not before
    it (:func:`trainer.train.check_steps_left`) and the same base
    model weights (a Hub model: when training starts, which downloads them). `other` is the way
    out the error names besides the checkpoint's values."""
    from trainer import pretrained
    from trainer.checkpoint_owner import check_format
    from trainer.train import check_resumable, check_same_inputs, check_steps_left

    check_format(record, f"step {record.get('step')}")
    world = int(record.get("world_size", 1))
    check_resumable(record.get("config", {}), cfg, world, world, True, other, log_changes=False)
    check_steps_left(record, cfg, other)
    saved = record.get("inputs") or {}
    if "base_model" in saved and cfg.model.init_from and not cfg.model.init_from.startswith(pretrained.HF_SCHEME):
        now = {"base_model": pretrained.weights_fingerprint(pretrained.source_for(cfg, weights=False))}
        check_same_inputs(saved, now, record.get("config", {}), cfg, other)


def state_bytes_per_rank(parameters: int, adapters: int, method: str, shards: int, frozen_bytes: int) -> int:
    """The training state one rank holds, activations aside. `full` trains every parameter
    (:data:`TRAINED_BYTES` each); `lora` keeps the base's `parameters` frozen at `frozen_bytes`
    each (no gradient, no optimizer state) and trains the `adapters`. FSDP splits all of it over
    `shards` ranks; DDP holds all of it on every rank (`shards` 1)."""
    trained = adapters if method == "lora" else parameters
    frozen = parameters if method == "lora" else 0
    return -(-(frozen_bytes * frozen + TRAINED_BYTES * trained) // shards)


def check_scratch_model(cfg: Config, here: bool = False) -> None:
    """Refuse a built-in task's model trained from scratch whose training state cannot fit
    (:func:`check_model_memory`, at :func:`scratch_parameters`, a lower bound): was, a model of
    10**12 parameters passed every check and failed in the replicas, naming no field."""
    if cfg.task in BUILTIN_TASKS and not cfg.model.init_from:
        check_model_memory(cfg, scratch_parameters(cfg), 0, here)


def scratch_parameters(cfg: Config) -> int:
    """At least the parameters of the built-in task's model `model.*` builds; what the data decide
    (a table's width and classes, a tokenizer's vocabulary) counted at its least (one feature and
    two classes; 256 tokens)."""
    m = cfg.model
    if cfg.task == "classification":
        widths = [1, *m.hidden_sizes, 2]
        return sum(a * b + b for a, b in itertools.pairwise(widths))
    # Each block: attention's q, k, v and output (4 n^2) and the MLP's two 4x layers (8 n^2).
    return m.n_layer * 12 * m.n_embd**2 + (256 + m.block_size) * m.n_embd


#: What a GPU driver shows on Linux (NVIDIA, AMD's ROCm, WSL's): local ranks use a GPU where there is one.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def _ranks_on_cpu() -> bool:
    """Whether local ranks train on the CPU (:func:`trainer.distributed.device_for`: a GPU each
    where CUDA is present), asked of the system, not of torch (the pre-flight does not import it):
    a machine with a GPU driver counts as one whose ranks do not, so a run is never refused for
    host memory its GPUs would hold."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return not torch.cuda.is_available()
    return not any(os.path.exists(p) for p in GPU_DRIVER_PATHS)


def _total_memory() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def check_model_memory(cfg: Config, parameters: int, adapters: int, here: bool = False) -> None:
    """Refuse a model whose training state (:func:`state_bytes_per_rank`) alone exceeds the
    memory the config gives each rank: `kubernetes.gpu_memory_gb` per GPU, or on a CPU job
    (`kubernetes.gpus_per_node` 0) `kubernetes.memory` per replica of `job.nproc_per_node` ranks;
    with neither, and `here` (`kftrain run --local`: every rank on this machine) where the ranks
    train on the CPU, this machine's memory for all of them. Activations (batch, block size,
    checkpointing) come on top and are not counted, so a refused run cannot fit; one that passes
    may still not. No limit: no check."""
    kc, job, train = cfg.kubernetes, cfg.job, cfg.train
    nodes = kc.elastic.min_replicas if kc.elastic.enabled else job.replicas
    world = nodes * job.nproc_per_node  # the smallest world the job runs at holds the largest shards
    fsdp = train.strategy == "fsdp"
    gpu = kc.gpu_memory_gb > 0
    machine = 0  # this machine's memory, where it is the limit
    if gpu:
        field, value, limit = "kubernetes.gpu_memory_gb", f"{kc.gpu_memory_gb:g}", kc.gpu_memory_gb * 2**30
        ranks_per_limit, place = 1, "each GPU"
        frozen = 2 if train.precision in ("auto", "bf16") else 4  # a LoRA base is bf16 on GPUs
    elif not kc.gpus_per_node and kc.memory:
        field, value, limit = "kubernetes.memory", kc.memory, quantity_value(kc.memory)
        ranks_per_limit, place = job.nproc_per_node, "each replica"
        frozen = 4
    elif here and not kc.gpus_per_node and _ranks_on_cpu() and (machine := _total_memory()):
        field, value, limit = "this machine's memory", "", machine
        ranks_per_limit, place = (
            world,
            "this machine" if world == 1 else f"this machine, where all {world} local ranks run,",
        )
        frozen = 4
    else:
        return

    def need(method: str, shards: int) -> int:
        return ranks_per_limit * state_bytes_per_rank(parameters, adapters, method, shards, frozen)

    method = train.method
    needed = need(method, world if fsdp else 1)
    if needed <= limit:
        return
    if method == "lora":
        what = (
            f"the frozen base at {frozen} bytes per parameter and {_count(adapters)} adapter parameters at "
            f"{TRAINED_BYTES}"
        )
    else:
        what = f"weights, gradients and AdamW moments in fp32: {TRAINED_BYTES} bytes per parameter"
    if fsdp:
        what += f", split over {world} ranks"
    if ranks_per_limit > 1:
        what += f", x {ranks_per_limit} {'local ranks' if machine else 'ranks per replica'}"
    fixes = []
    if not fsdp and (world > 1 or not machine):  # one rank on this machine: FSDP would shard nothing
        spread = f"for the {world} ranks together" if machine else f"over the {world} ranks"
        fixes.append(f"train.strategy: fsdp ({_gib(need(method, world))} {spread})")
    if method == "full" and cfg.model.init_from:
        fixes.append(f"train.method: lora (the frozen base alone: {_gib(need('lora', world if fsdp else 1))})")
    if not machine:  # this machine's ranks are the job's: more of them share the same memory
        ranks = math.ceil(need(method, 1) / limit)
        fixes.append(f"at least {ranks} ranks under fsdp (job.replicas x job.nproc_per_node, now {world})")
    if not cfg.model.init_from:
        sizes = "model.hidden_sizes" if cfg.task == "classification" else "model.n_layer or model.n_embd"
        fixes.append(f"a smaller model ({sizes})")
    fixes.append("a machine with more memory" if machine else "larger GPUs" if gpu else "a larger kubernetes.memory")
    model = repr(cfg.model.init_from) if cfg.model.init_from else f"the {cfg.task} model of model.*"
    at_least = "" if cfg.model.init_from else "at least "
    raise ConfigError(
        f"{field}{f' {value}' if value else ''}: training {model} ({at_least}{_count(parameters)} parameters, "
        f"train.method {method}, train.strategy {train.strategy}) needs at least {_gib(needed)} in {place} before "
        f"activations ({what}), more than its {_gib(limit)}; use "
        + (f"{', '.join(fixes[:-1])}, or {fixes[-1]}" if len(fixes) > 1 else fixes[0])
    )


def _gib(n: float) -> str:
    """Bytes as the largest binary unit that keeps a digit before the point."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} bytes"


def _count(n: int) -> str:
    """A parameter count the way model cards give it (7.62B, 1.3M)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def check_base_model(cfg: Config, hub: bool = False) -> None:
    """`model.init_from` names a model kftrain can fine-tune as configured: the folder exists with
    config.json (an architecture kftrain builds; remote code only under `model.trust_remote_code`)
    and tokenizer.json, `model.block_size` is within its context, `data.format: chat` has a chat
    template, its safetensors headers hold every tensor the model needs in the right shape,
    `lora.target_modules` name layers LoRA can adapt, and the training state fits the configured
    memory (:func:`check_model_memory`). No weight is read.

    An `hf://` model is checked for its form only: the Hub is asked in data prep, from a pod that
    has the network and the token (a cluster's configure step has neither). With `hub` (the steps
    run here: `kftrain run --local`), its config and tokenizer files are fetched into the Hugging
    Face cache, where data prep reads them again, and checked as a folder's are, without the weights."""
    origin = cfg.model.init_from
    if not origin:
        return
    from trainer import pretrained

    if origin.startswith(pretrained.HF_SCHEME):
        pretrained.parse_hf_uri(origin)
        if hub:
            _check_folder(cfg, pretrained.resolve(origin, weights=False))
        return
    try:
        with check_deadline(MODEL_CHECK_BUDGET_S):
            source = pretrained.source_for(cfg)
            config = _check_folder(cfg, source)
            index = pretrained.tensor_index(source)
    except StoreError as exc:
        raise under_setting("model.init_from" if origin in str(exc) else f"model.init_from {origin}", exc) from None
    adapters = _check_modules(cfg, source, config, index)
    parameters = sum(math.prod(e.shape) for e in index.values())
    check_model_memory(cfg, parameters, adapters, hub)


def _check_folder(cfg: Config, source: ModelSource) -> dict[str, Any]:
    """The folder's config.json, after the checks its small files allow."""
    from trainer import pretrained

    origin, store = source.origin, source.store
    if parse_uri(source.uri).key and store.exists(source.uri.rstrip("/")):
        raise pretrained.PretrainedError(
            f"model.init_from {origin!r}: a file, not a folder; name the model's folder (config.json, "
            "*.safetensors, tokenizer.json)"
        )
    if not store.exists(join_uri(source.uri, pretrained.CONFIG)) and not store.list(source.uri.rstrip("/") + "/"):
        raise pretrained.PretrainedError(
            f"model.init_from {origin!r}: no such folder (nothing at or under it); fix the path, or put the "
            "model's folder there (config.json, *.safetensors, tokenizer.json)"
        )
    config = pretrained.read_config(source, cfg.model.trust_remote_code)
    if not store.exists(join_uri(source.uri, "tokenizer.json")):
        raise pretrained.PretrainedError(
            f"model.init_from {origin!r}: no tokenizer.json in the folder; kftrain tokenizes with the model's fast "
            "tokenizer: add it (transformers: `AutoTokenizer.from_pretrained(...).save_pretrained(folder)`)"
        )
    pretrained.check_tokenizer_files(source, config, chat=cfg.data.format == "chat")
    limit = pretrained.context_length(config)
    if limit and cfg.model.block_size > limit:
        raise ConfigError(
            f"model.block_size {cfg.model.block_size} is longer than the pretrained model's context "
            f"({limit} tokens, config.json of {origin!r}); use at most {limit}"
        )
    return config


def _check_lora_targets(cfg: Config, modules: dict[str, Any], linear: set[str]) -> None:
    """Every `lora.target_modules` entry names a layer of the model (peft's rule: the layer's
    name, or its last path components): a misspelled entry beside a good one is dropped by peft
    in silence."""
    layers = f"The model's linear layers: {', '.join(sorted(linear))} (a name matches a layer's last path component)"
    matched = {t: [m for n, m in modules.items() if n == t or n.endswith("." + t)] for t in cfg.lora.target_modules}
    missing = [t for t, found in matched.items() if not found]
    if missing:
        peft = "; peft's 'all-linear' is not taken here: list the layers" if "all-linear" in missing else ""
        raise ConfigError(
            f"lora.target_modules {missing}: not found in the model (a misspelled name beside a good one would be "
            f"dropped{peft}). {layers}"
        )
    for target, found in matched.items():
        if not any(_adaptable(m) for m in found):
            kind = type(found[0]).__name__
            what = "a block of layers" if any(True for _ in found[0].children()) else "not a layer LoRA adapts"
            raise ConfigError(
                f"lora.target_modules: {target!r} names a {kind}, {what}; name the layers in it. {layers}"
            )


def _adaptable(module: Any) -> bool:
    """A layer peft's LoRA can adapt: linear (GPT-2's `Conv1D` included), embedding or convolution
    or multi-head attention."""
    import torch

    kinds = (torch.nn.Embedding, torch.nn.modules.conv._ConvNd, torch.nn.MultiheadAttention)
    return _linear(module) or isinstance(module, kinds)


def _linear(module: Any) -> bool:
    """A linear layer: `nn.Linear`, or transformers' `Conv1D` (GPT-2's, a linear layer with its weight input-major)."""
    import torch

    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


def _check_lora_rank(cfg: Config, model: Any) -> None:
    """`lora.rank` is at most the smaller side of every layer it adapts: past it an adapter only
    costs memory (a rank of 10**6 on a 64-wide layer took gigabytes, then the job)."""
    sides = [min(m.in_features, m.out_features) for m in model.modules() if hasattr(m, "lora_A")]
    if sides and cfg.lora.rank > min(sides):
        raise ConfigError(
            f"lora.rank: {cfg.lora.rank} is larger than the smaller side ({min(sides)}) of a layer it adapts: an "
            "adapter's rank is at most that; lower lora.rank"
        )


def _check_merge(cfg: Config, model: Any, shared: set[str]) -> None:
    """`export.merge_lora` with an adapter on either side of a weight tie (`lm_head` tied to the
    embeddings, or the embeddings themselves): merging its change into the one tensor would change
    the other side too, which the trained model never did (was: the embeddings' adapter merged,
    and the exported model's loss far from the reported one); found now, not at export."""
    if not cfg.export.merge_lora:
        return
    adapted = [n for n, m in model.named_modules() if hasattr(m, "lora_A") or hasattr(m, "lora_embedding_A")]
    clash = sorted(c for c in shared if any(a == c or a.endswith("." + c) for a in adapted))
    if clash:
        raise ConfigError(
            f"export.merge_lora: the adapter on {clash[0]!r} changes a weight tied to another one, which a merged "
            "folder cannot hold; serve the adapter (export.merge_lora: false), or leave it out of lora.target_modules"
        )


def _check_weights(origin: str, model: Any, index: dict[str, TensorEntry]) -> None:
    """The folder's safetensors hold every tensor `model` (built from its config.json, on the meta
    device) needs, in its shape; a tied copy is said once, in a warning."""
    from trainer import pretrained
    from trainer.model_io import tied_names

    tied = tied_names(model)
    for key in sorted({pretrained.base_name(name) for name in tied} & index.keys()):
        # transformers 5 unties the two where their values differ; kftrain reads config.json alone.
        log.warning(
            "model.init_from %r: config.json ties %r to the input embeddings (tie_word_embeddings: true), and the "
            "weights hold their own %r too: kftrain trains and exports the embeddings in its place, which is the "
            "same model where the two are equal; where they differ, set tie_word_embeddings: false in config.json",
            origin,
            key,
            key,
        )
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name in tied:
            continue
        key = pretrained.base_name(name)
        entry = index.get(key)
        if entry is None:
            raise pretrained.PretrainedError(
                f"model.init_from {origin!r}: the folder's weights lack {key!r}, which the model of its config.json "
                "needs; the folder is incomplete or of another architecture"
            )
        if tuple(entry.shape) != tuple(tensor.shape):
            raise pretrained.PretrainedError(
                f"{entry.uri}: tensor {key!r} has shape {list(entry.shape)}, the model built from config.json "
                f"expects {list(tensor.shape)}; the folder's weights and config.json disagree"
            )
    unused = _unused_tensors(model, index)
    if unused:
        # Was: left unread, so a config.json of a smaller variant (fewer layers, no biases) trained
        # and exported another model than the weights', silently.
        raise pretrained.PretrainedError(
            f"model.init_from {origin!r}: the folder's weights hold {len(unused)} tensor(s) the model of its "
            f"config.json has no place for (e.g. {', '.join(repr(k) for k in unused[:3])}): config.json describes "
            "another model than the weights (num_hidden_layers, a bias flag?), or they hold more than the causal "
            "language model (a value head); use the config.json saved with these weights, or save the model alone "
            "(transformers: `save_pretrained` of the causal LM)"
        )


def _unused_tensors(model: Any, index: dict[str, TensorEntry]) -> list[str]:
    """The folder's tensors that `model` (built from its config.json) has no parameter or buffer
    for, less the leftovers of older saves: the names the model class lists as such (GPT-2's
    `attn.bias`), per-layer rotary tables and position ids where the model keeps them as buffers
    of its own now (as transformers' loader drops them), and scalars."""
    import re

    from trainer import pretrained

    buffers = [name for name, _ in model.named_buffers()]
    known = {pretrained.base_name(name) for name in [*model.state_dict(keep_vars=True), *buffers]}
    leftovers = set(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    if any(name.endswith("rotary_emb.inv_freq") for name in buffers):
        leftovers.add(r"rotary_emb\.inv_freq")
    if any(name.endswith("position_ids") for name in buffers):
        leftovers.add(r"(^|\.)position_ids$")
    dropped = re.compile("|".join(f"(?:{p})" for p in leftovers)) if leftovers else None
    # A scalar is a constant an older save kept (GPT-2's `attn.masked_bias`, which transformers
    # loads past with a note), not a weight of another model.
    return sorted(
        k for k, entry in index.items() if entry.shape and k not in known and not (dropped and dropped.search(k))
    )


def _check_modules(cfg: Config, source: ModelSource, config: dict[str, Any], index: dict[str, TensorEntry]) -> int:
    """Build the model of `config` on the meta device (with its LoRA adapters), compare it with
    the safetensors headers in `index`, and return how many adapter parameters train (0: full)."""
    import warnings

    import torch

    from trainer import pretrained
    from trainer.model_io import shared_names
    from trainer.tasks.pretrained_lm import apply_lora

    origin = cfg.model.init_from
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and peft's notes to their own developers
        model = pretrained.build_on_meta(config, torch.float32, source)  # its errors name the folder
        # The weights against config.json first: a folder of another architecture is said as such,
        # not as layers its config lacks (`lora.target_modules`).
        _check_weights(origin, model, index)
        if cfg.train.method == "lora":
            linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if _linear(m)}
            _check_lora_targets(cfg, dict(model.named_modules()), linear)
            shared = {name.removesuffix(".weight") for name in shared_names(model)}  # both sides of a tie
            try:
                model = apply_lora(model, dataclasses.asdict(cfg.lora))
            except pretrained.PretrainedError as exc:
                raise pretrained.PretrainedError(
                    f"{exc} The model's linear layers: {', '.join(sorted(linear))} (a name matches a layer's last "
                    "path component)"
                ) from None
            _check_lora_rank(cfg, model)
            _check_merge(cfg, model, shared)
    return sum(p.numel() for p in model.parameters() if p.requires_grad) if cfg.train.method == "lora" else 0
