"""The pipeline steps as plain functions: which launcher `auto` means where, the store each URI
gets, data prep on a small local CSV, and what claiming the checkpoint prefix does to the config
the training job's replicas run with."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import current_owner
from trainer.config import ConfigError, config_from_json, load_config, to_dict
from trainer.launch.local import RUN_MARKER_ENV, LocalBackend
from trainer.launch.spec import JobSpec, job_name
from trainer.pipeline_steps import (
    claim_checkpoints,
    prepare_data,
    resolve_launcher,
    run_config,
    run_prediction,
    select_backend,
    store_for,
    train_model,
    with_recorded_pods,
)
from trainer.shards import DataError, read_manifest
from trainer.storage import LocalStore, ObjectNotFound, S3Store, StoreError, join_uri
from trainer.train import TRAINING_RECORD

# --- the launcher -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("launcher", "service_host", "resolved"),
    [
        # auto: Kubernetes inside a pod (the API server's address is in the environment), else local.
        ("auto", "10.0.0.1", "kubernetes"),
        ("auto", None, "local"),
        ("auto", "", "local"),
        # An explicit launcher is taken as asked, wherever it runs.
        ("local", "10.0.0.1", "local"),
        ("local", None, "local"),
        ("kubernetes", None, "kubernetes"),
        ("kubernetes", "10.0.0.1", "kubernetes"),
    ],
)
def test_resolve_launcher(monkeypatch, launcher, service_host, resolved):
    if service_host is None:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    else:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", service_host)
    assert resolve_launcher(launcher) == resolved


@pytest.mark.parametrize("launcher", ["k8s", "Local", "AUTO", "", "kubeflow"])
def test_an_unknown_launcher_is_refused_naming_the_choices(launcher):
    with pytest.raises(ConfigError) as err:  # a KftrainError: the step ends on this one line, no traceback
        resolve_launcher(launcher)
    assert str(err.value) == f"launcher {launcher!r}: must be one of auto, local, kubernetes"
    with pytest.raises(ConfigError, match="must be one of"):
        select_backend(launcher)  # refused before any backend is built


def test_auto_outside_a_pod_runs_the_job_as_local_processes(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert isinstance(select_backend("auto"), LocalBackend)
    assert isinstance(select_backend("local"), LocalBackend)


# --- the store ----------------------------------------------------------------------------------


def test_store_for_a_local_path_is_a_local_store_and_check_creates_nothing(tmp_path):
    uri = str(tmp_path / "out" / "model")
    store = store_for(load_config(), uri)
    assert isinstance(store, LocalStore)
    store_for(load_config(), uri, check=True)  # writable: the nearest existing folder is
    assert not Path(uri).exists() and not (tmp_path / "out").exists()  # the first write makes the folders


def test_store_for_a_path_that_cannot_be_a_directory_fails_the_check(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file, not a folder"):
        store_for(load_config(), str(tmp_path / "file" / "model"), check=True)


def test_store_for_an_s3_uri_uses_the_configured_endpoint_and_retry_budget(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://from-env:9000")  # the config's endpoint wins
    cfg = load_config(overrides={"store.endpoint": "http://minio.kubeflow:9000", "store.retry_budget_seconds": 7})
    store = store_for(cfg, "s3://bucket/model")  # no `check`: no request is made
    assert isinstance(store, S3Store)
    assert store.endpoint == "http://minio.kubeflow:9000"
    assert store.policy.budget_s == 7


# --- data prep ----------------------------------------------------------------------------------


def small_csv(tmp_path: Path, rows: int = 60) -> str:
    path = tmp_path / "source.csv"
    path.write_text("a,b,label\n" + "".join(f"{i % 7}.5,{(i * 3) % 11}.25,{'xy'[i % 2]}\n" for i in range(rows)))
    return str(path)


def test_prepare_data_writes_shards_and_a_manifest_through_the_store(tmp_path):
    dataset = str(tmp_path / "dataset")
    cfg = load_config(overrides={"data.source": small_csv(tmp_path), "data.shard_rows": 16})
    manifest = prepare_data(cfg, dataset)
    assert read_manifest(LocalStore(), dataset, expected_format=manifest["format"]) == manifest
    assert manifest["feature_names"] == ["a", "b"] and manifest["classes"] == ["x", "y"]
    assert sum(split["rows"] for split in manifest["splits"].values()) == 60
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            assert LocalStore().exists(join_uri(dataset, shard["name"]))


def test_prepare_data_checks_the_source_before_writing_anything(tmp_path):
    dataset = tmp_path / "dataset"
    missing = str(tmp_path / "no-such.csv")
    with pytest.raises(DataError) as err:
        prepare_data(load_config(overrides={"data.source": missing}), str(dataset))
    assert "data.source" in str(err.value) and missing in str(err.value)
    assert not dataset.exists()


# --- the checkpoint prefix ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "owner"),
    [
        # The step's task identity owns the prefix, and the replicas write as that owner.
        ({}, "run-1/train"),
        # checkpoint.owner in the config names the owner instead (a run continued by hand).
        ({"checkpoint.owner": "pinned"}, "pinned"),
    ],
)
@pytest.mark.parametrize("own_uri", [False, True], ids=["under the model", "checkpoint.uri"])
def test_claim_checkpoints_sets_the_owner_the_replicas_write_as(tmp_path, caplog, overrides, owner, own_uri):
    model_uri = str(tmp_path / "model")
    prefix = str(tmp_path / "elsewhere") if own_uri else join_uri(model_uri, "checkpoints")
    cfg = load_config(overrides={**overrides, **({"checkpoint.uri": prefix} if own_uri else {})})
    with caplog.at_level("WARNING", logger="kftrain"):
        claimed = claim_checkpoints(cfg, model_uri, owner="run-1/train")
    # Another run's identity is said: a config copied from a run's records holds it (was: silent).
    said = f"checkpoint.owner 'pinned': this task (run-1/train) trains as that run, owning its checkpoints at {prefix}"
    assert (said in caplog.text) is (owner == "pinned"), caplog.text
    # Under `kftrain run --local`, which names its run id the owner (and refuses another): not said.
    caplog.clear()
    with caplog.at_level("WARNING", logger="kftrain"), pytest.MonkeyPatch.context() as env:
        env.setenv(RUN_MARKER_ENV, "run-1")
        claim_checkpoints(cfg, model_uri, owner="run-1/train")
    assert "checkpoint.owner" not in caplog.text
    assert claimed.checkpoint.owner == owner
    assert current_owner(LocalStore(), prefix)["owner"] == owner
    assert cfg.checkpoint.owner == overrides.get("checkpoint.owner", "")  # the caller's config is unchanged
    assert claimed.checkpoint.uri == cfg.checkpoint.uri and claimed.train == cfg.train  # nothing else changes


def test_with_checkpoints_off_nothing_is_claimed(tmp_path):
    model_uri = str(tmp_path / "model")
    cfg = load_config(overrides={"checkpoint.enabled": False})
    assert claim_checkpoints(cfg, model_uri, owner="run-1/train") is cfg
    assert not (tmp_path / "model").exists()


# --- the training step, with a backend that stands in for the job -------------------------------


class JobThatWritesItsRecord:
    """A JobBackend whose job succeeds at once, writing the training record as rank 0 would."""

    def __init__(self) -> None:
        self.submitted: list[JobSpec] = []

    def submit(self, spec: JobSpec) -> None:
        self.submitted.append(spec)

    def wait(self, spec: JobSpec) -> None:
        model_uri = spec.artifact_uris["model URI"]
        LocalStore().put_bytes(join_uri(model_uri, TRAINING_RECORD), json.dumps({"steps": 3}).encode())

    def logs(self, spec: JobSpec, tail: int = 50) -> dict[str, list[str]]:
        return {}

    def cancel(self, spec: JobSpec) -> None:
        pass


def replica_config(spec: JobSpec):
    args = list(spec.command)
    return config_from_json(args[args.index("--config-json") + 1])


def test_train_model_runs_the_job_as_the_claimed_owner_and_returns_its_record(tmp_path):
    dataset, model = str(tmp_path / "dataset"), str(tmp_path / "model")
    prepare_data(load_config(overrides={"data.source": small_csv(tmp_path)}), dataset)
    backend = JobThatWritesItsRecord()
    # The pods' settings as the step applied them (a KFP task's resources merged in), which the
    # replicas never get: recorded here, and what the card and report show (were: the export and
    # evaluate steps' own config, without the task's settings).
    cfg = load_config(overrides={"train.batch_size": 8, "kubernetes.gpus_per_node": 1, "job.nproc_per_node": 1})
    record = train_model(cfg, dataset, model, backend, identity="run-7/train")
    pods = {"kubernetes": to_dict(cfg)["kubernetes"]}
    assert record == {"steps": 3, "pod_settings": pods}
    assert json.loads(LocalStore().get_bytes(join_uri(model, "training.json"))) == record
    shown = run_config({**record, "config": {"train": {"max_steps": 3}}}, load_config())
    assert shown == {"train": {"max_steps": 3}, **pods} and shown["kubernetes"]["gpus_per_node"] == 1
    # And the report's prediction is for those pods (was: the evaluate step's own, without GPUs).
    assert with_recorded_pods(load_config(), record).kubernetes == cfg.kubernetes
    assert with_recorded_pods(load_config(), {"steps": 3}) == load_config()
    (spec,) = backend.submitted
    assert spec.name == job_name("run-7/train")
    assert replica_config(spec).checkpoint.owner == "run-7/train"
    assert current_owner(LocalStore(), join_uri(model, "checkpoints"))["owner"] == "run-7/train"


@pytest.mark.skipif(torch.cuda.is_available(), reason="says what a machine without a GPU does")
@pytest.mark.parametrize(("local", "gpus", "warned"), [(True, 1, True), (True, 0, False), (False, 1, False)])
def test_a_job_asking_for_gpus_on_a_machine_without_any_is_said_to_train_on_the_cpu(
    tmp_path, caplog, local, gpus, warned
):
    """The local launcher's replicas are this machine's processes (was: `gpus_per_node` 1 on a
    CPU machine trained on the CPU, said nowhere); a cluster's pods get their GPUs."""

    class LocalJob(JobThatWritesItsRecord, LocalBackend):  # the local launcher's kind, its job stood in for
        pass

    dataset, model = str(tmp_path / "dataset"), str(tmp_path / "model")
    prepare_data(load_config(overrides={"data.source": small_csv(tmp_path)}), dataset)
    cfg = load_config(overrides={"train.batch_size": 8, "kubernetes.gpus_per_node": gpus, "job.nproc_per_node": 1})
    with caplog.at_level(logging.WARNING, logger="kftrain"):
        train_model(cfg, dataset, model, LocalJob() if local else JobThatWritesItsRecord(), identity="run-7/train")
    said = [r.getMessage() for r in caplog.records if "gpus_per_node" in r.getMessage()]
    assert said == (
        [
            "kubernetes.gpus_per_node 1: the local launcher's replicas are processes on this machine, "
            "which has no GPU: they train on the CPU"
        ]
        if warned
        else []
    )


