"""A FAKE Kubernetes API for the launcher's tests.

No API server can run on the test machines, so this in-memory object stands in for
`CustomObjectsApi` (PyTorchJobs) and `CoreV1Api` (pods, logs, events). It returns the real
`kubernetes.client` model objects, raises the real `kubernetes.client.ApiException` with HTTP
status codes (and headers), and advances a scripted timeline each time the launcher polls the
job. It is a fake: tests script what the operator, Kueue and the API server would do.

What it models (`kind="pytorchjob"`, the default, or `kind="trainjob"`):
- API discovery (`get_api_resources(group, version)`): 404 for a group/version no served CRD
  belongs to, else the group's resources (other CRDs of the group included); a create of a kind
  the cluster does not serve is a 404, as the API server answers for an unknown resource;
- TrainJobs (Trainer v2.3.0): the webhook refuses (403, as controller-runtime denies) a runtime
  the cluster lacks; no `status` until a test sets a condition; Kueue suspends through
  `spec.suspend` and the controller sets `Suspended` True (reason `Suspended`) and, on admission,
  False (reason `Resumed`); pods are JobSet's: `<job>-node-0-<i>-<random>` with the
  `jobset.sigs.k8s.io/*` labels and `batch.kubernetes.io/job-completion-index`, container `node`,
  and a recreated pod gets a new random name (the Job controller makes a new pod);
- a log read names a container: the wrong one is a 400, as the API server answers;
- PyTorchJobs: create (409 when the name exists), get (404 when gone), patch (a JSON merge
  patch, as the client sends a dict), delete (the job's pods go with it), conditions updated
  in place with a lastTransitionTime;
- pod disruption as the API shows it (`disrupt`): a `DisruptionTarget` condition, a pod
  `status.reason` (`Evicted`, `NodeLost`), and a container's terminated reason (`OOMKilled`);
- pods with a uid each; `add_pod` updates a pod in place (same uid), `recreate_pod` deletes it
  and makes a new one under the same name (new uid), as the operator does under
  restartPolicy ExitCode; logs are read by pod name, so they are the current pod's;
- Kueue (`kueue=True`): a job with the `kueue.x-k8s.io/queue-name` label is created suspended
  (`runPolicy.suspend: true`, Kueue's webhook) with condition `Suspended` True (the operator);
  `admit` resumes it, `suspend` puts it back in the queue (preemption) and deletes its pods;
- faults on any call (`fail_next`): HTTP 5xx / 429 with a `Retry-After` header, any 4xx,
  connection errors, and answers lost after the call took effect (`applied=True`).

What it does NOT model: watches and resourceVersions, admission webhooks other than Kueue's
suspend, validation of the manifest (preflight does that), real scheduling, PodGroups and
gang schedulers (tests add pods when a scheduler would), quotas, RBAC, the Training Operator's
reconcile loop (no pods appear unless a test adds them), log streams that stay open while a
container runs (a stream returns the log as it is when opened), and the real client's
transport and timeouts.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import json
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from kubernetes import client as k8s
from kubernetes.client import ApiException
from urllib3._collections import HTTPHeaderDict

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
CALLS = ("create", "get", "delete", "patch", "list_pods", "list_events", "read_log", "discover")
#: What each kind looks like to the API: CRD, group/version/plural, pod labels and container.
KINDS = {
    "pytorchjob": {
        "crd": "pytorchjobs.kubeflow.org",
        "gvp": ("kubeflow.org", "v1", "pytorchjobs"),
        "kind": "PyTorchJob",
        "job_label": "training.kubeflow.org/job-name",
        "container": "pytorch",
    },
    "trainjob": {
        "crd": "trainjobs.trainer.kubeflow.org",
        "gvp": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
        "kind": "TrainJob",
        "job_label": "jobset.sigs.k8s.io/jobset-name",
        "container": "node",
    },
}
#: Other resources a real cluster serves in the same group/version (discovery lists them too).
NEIGHBOURS = {
    ("kubeflow.org", "v1"): ["tfjobs", "mpijobs", "xgboostjobs", "paddlejobs", "jaxjobs"],
    ("trainer.kubeflow.org", "v1alpha1"): ["clustertrainingruntimes", "trainingruntimes"],
}


def api_error(status: int, headers: dict[str, str] | None = None) -> ApiException:
    """The real client's exception, as it comes out of a response (`headers` case-insensitive)."""
    exc = ApiException(status=status, reason=HTTPStatus(status).phrase)
    exc.headers = HTTPHeaderDict(headers) if headers else None
    return exc


