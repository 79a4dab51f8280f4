"""The PyTorchJob manifest (kubeflow.org/v1, Training Operator v1.9) as a pure function.

Built with the kubeflow-training SDK models and serialised the way the Kubernetes client sends
them (`ApiClient().sanitize_for_serialization`: camelCase keys, no None fields).
"""

from __future__ import annotations

from typing import Any

from kubeflow.training import models as kt
from kubernetes import client as k8s

from trainer.config import SHM_VOLUME
from trainer.job_status import PYTORCHJOB_NAME_ENV
from trainer.k8s_formats import KUEUE_QUEUE_LABEL, MANAGED_BY_LABEL
from trainer.launch.container_env import container_env, literal
from trainer.launch.spec import DEFAULT_PORT, JobSpec

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "pytorchjobs", "PyTorchJob"
CONTAINER = "pytorch"  # the operator finds the training container by this name
PORT_NAME = "pytorchjob-port"
#: The label the Training Operator puts on every pod of a PyTorchJob: the job's name.
JOB_NAME_LABEL = "training.kubeflow.org/job-name"


def owner_reference(pod_name: str, pod_uid: str) -> dict[str, Any]:
    """An ownerReference to the launcher pod: deleting the pod (run cancelled) deletes the job."""
    return {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid, "blockOwnerDeletion": False}


def _container(spec: JobSpec) -> k8s.V1Container:
    kc = spec.kubernetes
    env = container_env(spec, PYTORCHJOB_NAME_ENV, JOB_NAME_LABEL)
    amounts: dict[str, str] = {}
    if kc.cpu:
        amounts["cpu"] = kc.cpu
    if kc.memory:
        amounts["memory"] = kc.memory
    limits = dict(amounts)
    if kc.gpus_per_node:
        limits["nvidia.com/gpu"] = str(kc.gpus_per_node)
    resources = k8s.V1ResourceRequirements(requests=amounts or None, limits=limits or None)
    mounts: list[Any] = [k8s.V1VolumeMount(name=SHM_VOLUME, mount_path="/dev/shm")] if kc.shm_size else []
    mounts += [dict(m) for m in kc.volume_mounts]  # already in pod-spec form (camelCase)
    return k8s.V1Container(
        name=CONTAINER,
        image=spec.image,
        image_pull_policy="IfNotPresent",
        command=[literal(arg) for arg in spec.command],
        env=env,
        ports=[k8s.V1ContainerPort(name=PORT_NAME, container_port=spec.port)],
        resources=resources if (amounts or limits) else None,
        volume_mounts=mounts or None,
    )


def _pod_template(spec: JobSpec) -> k8s.V1PodTemplateSpec:
    kc = spec.kubernetes
    volumes: list[Any] = (
        [k8s.V1Volume(name=SHM_VOLUME, empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit=kc.shm_size))]
        if kc.shm_size
        else []
    )
    volumes += [dict(v) for v in kc.volumes]  # already in pod-spec form (camelCase)
    pod = k8s.V1PodSpec(
        containers=[_container(spec)],
        volumes=volumes or None,
        tolerations=list(kc.tolerations) or None,  # already in pod-spec form (camelCase)
        node_selector=dict(kc.node_selector) or None,
        affinity=dict(kc.affinity) or None,
        priority_class_name=kc.priority_class or None,
        service_account_name=kc.service_account or None,
        image_pull_secrets=[k8s.V1LocalObjectReference(name=n) for n in kc.image_pull_secrets] or None,
        termination_grace_period_seconds=kc.termination_grace_seconds,
    )
    meta = k8s.V1ObjectMeta(labels={**MANAGED_BY_LABEL, **kc.labels}, annotations=dict(kc.annotations) or None)
    return k8s.V1PodTemplateSpec(metadata=meta, spec=pod)


def _run_policy(spec: JobSpec) -> kt.KubeflowOrgV1RunPolicy:
    kc = spec.kubernetes
    scheduling = None
    if kc.min_available or kc.scheduling_queue or kc.schedule_timeout_seconds:
        scheduling = kt.KubeflowOrgV1SchedulingPolicy(
            min_available=kc.min_available or None,
            queue=kc.scheduling_queue or None,
            priority_class=kc.priority_class or None,
            schedule_timeout_seconds=kc.schedule_timeout_seconds or None,
        )
    return kt.KubeflowOrgV1RunPolicy(
        clean_pod_policy=kc.clean_pod_policy,
        ttl_seconds_after_finished=kc.ttl_seconds_after_finished,
        # The server-side twin of the launcher's deadline: the job stops even if the launcher died.
        active_deadline_seconds=kc.active_deadline_seconds or spec.timeout_s,
        backoff_limit=kc.backoff_limit,
        scheduling_policy=scheduling,
    )


def pytorchjob_manifest(spec: JobSpec, namespace: str = "", owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """The PyTorchJob for `spec`: 1 Master + (replicas - 1) Workers, or Workers only when elastic."""
    kc = spec.kubernetes
    template = _pod_template(spec)
    replica = {"restart_policy": kc.restart_policy, "template": template}
    if spec.elastic:
        replica_specs = {"Worker": kt.KubeflowOrgV1ReplicaSpec(replicas=spec.replicas, **replica)}
        elastic = kt.KubeflowOrgV1ElasticPolicy(
            min_replicas=kc.elastic.min_replicas,
            max_replicas=kc.elastic.max_replicas,
            max_restarts=kc.elastic.max_restarts,
            rdzv_backend="c10d",
            rdzv_port=spec.port if spec.port != DEFAULT_PORT else None,
        )
    else:
        replica_specs = {"Master": kt.KubeflowOrgV1ReplicaSpec(replicas=1, **replica)}
        if spec.replicas > 1:
            replica_specs["Worker"] = kt.KubeflowOrgV1ReplicaSpec(replicas=spec.replicas - 1, **replica)
        elastic = None
    labels = {**MANAGED_BY_LABEL, **kc.labels}
    if kc.queue:
        labels[KUEUE_QUEUE_LABEL] = kc.queue
    job = kt.KubeflowOrgV1PyTorchJob(
        api_version=f"{GROUP}/{VERSION}",
        kind=KIND,
        metadata=k8s.V1ObjectMeta(
            name=spec.name,
            namespace=namespace or None,
            labels=labels,
            annotations=dict(kc.annotations) or None,
            owner_references=[owner] if owner else None,
        ),
        spec=kt.KubeflowOrgV1PyTorchJobSpec(
            nproc_per_node=str(spec.nproc_per_node),
            pytorch_replica_specs=replica_specs,
            run_policy=_run_policy(spec),
            elastic_policy=elastic,
        ),
    )
    return k8s.ApiClient().sanitize_for_serialization(job)
