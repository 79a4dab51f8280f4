"""What the Kubernetes backend learns from a JobKind: each kind's replica names from its pods'
labels, which conditions and fields mean done, failed and queued, which kind `job.kind` picks on
a cluster that serves one CRD, both or neither, and that each kind's manifest builder and
preflight agree with the kind."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from trainer.config import AUTO, JOB_KINDS, PYTORCHJOB, TRAINJOB
from trainer.launch.jobkind import (
    BY_NAME,
    COMPLETION_INDEX,
    JOB_INDEX_LABEL,
    JOB_NAME_LABEL,
    JOBSET_NAME_LABEL,
    PYTORCHJOB_KIND,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    REPLICATED_JOB_LABEL,
    TRAINJOB_KIND,
    NoJobKindServed,
    choose_kind,
)
from trainer.launch.kubernetes import is_suspended
from trainer.launch.preflight import ManifestError
from trainer.launch.spec import JobSpec


def pod(name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> k8s.V1Pod:
    """A pod as the API returns it: the client's model object, labels and annotations maybe None."""
    return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name, labels=labels, annotations=annotations))


def v1_labels(rtype: str, index: str) -> dict[str, str]:
    return {JOB_NAME_LABEL: "job", REPLICA_TYPE_LABEL: rtype, REPLICA_INDEX_LABEL: index}


def jobset_labels(index: str | None = "1", rjob: str = "node", job_index: str = "0") -> dict[str, str]:
    labels = {JOBSET_NAME_LABEL: "job", REPLICATED_JOB_LABEL: rjob, JOB_INDEX_LABEL: job_index}
    if index is not None:
        labels[COMPLETION_INDEX] = index
    return labels


# --- replica names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "the_pod", "key"),
    [
        # PyTorchJob: the operator's replica type and index labels.
        (PYTORCHJOB_KIND, pod("job-master-0", v1_labels("master", "0")), "master-0"),
        (PYTORCHJOB_KIND, pod("job-worker-1", v1_labels("worker", "1")), "worker-1"),
        # Fallbacks: a pod without the labels still gets a key that names it.
        (PYTORCHJOB_KIND, pod("stray", None), "pod-stray"),
        (PYTORCHJOB_KIND, pod("job-worker-x", {REPLICA_TYPE_LABEL: "worker"}), "worker-job-worker-x"),
        # TrainJob: the JobSet's replicated job and job index, and the Job controller's completion
        # index, which is the pod's hostname without the job name (`<job>-node-0-1`).
        (TRAINJOB_KIND, pod("job-node-0-0-abcde", jobset_labels("0")), "node-0-0"),
        (TRAINJOB_KIND, pod("job-node-0-1-abcde", jobset_labels("1")), "node-0-1"),
        # Before Kubernetes 1.28 the completion index is only an annotation.
        (TRAINJOB_KIND, pod("job-node-0-2-abcde", jobset_labels(None), {COMPLETION_INDEX: "2"}), "node-0-2"),
        # The label wins over the annotation where both are there.
        (TRAINJOB_KIND, pod("job-node-0-3-abcde", jobset_labels("3"), {COMPLETION_INDEX: "9"}), "node-0-3"),
        # Any of the three missing: the pod's own name, not a key that could collide with a real one.
        (TRAINJOB_KIND, pod("job-node-0-4-abcde", jobset_labels(None)), "pod-job-node-0-4-abcde"),
        (TRAINJOB_KIND, pod("other", {COMPLETION_INDEX: "0"}), "pod-other"),
        (TRAINJOB_KIND, pod("bare", None, None), "pod-bare"),
    ],
)
def test_each_kind_names_a_pod_as_its_replica(kind, the_pod, key):
    assert kind.replica_key(the_pod) == key


def test_a_pytorchjob_pod_is_not_named_by_trainjob_labels_nor_the_other_way_round():
    v1, v2 = pod("a", v1_labels("master", "0")), pod("b", jobset_labels("0"))
    assert TRAINJOB_KIND.replica_key(v1) == "pod-a"
    assert PYTORCHJOB_KIND.replica_key(v2) == "pod-b"


