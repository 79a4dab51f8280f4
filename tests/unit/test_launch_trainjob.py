"""Kubeflow Trainer v2 (TrainJob): golden manifests, strict preflight, the v2 environment contract,
and which kind a config may run as.

The manifests are checked against the TrainJob v2.3.0 CRD schema vendored in the package
(trainer/launch/schemas/trainjob.v1alpha1.json, made strict: unknown fields are errors) and the
webhook rules found in the Trainer v2.3.0 source (trainer/launch/preflight.py says which).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from trainer.config import load_config
from trainer.horovod.api import topology
from trainer.launch.job import training_job
from trainer.launch.preflight import (
    TORCHRUN_RESERVED_ENV,
    ManifestError,
    validate_schema,
    validate_trainjob,
    validate_trainjob_rules,
)
from trainer.launch.spec import TRAINJOB_PORT, JobSpec, replica_env, replica_env_v2
from trainer.launch.trainjob import trainjob_manifest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
#: Example config -> the `--set` a user needs to run it as a TrainJob (PyTorchJob-only settings
#: back at their defaults), or None when it cannot be one (see the refusal table below).
EXAMPLES = {
    "demo": [],
    "gpt-tiny": [],
    # Its local demo's paths (`kftrain example-model`) as a cluster's pods would read them.
    "finetune-tiny": ["data.source=s3://datasets/chat.jsonl", "model.init_from=s3://models/tiny-llama"],
    "master-only": [],
    "multinode-gpu": [
        "kubernetes.priority_class=''",
        "kubernetes.restart_policy=OnFailure",
        "kubernetes.backoff_limit=3",
    ],
    "elastic": None,
}


def spec_for(overrides=None, name="kftrain-job") -> JobSpec:
    cfg = load_config(overrides={"job.kind": "trainjob", **(overrides or {})})
    return training_job(cfg, name, "s3://kftrain/dataset", "s3://kftrain/model")


def _set(path: str, value):
    def mutate(m):
        node = m
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(leaf) if leaf.isdigit() else leaf] = value

    return mutate


_POD = "spec.runtimePatches.0.trainingRuntimeSpec.template.spec.replicatedJobs.0.template.spec.template.spec"


def test_every_example_config_has_a_trainjob_answer():
    assert set(EXAMPLES) == {p.stem for p in (REPO / "configs").glob("*.yaml")}


def test_multinode_gpu_as_a_trainjob_carries_every_pod_setting():
    m = yaml.safe_load((GOLDEN / "multinode-gpu.trainjob.yaml").read_text())
    trainer = m["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    assert m["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpu"
    secret_refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in trainer["env"] if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert secret_refs["AWS_SECRET_ACCESS_KEY"] == {
        "name": "s3-training-credentials",
        "key": "secretkey",
        "optional": False,
    }
    (patch,) = m["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rjob["template"]["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "team-a"
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["spec"]["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}
    assert pod["spec"]["containers"] == [{"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
    assert not set(TORCHRUN_RESERVED_ENV) & {e["name"] for e in trainer["env"]}


def test_pod_settings_reach_the_runtime_patch():
    spec = spec_for(
        {
            "kubernetes.service_account": "trainer-sa",
            "kubernetes.image_pull_secrets": ["regcred"],
            "kubernetes.affinity": {"nodeAffinity": {}},
            "kubernetes.volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "pvc"}}],
            "kubernetes.volume_mounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            "kubernetes.annotations": {"a": "b"},
            "kubernetes.runtime": "torch-distributed-cuda",
        }
    )
    m = trainjob_manifest(spec, "ns", {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"})
    validate_trainjob(m)
    pod = m["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "trainer-sa"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["affinity"] == {"nodeAffinity": {}}
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm", "data"]
    assert pod["spec"]["containers"][0]["volumeMounts"][1] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert pod["metadata"]["annotations"] == {"a": "b"}
    assert m["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert m["metadata"]["namespace"] == "ns"
    assert m["spec"]["runtimeRef"]["name"] == "torch-distributed-cuda"
    assert m["spec"]["activeDeadlineSeconds"] == 3600


def test_no_store_secret_means_no_secret_refs():
    m = trainjob_manifest(spec_for({"kubernetes.store_secret": ""}))
    assert all("secretKeyRef" not in e.get("valueFrom", {}) for e in m["spec"]["trainer"]["env"])


def test_the_hub_token_comes_from_its_secret_and_never_its_value(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_very_secret_value")
    overrides = {
        "task": "causal_lm",
        "model.init_from": "hf://org/gated-model",
        "kubernetes.hf_token_secret": "hf-token",
    }
    m = trainjob_manifest(spec_for(overrides))
    validate_trainjob(m)
    env = {e["name"]: e for e in m["spec"]["trainer"]["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN", "optional": True}},
    }
    assert "hf_very_secret_value" not in yaml.safe_dump(m)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (_set("spec.trainer.numProcsPerNode", 8), "spec.trainer: Additional properties"),
        (_set("spec.trainer.numProcPerNode", "auto"), "job.nproc_per_node: 'auto' is not of type 'integer' (TrainJob"),
        (_set("spec.runtimeRef.nmae", "x"), "spec.runtimeRef: Additional properties"),
        (
            _set(f"{_POD}.priorityClassName", "high"),
            "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[node].template.spec.template."
            "spec: Additional properties",
        ),
        (_set("spec.podTemplateOverrides", []), "TrainJob spec: Additional properties"),
        (
            _set("spec.trainer.env", [{"name": "PET_NNODES", "value": "2"}]),
            "kubernetes.env.PET_NNODES: PET_NNODES is set by the torch plugin (reserved)",
        ),
        (  # a Secret's key mapped onto it: named as that field (was: kubernetes.env)
            _set(
                "spec.trainer.env", [{"name": "PET_NNODES", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
            ),
            "kubernetes.store_secret_keys: PET_NNODES is set by the torch plugin",
        ),
        (
            _set("spec.trainer.env", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
            "spec.trainer.env[1].name: 'A' appears more than once",
        ),
        (_set("spec.runtimePatches.0.manager", "kftrain"), "spec.runtimePatches[0].manager: 'kftrain'"),
        (
            _set("spec.runtimePatches.0.trainingRuntimeSpec.template.spec.replicatedJobs.0.name", "launcher"),
            "replicatedJobs[0].name: 'launcher'",
        ),
        (_set(f"{_POD}.containers.0.name", "pytorch"), "containers[0].name: 'pytorch'"),
        (_set(f"{_POD}.containers.0.env", [{"name": "X", "value": "1"}]), "containers[0].env: must not be set"),
        (_set(f"{_POD}.containers.0.volumeMounts.0.name", "cache"), "volumeMounts[0].name: 'cache' is not a volume"),
        (_set("metadata.name", "a" * 64), "TrainJob metadata.name"),
        (_set("metadata.name", "Job_1"), "TrainJob metadata.name: 'Job_1'"),
        (_set("spec.runtimeRef.name", ""), "spec.runtimeRef.name"),
        (_set("spec.trainer.numNodes", 0), "spec.trainer.numNodes: must be >= 1, got 0"),
        (
            _set("spec.activeDeadlineSeconds", 0),
            "kubernetes.active_deadline_seconds (0: job.timeout_seconds): 0 is less",
        ),
    ],
)
def test_preflight_refuses_what_the_api_server_or_webhook_would(mutate, field):
    m = copy.deepcopy(trainjob_manifest(spec_for()))
    validate_trainjob(m)  # the unmutated manifest passes
    mutate(m)
    with pytest.raises(ManifestError) as err:
        validate_trainjob_rules(m)
        validate_schema(m)
    assert field in str(err.value)


@pytest.mark.parametrize("kind", ["trainjob", "auto"])
@pytest.mark.parametrize(
    ("override", "field"),
    [
        (
            {"kubernetes.elastic.enabled": True, "kubernetes.elastic.max_replicas": 2, "data.partitions": 4},
            "kubernetes.elastic.enabled: true is not supported",
        ),
        ({"kubernetes.priority_class": "high"}, "kubernetes.priority_class: 'high'"),
        ({"kubernetes.min_available": 2}, "kubernetes.min_available: 2"),
        ({"kubernetes.scheduling_queue": "q"}, "kubernetes.scheduling_queue: 'q'"),
        ({"kubernetes.schedule_timeout_seconds": 5}, "kubernetes.schedule_timeout_seconds: 5"),
        ({"kubernetes.restart_policy": "ExitCode"}, "kubernetes.restart_policy: 'ExitCode'"),
        ({"kubernetes.backoff_limit": 5}, "kubernetes.backoff_limit: 5"),
        ({"kubernetes.clean_pod_policy": "All"}, "kubernetes.clean_pod_policy: 'All'"),
        ({"kubernetes.ttl_seconds_after_finished": 60}, "kubernetes.ttl_seconds_after_finished: 60"),
    ],
)
def test_settings_a_trainjob_has_no_field_for_are_refused_by_name(kind, override, field):
    with pytest.raises(ValueError, match="job.kind") as err:
        spec_for({"job.kind": kind, **override})
    assert field in str(err.value)
    training_job(load_config(overrides=override), "kftrain-job", "s3://b/d", "s3://b/m")  # fine as a PyTorchJob


def test_every_setting_a_trainjob_has_no_field_for_is_named_at_once():
    """Was: one a run, so a platform's PyTorchJob config took a run per setting to move."""
    override = {
        "kubernetes.priority_class": "high",
        "kubernetes.restart_policy": "Never",
        "kubernetes.backoff_limit": 5,
    }
    with pytest.raises(ValueError) as err:
        spec_for({"job.kind": "trainjob", **override})
    message = str(err.value)
    assert message.startswith(
        "kubernetes.priority_class: 'high', kubernetes.backoff_limit: 5, kubernetes.restart_policy: 'Never': "
        "no TrainJob v2.3.0 field for them"
    ), message
    assert (
        "leave kubernetes.priority_class at '', kubernetes.backoff_limit at 3, kubernetes.restart_policy at " in message
    )