def test_train_model_with_no_whole_step_in_an_epoch_fails_before_any_job_or_claim(tmp_path):
    dataset, model = str(tmp_path / "dataset"), tmp_path / "model"
    prepare_data(load_config(overrides={"data.source": small_csv(tmp_path)}), dataset)
    backend = JobThatWritesItsRecord()
    cfg = load_config(overrides={"train.batch_size": 1_000_000})  # as typed in the KFP UI
    with pytest.raises(ConfigError, match=r"^train\.batch_size: the \d+ training items .* make no whole step"):
        train_model(cfg, dataset, str(model), backend, identity="run-7/train")
    assert backend.submitted == []
    assert current_owner(LocalStore(), str(model / "checkpoints")) is None


def test_train_model_without_a_prepared_dataset_fails_before_any_job_or_claim(tmp_path):
    model = tmp_path / "model"
    backend = JobThatWritesItsRecord()
    # Also what another artifact wired into the step's `dataset` input gets: what to wire instead.
    with pytest.raises(
        ObjectNotFound,
        match=r"no file at .*no-dataset/manifest\.json: .* is not a dataset kftrain's "
        r"data prep wrote; give the step the `dataset` output of data prep",
    ):
        train_model(load_config(), str(tmp_path / "no-dataset"), str(model), backend, identity="run-7/train")
    assert backend.submitted == []
    assert current_owner(LocalStore(), str(model / "checkpoints")) is None


