"""What differs between a PyTorchJob and a TrainJob, in one small object per kind.

The Kubernetes backend is written once against :class:`JobKind`: which API resource to call,
which pure manifest builder and preflight to use, how to find the job's pods and name each one
as a replica, and which conditions mean done, failed and queued.

- PyTorchJob (Training Operator v1.9): pods labelled `training.kubeflow.org/job-name`,
  `.../replica-type` and `.../replica-index` (keys `master-0`, `worker-1`); container `pytorch`;
  conditions `Succeeded` / `Failed` / `Suspended`; Kueue suspends through `runPolicy.suspend`;
  a gang scheduler is named in `runPolicy.schedulingPolicy`.
- TrainJob (Trainer v2.3.0, a JobSet underneath named like the TrainJob): pods labelled
  `jobset.sigs.k8s.io/jobset-name`, `jobset.sigs.k8s.io/replicatedjob-name`,
  `jobset.sigs.k8s.io/job-index` and, by the Job controller, `batch.kubernetes.io/job-completion-index`
  (keys `node-0-0`, `node-0-1`: the pod's hostname without the job name); container `node`;
  conditions `Complete` / `Failed` / `Suspended` (the TrainJob controller copies JobSet's
  Completed as `Complete`, its Failed as `Failed`, and sets `Suspended` True while `spec.suspend`,
  then False with reason `Resumed`); Kueue suspends through `spec.suspend`; no gang-scheduling
  field on the job (it is the runtime's `podGroupPolicy`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.errors import KftrainError
from trainer.launch import pytorchjob, trainjob
from trainer.launch.preflight import validate_pytorchjob, validate_trainjob
from trainer.launch.spec import AUTO, PYTORCHJOB, TRAINJOB, JobSpec

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # a label (k8s >= 1.28) and an annotation


def _pytorchjob_replica(pod: Any) -> str:
    labels = pod.metadata.labels or {}
    return f"{labels.get(REPLICA_TYPE_LABEL, 'pod')}-{labels.get(REPLICA_INDEX_LABEL, pod.metadata.name)}"


def _trainjob_replica(pod: Any) -> str:
    labels = pod.metadata.labels or {}
    index = labels.get(COMPLETION_INDEX) or (pod.metadata.annotations or {}).get(COMPLETION_INDEX)
    rjob, job_index = labels.get(REPLICATED_JOB_LABEL), labels.get(JOB_INDEX_LABEL)
    if rjob is None or job_index is None or index is None:
        return f"pod-{pod.metadata.name}"
    return f"{rjob}-{job_index}-{index}"


def _run_policy(job: dict[str, Any]) -> dict[str, Any]:
    return (job.get("spec") or {}).get("runPolicy") or {}


@dataclass(frozen=True, slots=True)
class JobKind:
    """One Kubeflow job kind, as the launcher needs to know it."""

    name: str
    """`job.kind` spelling: `pytorchjob` or `trainjob`."""
    crd_kind: str
    """The custom resource's kind in manifests and messages: `PyTorchJob` or `TrainJob`."""
    group: str
    """API group of the CRD."""
    version: str
    """API version the launcher uses."""
    plural: str
    """Resource name in URLs and RBAC."""
    container: str
    """The training container of each pod (its log is the replica's log)."""
    succeeded: str
    """The condition type that means the job finished successfully."""
    job_label: str
    """Pod label whose value is the job's name: selects the job's pods."""
    build: Callable[[JobSpec, str, dict[str, Any] | None], dict[str, Any]]
    """The pure manifest builder `(spec, namespace, owner) -> manifest`."""
    validate: Callable[[dict[str, Any]], None]
    """Preflight: raises ManifestError naming the field."""
    replica_key: Callable[[Any], str]
    """A pod's replica key in logs and errors (`master-0`, `node-0-1`)."""
    failed: str = "Failed"
    """The condition type that means the job failed."""
    suspended: str = "Suspended"
    """The condition type that means the job waits in a queue."""

    @property
    def crd(self) -> str:
        """The CRD's name, `<plural>.<group>`."""
        return f"{self.plural}.{self.group}"

    def pod_selector(self, job_name: str) -> str:
        """Label selector of the job's pods."""
        return f"{self.job_label}={job_name}"

    def suspend_requested(self, job: dict[str, Any]) -> bool:
        """The job's own suspend field (Kueue sets it until it admits the job)."""
        if self.name == TRAINJOB:
            return bool((job.get("spec") or {}).get("suspend"))
        return bool(_run_policy(job).get("suspend"))

    def gang_queue(self, job: dict[str, Any]) -> str | None:
        """The gang scheduler's queue named on the job, if the kind has such a field and it is set."""
        if self.name == PYTORCHJOB:
            return (_run_policy(job).get("schedulingPolicy") or {}).get("queue")
        return None

    def gang_scheduled(self, job: dict[str, Any]) -> bool:
        """The job asks a gang scheduler (which delays pod creation until its PodGroup is admitted)."""
        return self.name == PYTORCHJOB and bool(_run_policy(job).get("schedulingPolicy"))


def _kind(name: str, manifests: Any, **behaviour: Any) -> JobKind:
    """A JobKind whose resource facts (kind, group, version, plural, container) are those of its
    manifest builder's module, so that they are written once."""
    return JobKind(
        name=name,
        crd_kind=manifests.KIND,
        group=manifests.GROUP,
        version=manifests.VERSION,
        plural=manifests.PLURAL,
        container=manifests.CONTAINER,
        **behaviour,
    )


PYTORCHJOB_KIND = _kind(
    PYTORCHJOB,
    pytorchjob,
    succeeded="Succeeded",
    job_label=JOB_NAME_LABEL,
    build=pytorchjob.pytorchjob_manifest,
    validate=validate_pytorchjob,
    replica_key=_pytorchjob_replica,
)
TRAINJOB_KIND = _kind(
    TRAINJOB,
    trainjob,
    succeeded="Complete",
    job_label=JOBSET_NAME_LABEL,  # the JobSet is named like the TrainJob
    build=trainjob.trainjob_manifest,
    validate=validate_trainjob,
    replica_key=_trainjob_replica,
)
#: The job kinds a cluster can run, by their `job.kind` spelling (`auto` is not one: it chooses).
BY_NAME = {k.name: k for k in (PYTORCHJOB_KIND, TRAINJOB_KIND)}


def kinds_it_may_become(kind: str) -> list[JobKind]:
    """The job kinds a `job.kind` of `kind` may create on a cluster: itself, or each (`auto`)."""
    return [BY_NAME[kind]] if kind in BY_NAME else list(BY_NAME.values())


#: `auto` prefers the newer API when a cluster serves both.
AUTO_PREFERENCE = (TRAINJOB_KIND, PYTORCHJOB_KIND)


class NoJobKindServed(KftrainError, RuntimeError):
    """`job.kind: auto` and the cluster serves neither CRD."""


def choose_kind(requested: str, served: Callable[[JobKind], bool]) -> JobKind:
    """The JobKind for `requested` (`pytorchjob`, `trainjob`, or `auto`). For `auto`, ask
    `served(kind)` (API discovery) in order of preference: TrainJob first, then PyTorchJob."""
    if requested != AUTO:
        return BY_NAME[requested]
    for kind in AUTO_PREFERENCE:
        if served(kind):
            return kind
    raise NoJobKindServed(
        "job.kind is 'auto' but the cluster serves neither "
        + " nor ".join(f"{k.crd} ({k.group}/{k.version})" for k in AUTO_PREFERENCE)
        + ": install Kubeflow Trainer v2 (TrainJob) or the Training Operator v1 (PyTorchJob)"
    )
