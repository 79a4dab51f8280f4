"""The KFP task's pod settings merged into the replicas' `kubernetes` section: every kind of setting,
the config's precedence, the conflicts it reports, the values refused, and manifests of both kinds
built from the merge passing the vendored CRD schemas and the webhook rules."""

from __future__ import annotations

import pytest

from trainer.config import load_config
from trainer.launch.job import training_job
from trainer.launch.jobkind import BY_NAME
from trainer.launch.taskconfig import TaskConfigError, apply_task_config

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SPOT = {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
        }
    }
}
OTHER_AFFINITY = {
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}}
        ]
    }
}
PVC = {"name": "data", "persistentVolumeClaim": {"claimName": "shared-data"}}
SECRET_ENV = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}

#: What the KFP driver hands the component (`json.Marshal` of its `TaskConfig`: every key present,
#: null where nothing was set, quantities as strings), for a task with GPU limits, a toleration, a
#: node selector, a Secret as env, a PVC, and the pipeline's own settings on the launcher.
DRIVER_TASK_CONFIG = {
    "affinity": None,
    "tolerations": [TOLERATION],
    "nodeSelector": {"accelerator": "h100"},
    "env": [
        {"name": "WANDB_PROJECT", "value": "digits"},
        SECRET_ENV,
        # The pipeline's store Secret (already on every replica through kubernetes.store_secret).
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "mlpipeline-minio-artifact", "key": "a"}}},
        # The launcher's own identity (launcher_task_options): on a replica it would name the replica.
        {"name": "KFTRAIN_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ],
    "volumes": [PVC],
    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    "resources": {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "4"}},
}


def merged(config: dict, task: dict | None):
    cfg, notes = apply_task_config(load_config(None, config), task)
    return cfg.kubernetes, notes


