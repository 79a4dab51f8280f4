"""A FAKE Kubernetes API for the launcher's tests.

No API server can run on the test machines, so this in-memory object stands in for
`CustomObjectsApi` (PyTorchJobs) and `CoreV1Api` (pods, logs, events). It returns the real
`kubernetes.client` model objects, raises `ApiException`-like errors with HTTP status codes, and
advances a scripted timeline each time the launcher polls the job. It is a fake: it does not
run the Training Operator; tests script what the operator would do.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class FakeApiError(Exception):
    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status


class FakeStream:
    def __init__(self, lines: list[str]) -> None:
        self._data = "".join(f"{line}\n" for line in lines).encode()

    def stream(self, amt: int):
        for i in range(0, len(self._data), 7):  # odd-sized chunks: lines split across reads
            yield self._data[i : i + 7]

    def release_conn(self) -> None:
        pass


class FakeCluster:
    """Jobs, pods, logs and events in memory; `timeline[i]` runs on the i-th job poll."""

    def __init__(self, namespace: str = "team") -> None:
        self.namespace = namespace
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, k8s.V1Pod] = {}
        self.pod_logs: dict[str, list[str]] = {}
        self.events: dict[str, list[tuple[str, str]]] = {}
        self.calls: list[tuple[str, str]] = []
        self.timeline: list[Callable[[FakeCluster], None]] = []
        self.polls = 0
        self.clock = T0
        self.create_error: int | None = None

    def now(self) -> dt.datetime:
        return self.clock

    # -- CustomObjectsApi ---------------------------------------------------------------
    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert (group, version, plural, namespace) == ("kubeflow.org", "v1", "pytorchjobs", self.namespace)
        self.calls.append(("create", body["metadata"]["name"]))
        if self.create_error:
            raise FakeApiError(self.create_error, "Forbidden")
        name = body["metadata"]["name"]
        if name in self.jobs:
            raise FakeApiError(409, "AlreadyExists")
        job = copy.deepcopy(body)
        job["metadata"]["creationTimestamp"] = self.clock.isoformat().replace("+00:00", "Z")
        job["status"] = {"conditions": [{"type": "Created", "status": "True"}]}
        self.jobs[name] = job
        return job

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self.calls.append(("get", name))
        if self.timeline and name in self.jobs:
            step = self.timeline[min(self.polls, len(self.timeline) - 1)]
            self.polls += 1
            step(self)
        if name not in self.jobs:
            raise FakeApiError(404, "NotFound")
        return copy.deepcopy(self.jobs[name])

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None):
        self.calls.append(("delete", name))
        if name not in self.jobs:
            raise FakeApiError(404, "NotFound")
        del self.jobs[name]
        for pod in [p for p in self.pods.values() if p.metadata.labels["training.kubeflow.org/job-name"] == name]:
            del self.pods[pod.metadata.name]

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        self.calls.append(("patch", name))
        self.jobs[name]["metadata"].update(copy.deepcopy(body["metadata"]))

    # -- CoreV1Api ----------------------------------------------------------------------
    def list_namespaced_pod(self, namespace, label_selector):
        key, value = label_selector.split("=")
        return k8s.V1PodList(items=[p for p in self.pods.values() if p.metadata.labels.get(key) == value])

    def list_namespaced_event(self, namespace, field_selector):
        name = field_selector.split("=", 1)[1]
        return k8s.CoreV1EventList(
            items=[
                k8s.CoreV1Event(
                    metadata=k8s.V1ObjectMeta(name=f"{name}.{i}"),
                    involved_object=k8s.V1ObjectReference(name=name),
                    reason=reason,
                    message=message,
                )
                for i, (reason, message) in enumerate(self.events.get(name, []))
            ]
        )

    def read_namespaced_pod_log(
        self, name, namespace, container=None, tail_lines=None, follow=False, _preload_content=True
    ):
        assert container == "pytorch"
        lines = self.pod_logs.get(name, [])
        if follow:
            return FakeStream(lines)
        return "\n".join(lines[-tail_lines:] if tail_lines else lines)

    # -- what the operator would do -------------------------------------------------------
    def add_pod(
        self, job: str, rtype: str, index: int, phase: str, logs=(), exit_code=None, waiting=None, age_s=0, restarts=0
    ):
        name = f"{job}-{rtype}-{index}"
        state = k8s.V1ContainerState(
            terminated=k8s.V1ContainerStateTerminated(exit_code=exit_code) if exit_code is not None else None,
            waiting=k8s.V1ContainerStateWaiting(reason=waiting[0], message=waiting[1]) if waiting else None,
        )
        self.pods[name] = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(
                name=name,
                labels={
                    "training.kubeflow.org/job-name": job,
                    "training.kubeflow.org/replica-type": rtype,
                    "training.kubeflow.org/replica-index": str(index),
                },
                creation_timestamp=self.clock - dt.timedelta(seconds=age_s),
            ),
            status=k8s.V1PodStatus(
                phase=phase,
                container_statuses=[
                    k8s.V1ContainerStatus(
                        name="pytorch",
                        image="img",
                        image_id="",
                        ready=phase == "Running",
                        restart_count=restarts,
                        state=state,
                    )
                ],
            ),
        )
        self.pod_logs[name] = list(logs)

    def set_condition(self, job: str, kind: str, reason: str = "", message: str = "") -> None:
        self.jobs[job]["status"]["conditions"].append(
            {"type": kind, "status": "True", "reason": reason, "message": message}
        )

    def advance(self, seconds: float) -> None:
        self.clock += dt.timedelta(seconds=seconds)