def _stamp(when: dt.datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


class FakeStream:
    """A following log stream that sends the lines logged so far, then ends (as one cut by a load
    balancer's idle timeout does: the launcher must open it again while the container runs).
    `timestamps`: each line after the kubelet's RFC 3339 stamp with nanoseconds, the i-th line's
    i microseconds after T0, in `zone` (`Z`, or a node's own offset such as `+08:00`);
    `since_seconds` is not applied, so a re-opened stream sends again what the last one sent."""

    def __init__(self, lines: list[str], timestamps: bool = False, zone: str = "Z") -> None:
        def stamp(i: int) -> str:
            when = T0 + dt.timedelta(microseconds=i)
            if zone != "Z":
                sign, hours, minutes = zone[0], int(zone[1:3]), int(zone[4:6])
                when += (1 if sign == "+" else -1) * dt.timedelta(hours=hours, minutes=minutes)
            return f"{when:%Y-%m-%dT%H:%M:%S}.{when.microsecond * 1000:09d}{zone} "

        # A line may hold bytes that are not UTF-8, as `"\udcff"` (surrogateescape): sent as they are.
        text = "".join(f"{stamp(i) if timestamps else ''}{line}\n" for i, line in enumerate(lines))
        self._data = text.encode("utf-8", "surrogateescape")

    def stream(self, amt: int):
        for i in range(0, len(self._data), 7):  # odd-sized chunks: lines split across reads
            yield self._data[i : i + 7]

    def release_conn(self) -> None:
        pass


class FakeResponse:
    """An unread answer (urllib3's HTTPResponse): `data` is the body's bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def release_conn(self) -> None:
        pass


class FakeCluster:
    """Jobs, pods, logs and events in memory; `timeline[i]` runs on the i-th job poll."""

    def __init__(
        self,
        namespace: str = "team",
        kueue: bool = False,
        kind: str = "pytorchjob",
        served: tuple[str, ...] | None = None,
        runtimes: tuple[str, ...] = ("torch-distributed",),
        deletion_seconds: float = 0,
    ) -> None:
        self.namespace = namespace
        #: How long a deleted job stays, with `metadata.deletionTimestamp`, before it is gone: a
        #: Foreground deletion waits for its pods, each within its termination grace period.
        self.deletion_seconds = deletion_seconds
        #: The zone of the kubelet's log timestamps: a node's runtime stamps in its local time.
        self.log_zone = "Z"
        self._gone_at: dict[str, dt.datetime] = {}  # job name -> when its deletion completes
        self.kueue = kueue
        self.kind = kind
        self.k = KINDS[kind]
        #: CRD names the cluster serves (default: the kind's own).
        self.served = set(served if served is not None else (self.k["crd"],))
        #: ClusterTrainingRuntimes installed (TrainJob only).
        self.runtimes = set(runtimes)
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, k8s.V1Pod] = {}
        self.pod_logs: dict[str, list[str]] = {}
        #: Events by the name of their object: (reason, message), or (reason, message, when) as
        #: `post_event` writes them. They outlive their object, as a real cluster's do (an hour).
        self.events: dict[str, list[tuple]] = {}
        self.calls: list[tuple[str, str]] = []
        self.untimed: list[tuple[str, str]] = []
        self.timeline: list[Callable[[FakeCluster], None]] = []
        self.polls = 0
        self.clock = T0
        self.sleeps: list[float] = []
        self._faults: dict[str, list[tuple[BaseException | Callable[[], BaseException], bool]]] = {}
        self._uids = itertools.count(1)
        self._rand = itertools.count(0x1A2B3)  # pod-name suffixes, deterministic
        self._pod_names: dict[tuple[str, str, int], str] = {}  # (job, rtype, index) -> current pod
        self._lock = threading.Lock()  # log streams call in from their own threads

    def now(self) -> dt.datetime:
        return self.clock

    def sleep(self, seconds: float) -> None:
        """The launcher's sleep: recorded, and the clock moves on (tests run instantly)."""
        self.sleeps.append(seconds)
        self.advance(seconds)

    # -- faults ---------------------------------------------------------------------------
    def fail_next(
        self,
        call: str,
        status: int | None = None,
        exc: type[BaseException] | BaseException | None = None,
        times: int = 1,
        headers: dict[str, str] | None = None,
        applied: bool = False,
    ) -> None:
        """Make the next `times` calls of `call` (one of CALLS) fail: with HTTP `status` (an
        `ApiException` carrying `headers`, e.g. `{"Retry-After": "7"}`) or with `exc` (e.g.
        `ConnectionResetError`). `applied=True`: the call takes effect, then its answer is lost."""
        assert call in CALLS, call
        assert (status is None) != (exc is None), "give status or exc"

        def make() -> BaseException:
            if status is not None:
                return api_error(status, headers)
            return exc() if isinstance(exc, type) else exc

        with self._lock:
            self._faults.setdefault(call, []).extend([(make, applied)] * times)

    def _fault(self, call: str) -> tuple[BaseException, bool] | None:
        with self._lock:
            queue = self._faults.get(call)
            if not queue:
                return None
            make, applied = queue.pop(0)
        return make(), applied

    def _call(self, timeout: Any, call: str, name: str, do: Callable[[], Any]) -> Any:
        """One API call: recorded (and in `untimed` when it carries no `_request_timeout`: a
        real connection that never answers would block it for good), faults applied."""
        self.calls.append((call, name))
        for job, when in list(self._gone_at.items()):  # deletions that completed by now
            if self.clock >= when:
                del self._gone_at[job]
                self.jobs.pop(job, None)
        if timeout is None:
            self.untimed.append((call, name))
        fault = self._fault(call)
        if fault and not fault[1]:
            raise fault[0]
        result = do()
        if fault:
            raise fault[0]
        return result

    # -- discovery ----------------------------------------------------------------------
    def get_api_resources(self, group, version, _request_timeout=None):
        """`GET /apis/<group>/<version>`: 404 unless a served CRD belongs to that group/version."""

        def do():
            mine = [k for k in KINDS.values() if k["crd"] in self.served and k["gvp"][:2] == (group, version)]
            if not mine:
                raise api_error(404)
            names = [k["gvp"][2] for k in mine] + NEIGHBOURS.get((group, version), [])
            return k8s.V1APIResourceList(
                group_version=f"{group}/{version}",
                resources=[
                    k8s.V1APIResource(
                        name=n,
                        singular_name="",
                        kind=n.title(),
                        namespaced=n != "clustertrainingruntimes",
                        verbs=["get", "list", "create", "delete"],
                    )
                    for n in names
                ],
            )

        return self._call(_request_timeout, "discover", f"{group}/{version}", do)

    # -- CustomObjectsApi ---------------------------------------------------------------
    def _check_resource(self, group, version, plural) -> None:
        served = {KINDS[k]["gvp"] for k in KINDS if KINDS[k]["crd"] in self.served}
        if (group, version, plural) not in served:
            raise api_error(404)  # the server could not find the requested resource
        assert (group, version, plural) == self.k["gvp"], "the test's cluster runs the other kind"

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, _request_timeout=None):
        assert namespace == self.namespace
        name = body["metadata"]["name"]

        def do():
            self._check_resource(group, version, plural)
            if name in self.jobs:
                raise api_error(409)
            if self.kind == "trainjob":
                runtime = body["spec"]["runtimeRef"]["name"]
                if runtime not in self.runtimes:
                    exc = api_error(403)
                    message = (
                        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
                        f'clustertrainingruntimes.trainer.kubeflow.org "{runtime}" not found'
                    )
                    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": 403})
                    raise exc
            job = copy.deepcopy(body)
            job["metadata"]["creationTimestamp"] = _stamp(self.clock)
            if self.kind == "pytorchjob":
                job["status"] = {"conditions": [self._cond("Created", "True", "PyTorchJobCreated")]}
            self.jobs[name] = job
            if self.kueue and QUEUE_LABEL in (job["metadata"].get("labels") or {}):
                self.suspend(name)
            return copy.deepcopy(job)

        return self._call(_request_timeout, "create", name, do)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, _request_timeout=None):
        def do():
            self._check_resource(group, version, plural)
            if self.timeline and name in self.jobs:
                step = self.timeline[min(self.polls, len(self.timeline) - 1)]
                self.polls += 1
                step(self)
            if name not in self.jobs:
                raise api_error(404)
            return copy.deepcopy(self.jobs[name])

        return self._call(_request_timeout, "get", name, do)

    def delete_namespaced_custom_object(
        self, group, version, namespace, plural, name, propagation_policy=None, _request_timeout=None
    ):
        def do():
            self._check_resource(group, version, plural)
            if name not in self.jobs:
                raise api_error(404)
            self._delete_pods(name)
            if not self.deletion_seconds:
                return self.jobs.pop(name)
            job = self.jobs[name]
            if name not in self._gone_at:
                job["metadata"]["deletionTimestamp"] = _stamp(self.clock)
                self._gone_at[name] = self.clock + dt.timedelta(seconds=self.deletion_seconds)
            return copy.deepcopy(job)  # the API answers a delete with the object (a Foreground one: still there)

        return self._call(_request_timeout, "delete", name, do)

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body, _request_timeout=None):
        """A JSON merge patch (RFC 7386, what the client sends for a dict body): mappings merge,
        anything else (a list of ownerReferences) replaces."""

        def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
            for key, value in patch.items():
                if value is None:
                    target.pop(key, None)
                elif isinstance(value, dict) and isinstance(target.get(key), dict):
                    merge(target[key], value)
                else:
                    target[key] = copy.deepcopy(value)

        def do():
            self._check_resource(group, version, plural)
            if name not in self.jobs:
                raise api_error(404)
            merge(self.jobs[name], body)
            return copy.deepcopy(self.jobs[name])

        return self._call(_request_timeout, "patch", name, do)

    # -- CoreV1Api ----------------------------------------------------------------------
    def list_namespaced_pod(self, namespace, label_selector, _request_timeout=None):
        key, value = label_selector.split("=")
        return self._call(
            _request_timeout,
            "list_pods",
            value,
            lambda: k8s.V1PodList(
                items=[copy.deepcopy(p) for p in self.pods.values() if p.metadata.labels.get(key) == value]
            ),
        )

    def list_namespaced_event(self, namespace, field_selector, _request_timeout=None):
        name = field_selector.split("=", 1)[1]
        return self._call(_request_timeout, "list_events", name, lambda: self._events(name))

    def _events(self, name: str) -> k8s.CoreV1EventList:
        return k8s.CoreV1EventList(
            items=[
                k8s.CoreV1Event(
                    metadata=k8s.V1ObjectMeta(name=f"{name}.{i}"),
                    involved_object=k8s.V1ObjectReference(name=name),
                    reason=event[0],
                    message=event[1],
                    last_timestamp=event[2] if len(event) > 2 else None,
                )
                for i, event in enumerate(self.events.get(name, []))
            ]
        )

    def read_namespaced_pod_log(self, name, namespace, container=None, tail_lines=None, follow=False, **options):
        """`options`: `timestamps`, `since_seconds` (not applied: see FakeStream), `_preload_content`,
        `_request_timeout`; any other name is refused, as the real client refuses it."""
        assert set(options) <= {"timestamps", "since_seconds", "_preload_content", "_request_timeout"}, options
        timestamps, _preload_content = options.get("timestamps", False), options.get("_preload_content", True)
        _request_timeout = options.get("_request_timeout")

        def do():
            if name not in self.pods:
                raise api_error(404)
            if container != self.k["container"]:
                raise api_error(400)  # container <x> is not valid for pod <name>
            lines = list(self.pod_logs.get(name, []))
            if follow:
                return FakeStream(lines, timestamps, self.log_zone)
            raw = "\n".join(lines[-tail_lines:] if tail_lines else lines).encode("utf-8", "surrogateescape")
            if not _preload_content:  # unread: the bytes as sent
                return FakeResponse(raw)
            # Read as kubernetes.client reads a `str` answer: decoded strictly (UnicodeDecodeError),
            # then parsed as JSON where it is JSON (`null` -> None, an object -> its Python repr).
            text = raw.decode("utf-8")
            try:
                parsed = json.loads(text)
            except ValueError:
                return text
            return None if parsed is None else str(parsed)

        return self._call(_request_timeout, "read_log", name, do)

    # -- what the operator would do -------------------------------------------------------
    def add_pod(
        self,
        job: str,
        rtype: str,
        index: int,
        phase: str,
        logs=(),
        exit_code=None,
        waiting=None,
        age_s=0,
        restarts=0,
        terminated_reason=None,
        init_waiting=None,
        unschedulable=None,
    ):
        """Set the pod of replica `rtype`/`index` to this state: a new pod, or the same pod (same
        uid) updated. PyTorchJob: `<job>-<rtype>-<index>`; TrainJob (`rtype` "node"): JobSet's
        `<job>-node-0-<index>-<random>`. `unschedulable`: the scheduler's message on the pod's
        PodScheduled condition (False, Unschedulable), as a scheduler that cannot place it writes."""
        key = (job, rtype, index)
        if self.kind == "trainjob":
            assert rtype == "node", rtype
            if self._pod_names.get(key) not in self.pods:  # none yet, or deleted: a new pod, a new name
                self._pod_names[key] = f"{job}-node-0-{index}-{format(next(self._rand), 'x')[-5:]}"
        else:
            self._pod_names[key] = f"{job}-{rtype}-{index}"
        name = self._pod_names[key]
        old = self.pods.get(name)
        uid = old.metadata.uid if old else f"pod-uid-{next(self._uids)}"
        created = old.metadata.creation_timestamp if old else self.clock - dt.timedelta(seconds=age_s)
        state = k8s.V1ContainerState(
            terminated=k8s.V1ContainerStateTerminated(exit_code=exit_code, reason=terminated_reason)
            if exit_code is not None
            else None,
            waiting=k8s.V1ContainerStateWaiting(reason=waiting[0], message=waiting[1]) if waiting else None,
            running=k8s.V1ContainerStateRunning() if phase == "Running" and exit_code is None and not waiting else None,
        )
        self.pods[name] = k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(
                name=name,
                uid=uid,
                labels=self._pod_labels(job, rtype, index),
                creation_timestamp=created,
            ),
            status=k8s.V1PodStatus(
                phase=phase,
                conditions=[
                    k8s.V1PodCondition(
                        type="PodScheduled", status="False", reason="Unschedulable", message=unschedulable
                    )
                ]
                if unschedulable
                else None,
                # An init container waiting (reason, message): the pod shows Init:<reason>.
                init_container_statuses=[
                    k8s.V1ContainerStatus(
                        name="init",
                        image="init-img",
                        image_id="",
                        ready=False,
                        restart_count=0,
                        state=k8s.V1ContainerState(
                            waiting=k8s.V1ContainerStateWaiting(reason=init_waiting[0], message=init_waiting[1])
                        ),
                    )
                ]
                if init_waiting
                else None,
                container_statuses=[
                    k8s.V1ContainerStatus(
                        name=self.k["container"],
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

    def disrupt(self, job: str, rtype: str, index: int, condition=None, reason=None, message="") -> None:
        """Mark a replica's pod as Kubernetes does when it disrupts it: a `DisruptionTarget`
        condition with reason `condition` (e.g. `PreemptionByScheduler`) and/or a pod
        `status.reason` (e.g. `Evicted`, `NodeLost`) with `message`; the phase becomes Failed."""
        pod = self.pods[self.pod_name(job, rtype, index)]
        pod.status.phase = "Failed"
        if condition:
            cond = k8s.V1PodCondition(type="DisruptionTarget", status="True", reason=condition, message=message)
            pod.status.conditions = [*(pod.status.conditions or []), cond]
        if reason:
            pod.status.reason, pod.status.message = reason, message

    def _pod_labels(self, job: str, rtype: str, index: int) -> dict[str, str]:
        if self.kind == "trainjob":
            return {
                "jobset.sigs.k8s.io/jobset-name": job,
                "jobset.sigs.k8s.io/replicatedjob-name": rtype,
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-completion-index": str(index),
                "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
            }
        return {
            "training.kubeflow.org/job-name": job,
            "training.kubeflow.org/replica-type": rtype,
            "training.kubeflow.org/replica-index": str(index),
        }

    def pod_name(self, job: str, rtype: str, index: int) -> str:
        """The latest pod name of a replica (a TrainJob's has a random suffix)."""
        return self._pod_names[(job, rtype, index)]

    def recreate_pod(self, job: str, rtype: str, index: int, phase: str, **kwargs: Any) -> None:
        """Delete the pod and create a new one (new uid): under the same name, as the operator
        does for a retryable exit code under restartPolicy ExitCode; under a new random name, as
        the Job controller does under a TrainJob."""
        self.pods.pop(self._pod_names.get((job, rtype, index), ""), None)
        self.add_pod(job, rtype, index, phase, **kwargs)

    def _delete_pods(self, job: str) -> None:
        for pod in [p for p in self.pods.values() if p.metadata.labels[self.k["job_label"]] == job]:
            del self.pods[pod.metadata.name]

    def _cond(self, kind: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": _stamp(self.clock),
        }

    def set_condition(self, job: str, kind: str, reason: str = "", message: str = "", status: str = "True") -> None:
        """Set a job condition in place, as the operator does (one entry per type)."""
        st = self.jobs[job].setdefault("status", {})
        conds = [c for c in st.get("conditions", []) if c["type"] != kind]
        st["conditions"] = [*conds, self._cond(kind, status, reason, message)]

    def set_child_jobs(self, job: str, **counts: int) -> None:
        """A TrainJob's `status.jobsStatus` (its JobSet's child Jobs, counted by state) as Kubeflow
        Trainer writes it: the only sign that it runs (it has no `Running` condition)."""
        entry = {"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0, **counts}
        self.jobs[job].setdefault("status", {})["jobsStatus"] = [entry]

    def suspend(self, job: str) -> None:
        """Kueue holds the job (at creation, or preempting it): suspended, its pods deleted."""
        if self.kind == "trainjob":
            self.jobs[job]["spec"]["suspend"] = True
            self.set_condition(job, "Suspended", "Suspended", "TrainJob is suspended")
        else:
            self.jobs[job]["spec"].setdefault("runPolicy", {})["suspend"] = True
            self.set_condition(job, "Suspended", "JobSuspended", "PyTorchJob is suspended.")
        self._delete_pods(job)

    def admit(self, job: str) -> None:
        """Kueue admits the job: it unsuspends it and the operator marks it resumed."""
        if self.kind == "trainjob":
            self.jobs[job]["spec"]["suspend"] = False
            self.set_condition(job, "Suspended", "Resumed", "TrainJob is resumed", status="False")
        else:
            self.jobs[job]["spec"]["runPolicy"]["suspend"] = False
            self.set_condition(job, "Suspended", "JobResumed", "PyTorchJob is resumed.", status="False")

    def post_event(self, name: str, reason: str, message: str) -> None:
        """An event about object `name`, last seen now."""
        self.events.setdefault(name, []).append((reason, message, self.clock))

    def advance(self, seconds: float) -> None:
        self.clock += dt.timedelta(seconds=seconds)


def launcher(cluster: FakeCluster, owner_uid: str | None = "uid-1", log: Callable[[str], None] | None = None):
    """A real KubernetesBackend whose API is `cluster` (this fake) and whose clock is the fake's,
    owned by launcher pod `owner_uid` (None: no owner)."""
    from trainer.launch.kubernetes import KubernetesBackend
    from trainer.launch.pytorchjob import owner_reference

    return KubernetesBackend(
        custom_api=cluster,
        core_api=cluster,
        namespace=cluster.namespace,
        owner=owner_reference("launcher-pod", owner_uid) if owner_uid else None,
        log=log or (lambda line: None),
        now=cluster.now,
        sleep=cluster.sleep,
    )