def test_train_model_with_shards_deleted_since_data_prep_fails_before_any_job_or_claim(tmp_path):
    """A cached data prep's dataset whose files were deleted (KFP's cache does not look): named
    with the fix before the job starts (was: a replica's "no file at ...rows-00000.npz")."""
    dataset, model = tmp_path / "dataset", tmp_path / "model"
    prepare_data(load_config(overrides={"data.source": small_csv(tmp_path)}), str(dataset))
    (shard,) = sorted((dataset / "train").iterdir())[:1]
    shard.unlink()
    backend = JobThatWritesItsRecord()
    with pytest.raises(DataError, match=rf"its manifest lists train/{shard.name}, which the dataset no longer holds"):
        train_model(load_config(), str(dataset), str(model), backend, identity="run-7/train")
    assert backend.submitted == []
    assert current_owner(LocalStore(), str(model / "checkpoints")) is None
    # A shard named another way than the listing spells it, or through a link: read as training reads it.
    (dataset / "elsewhere").mkdir()
    (dataset / "elsewhere" / shard.name).write_bytes(b"")
    manifest = json.loads((dataset / "manifest.json").read_text())
    (entry,) = [e for e in manifest["splits"]["train"]["shards"] if e["name"] == f"train/{shard.name}"]
    entry["name"] = f"./elsewhere/{shard.name}"
    (dataset / "manifest.json").write_text(json.dumps(manifest))
    cfg = load_config(overrides={"train.batch_size": 8, "job.nproc_per_node": 1})
    train_model(cfg, str(dataset), str(model), backend, identity="run-7/train")
    assert len(backend.submitted) == 1