@pytest.mark.parametrize(
    ("kind", "selector", "container", "crd"),
    [
        (PYTORCHJOB_KIND, "training.kubeflow.org/job-name=demo", "pytorch", "pytorchjobs.kubeflow.org"),
        # A TrainJob's pods belong to the JobSet of the same name.
        (TRAINJOB_KIND, "jobset.sigs.k8s.io/jobset-name=demo", "node", "trainjobs.trainer.kubeflow.org"),
    ],
)
def test_pods_container_and_crd_of_each_kind(kind, selector, container, crd):
    assert kind.pod_selector("demo") == selector
    assert kind.container == container
    assert kind.crd == crd


# --- conditions: done, failed, queued -----------------------------------------------------------


def cond(ctype: str, status: str = "True", reason: str = "") -> dict[str, str]:
    return {"type": ctype, "status": status, "reason": reason or ctype}


def job(conditions: list[dict[str, str]] = (), spec: dict | None = None) -> dict:
    return {"spec": spec or {}, "status": {"conditions": list(conditions)}}


def state(kind, obj: dict) -> str:
    """What the backend makes of a job's status: the kind's condition types, held True."""
    true = {c["type"] for c in obj["status"]["conditions"] if c["status"] == "True"}
    if kind.succeeded in true:
        return "succeeded"
    if kind.failed in true:
        return "failed"
    return "queued" if is_suspended(obj, kind) else "running"


RUNNING_V1 = [cond("Created"), cond("Running")]
RESUMED_V2 = [cond("Suspended", "False", "Resumed")]


@pytest.mark.parametrize(
    ("kind", "obj", "expected"),
    [
        # The Training Operator's conditions, as it writes them.
        (PYTORCHJOB_KIND, job(RUNNING_V1), "running"),
        (PYTORCHJOB_KIND, job([cond("Created"), cond("Running", "False"), cond("Succeeded")]), "succeeded"),
        (PYTORCHJOB_KIND, job([cond("Created"), cond("Running", "False"), cond("Failed")]), "failed"),
        (PYTORCHJOB_KIND, job([cond("Created"), cond("Suspended")]), "queued"),
        # Kueue holds it through runPolicy.suspend before any condition says so.
        (PYTORCHJOB_KIND, job([], {"runPolicy": {"suspend": True}}), "queued"),
        (PYTORCHJOB_KIND, job([cond("Suspended", "False", "Resumed"), *RUNNING_V1]), "running"),
        # Another kind's spellings mean nothing to a PyTorchJob.
        (PYTORCHJOB_KIND, job([cond("Complete")]), "running"),
        (PYTORCHJOB_KIND, job([], {"suspend": True}), "running"),
        # Trainer v2: JobSet's Completed becomes Complete; spec.suspend is Kueue's hold.
        (TRAINJOB_KIND, job(RESUMED_V2), "running"),
        (TRAINJOB_KIND, job([*RESUMED_V2, cond("Complete")]), "succeeded"),
        (TRAINJOB_KIND, job([*RESUMED_V2, cond("Failed")]), "failed"),
        (TRAINJOB_KIND, job([cond("Suspended")]), "queued"),
        (TRAINJOB_KIND, job([], {"suspend": True}), "queued"),
        (TRAINJOB_KIND, job([cond("Succeeded")]), "running"),
        (TRAINJOB_KIND, job([], {"runPolicy": {"suspend": True}}), "running"),
        # A condition held False is not the state.
        (TRAINJOB_KIND, job([cond("Complete", "False")]), "running"),
        (PYTORCHJOB_KIND, job([cond("Failed", "False")]), "running"),
    ],
)
def test_which_conditions_mean_done_failed_and_queued(kind, obj, expected):
    assert state(kind, obj) == expected


def test_a_status_without_conditions_or_spec_is_running_for_either_kind():
    for kind in BY_NAME.values():
        assert not is_suspended({}, kind)
        assert not kind.suspend_requested({"spec": None})


@pytest.mark.parametrize(
    ("kind", "queue", "gang"),
    [
        (PYTORCHJOB_KIND, "research", True),
        # A TrainJob has no scheduling field: gang scheduling is its runtime's podGroupPolicy.
        (TRAINJOB_KIND, None, False),
    ],
)
def test_only_a_pytorchjob_names_a_gang_scheduler_on_the_job(kind, queue, gang):
    obj = {"spec": {"runPolicy": {"schedulingPolicy": {"queue": "research", "minAvailable": 2}}}}
    assert kind.gang_queue(obj) == queue
    assert kind.gang_scheduled(obj) is gang
    plain = {"spec": {"runPolicy": {}}}
    assert kind.gang_queue(plain) is None and not kind.gang_scheduled(plain)