@pytest.mark.parametrize(
    ("kind", "replicas", "longest"),
    [
        # PyTorchJob: `<job>-worker-<replicas-2>` (Services and pods); 63 - len("-worker-2")
        ("pytorchjob", 4, 54),
        # TrainJob: JobSet's `<job>-node-0-<replicas-1>-abcde`; 63 - len("-node-0-3-abcde")
        ("trainjob", 4, 48),
        ("auto", 4, 48),
        ("trainjob", 12, 47),
        ("pytorchjob", 1, 54),  # `-master-0`
        ("trainjob", 1, 48),
    ],
)
def test_the_job_name_leaves_room_for_the_longest_pod_name_of_its_kind(kind, replicas, longest):
    def make(name: str) -> JobSpec:
        return JobSpec(name=name, image="i", command=("c",), replicas=replicas, kind=kind)

    make("a" * longest)
    with pytest.raises(ValueError, match=f"at most {longest} characters"):
        make("a" * (longest + 1))


def test_v2_contract_is_pet_only_with_the_first_nodes_hostname_and_port_29500():
    spec = JobSpec(name="tj", image="i", command=("c",), replicas=3, nproc_per_node=4, kind="trainjob")
    envs = [replica_env_v2(spec, r) for r in range(3)]
    for rank, env in enumerate(envs):
        assert env == {
            "PET_NNODES": "3",
            "PET_NPROC_PER_NODE": "4",
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "tj-node-0-0.tj",
            "PET_MASTER_PORT": str(TRAINJOB_PORT),
        }
    assert set(envs[0]) == set(TORCHRUN_RESERVED_ENV)  # what the webhook reserves is what the plugin sets
    assert TRAINJOB_PORT == 29500
    with pytest.raises(ValueError, match="node rank 3 out of range"):
        replica_env_v2(spec, 3)
    v1 = replica_env(JobSpec(name="tj", image="i", command=("c",), replicas=3, nproc_per_node=4), "worker", 1)
    assert {k for k in v1 if not k.startswith("PET_")} == {
        "PYTHONUNBUFFERED",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
    }


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"PET_NNODES": "1", "PET_NODE_RANK": "0"}, (0, 1)),  # one node without torchrun: rank 0 of 1 is right
        ({"RANK": "2", "WORLD_SIZE": "3"}, (2, 3)),  # a PyTorchJob pod without torchrun
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, RuntimeError),  # a TrainJob pod without torchrun
    ],
)
def test_horovod_topology_refuses_a_v2_pod_started_without_torchrun(environ, expected):
    if expected is RuntimeError:
        with pytest.raises(RuntimeError, match="PET_NNODES=2 but no RANK"):
            topology(environ)
    else:
        topo = topology(environ)
        assert (topo.rank, topo.size) == expected


def test_a_bring_your_own_image_job_runs_as_a_trainjob_too():
    from trainer.launch.byo import byo_job

    spec = byo_job(
        name="byo-job",
        image="registry.example.com/me/train:1",
        command=["torchrun", "train.py"],
        output_uri="s3://bucket/out",
        replicas=2,
        nproc_per_node=4,
        cluster=True,
        kind="trainjob",
    )
    m = trainjob_manifest(spec)
    validate_trainjob(m)
    env = {e["name"]: e.get("value") for e in m["spec"]["trainer"]["env"]}
    assert env["KFTRAIN_OUTPUT_URI"] == "s3://bucket/out"
    assert (m["spec"]["trainer"]["numNodes"], m["spec"]["trainer"]["numProcPerNode"]) == (2, 4)


def test_the_grace_period_reaches_the_runtime_patch():
    m = trainjob_manifest(spec_for({"kubernetes.termination_grace_seconds": 45}))
    validate_trainjob(m)
    pod = m["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert pod["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    env = {e["name"]: e.get("value") for e in m["spec"]["trainer"]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == env["KFTRAIN_TERMINATION_GRACE_SECONDS"] == "45"
