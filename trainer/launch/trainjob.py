"""The TrainJob manifest (trainer.kubeflow.org/v1alpha1, Kubeflow Trainer v2.3.0) as a pure function.

A TrainJob names a runtime (`spec.runtimeRef`, by default the `torch-distributed`
ClusterTrainingRuntime) and fills in the trainer: `spec.trainer` carries the image, command,
environment, node count, processes per node and resources per node. Everything else a pod needs
goes through v2.3.0's `spec.runtimePatches` (there is no `podTemplateOverrides` in v2.3.0): one
patch, owned by the manager `kftrain.dev/launcher`, of the runtime's trainer job `node` and its
container `node`, with the pod labels and annotations, volumes (kftrain's `/dev/shm` and
`kubernetes.volumes`), the container's volume mounts, tolerations, node selector, affinity,
service account and image pull secrets.

The webhook refuses environment in a `runtimePatches` container patch of `node`, so every
variable, the store credentials' `secretKeyRef` included, goes in `spec.trainer.env`. It also
refuses the five `PET_*` names the torch plugin injects (see trainer/launch/spec.py).
"""

from __future__ import annotations

from typing import Any

from trainer.config import SHM_VOLUME
from trainer.job_status import TRAINJOB_NAME_ENV
from trainer.k8s_formats import KUEUE_QUEUE_LABEL, MANAGED_BY_LABEL
from trainer.launch.container_env import container_env, literal
from trainer.launch.spec import NODE, UNBUFFERED_ENV, JobSpec

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
RUNTIME_KIND = "ClusterTrainingRuntime"
#: The trainer container of every Trainer v2 torch runtime (`constants.Node`).
CONTAINER = NODE
#: Owner of kftrain's runtime patch: the webhook wants a domain-prefixed path.
PATCH_MANAGER = "kftrain.dev/launcher"
#: What the Training Operator sets and Trainer v2 does not: Python's output reaches the log at once.
EXTRA_ENV = {UNBUFFERED_ENV: "1"}
#: JobSet's label on every pod: the JobSet's name, which is the TrainJob's.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def _resources(spec: JobSpec) -> dict[str, Any] | None:
    kc = spec.kubernetes
    amounts = {k: v for k, v in (("cpu", kc.cpu), ("memory", kc.memory)) if v}
    limits = dict(amounts)
    if kc.gpus_per_node:
        limits["nvidia.com/gpu"] = str(kc.gpus_per_node)
    out = {}
    if amounts:
        out["requests"] = amounts
    if limits:
        out["limits"] = limits
    return out or None


def _pod_patch(spec: JobSpec) -> dict[str, Any]:
    kc = spec.kubernetes
    volumes: list[dict[str, Any]] = (
        [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": kc.shm_size}}] if kc.shm_size else []
    )
    volumes += [dict(v) for v in kc.volumes]  # already in pod-spec form (camelCase)
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}] if kc.shm_size else []
    mounts += [dict(m) for m in kc.volume_mounts]
    # Time for the ranks to commit a checkpoint on SIGTERM before the SIGKILL.
    pod: dict[str, Any] = {"terminationGracePeriodSeconds": kc.termination_grace_seconds}
    if kc.service_account:
        pod["serviceAccountName"] = kc.service_account
    if volumes:
        pod["volumes"] = volumes
    if mounts:
        pod["containers"] = [{"name": CONTAINER, "volumeMounts": mounts}]
    if kc.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in kc.image_pull_secrets]
    if kc.node_selector:
        pod["nodeSelector"] = dict(kc.node_selector)
    if kc.affinity:
        pod["affinity"] = dict(kc.affinity)
    if kc.tolerations:
        pod["tolerations"] = [dict(t) for t in kc.tolerations]
    meta: dict[str, Any] = {"labels": {**MANAGED_BY_LABEL, **kc.labels}}
    if kc.annotations:
        meta["annotations"] = dict(kc.annotations)
    return {"metadata": meta, "spec": pod}


def trainjob_manifest(spec: JobSpec, namespace: str = "", owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """The TrainJob for `spec`: `spec.replicas` nodes of `spec.nproc_per_node` processes each, on
    the ClusterTrainingRuntime `kubernetes.runtime`, with kftrain's pod settings as a runtime patch."""
    kc = spec.kubernetes
    labels = {**MANAGED_BY_LABEL, **kc.labels}
    if kc.queue:
        labels[KUEUE_QUEUE_LABEL] = kc.queue  # Kueue's TrainJob integration reads the job's label
    metadata: dict[str, Any] = {"name": spec.name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = labels
    if kc.annotations:
        metadata["annotations"] = dict(kc.annotations)
    if owner:
        metadata["ownerReferences"] = [owner]
    trainer: dict[str, Any] = {
        "image": spec.image,
        "command": [literal(arg) for arg in spec.command],
        "env": container_env(spec, TRAINJOB_NAME_ENV, JOBSET_NAME_LABEL, EXTRA_ENV),
        "numNodes": spec.replicas,
        "numProcPerNode": spec.nproc_per_node,
    }
    if (resources := _resources(spec)) is not None:
        trainer["resourcesPerNode"] = resources
    patch = {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {"replicatedJobs": [{"name": NODE, "template": {"spec": {"template": _pod_patch(spec)}}}]}
            }
        },
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "runtimeRef": {"name": kc.runtime, "apiGroup": GROUP, "kind": RUNTIME_KIND},
            "trainer": trainer,
            "runtimePatches": [patch],
            # The server-side twin of the launcher's deadline: the job stops even if the launcher died.
            "activeDeadlineSeconds": kc.active_deadline_seconds or spec.timeout_s,
        },
    }