CASES = {
    # --- resources: the limit, else the request; the config's own value wins -------------------
    "resources from the limits": (
        {},
        {"resources": {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "4"}}},
        {"cpu": "8", "memory": "32Gi", "gpus_per_node": 1},
        [],
    ),
    "resources from the requests": (
        {},
        {"resources": {"requests": {"cpu": "500m", "memory": "2Gi"}}},
        {"cpu": "500m", "memory": "2Gi", "gpus_per_node": 0},
        [],
    ),
    "config cpu wins over the task's": (
        {"kubernetes": {"cpu": "16"}},
        {"resources": {"limits": {"cpu": "8", "memory": "32Gi"}}},
        {"cpu": "16", "memory": "32Gi"},
        ["resources cpu=8: kubernetes.cpu sets 16"],
    ),
    "config gpus win over the task's": (
        {"job": {"nproc_per_node": 2}, "kubernetes": {"gpus_per_node": 2}},
        {"resources": {"limits": {"nvidia.com/gpu": "4"}}},
        {"gpus_per_node": 2},
        ["resources nvidia.com/gpu=4: kubernetes.gpus_per_node sets 2"],
    ),
    "the same value twice is no conflict": (
        {"kubernetes": {"memory": "32Gi"}},
        {"resources": {"limits": {"memory": "32Gi"}}},
        {"memory": "32Gi"},
        [],
    ),
    # --- tolerations add up ------------------------------------------------------------------
    "tolerations add up, none doubled": (
        {"kubernetes": {"tolerations": [SPOT, TOLERATION]}},
        {"tolerations": [TOLERATION]},
        {"tolerations": [SPOT, TOLERATION]},
        [],
    ),
    "task tolerations alone": ({}, {"tolerations": [TOLERATION]}, {"tolerations": [TOLERATION]}, []),
    # --- node selector: per label, the config wins ------------------------------------------
    "node selector labels merge": (
        {"kubernetes": {"node_selector": {"pool": "train"}}},
        {"nodeSelector": {"accelerator": "h100"}},
        {"node_selector": {"pool": "train", "accelerator": "h100"}},
        [],
    ),
    "config node selector label wins": (
        {"kubernetes": {"node_selector": {"accelerator": "a100"}}},
        {"nodeSelector": {"accelerator": "h100"}},
        {"node_selector": {"accelerator": "a100"}},
        ["node selector accelerator='h100': kubernetes.node_selector sets 'a100'"],
    ),
    # --- affinity: the whole object -----------------------------------------------------------
    "task affinity alone": ({}, {"affinity": AFFINITY}, {"affinity": AFFINITY}, []),
    "config affinity wins": (
        {"kubernetes": {"affinity": OTHER_AFFINITY}},
        {"affinity": AFFINITY},
        {"affinity": OTHER_AFFINITY},
        ["affinity: kubernetes.affinity is set and replaces the task's"],
    ),
    # --- volumes and mounts: by name, by path --------------------------------------------------
    "task volume and mount added": (
        {"kubernetes": {"volumes": [{"name": "cache", "emptyDir": {}}]}},
        {"volumes": [PVC], "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        {
            "volumes": [{"name": "cache", "emptyDir": {}}, PVC],
            "volume_mounts": [{"name": "data", "mountPath": "/data"}],
        },
        [],
    ),
    "config volume of the same name wins": (
        {
            "kubernetes": {
                "volumes": [{"name": "data", "emptyDir": {}}],
                "volume_mounts": [{"name": "data", "mountPath": "/data"}],
            }
        },
        {"volumes": [PVC], "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        {"volumes": [{"name": "data", "emptyDir": {}}], "volume_mounts": [{"name": "data", "mountPath": "/data"}]},
        ["volume 'data': kubernetes.volumes has one of that name"],
    ),
    "no mount of a task volume the config replaced": (
        {"kubernetes": {"volumes": [{"name": "data", "emptyDir": {}}]}},
        {"volumes": [PVC], "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        {"volumes": [{"name": "data", "emptyDir": {}}], "volume_mounts": []},
        ["volume 'data': kubernetes.volumes has one of that name"],
    ),
    "config mount at the same path wins": (
        {
            "kubernetes": {
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "volume_mounts": [{"name": "cache", "mountPath": "/data"}],
            }
        },
        {"volumes": [PVC], "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        {"volume_mounts": [{"name": "cache", "mountPath": "/data"}]},
        ["volume mount at '/data': kubernetes.volume_mounts mounts another there"],
    ),
    # --- environment: plain and from Secrets; the config's and kftrain's own win -----------------
    "plain and Secret variables reach the replicas": (
        {},
        {"env": [{"name": "WANDB_PROJECT", "value": "digits"}, SECRET_ENV]},
        {"extra_env": [{"name": "WANDB_PROJECT", "value": "digits"}, SECRET_ENV]},
        [],
    ),
    "kubernetes.env wins": (
        {"kubernetes": {"env": {"WANDB_PROJECT": "mine"}}},
        {"env": [{"name": "WANDB_PROJECT", "value": "digits"}]},
        {"extra_env": [], "env": {"WANDB_PROJECT": "mine"}},
        ["variable WANDB_PROJECT: the config sets it (kubernetes.env or kubernetes.extra_env)"],
    ),
    "kubernetes.extra_env wins": (
        {
            "kubernetes": {
                "extra_env": [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}]
            }
        },
        {"env": [SECRET_ENV]},
        {"extra_env": [{"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "x", "key": "k"}}}]},
        ["variable WANDB_API_KEY: the config sets it (kubernetes.env or kubernetes.extra_env)"],
    ),
    "kftrain's own variables keep kftrain's value": (
        {"kubernetes": {"hf_token_secret": "hub"}},
        {
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "HF_TOKEN"}}},
                {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "KFTRAIN_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "OMP_NUM_THREADS", "value": "8"},
                {"name": "MASTER_ADDR", "value": "elsewhere"},
                # torchrun's per-process variables and the replica's own node: never the launcher's
                {"name": "LOCAL_RANK", "value": "3"},
                {"name": "TORCHELASTIC_RUN_ID", "value": "launcher"},
                {"name": "KFTRAIN_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            ]
        },
        {"extra_env": []},
        [],
    ),
    # --- nothing set ---------------------------------------------------------------------------
    "no task config": ({}, None, {"extra_env": [], "tolerations": [], "cpu": ""}, []),
    "the driver's nulls": (
        {},
        {k: None for k in DRIVER_TASK_CONFIG} | {"resources": {}},
        {"extra_env": [], "volumes": [], "node_selector": {}, "affinity": {}, "cpu": ""},
        [],
    ),
}


@pytest.mark.parametrize("config, task, expected, notes", CASES.values(), ids=CASES.keys())
def test_the_task_settings_merge_into_the_kubernetes_section(config, task, expected, notes):
    kc, got_notes = merged(config, task)
    for field, value in expected.items():
        assert getattr(kc, field) == value, field
    assert got_notes == notes


def test_no_task_config_leaves_the_config_as_it_was():
    cfg = load_config(None, {"kubernetes": {"cpu": "2", "tolerations": [SPOT]}})
    assert apply_task_config(cfg, None) == (cfg, [])
    assert apply_task_config(cfg, {}) == (cfg, [])


def test_the_task_s_store_variables_reach_the_replicas_though_the_config_may_not_give_them():
    """A variable set on the KFP task (every step's, with `set_env_variable`) is the launcher's too:
    passed on, the replicas use the store the launcher does. The same in kubernetes.env would be the
    replicas' alone, and is refused (test_launch_fieldrules)."""
    from trainer.launch.job import training_job

    endpoint = {"name": "AWS_ENDPOINT_URL", "value": "http://minio.team:9000"}
    cfg, _ = apply_task_config(load_config(None, {}), {"env": [endpoint]})
    assert endpoint in cfg.kubernetes.extra_env
    training_job(cfg, "job-1", "s3://b/dataset", "s3://b/model")  # builds: not refused as the config's own


BAD = {
    "a key the driver does not send": ({}, {"hostNetwork": True}, "unknown keys ['hostNetwork']"),
    "a resource kftrain cannot set": (
        {},
        {"resources": {"limits": {"amd.com/gpu": "1"}}},
        "task resources: 'amd.com/gpu' cannot be given to the replicas",
    ),
    "a fraction of a GPU": (
        {},
        {"resources": {"limits": {"nvidia.com/gpu": "500m"}}},
        "nvidia.com/gpu '500m' must be a whole number of GPUs",
    ),
    "GPUs other than the processes per node": (
        {"job": {"nproc_per_node": 1}},
        {"resources": {"limits": {"nvidia.com/gpu": "4"}}},
        "the KFP task's settings given to the replicas: kubernetes.gpus_per_node",
    ),
    "a volume named like kftrain's /dev/shm": (
        {},
        {"volumes": [{"name": "dshm", "emptyDir": {}}]},
        "the KFP task's settings given to the replicas: kubernetes.volumes[0].name",
    ),
    "a credential as a plain variable": (
        {},
        {"env": [{"name": "API_TOKEN", "value": "abc"}]},
        "replicas: kubernetes.extra_env.API_TOKEN: its name looks like a credential",
    ),
    "a non-label node selector value": (
        {},
        {"nodeSelector": {"pool": "not a label"}},
        "the KFP task's settings given to the replicas: kubernetes.node_selector: 'pool': value 'not a label'",
    ),
}


@pytest.mark.parametrize("config, task, message", BAD.values(), ids=BAD.keys())
def test_task_settings_kftrain_cannot_honour_are_refused_by_name(config, task, message):
    with pytest.raises(TaskConfigError) as info:
        merged(config, task)
    assert message in str(info.value)


@pytest.mark.parametrize("kind", sorted(BY_NAME))
def test_manifests_from_the_merge_pass_the_crd_schemas_and_carry_the_settings(kind):
    cfg, _ = apply_task_config(
        load_config(None, {"job": {"kind": kind}, "kubernetes": {"tolerations": [SPOT]}}), DRIVER_TASK_CONFIG
    )
    job = BY_NAME[kind]
    manifest = job.build(training_job(cfg, "kftrain-job", "s3://b/dataset", "s3://b/model"), "team-a", None)
    job.validate(manifest)  # the vendored CRD schema and the operator's / webhook's rules

    text = repr(manifest)
    for expected in ("'claimName': 'shared-data'", "'mountPath': '/data'", "'accelerator': 'h100'", "'wandb'"):
        assert expected in text, expected
    assert "KFTRAIN_POD_NAME" not in text and "'a'}" not in text  # the launcher's identity, the task's store key
    assert "'nvidia.com/gpu': '1'" in text and "'cpu': '8'" in text
    assert repr([SPOT, TOLERATION])[1:-1] in text
