"""The preflight's field table (trainer/launch/fieldrules.py): what the API server, the operator or
NCCL would refuse or misread is refused before anything runs, naming the config field, the bad
value and what is allowed. Pure: manifests are built from configs and checked, nothing runs."""

# ruff: noqa: E501 (the tables read best one row a line)
from __future__ import annotations

import copy

import pytest

from trainer.config import parse_config
from trainer.launch.fieldrules import RULES, SOURCES, Item, _match, config_field
from trainer.launch.job import PREFLIGHT_NAME, PREFLIGHT_URIS, check_job_manifests, training_job
from trainer.launch.jobkind import BY_NAME
from trainer.launch.preflight import ManifestError, validate_pytorchjob, validate_trainjob

BOTH = ("pytorchjob", "trainjob")
V1 = ("pytorchjob",)  # settings a TrainJob has no field for (refused by name for trainjob already)


def manifest(kind: str, **overrides) -> dict:
    cfg = parse_config("", {**overrides, "job.kind": kind})
    return BY_NAME[kind].build(training_job(cfg, PREFLIGHT_NAME, *PREFLIGHT_URIS), cfg.kubernetes.namespace, None)


# (config overrides, kinds, the phrases the one-line error must hold: config field first, then the value)
REFUSED = [
    # labels and annotations: keys are qualified names, values label values, 256 KiB in all
    ({"kubernetes.labels": {"bad key!": "x"}}, BOTH, ["kubernetes.labels: key 'bad key!' is not a label key"]),
    ({"kubernetes.labels": {"a/b/c": "x"}}, BOTH, ["kubernetes.labels: key 'a/b/c'", "prefix 'a/b'"]),
    ({"kubernetes.labels": {"Example.com/x": "y"}}, BOTH, ["kubernetes.labels", "prefix 'Example.com'"]),
    ({"kubernetes.labels": {"/x": "y"}}, BOTH, ["kubernetes.labels: key '/x'", "prefix ''"]),
    ({"kubernetes.labels": {"example.com/": "y"}}, BOTH, ["kubernetes.labels: key 'example.com/'", "name ''"]),
    ({"kubernetes.labels": {"k" * 64: "y"}}, BOTH, ["kubernetes.labels: key 'kkk", "<= 63"]),
    ({"kubernetes.queue": "team queue"}, BOTH, ["kubernetes.queue:", "value 'team queue' is not a label value"]),
    ({"kubernetes.annotations": {"bad key!": "x"}}, BOTH, ["kubernetes.annotations: key 'bad key!'"]),
    (
        {"kubernetes.annotations": {"note": "x" * 5_000_000}},
        BOTH,
        ["kubernetes.annotations: 5000004 bytes", "'note', 5000000 characters", "262144 bytes (256 KiB)"],
    ),
    ({"kubernetes.node_selector": {"pool name": "gpu"}}, BOTH, ["kubernetes.node_selector: key 'pool name'"]),
    # tolerations: operator Exists|Equal, effect NoSchedule|PreferNoSchedule|NoExecute
    ({"kubernetes.tolerations": [{"key": "a", "operator": "Maybe"}]}, BOTH, ["kubernetes.tolerations[0]: operator 'Maybe'", "Equal or Exists"]),
    ({"kubernetes.tolerations": [{"key": "a", "operator": "Exists", "value": "v"}]}, BOTH, ["kubernetes.tolerations[0]: value 'v' must be empty"]),
    ({"kubernetes.tolerations": [{"operator": "Equal", "value": "v"}]}, BOTH, ["kubernetes.tolerations[0]: an empty key needs operator Exists"]),
    ({"kubernetes.tolerations": [{"key": "a", "value": "a b"}]}, BOTH, ["kubernetes.tolerations[0]: value 'a b' is not a label value"]),
    ({"kubernetes.tolerations": [{"key": "a b", "operator": "Exists"}]}, BOTH, ["kubernetes.tolerations[0]: key 'a b'"]),
    ({"kubernetes.tolerations": [{"key": "a", "effect": "NoScheduel"}]}, BOTH, ["kubernetes.tolerations[0]: effect 'NoScheduel'"]),
    (
        {"kubernetes.tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 60}]},
        BOTH,
        ["kubernetes.tolerations[0]: tolerationSeconds needs effect NoExecute, got 'NoSchedule'"],
    ),
    # YAML's reading of a plain scalar where the pod spec wants text, or an octal number
    ({"kubernetes.tolerations": [{"key": "gpu", "value": True}]}, BOTH, ['kubernetes.tolerations[0]: value must be a string (unquoted, YAML and JSON read it as a boolean: write "true")']),
    ({"kubernetes.tolerations": [{"key": "gpu", "value": 0}]}, BOTH, ['kubernetes.tolerations[0]: value must be a string (unquoted, YAML and JSON read it as a number: write "0")']),
    ({"kubernetes.tolerations": [{"key": 1, "operator": "Exists"}]}, BOTH, ['kubernetes.tolerations[0]: key must be a string (unquoted, YAML and JSON read it as a number: write "1")']),
    ({"kubernetes.volumes": [{"name": "creds", "secret": {"secretName": "creds", "defaultMode": "0400"}}]}, BOTH, ["kubernetes.volumes (creds): defaultMode must be a number: '0400' is text here", "write 0o400 or 256"]),
    # names: a namespace is a DNS-1123 label, a Secret's name a DNS-1123 subdomain
    ({"kubernetes.namespace": "team.a"}, BOTH, ["kubernetes.namespace: 'team.a' is not a namespace: a DNS-1123 label"]),
    ({"kubernetes.namespace": "n" * 64}, BOTH, ["kubernetes.namespace: 'nnn", "<= 63"]),
    ({"kubernetes.image_pull_secrets": ["regcred\n"]}, BOTH, ["kubernetes.image_pull_secrets: 'regcred\\n' is not a Secret's name"]),
    ({"kubernetes.labels": {"team\n": "ml"}}, BOTH, ["kubernetes.labels: key 'team\\n' is not a label key"]),
    ({"kubernetes.image_pull_secrets": ["My_Secret"]}, BOTH, ["kubernetes.image_pull_secrets: 'My_Secret' is not a Secret's name"]),
    ({"kubernetes.store_secret": "Store_Keys"}, BOTH, ["kubernetes.store_secret: 'Store_Keys' is not a Secret's name"]),
    ({"kubernetes.store_secret_keys": {"access key": "AWS_ACCESS_KEY_ID"}}, BOTH, ["kubernetes.store_secret_keys: 'access key' is not a Secret key"]),
    ({"kubernetes.store_secret_keys": {"accesskey": "AWS=KEY"}}, BOTH, ["kubernetes.store_secret_keys: name 'AWS=KEY'"]),
    ({"kubernetes.hf_token_secret": "HF_Token"}, BOTH, ["kubernetes.hf_token_secret: 'HF_Token' is not a Secret's name"]),
    ({"kubernetes.service_account": "Trainer_SA"}, BOTH, ["kubernetes.service_account: 'Trainer_SA' is not a valid serviceAccountName"]),
    ({"kubernetes.priority_class": "High_Prio"}, V1, ["kubernetes.priority_class: 'High_Prio' is not a valid priorityClassName"]),
    # environment: names, the operator's and torchrun's variables, NCCL_DEBUG levels
    ({"kubernetes.env": {"A=B": "1"}}, BOTH, ["kubernetes.env.A=B: name 'A=B' is not an environment variable name", "no '='"]),
    ({"kubernetes.env": {"A\nB": "1"}}, BOTH, ["kubernetes.env.'A\\nB': name 'A\\nB' is not an environment variable name"]),
    ({"kubernetes.env": {"1ST": "1"}}, BOTH, ["kubernetes.env.1ST: name '1ST'", "not starting with a digit"]),
    ({"kubernetes.env": {"..X": "1"}}, BOTH, ["kubernetes.env...X: name '..X'"]),
    ({"kubernetes.env": {"WORLD_SIZE": "4"}}, BOTH, ["kubernetes.env.WORLD_SIZE: WORLD_SIZE is set in every replica", "remove it"]),
    ({"kubernetes.env": {"MASTER_ADDR": "10.0.0.1"}}, BOTH, ["kubernetes.env.MASTER_ADDR: MASTER_ADDR is set"]),
    ({"kubernetes.env": {"RANK": "0"}}, BOTH, ["kubernetes.env.RANK: RANK is set"]),
    ({"kubernetes.env": {"LOCAL_RANK": "0"}}, BOTH, ["kubernetes.env.LOCAL_RANK: LOCAL_RANK is set"]),
    ({"kubernetes.env": {"PET_RDZV_ENDPOINT": "x:1"}}, BOTH, ["kubernetes.env.PET_RDZV_ENDPOINT: PET_RDZV_ENDPOINT is set"]),
    # (a TrainJob's webhook reserves the five PET_* names itself: its rule speaks first, naming them)
    ({"kubernetes.env": {"PET_MASTER_ADDR": "x"}}, V1, ["kubernetes.env.PET_MASTER_ADDR: PET_MASTER_ADDR is set"]),
    ({"kubernetes.env": {"PET_MASTER_ADDR": "x"}}, ("trainjob",), ["kubernetes.env.PET_MASTER_ADDR: PET_MASTER_ADDR is set"]),
    ({"kubernetes.extra_env": [{"name": "X", "value": "a", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}, BOTH, ["kubernetes.extra_env[0]: X has both `value` and `valueFrom`"]),
    ({"kubernetes.extra_env": [{"name": "X", "valueFrom": {}}]}, BOTH, ["kubernetes.extra_env[0]: X: `valueFrom` must have exactly one of"]),
    ({"kubernetes.extra_env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]}, BOTH, ["kubernetes.extra_env[0].valueFrom.fieldRef.fieldPath: 'spec.bogus' is not a pod field"]),
    # pod settings Kubernetes refuses a pod for, after the job was created
    ({"kubernetes.affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "z", "operator": "In"}]}]}}}}, BOTH, ["kubernetes.affinity: operator In needs a non-empty `values` list"]),
    ({"kubernetes.affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "z", "operator": "Gt", "values": ["a"]}]}]}}}}, BOTH, ["kubernetes.affinity: operator Gt needs one integer"]),
    ({"kubernetes.affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}, BOTH, ["kubernetes.affinity: must have at least one node selector term"]),
    # byte quantities without their unit: valid, and never what was meant
    ({"kubernetes.memory": "512"}, BOTH, ["kubernetes.memory: '512' is 512 bytes", "write the unit, e.g. 512Mi or 512Gi"]),
    ({"kubernetes.memory": "1e-3"}, BOTH, ["kubernetes.memory: '1e-3' is 0.001 bytes", "e.g. 512Mi or 8Gi"]),
    ({"kubernetes.memory": "5n"}, BOTH, ["kubernetes.memory: '5n' is 5e-09 bytes"]),
    ({"kubernetes.shm_size": "64"}, BOTH, ["kubernetes.shm_size: '64' is 64 bytes"]),
    ({"kubernetes.volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": 100}}]}, BOTH, ["kubernetes.volumes[0].emptyDir.sizeLimit: '100' is 100 bytes"]),
    # the store's variables, which only the replicas would get (the pipeline's other steps: store.*)
    ({"kubernetes.env": {"AWS_ENDPOINT_URL": "http://b:9000"}}, BOTH, ["kubernetes.env.AWS_ENDPOINT_URL: AWS_ENDPOINT_URL would choose", "set store.endpoint"]),
    ({"kubernetes.env": {"AWS_ENDPOINT_URL_S3": "http://b:9000"}}, BOTH, ["kubernetes.env.AWS_ENDPOINT_URL_S3", "set store.endpoint"]),
    ({"kubernetes.env": {"AWS_DEFAULT_REGION": "eu-west-1"}}, BOTH, ["kubernetes.env.AWS_DEFAULT_REGION", "set store.region"]),
    ({"kubernetes.extra_env": [{"name": "AWS_REGION", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "r"}}}]}, BOTH, ["kubernetes.extra_env[0]: AWS_REGION would choose", "set store.region"]),
    # zero replica resources: valid, and never what was meant (empty is how a field says none)
    ({"kubernetes.cpu": "0"}, BOTH, ["kubernetes.cpu: '0' gives each replica no CPU", "leave it empty"]),
    ({"kubernetes.cpu": "0m"}, BOTH, ["kubernetes.cpu: '0m' gives each replica no CPU"]),
    ({"kubernetes.memory": "0Gi"}, BOTH, ["kubernetes.memory: '0Gi' gives each replica no memory", "e.g. 64Gi"]),
    ({"kubernetes.shm_size": "0.0"}, BOTH, ["kubernetes.shm_size: '0.0' gives each replica no /dev/shm"]),
    ({"kubernetes.memory": "0m"}, BOTH, ["kubernetes.memory: '0m' gives each replica no memory"]),  # not "write 0Mi"
    ({"job.nccl_debug": "LOUD"}, BOTH, ["job.nccl_debug", "'LOUD'"]),
    ({"kubernetes.env": {"NCCL_DEBUG": "verbose"}}, BOTH, ["kubernetes.env.NCCL_DEBUG", "'verbose'", "VERSION, WARN, INFO"]),
    # integers within the API server's types (the CRD schemas' int32/int64 formats)
    ({"kubernetes.backoff_limit": 2**31}, V1, ["kubernetes.backoff_limit: 2147483648 is out of range", "int32"]),
    ({"kubernetes.ttl_seconds_after_finished": 2**31}, V1, ["kubernetes.ttl_seconds_after_finished: 2147483648"]),
    ({"kubernetes.active_deadline_seconds": 2**63}, BOTH, ["kubernetes.active_deadline_seconds", "9223372036854775808", "int64"]),
    ({"job.timeout_seconds": 2**63}, BOTH, ["job.timeout_seconds", "9223372036854775808", "int64"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "kind", "phrases"),
    [pytest.param(o, k, p, id=f"{k}-{p[0][:50]}") for o, kinds, p in REFUSED for k in kinds],
)
def test_refused_naming_the_config_field_and_the_value(overrides, kind, phrases):
    # ValueError: a config-level check on the same field (ConfigError) may speak first; the
    # manifest's (ManifestError) must say as much when it is the one that does.
    with pytest.raises(ValueError) as err:
        check_job_manifests(parse_config("", {**overrides, "job.kind": kind}))
    message = str(err.value)
    assert "\n" not in message and len(message) < 600, message
    for phrase in phrases:
        assert phrase in message, message


# Values the API server takes: none may be refused.
ACCEPTED = [
    # a small byte quantity with its unit written: what was meant
    {"kubernetes.volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "100Ki"}}], "kubernetes.memory": "8Gi"},
    {"kubernetes.shm_size": "512Ki"},
    {"kubernetes.labels": {"example.com/team": "ml", "app.kubernetes.io/part-of": "x", "empty": ""}},
    {"kubernetes.annotations": {"Example.COM/Note": "x" * 200_000, "k8s.io/a_b.c": ""}},
    {"kubernetes.node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    {"kubernetes.tolerations": [{"operator": "Exists"}]},
    {"kubernetes.tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]},
    {"kubernetes.tolerations": [{"key": "gpu", "value": "a100", "effect": "PreferNoSchedule"}]},
    {
        "kubernetes.namespace": "team-a",
        "kubernetes.image_pull_secrets": ["regcred.v2"],
        "kubernetes.store_secret": "s3",
        "kubernetes.hf_token_secret": "hf-token.v2",
    },
    {"kubernetes.env": {"my.var-name": "1", "_X": "", "PET_MONITOR_INTERVAL": "1", "NCCL_DEBUG": "info"}},
    {"job.nccl_debug": "TRACE"},
    {
        "job.replicas": 4,
        "job.timeout_seconds": 31622400,
        "kubernetes.active_deadline_seconds": 31622400,
    },  # the longest the config takes
    # What the API server takes: an empty value beside valueFrom, the pod fields a variable may read,
    # a signed integer for Gt/Lt.
    {
        "kubernetes.extra_env": [
            {"name": "A", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
            {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
        ]
    },
    {
        "kubernetes.affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "gen", "operator": "Gt", "values": ["+5"]},
                                {"key": "zone", "operator": "Exists"},
                                {"key": "pool", "operator": "NotIn", "values": ["cpu"]},
                            ]
                        }
                    ]
                }
            }
        }
    },
]


@pytest.mark.parametrize("kind", BOTH)
@pytest.mark.parametrize("overrides", ACCEPTED)
def test_what_the_api_server_takes_passes(overrides, kind):
    check_job_manifests(parse_config("", {**overrides, "job.kind": kind}))


_POD = ("spec", "pytorchReplicaSpecs", "Master", "template", "spec")
_CONTAINER = (*_POD, "containers", 0)

# Manifest fields no config value reaches directly, or values the config refuses at load already
# (tests/unit/test_k8s_formats.py): edit the PyTorchJob, expect the phrase.
EDITS = [
    ((*_CONTAINER, "resources"), {"limits": {"cpu": "1.5.5"}}, "kubernetes.cpu: '1.5.5' is not a Kubernetes quantity"),
    ((*_CONTAINER, "resources"), {"requests": {"memory": "-1Gi"}}, "kubernetes.memory: '-1Gi' is not a Kubernetes quantity"),
    ((*_CONTAINER, "resources"), {"limits": {"memory": "1Qi"}}, "kubernetes.memory: '1Qi'"),
    ((*_CONTAINER, "resources"), {"limits": {"nvidia.com/gpu": "0.5"}}, "kubernetes.gpus_per_node: nvidia.com/gpu '0.5' is not a whole number"),
    ((*_POD, "volumes", 0, "emptyDir", "sizeLimit"), "2 Gi", "kubernetes.shm_size: '2 Gi' is not a Kubernetes quantity"),
    ((*_POD, "volumes"), [{"name": "keys", "secret": {"secretName": "My_Keys"}}], "kubernetes.volumes (keys): 'My_Keys' is not a Secret's name"),
    ((*_CONTAINER, "ports", 0, "containerPort"), 70000, "70000 is not a port number (1-65535)"),
    ((*_POD, "priority"), 2**31, "spec.priority: 2147483648 is out of range: the API server takes an int32"),
]  # fmt: skip

EDITS_ACCEPTED = [
    ((*_CONTAINER, "resources"), {"limits": {"cpu": "1e3", "memory": "+1.5Gi", "nvidia.com/gpu": "8"}}),
    ((*_CONTAINER, "resources"), {"requests": {"cpu": ".5", "memory": "128974848"}, "limits": {"cpu": 2}}),
    ((*_CONTAINER, "resources"), {"limits": {"cpu": "100n", "memory": "1E"}}),
    (("spec", "runPolicy", "activeDeadlineSeconds"), 2**31),  # an int64, not an int32
]


def test_a_trainjob_quantity_names_its_field():
    m = manifest("trainjob", **{"kubernetes.cpu": "4"})
    m["spec"]["trainer"]["resourcesPerNode"]["limits"]["cpu"] = "4 cores"
    with pytest.raises(ManifestError, match=r"^kubernetes.cpu: '4 cores' is not a Kubernetes quantity"):
        validate_trainjob(m)


def _edit(m: dict, path: tuple, value) -> dict:
    m = copy.deepcopy(m)
    node = m
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return m


@pytest.mark.parametrize(("path", "value", "phrase"), EDITS, ids=[e[2][:50] for e in EDITS])
def test_manifest_fields_refused(path, value, phrase):
    m = _edit(manifest("pytorchjob"), path, value)
    with pytest.raises(ManifestError) as err:
        validate_pytorchjob(m)
    assert phrase in str(err.value)


@pytest.mark.parametrize(("path", "value"), EDITS_ACCEPTED)
def test_manifest_fields_accepted(path, value):
    validate_pytorchjob(_edit(manifest("pytorchjob"), path, value))


def test_every_shipped_config_passes():
    from pathlib import Path

    from trainer.config import load_config

    for path in sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")):
        check_job_manifests(load_config(path))


# -- the path patterns ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "captured"),
    [
        ("metadata.namespace", ("metadata", "namespace"), []),
        ("metadata.namespace", ("spec", "metadata", "namespace"), None),
        ("**.metadata.labels.*", ("metadata", "labels", "a.b/c"), ["a.b/c"]),
        ("**.metadata.labels.*", ("spec", "template", "metadata", "labels", "x"), ["x"]),
        ("**.metadata.labels.'kueue.x-k8s.io/queue-name'", ("metadata", "labels", "kueue.x-k8s.io/queue-name"), []),
        ("**.env[*]", ("spec", "trainer", "env", Item(3, "RANK")), ["RANK"]),
        ("**.env[NCCL_DEBUG]", ("env", Item(0, "NCCL_DEBUG")), []),
        ("**.env[NCCL_DEBUG]", ("env", Item(0, "RANK")), None),
        ("**.tolerations[*]", ("tolerations", Item(2)), [2]),
        ("**.tolerations[*]", ("tolerations", "2"), None),
        ("**.resources.*.*", ("c", "resources", "limits", "cpu"), ["limits", "cpu"]),
    ],
)
def test_patterns(pattern, path, captured):
    assert _match(pattern, path) == captured


def test_every_pattern_in_the_tables_parses_into_segments():
    for pattern in [r.pattern for r in RULES] + [p for p, _ in SOURCES]:
        assert _match(pattern, ()) in (None, []), pattern


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("metadata", "labels", "kueue.x-k8s.io/queue-name"), "kubernetes.queue"),
        (("metadata", "labels", "team"), "kubernetes.labels"),
        (("spec", "trainer", "env", Item(0, "HF_HOME")), "kubernetes.env.HF_HOME"),
        (("spec", "trainer", "env", Item(0, "X"), "valueFrom", "secretKeyRef", "name"), "kubernetes.store_secret"),
        ((*_POD, "tolerations", Item(1), "operator"), "kubernetes.tolerations[1]"),
        ((*_POD, "volumes", Item(0, "dshm"), "emptyDir", "sizeLimit"), "kubernetes.shm_size"),
        (("spec", "pytorchReplicaSpecs", "Worker", "replicas"), "job.replicas"),
        (("spec", "trainer", "resourcesPerNode", "limits", "nvidia.com/gpu"), "kubernetes.gpus_per_node"),
        (("metadata", "annotations", "cpu"), "kubernetes.annotations"),  # only a resource named cpu is kubernetes.cpu
        (("apiVersion",), None),
    ],
)
def test_manifest_paths_map_back_to_config_fields(path, field):
    assert config_field(path) == field