# --- the report's prediction --------------------------------------------------------------------

GPT = {
    "task": "causal_lm",
    "model.n_layer": 2,
    "model.n_head": 2,
    "model.n_embd": 64,
    "model.block_size": 64,
    "train.batch_size": 16,
    "train.max_steps": 100,
}
GPU_JOB = {"job.nproc_per_node": 8, "kubernetes.gpus_per_node": 8}


@pytest.mark.parametrize(
    ("overrides", "source", "timed"),
    [
        # a CPU run: the config's GPU type and memory are not what it ran on; its step time comes
        # from a probe of a few steps in this process
        ({"plan.gpu": "H200", "kubernetes.gpu_memory_gb": 80.0}, "on the CPU, 2 node(s) x 1 process(es)", True),
        ({**GPU_JOB, "plan.gpu": "H100"}, "on H100, 2 node(s) x 8 process(es)", True),
    ],
)
def test_the_reports_prediction_is_for_the_device_and_shape_the_run_had(overrides, source, timed):
    from trainer.pipeline_steps import plan_run

    cfg = load_config(None, {**GPT, **overrides})
    manifest = {"vocab_size": 256}
    prediction = run_prediction(cfg, manifest)
    assert source in prediction["source"]
    on_cpu = "kubernetes.gpus_per_node" not in overrides
    plan = plan_run(cfg, nodes=(2,), manifest=manifest) if not on_cpu else None
    if plan is not None:  # the tensors only: the allocator's counter does not see the CUDA context
        assert prediction["peak_memory_bytes"] == plan.memory.total - plan.memory.other < plan.memory.total
    assert prediction["peak_memory_bytes"] > 0
    assert (prediction["step_seconds"] is not None) == timed
    assert (prediction["eta_seconds"] is not None) == timed
    if timed:
        assert prediction["eta_seconds"] == pytest.approx(100 * prediction["step_seconds"])


def test_a_gpu_job_without_a_gpu_type_has_no_prediction_and_says_why():
    prediction = run_prediction(load_config(None, {**GPT, **GPU_JOB}), {"vocab_size": 256})
    assert prediction == {"problem": "a GPU job without plan.gpu: set it to the nodes' GPU type for a prediction"}
    assert run_prediction(load_config(None, {**GPT, **GPU_JOB}), {"vocab_size": 256}, "cuda") == prediction
    # A local run of a CPU job's config takes the machine's GPU: said as such (was: "a GPU job").
    assert run_prediction(load_config(None, GPT), {"vocab_size": 256}, "cuda") == {
        "problem": "a job that trained on a GPU without plan.gpu: set it to that GPU's type for a prediction"
    }


