"""The PyTorchJob manifest, built in one process: the example configs, strict preflight, bad configs
named by their field. `kftrain job manifest` as a process is in tests/integration/test_job_manifest_cli.py."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from trainer.config import ConfigError, load_config
from trainer.launch.job import training_job
from trainer.launch.preflight import (
    ManifestError,
    validate_pod_templates,
    validate_pytorchjob,
    validate_schema,
    validate_webhook_rules,
)
from trainer.launch.pytorchjob import pytorchjob_manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))


def manifest_for(config: str | None = None, overrides=None, name="kftrain-job", namespace="team-a"):
    cfg = load_config(REPO / "configs" / f"{config}.yaml" if config else None, overrides)
    return pytorchjob_manifest(training_job(cfg, name, "s3://kftrain/dataset", "s3://kftrain/model"), namespace)


def edit(manifest, path, value):
    m = copy.deepcopy(manifest)
    node = m
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return m


ELASTIC_512 = (
    "train:\n  batch_size: 512\njob:\n  replicas: 2\n  nproc_per_node: 4\n"
    "kubernetes:\n  gpus_per_node: 4\n  elastic: {enabled: true, min_replicas: 2, max_replicas: 4}\n"
)


def test_every_example_config_is_covered():
    assert {"demo", "multinode-gpu", "elastic", "master-only"} <= set(EXAMPLES)


@pytest.mark.parametrize("config", EXAMPLES)
def test_examples_pass_strict_crd_webhook_and_pod_schema_checks(config):
    manifest = manifest_for(config)
    validate_webhook_rules(manifest)
    validate_schema(manifest)
    assert validate_pod_templates(manifest)  # kubernetes-validate ran


def test_multinode_gpu_job_shape():
    m = manifest_for("multinode-gpu")
    specs = m["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 3)
    assert m["spec"]["nprocPerNode"] == "8"
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpu"
    pod = specs["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "pytorch"
    assert container["resources"]["limits"] == {"cpu": "96", "memory": "1000Gi", "nvidia.com/gpu": "8"}
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "training-high"
    env = {e["name"]: e for e in container["env"]}
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["value"] == "1"
    assert env["NCCL_DEBUG"]["value"] == "WARN"
    assert env["OMP_NUM_THREADS"]["value"] == "4"
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"key": "secretkey", "name": "s3-training-credentials", "optional": False}},
    }
    assert specs["Worker"]["restartPolicy"] == "ExitCode"
    run = m["spec"]["runPolicy"]
    assert run == {
        "activeDeadlineSeconds": 86400,
        "backoffLimit": 5,
        "cleanPodPolicy": "Running",
        "ttlSecondsAfterFinished": 86400,
    }
    assert "kubernetes" not in container["command"][container["command"].index("--config-json") + 1]


def test_elastic_job_has_workers_only_and_c10d():
    m = manifest_for("elastic")
    assert list(m["spec"]["pytorchReplicaSpecs"]) == ["Worker"]
    assert m["spec"]["elasticPolicy"] == {
        "maxReplicas": 4,
        "maxRestarts": 3,
        "minReplicas": 2,
        "rdzvBackend": "c10d",
    }


def test_master_only_job():
    m = manifest_for("master-only")
    assert list(m["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_gang_scheduling_policy():
    m = manifest_for(
        overrides={
            "kubernetes.min_available": 2,
            "kubernetes.scheduling_queue": "gpu",
            "kubernetes.schedule_timeout_seconds": 600,
        }
    )
    assert m["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 2,
        "queue": "gpu",
        "scheduleTimeoutSeconds": 600,
    }
    validate_pytorchjob(m)


def test_no_credential_value_is_in_the_manifest(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    text = yaml.safe_dump(manifest_for("multinode-gpu"))
    assert "very-secret-value" not in text


HF_MODEL = {"task": "causal_lm", "model.init_from": "hf://org/gated-model", "kubernetes.hf_token_secret": "hf-token"}


def test_the_hub_token_comes_from_its_secret_and_never_its_value(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_very_secret_value")
    m = manifest_for(overrides=HF_MODEL)
    validate_pytorchjob(m)
    for spec in m["spec"]["pytorchReplicaSpecs"].values():
        env = {e["name"]: e for e in spec["template"]["spec"]["containers"][0]["env"]}
        assert env["HF_TOKEN"] == {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN", "optional": True}},
        }
    assert "hf_very_secret_value" not in yaml.safe_dump(m)
    without = manifest_for(overrides={**HF_MODEL, "kubernetes.hf_token_secret": ""})
    assert "HF_TOKEN" not in yaml.safe_dump(without)


# -- bad input fails before submission, naming the field -------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kubernetes.gpus_per_node": 4}, "kubernetes.gpus_per_node: must equal job.nproc_per_node (1)"),
        ({"kubernetes.memory": "lots"}, "kubernetes.memory: 'lots' is not a Kubernetes quantity"),
        ({"kubernetes.restart_policy": "Sometimes"}, "kubernetes.restart_policy: must be one of"),
        ({"kubernetes.restart_policy": "Always"}, "not Always: it restarts a replica that finished"),
        ({"kubernetes.clean_pod_policy": "Never"}, "kubernetes.clean_pod_policy: must be one of"),
        ({"kubernetes.namespace": "Team_A"}, "kubernetes.namespace: 'Team_A' is not a namespace: a DNS-1123 label"),
        ({"kubernetes.labels": {"team": "a b"}}, "kubernetes.labels: 'team': value 'a b' is not a label value"),
        (
            {"kubernetes.elastic": {"enabled": True, "min_replicas": 3, "max_replicas": 4}},
            "job.replicas: must lie within",
        ),
        (
            {"kubernetes.elastic": {"min_replicas": 3, "max_replicas": 2}},
            "kubernetes.elastic.max_replicas: must be >= min_replicas",
        ),
        ({"kubernetes.gpu_per_node": 1}, "kubernetes.gpu_per_node: unknown key"),
    ],
)
def test_bad_configs_fail_with_the_field_named(overrides, message):
    with pytest.raises(ConfigError) as info:
        manifest_for(overrides=overrides)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"kubernetes.tolerations": [{"key": "gpu", "efect": "NoSchedule"}]},
            "kubernetes.tolerations[0]: Additional properties are not allowed ('efect' was unexpected) (PyTorchJob "
            "spec.pytorchReplicaSpecs.Master.template.spec.tolerations[0])",
        ),
        (
            {"kubernetes.tolerations": [{"key": "gpu", "effect": "NoExecute", "tolerationSeconds": "soon"}]},
            "kubernetes.tolerations[0]: 'soon' is not of type 'integer' (PyTorchJob spec.pytorchReplicaSpecs.Master."
            "template.spec.tolerations[0].tolerationSeconds)",
        ),
        (
            {"kubernetes.affinity": {"nodeAfinity": {}}},
            "kubernetes.affinity: Additional properties are not allowed ('nodeAfinity'",
        ),
        (
            {"kubernetes.affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}},
            "nodeSelectorTerms' is a required property",
        ),
    ],
)
def test_bad_pod_settings_fail_preflight_with_the_field_named(overrides, message):
    m = manifest_for(overrides=overrides)
    with pytest.raises(ManifestError) as info:
        validate_pytorchjob(m)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("metadata", "name"), "Job_1", "metadata.name: 'Job_1' must be a DNS-1035 label"),
        (("metadata", "name"), "j" * 64, "must be a DNS-1035 label"),
        (("spec", "pytorchReplicaSpecs", "Master", "replicas"), 2, "Master.replicas: must be 1, got 2"),
        (("spec", "pytorchReplicaSpecs", "Chief"), {}, "pytorchReplicaSpecs.Chief: unknown replica type"),
        (
            ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers", 0, "name"),
            "trainer",
            "needs a container named 'pytorch'",
        ),
        (
            ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers", 0, "image"),
            "",
            "image: must not be empty",
        ),
        (
            ("spec", "elasticPolicy"),
            {"minReplicas": 1, "maxReplicas": 2, "nProcPerNode": 2},
            "must not be set together with spec.nprocPerNode",
        ),
        (
            ("spec", "runPolicy", "cleanPodPolicys"),
            "All",
            "spec.runPolicy: Additional properties are not allowed ('cleanPodPolicys'",
        ),
        (
            ("spec", "runPolicy", "backoffLimit"),
            "3",
            "kubernetes.backoff_limit: '3' is not of type 'integer' (PyTorchJob spec.runPolicy.backoffLimit)",
        ),
        (("spec", "nprocPerNode"), 8, "job.nproc_per_node: 8 is not of type 'string' (PyTorchJob spec.nprocPerNode)"),
    ],
)
def test_webhook_and_strict_schema_rules(path, value, message):
    with pytest.raises(ManifestError) as info:
        validate_pytorchjob(edit(manifest_for("demo"), path, value))
    assert message in str(info.value)


def test_elastic_without_workers_is_rejected():
    m = edit(manifest_for("master-only"), ("spec", "elasticPolicy"), {"minReplicas": 1, "maxReplicas": 1})
    with pytest.raises(ManifestError, match="elasticPolicy: needs a Worker replica spec"):
        validate_pytorchjob(m)


def test_pods_and_local_processes_run_the_same_command_and_environment():
    """The local backend starts exactly what the manifest's containers run (plus the operator env)."""
    cfg = load_config(REPO / "configs" / "demo.yaml")
    spec = training_job(cfg, "kftrain-job", "s3://kftrain/dataset", "s3://kftrain/model")
    manifest = pytorchjob_manifest(spec, "team-a")
    for rtype in ("Master", "Worker"):
        (container,) = manifest["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]
        assert tuple(container["command"]) == spec.command
        plain_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert plain_env == spec.env


def test_pipeline_parameters_and_config_reach_the_pytorchjob():
    """What a run sets in the KFP UI (parameters + the config text) ends up in the job."""
    from components.params import config_from_params

    config = "kubernetes:\n  tolerations:\n    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n"
    cfg = config_from_params(
        config, replicas=4, nproc_per_node=8, gpus_per_node=8, queue="team-a", batch_size=512, image="reg/kftrain:1"
    )
    m = pytorchjob_manifest(training_job(cfg, "kftrain-run", "s3://b/d", "s3://b/m"), "team-a")
    worker = m["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    assert worker["replicas"] == 3 and m["spec"]["nprocPerNode"] == "8"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["containers"][0]["image"] == "reg/kftrain:1"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    validate_pytorchjob(m)


@pytest.mark.parametrize(
    ("config", "args", "message"),
    [
        # Pod and Service names `<job>-worker-<i>` are DNS labels of at most 63 characters.
        ("", ["--name", "a" * 55], "job name 'aaaa"),
        ("", ["--name", "a" * 55], "at most 54 characters"),
        ("job:\n  replicas: 12\ntrain:\n  batch_size: 60\n", ["--name", "a" * 54], "at most 53 characters"),
        (ELASTIC_512, [], "must divide by every world size the elastic range allows (8, 12, 16 ranks)"),
        (ELASTIC_512, [], "but not by 12: use a multiple of 48"),
        ("", ["--dataset-uri", "/data/digits"], "--dataset-uri '/data/digits' is a local path"),
        ("", ["--model-uri", "out/model"], "--model-uri 'out/model' is a local path"),
        (
            "",
            ["--model-uri", "gs://bucket/model"],
            "--model-uri 'gs://bucket/model': not an object store kftrain writes to; use s3://",
        ),
        ("checkpoint:\n  uri: /mnt/ckpt\n", [], "checkpoint.uri '/mnt/ckpt' is a local path"),
    ],
)
def test_manifests_that_could_not_run_are_refused_naming_the_field(tmp_path, capsys, config, args, message):
    """Each would pass the CRD schema and then fail on the cluster; `kftrain job manifest` says why."""
    from pipelines.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(config)
    assert main(["job", "manifest", *(["--config", str(path)] if config else []), *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err


def test_a_checkpoint_prefix_never_written_is_no_shared_artifact():
    # checkpoint.enabled: false writes nothing there: a local path is no reason to refuse the job.
    on = {"checkpoint.uri": "/mnt/ckpt"}
    assert training_job(load_config(overrides=on), "kftrain-x", "s3://b/d", "s3://b/m").artifact_uris == {
        "dataset URI": "s3://b/d",
        "model URI": "s3://b/m",
        "checkpoint.uri": "/mnt/ckpt",
    }
    off = training_job(load_config(overrides={**on, "checkpoint.enabled": False}), "kftrain-x", "s3://b/d", "s3://b/m")
    assert "checkpoint.uri" not in off.artifact_uris


def test_the_longest_allowed_name_is_accepted():
    spec = training_job(
        load_config(overrides={"job.replicas": 12, "train.batch_size": 60}), "a" * 53, "s3://b/d", "s3://b/m"
    )
    pods = [f"{spec.name}-worker-{i}" for i in range(11)]
    assert max(len(p) for p in pods) == 63


def test_the_kubernetes_backend_refuses_local_artifact_paths_before_creating_anything():
    from tests.fake_kube import FakeCluster, launcher

    cluster = FakeCluster()
    backend = launcher(cluster, owner_uid=None)
    spec = training_job(load_config(), "kftrain-x", "/tmp/dataset", "s3://b/m")
    with pytest.raises(ValueError, match="dataset URI '/tmp/dataset' is a local path"):
        backend.submit(spec)
    assert cluster.calls == []


def test_the_grace_period_is_on_every_replica_and_torchrun_waits_as_long():
    m = manifest_for("multinode-gpu", {"kubernetes.termination_grace_seconds": 300})
    validate_pytorchjob(m)
    for replica in m["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == 300
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        # torchrun SIGKILLs its workers this long after passing SIGTERM on; the trainer warns by it.
        assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == env["KFTRAIN_TERMINATION_GRACE_SECONDS"] == "300"
        # torchrun through kftrain's wrapper, which exits 143 when SIGTERM stopped it.
        assert pod["containers"][0]["command"][:3] == ["python", "-m", "trainer.torchrun"]


CONTAINER = ("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0)


@pytest.mark.parametrize(
    ("path", "extra", "named"),
    [
        ((*CONTAINER, "env"), {"name": "OMP_NUM_THREADS", "value": "8"}, "'OMP_NUM_THREADS' appears more than once"),
        ((*CONTAINER, "volumeMounts"), {"name": "other", "mountPath": "/dev/shm"}, "'/dev/shm' appears more than once"),
        # The API server defaults a port's protocol to TCP before it compares the keys.
        ((*CONTAINER, "ports"), {"containerPort": 23456, "name": "again"}, "(23456, 'TCP') appears more than once"),
        (
            ("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "volumes"),
            {"name": "dshm", "emptyDir": {}},
            "'dshm' appears more than once",
        ),
    ],
    ids=["env", "volumeMounts", "ports", "volumes"],
)
def test_every_keyed_list_of_the_schema_refuses_a_key_twice(path, extra, named):
    """Lists the CRD schema declares `x-kubernetes-list-type: map` (whatever put the entry there)."""
    manifest = manifest_for("demo")
    node = manifest
    for key in path:
        node = node[key]
    node.append(extra)
    with pytest.raises(ManifestError, match=re.escape(named)):
        validate_pytorchjob(manifest)