# --- choosing the kind --------------------------------------------------------------------------


def test_every_job_kind_of_the_config_is_a_kind_or_auto():
    assert set(BY_NAME) == set(JOB_KINDS) - {AUTO}
    assert {k.name for k in BY_NAME.values()} == {PYTORCHJOB, TRAINJOB}


@pytest.mark.parametrize(
    ("requested", "served", "chosen"),
    [
        # An explicit kind is taken as asked, whatever the cluster serves (its CRD missing is the
        # backend's error, naming that kind).
        (PYTORCHJOB, set(), PYTORCHJOB_KIND),
        (PYTORCHJOB, {TRAINJOB}, PYTORCHJOB_KIND),
        (TRAINJOB, set(), TRAINJOB_KIND),
        (TRAINJOB, {PYTORCHJOB}, TRAINJOB_KIND),
        # auto prefers the newer API.
        (AUTO, {PYTORCHJOB, TRAINJOB}, TRAINJOB_KIND),
        (AUTO, {TRAINJOB}, TRAINJOB_KIND),
        (AUTO, {PYTORCHJOB}, PYTORCHJOB_KIND),
    ],
)
def test_choose_kind(requested, served, chosen):
    asked: list[str] = []

    def discovery(kind) -> bool:
        asked.append(kind.name)
        return kind.name in served

    assert choose_kind(requested, discovery) is chosen
    if requested != AUTO:
        assert asked == []  # an explicit kind needs no API discovery (nor the RBAC for it)


def test_auto_on_a_cluster_serving_neither_says_what_to_install():
    with pytest.raises(NoJobKindServed) as err:
        choose_kind(AUTO, lambda kind: False)
    msg = str(err.value)
    assert msg.startswith("job.kind is 'auto' but the cluster serves neither ")
    assert "trainjobs.trainer.kubeflow.org (trainer.kubeflow.org/v1alpha1)" in msg
    assert "pytorchjobs.kubeflow.org (kubeflow.org/v1)" in msg
    assert msg.index("trainjobs") < msg.index("pytorchjobs")  # in order of preference
    assert msg.endswith("install Kubeflow Trainer v2 (TrainJob) or the Training Operator v1 (PyTorchJob)")
    assert "\n" not in msg


# --- the manifest builder and preflight of each kind --------------------------------------------


def small_spec(kind: str) -> JobSpec:
    return JobSpec(name="kftrain-demo", image="img:1", command=("python", "-m", "trainer.train"), replicas=2, kind=kind)


@pytest.mark.parametrize("kind", list(BY_NAME.values()), ids=list(BY_NAME))
def test_the_kinds_builder_makes_a_manifest_its_preflight_accepts(kind):
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "launcher", "uid": "u-1", "blockOwnerDeletion": False}
    manifest = kind.build(small_spec(kind.name), "ns", owner)
    kind.validate(manifest)
    assert manifest["apiVersion"] == f"{kind.group}/{kind.version}"
    assert manifest["kind"] == kind.crd_kind
    assert manifest["metadata"]["name"] == "kftrain-demo"
    assert manifest["metadata"]["namespace"] == "ns"
    assert manifest["metadata"]["ownerReferences"] == [owner]


@pytest.mark.parametrize("kind", list(BY_NAME.values()), ids=list(BY_NAME))
def test_the_other_kinds_preflight_refuses_the_manifest(kind):
    (other,) = [k for k in BY_NAME.values() if k is not kind]
    with pytest.raises(ManifestError):
        other.validate(kind.build(small_spec(kind.name), "ns", None))


def test_the_log_container_is_the_one_the_manifest_names():
    v1 = PYTORCHJOB_KIND.build(small_spec(PYTORCHJOB), "ns", None)
    for replica in v1["spec"]["pytorchReplicaSpecs"].values():
        assert [c["name"] for c in replica["template"]["spec"]["containers"]] == [PYTORCHJOB_KIND.container]
    v2 = TRAINJOB_KIND.build(small_spec(TRAINJOB), "ns", None)
    patched = [
        c["name"]
        for patch in v2["spec"]["runtimePatches"]
        for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        for c in rjob["template"]["spec"]["template"]["spec"].get("containers", [])
    ]
    assert patched == [TRAINJOB_KIND.container]