def test_a_gpu_jobs_config_run_on_the_cpu_is_predicted_on_the_cpu():
    """`kftrain run --local` of a GPU job's config on a machine without one (was: "a GPU job
    without plan.gpu", no prediction for what ran)."""
    cfg = load_config(None, {**GPT, **GPU_JOB})
    prediction = run_prediction(cfg, {"vocab_size": 256}, "cpu")
    assert "problem" not in prediction and "on the CPU" in prediction["source"]
    on_cpu = run_prediction(load_config(None, {**GPT, "job.nproc_per_node": 8}), {"vocab_size": 256})
    assert (prediction["source"], prediction["peak_memory_bytes"]) == (on_cpu["source"], on_cpu["peak_memory_bytes"])


def test_the_model_card_tells_the_config_and_the_steps_the_weights_trained_under(digits, tmp_path):
    """Was: the export step's own config (a resume with other settings showed those) and no step
    count, so a card could not say which weights it describes."""
    from trainer.config import load_config, to_dict
    from trainer.distributed import DistEnv
    from trainer.pipeline_steps import export
    from trainer.train import run_training

    trained = load_config(overrides={"train.max_steps": 3, "model.hidden_sizes": [16], "job.replicas": 1})
    run_training(trained, digits, str(tmp_path / "model"), DistEnv())
    # The replicas never get the pods' settings: the record leaves them out rather than keep the
    # defaults a replica reads (was: `kubernetes` at its defaults, whatever the run set), and says
    # what the job trained on.
    record = json.loads((tmp_path / "model" / "training.json").read_text())
    assert "kubernetes" not in record["config"] and record["device"] == "cpu"
    pods = {"kubernetes.shm_size": "8Gi", "kubernetes.labels": {"team": "a"}}
    later = load_config(overrides={"train.max_steps": 9, "export.max_shard_bytes": 1 << 20, **pods})
    card = export(later, str(tmp_path / "model"), str(tmp_path / "exported"), {"test_accuracy": 0.5})
    assert card["training"] == {"steps": 3, "resumed_from_step": 0}
    assert card["training_config"]["train"]["max_steps"] == 3
    assert card["training_config"]["model"] == to_dict(trained)["model"]
    # The pods' settings are the run's, from the pipeline's config (were: the defaults, 2Gi and none).
    assert card["training_config"]["kubernetes"] == to_dict(later)["kubernetes"]


@pytest.mark.parametrize(("best", "kept"), [(None, [10, 20]), (20, [10]), (11, [10]), (10, [])])
def test_the_card_of_the_best_steps_weights_lists_the_changes_they_trained_under(digits, tmp_path, best, kept):
    """With checkpoint.export_best the card is the best step's: a change a resume made at or after it
    never reached those weights (was: every change of the run listed, then none of those it
    dropped undone in its config)."""
    from trainer.distributed import DistEnv
    from trainer.pipeline_steps import export
    from trainer.train import run_training

    model = tmp_path / "model"
    trained = load_config(overrides={"train.max_steps": 2, "model.hidden_sizes": [8], "job.replicas": 1})
    run_training(trained, digits, str(model), DistEnv())
    record = json.loads((model / "training.json").read_text())
    record["config_changes"] = [
        {"at_step": 10, "field": "train.learning_rate", "from": 0.003, "to": 0.01},
        {"at_step": 20, "field": "train.learning_rate", "from": 0.01, "to": 0.02},
    ]
    if best is not None:
        record["metrics"]["best_step"] = best
    (model / "training.json").write_text(json.dumps(record))
    card = export(trained, str(model), str(tmp_path / "exported"), {})
    got = [c["at_step"] for c in card["training"].get("config_changes", [])]
    assert got == kept
    # Its config is the one those weights trained under: each later change undone (was: the last
    # start's, showing a learning rate the weights never had).
    lr = {(): 0.003, (10,): 0.01, (10, 20): 0.02}[tuple(kept)]
    record["config"]["train"]["learning_rate"] = 0.02  # the last start's
    (model / "training.json").write_text(json.dumps(record))
    card = export(trained, str(model), str(tmp_path / "exported2"), {})
    assert card["training_config"]["train"]["learning_rate"] == lr
