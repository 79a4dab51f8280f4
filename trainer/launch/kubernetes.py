"""Run a job as a Kubeflow PyTorchJob or TrainJob: submit, re-attach, wait, stream logs, cancel.

The two kinds differ only in what :class:`~trainer.launch.jobkind.JobKind` describes (the API
resource, the pure manifest builder, how pods are labelled, which conditions mean what);
everything below holds for both. `job.kind: auto` is resolved once per job by API discovery
(`GET /apis/<group>/<version>` through `CustomObjectsApi.get_api_resources`): TrainJob when
the cluster serves it, else PyTorchJob, else an error naming both CRDs.

What the old launchers got wrong and this one does:

- the job name is deterministic per KFP run and task, so a retried or restarted launcher
  re-attaches to the job it created instead of starting a second one (a job that already
  Failed is replaced: that is what a retry asks for);
- SIGTERM (a KFP run terminated) and every error path delete the job (`run_job`), the delete
  first: the container ends about a second after the signal. The job's ownerReference to the
  launcher pod deletes it too when the pod is deleted;
- Failed fails the step, with the condition's reason, its cause (`trainer/launch/failures.py`:
  preempted, node lost, OOMKilled, image pull, collective timeout, non-finite loss, user error)
  and the failing replica's last log lines; unless the cause is an infrastructure one within its
  budget (`kubernetes.max_restarts_by_cause`): then the job is deleted and re-created under the
  same name (a restarted launcher still finds it; the checkpoint prefix is the same, so the trainer
  resumes from its latest checkpoint), within the same deadline;
- a pod Pending past `kubernetes.pending_timeout_seconds` fails the step with its events
  (`Insufficient nvidia.com/gpu`, `ErrImagePull`, ...) instead of waiting forever;
- the deadline is a real wall-clock deadline (`job.timeout_seconds`), not a per-request timeout;
- every replica's log streams into the step's log with a `[master-0]` / `[worker-1]` prefix,
  one stream per pod uid and container restart, so a pod the operator deleted and recreated
  under the same name (restartPolicy ExitCode) is streamed again;
- transient API errors (5xx, 429, connection resets) are retried (`trainer/launch/retry.py`)
  within `kubernetes.api_retry_budget_seconds`: only a final answer fails the step and deletes
  the job (the Failed condition, a 4xx, the deadline, or the budget spent);
- an answer that is not a Kubernetes object (an auth proxy's login page, an empty body) is a
  final one too, one line naming the server, the call and what came instead (:func:`api_call`);
- rank 0's progress, which it reports to the job object (a TrainJob's `status.trainerStatus`, a
  PyTorchJob's `kftrain.io/progress` annotation; trainer/job_status.py), is printed in the step's
  log whenever it changes, as the same line rank 0 logs (`trainer.progress.format_progress`);
  `kftrain job status NAME` prints it too (:func:`job_status`);
- a job held in a queue (Kueue suspends it; a gang scheduler creates no pods until its PodGroup
  is admitted) is reported as queued, with its queue, and again when admitted. The Pending clock
  starts at admission; queue time has its own limit, `kubernetes.queue_timeout_seconds` (off by
  default).

Polling, not watching. Each poll is a fresh GET of the job and a fresh LIST of its pods, so
there is no resourceVersion to expire and no 410 Gone to re-list after: a poll that fails is
retried, and the next one sees the current state whatever happened in between. A watch would
need the same retries plus re-list handling, and would only save a few seconds of latency on a
job that runs for hours (`kubernetes.poll_seconds`).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainer.errors import KftrainError, redact, yaml_problem
from trainer.k8s_formats import KUEUE_QUEUE_LABEL
from trainer.launch import failures
from trainer.launch.backend import JobFailed, JobTimeout, failure_excerpt, print_line
from trainer.launch.jobkind import (
    AUTO_PREFERENCE,
    BY_NAME,
    JOB_NAME_LABEL,
    PYTORCHJOB_KIND,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    TRAINJOB_KIND,
    JobKind,
    NoJobKindServed,
    choose_kind,
)
from trainer.launch.logstream import LogStreams
from trainer.launch.pytorchjob import owner_reference
from trainer.launch.retry import (
    CANCEL_RETRY_BUDGET_S,
    CONNECTION_ERRORS,
    REQUEST_TIMEOUT_S,
    ApiRetry,
    ApiUnavailable,
    describe,
    http_status,
    refused_call,
    unreachable,
)
from trainer.launch.spec import AUTO, POD_NAME_ENV, POD_UID_ENV, JobSpec, require_object_store
from trainer.progress import PROGRESS_ANNOTATION, Snapshot, format_seconds, progress_of, stamp

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: A log stream's (connect, read) timeout: a replica quiet for longer (a long evaluation) has its
#: stream opened again at the next poll, as has one whose connection went silent for good.
STREAM_TIMEOUT_S = (10.0, 300.0)
#: Extra time, past the pods' termination grace period, for an old job's deletion to finish before
#: it is re-created (the operator, the garbage collector and the kubelet each take their turn).
DELETION_SLACK_S = 300
#: A job the operator ended at its activeDeadlineSeconds this close to the run's own deadline ran
#: out of the run's time (`job.timeout_seconds`), not of a shorter `kubernetes.active_deadline_seconds`.
DEADLINE_SLACK_S = 60
__all__ = ["JOB_NAME_LABEL", "REPLICA_INDEX_LABEL", "REPLICA_TYPE_LABEL", "KubernetesBackend"]


def current_namespace() -> str:
    """The namespace this pod runs in (its service-account mount), else `default`."""
    try:
        return SA_NAMESPACE_FILE.read_text().strip() or "default"
    except OSError:
        return "default"


def launcher_owner() -> dict[str, Any] | None:
    """The ownerReference to this launcher pod, when the pipeline exposed its name and uid."""
    name, uid = os.environ.get(POD_NAME_ENV), os.environ.get(POD_UID_ENV)
    return owner_reference(name, uid) if name and uid else None


def _condition(job: dict[str, Any], kind: str, status: str = "True") -> dict[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == status:
            return cond
    return None


def is_suspended(job: dict[str, Any], kind: JobKind = PYTORCHJOB_KIND) -> bool:
    """Held by a queue: the job's suspend field (`runPolicy.suspend` / `spec.suspend`: Kueue sets
    it until it admits the job) or the `Suspended` condition (either may lag the other by a reconcile)."""
    return kind.suspend_requested(job) or _condition(job, kind.suspended) is not None


def queue_of(job: dict[str, Any], kind: JobKind = PYTORCHJOB_KIND) -> str:
    """The queue a job waits in, as its user named it: Kueue's LocalQueue label, else the
    gang scheduler's `runPolicy.schedulingPolicy.queue` (PyTorchJob only)."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    if labels.get(KUEUE_QUEUE_LABEL):
        return f"queue {labels[KUEUE_QUEUE_LABEL]} ({KUEUE_QUEUE_LABEL})"
    queue = kind.gang_queue(job)
    if queue:
        return f"queue {queue} (runPolicy.schedulingPolicy.queue)"
    return "a queue (none named on the job)"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class _Admission:
    """Whether the job waits in a queue, since when, and when it was admitted.

    The Pending clock starts at admission: time in a queue is the queue doing its job, not a
    pod that cannot start. Admission is when the operator marked the job resumed (`Suspended`
    False), else when this launcher first saw it out of the queue; a job never queued was
    admitted when it was created.
    """

    def __init__(self, kind: JobKind) -> None:
        self.kind = kind
        self.queued_since: dt.datetime | None = None
        self.admitted_at: dt.datetime | None = None
        self.from_queue = False  # False: admitted_at is the job's creation (it was never queued)
        self.seen_pods = False
        self.pods_last_seen: dt.datetime | None = None  # a poll that listed pods, the latest
        #: The pods of the latest poll, by name: the operator may delete a failed replica's pod
        #: (cleanPodPolicy Running) as it marks the job Failed, before the launcher reads it.
        #: Only the latest: a pod replaced earlier (a JobSet restart, an elastic scale-down) is
        #: not this failure's.
        self.pods: dict[str, Any] = {}
        self.said_elastic = False  # an elastic job's Pending replicas were reported

    def queued(self, job: dict[str, Any], pods: list[Any]) -> str | None:
        """Why the job is queued, or None when it is admitted."""
        self.seen_pods = self.seen_pods or bool(pods)
        if is_suspended(job, self.kind):
            return "suspended until the queue admits it"
        # Gang schedulers (Volcano) make the operator delay pod creation until the job's
        # PodGroup is admitted: no pods yet and a schedulingPolicy means queued, not stuck.
        if self.kind.gang_scheduled(job) and not self.seen_pods:
            return "no pods until the gang scheduler admits its PodGroup"
        # A gang scheduler that holds the pods themselves (a TrainJob runtime's podGroupPolicy:
        # Volcano, scheduler-plugins' coscheduling) until their whole group can be placed.
        held = [said for pod in pods if (said := _gang_wait(pod))]
        if held and all(pod.status.phase == "Pending" for pod in pods):
            # Its words said: a group that can never fit (more GPUs than the cluster has) reads the same.
            return f"its pods wait until the gang scheduler can place their whole group ({held[0]})"
        return None

    def enter_queue(self, job: dict[str, Any], now: dt.datetime) -> bool:
        """Record that the job is queued; True the first time (so it is reported once)."""
        if self.queued_since is not None:
            return False
        cond = _condition(job, self.kind.suspended)
        self.queued_since = _parse_time(cond["lastTransitionTime"]) if cond and cond.get("lastTransitionTime") else now
        self.admitted_at = None
        return True

    def admit(self, job: dict[str, Any], now: dt.datetime) -> dt.timedelta | None:
        """Record that the job is out of the queue; how long it was queued when it just left a
        queue this launcher saw, else None."""
        if self.admitted_at is not None:
            return None
        resumed = _condition(job, self.kind.suspended, status="False")
        was_queued = self.queued_since is not None
        self.from_queue = was_queued or resumed is not None
        if resumed and resumed.get("lastTransitionTime"):
            self.admitted_at = _parse_time(resumed["lastTransitionTime"])
        elif was_queued:
            self.admitted_at = now
        else:
            self.admitted_at = _created(job) or now
        queued_for = self.admitted_at - self.queued_since if was_queued else None
        self.queued_since = None
        return queued_for

    def pods_started(self, now: dt.datetime) -> dt.datetime:
        """Since when the job has had no pods to show: the last poll that listed some, if after
        admission, else admission (which a re-admitted job's pods wait for)."""
        admitted = self.admitted_at or now
        return self.pods_last_seen if self.pods_last_seen and self.pods_last_seen > admitted else admitted

    def pending_since(self, pod: Any) -> dt.datetime:
        """When a Pending pod's clock started: its creation, but never before admission."""
        created = pod.metadata.creation_timestamp
        return max(created, self.admitted_at) if self.from_queue and self.admitted_at else created


#: What gang schedulers write on a pod they hold for its group (Volcano: "... gang
#: unschedulable: pod group is not ready, 1 Pending, 2 minAvailable"; coscheduling: "... cannot
#: find enough sibling pods, ... minMember ...").
_GANG_WAIT = re.compile(r"pod ?group is not ready|gang unschedulable|sibling pods|minMember|minAvailable", re.I)


def _gang_wait(pod: Any) -> str:
    """The scheduler's message where it left `pod` unscheduled for its pod group
    (:data:`_GANG_WAIT`), else ""."""
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and _GANG_WAIT.search(c.message or ""):
            return str(c.message)
    return ""


def _created(obj: dict[str, Any]) -> dt.datetime | None:
    """When the API server created `obj` (API JSON), if it says."""
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    return _parse_time(created) if created else None


def _event_time(event: Any) -> dt.datetime | None:
    """When an event was last seen: `lastTimestamp` (core events), else `eventTime` (events.k8s.io
    writers), else its creation."""
    meta = getattr(event, "metadata", None)
    return event.last_timestamp or event.event_time or (meta.creation_timestamp if meta else None)


#: When the run's time (`job.timeout_seconds`) is up, RFC 3339, on the job: a retried launcher
#: that re-attaches to the job, and every re-creation of it, keep the first attempt's deadline.
DEADLINE_ANNOTATION = "kftrain.io/deadline"
#: The job's re-creations so far by cause, JSON (`{"preempted": 2}`), on the job: a retried
#: launcher that re-attaches to it spends the same `kubernetes.max_restarts_by_cause` budget.
RESTARTS_ANNOTATION = "kftrain.io/restarts"


def _annotation(obj: dict[str, Any] | None, key: str) -> str:
    return (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(key) or ""


def _deadline_of(obj: dict[str, Any] | None) -> dt.datetime | None:
    """The deadline a job carries (:data:`DEADLINE_ANNOTATION`), if it does and it parses."""
    text = _annotation(obj, DEADLINE_ANNOTATION)
    try:
        return _parse_time(text) if text else None
    except ValueError:
        return None


def _restarts_of(obj: dict[str, Any] | None) -> dict[str, int]:
    """The re-creations a job carries (:data:`RESTARTS_ANNOTATION`); what does not parse counts
    as none (an annotation someone edited must not stop the run)."""
    try:
        found = json.loads(_annotation(obj, RESTARTS_ANNOTATION) or "{}")
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    # `true` is no count (bool is an int to Python).
    return {c: n for c, n in found.items() if c in failures.CAUSES and type(n) is int and n >= 0}


class _Job:
    """One job as the backend drives it: its spec, its kind (`auto` already resolved), where it
    lives, its owner, its deadline, and the API calls on its resource."""

    def __init__(self, backend: KubernetesBackend, spec: JobSpec, kind: JobKind) -> None:
        self.spec, self.kind, self.name = spec, kind, spec.name
        self.namespace = spec.kubernetes.namespace or backend._home
        # The launcher pod owns the job only in the pod's own namespace: Kubernetes treats a
        # cross-namespace owner as absent and would garbage-collect the job at once.
        self.owner = backend._owner if self.namespace == backend._home else None
        self.deadline: dt.datetime | None = None  # set by submit: now + timeout, or the job's own
        self.restarts: dict[str, int] = {}  # re-creations per cause: this launcher's, or the job's own
        #: The API server's clock minus this launcher's, as the job's creationTimestamp showed it
        #: (zero within the stamp's one-second grain, and for a job another launcher created).
        self.clock_offset = dt.timedelta(0)
        #: The API server refused to create it (a final answer: RBAC, a webhook): there is no job
        #: of this attempt to delete, and a cancel must not say one may still run.
        self.refused = False
        self._backend = backend

    @property
    def what(self) -> str:
        """`PyTorchJob <name>` / `TrainJob <name>`, for log lines and errors."""
        return f"{self.kind.crd_kind} {self.name}"

    @property
    def ref(self) -> str:
        """`<namespace>/<name>`."""
        return f"{self.namespace}/{self.name}"

    def api(self, what: str, fn: Callable[..., Any], *args: Any, text: bool = False, **kwargs: Any) -> Any:
        """One API call for this job, through the backend's retry policy and answer check
        (`text`: the answer is text, a log, not an object)."""
        return self._backend._api(self.spec, what, fn, *args, text=text, **kwargs)

    def custom(self, verb: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One custom-objects API call on the job's resource: `method(group, version, namespace,
        plural, *args)`, e.g. `custom("get", api.get_namespaced_custom_object, name)`."""
        k = self.kind
        return self.api(
            f"{verb} {k.crd_kind} {self.ref}", method, k.group, k.version, self.namespace, k.plural, *args, **kwargs
        )

    def manifest(self, now: dt.datetime) -> dict[str, Any]:
        """The validated job (preflight raises before anything is sent), carrying its deadline
        and its re-creations so far, with the server-side deadline (`activeDeadlineSeconds`) no
        later: a re-created job gets the time left, not the whole timeout again."""
        require_object_store(self.spec.artifact_uris)
        spec = self.spec
        if self.deadline is not None:  # the builders set activeDeadlineSeconds from these two fields
            left = max(1, math.ceil((self.deadline - now).total_seconds()))
            kc = spec.kubernetes
            spec = replace(
                spec,
                timeout_s=min(spec.timeout_s, left),
                kubernetes=replace(kc, active_deadline_seconds=min(kc.active_deadline_seconds or left, left)),
            )
        manifest = self.kind.build(spec, self.namespace, self.owner)
        run_state = {}
        if self.deadline is not None:
            run_state[DEADLINE_ANNOTATION] = stamp(int(self.deadline.timestamp()))
        if self.restarts:
            run_state[RESTARTS_ANNOTATION] = json.dumps(self.restarts, sort_keys=True)
        if run_state:
            meta = manifest["metadata"]
            meta["annotations"] = {**(meta.get("annotations") or {}), **run_state}
        self.kind.validate(manifest)
        return manifest


def _replica_order(replica: str) -> list[Any]:
    """Sort key of a replica name in replica order: `worker-2` before `worker-10`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", replica)]


class KubernetesBackend:
    """PyTorchJobs or TrainJobs (`spec.kind`) through the Kubernetes API.

    `custom_api` / `core_api` are a `kubernetes.client.CustomObjectsApi` and `CoreV1Api` (the
    in-cluster or kubeconfig client by default); tests pass a fake object with the same methods.
    Every call goes through one retry policy (:class:`ApiRetry`) on the injected `now`/`sleep`.
    """

    def __init__(
        self,
        custom_api: Any = None,
        core_api: Any = None,
        namespace: str | None = None,
        owner: dict[str, Any] | None = None,
        log: Callable[[str], None] | None = None,
        now: Callable[[], dt.datetime] = _now,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if custom_api is None or core_api is None:
            from kubernetes import client

            load_cluster_config()
            configuration = client.Configuration.get_default_copy()
            # ApiRetry owns retries: urllib3's own three more made each timed-out call wait 4x.
            configuration.retries = 0
            api_client = client.ApiClient(configuration)
            custom_api, core_api = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
        self.custom, self.core = custom_api, core_api
        self._home = namespace or current_namespace()  # the launcher pod's own namespace
        self._owner = owner if owner is not None else launcher_owner()
        self._log = log or print_line
        self._now, self._sleep, self._rng = now, sleep, rng
        self._deadline: dt.datetime | None = None  # while waiting: retries stop here too
        self._streams = LogStreams(self._log)
        self._jobs: dict[str, _Job] = {}  # by job name; `auto` resolved once
        self._progress: dict[str, Snapshot] = {}  # by job name: the last progress printed

    def _job(self, spec: JobSpec) -> _Job:
        """The handle of `spec`'s job; `auto` asks the cluster once (API discovery, retried)."""
        job = self._jobs.get(spec.name)
        if job is None:
            try:
                kind = choose_kind(spec.kind, lambda k: self._served(spec, k))
            except NoJobKindServed as exc:
                raise JobFailed(str(exc)) from None
            job = self._jobs[spec.name] = _Job(self, spec, kind)
        elif job.spec is not spec:  # the same job, described again: its kind and run state stay
            before, job = job, _Job(self, spec, job.kind)
            job.deadline, job.restarts, job.clock_offset = before.deadline, before.restarts, before.clock_offset
            self._jobs[spec.name] = job
        return job

    def _served(self, spec: JobSpec, kind: JobKind) -> bool:
        """Whether the cluster serves `kind`'s resource: discovery of its group/version (404: the
        group/version is not installed; served without the resource: another CRD of the group)."""
        try:
            found = self._api(
                spec,
                f"discover {kind.group}/{kind.version}",
                self.custom.get_api_resources,
                kind.group,
                kind.version,
            )
        except Exception as exc:
            status = http_status(exc)
            if status == 404:
                return False
            if status is not None:
                raise JobFailed(f"API discovery of {kind.group}/{kind.version} failed: {describe(exc)}") from None
            raise
        return any(r.name == kind.plural for r in (getattr(found, "resources", None) or []))

    # -- the JobBackend interface ---------------------------------------------------------

    def submit(self, spec: JobSpec) -> None:
        """Create the job; re-attach to it if it exists (replace it if it already Failed, wait for
        it to go if it is being deleted)."""
        job = self._job(spec)
        job.refused = False
        now = self._now()
        job.deadline = now + dt.timedelta(seconds=spec.timeout_s)
        manifest = job.manifest(now)
        try:
            existing = self._create(job, manifest)
            if existing is None:
                self._log(f"kftrain: created {job.kind.crd_kind} {job.ref}")
                if job.owner is None:
                    self._log(f"kftrain: warning: {job.kind.crd_kind} {job.ref} {self._no_owner(job)}")
                return
            if _condition(existing, job.kind.failed) or _deleting(existing):
                # A retried step asks for a new attempt, not for the old failure again; a job
                # being deleted (a cancelled attempt's) is gone once its pods are.
                state = "Failed" if _condition(existing, job.kind.failed) else "is being deleted"
                self._log(f"kftrain: {job.kind.crd_kind} {job.ref} exists and {state}; replacing it")
                self._delete(spec)
                self._wait_deleted(job)
                self._create(job, job.manifest(self._now()), ours=True)
                self._log(f"kftrain: created {job.kind.crd_kind} {job.ref}")
                return
            # Re-attached (a retried launcher): the run's time and re-creations count from its first attempt.
            job.deadline = _deadline_of(existing) or job.deadline
            job.restarts = _restarts_of(existing)
            self._log(f"kftrain: {job.kind.crd_kind} {job.ref} already exists; re-attaching to it")
            self._adopt(job, existing)
        except JobFailed:
            raise
        except Exception as exc:
            if http_status(exc) is None:
                raise
            raise self._refusal(job, exc) from None

    def _refusal(self, job: _Job, exc: BaseException, during: str = "") -> JobFailed:
        """One line for a final API answer (401, 403, 404, 422, ...): the call it refused, the
        answer, the API server's own reason (a webhook's denial), and what to check."""
        status, detail = http_status(exc), _status_message(exc)
        hint = ""
        if _quota_of_nothing(exc):
            hint = f" (a ResourceQuota of namespace {job.namespace} allows none of it: ask its admins for some)"
        elif _over_quota(exc):
            hint = (
                f" (a ResourceQuota of namespace {job.namespace} is used up; `kubectl -n {job.namespace} describe "
                "quota` shows it: wait for other jobs to end, or ask for more)"
            )
        elif status == 403 and "admission webhook" not in detail:  # a webhook's denial says why itself
            hint = (
                f" (the run's service account lacks RBAC for that call in namespace {job.namespace}: "
                "`kubectl apply -k deploy/rbac/standalone` or `deploy/rbac/multi-user` grants what the launcher needs)"
            )
        elif status == 404 and "create" in refused_call(exc):
            hint = f" (is the {job.kind.crd} CRD installed?)"
        return JobFailed(f"the Kubernetes API refused {refused_call(exc)}{during}: {describe(exc)}{hint}{detail}")

    def _no_owner(self, job: _Job) -> str:
        """Why `job` has no owner and what that costs: cancelling the run deletes the job only
        through this launcher (SIGTERM), not through Kubernetes' garbage collector."""
        if job.namespace != self._home:
            why = (
                f"runs in namespace {job.namespace}, not in the launcher pod's {self._home}, so the pod cannot own it "
                "(Kubernetes ignores an owner in another namespace)"
            )
        else:
            why = (
                f"has no owner: {POD_NAME_ENV} and {POD_UID_ENV} are not set in the launcher pod (a pipeline of "
                "your own: apply components.task_options.launcher_task_options to the training task)"
            )
        return (
            f"{why}; if the launcher pod dies before it deletes the job (its node lost, a SIGKILL), the job and its "
            f"GPUs run on until its activeDeadlineSeconds of "
            f"{job.spec.kubernetes.active_deadline_seconds or job.spec.timeout_s:.0f}s "
            f"(kubernetes.active_deadline_seconds, else {job.spec.timeout_field})"
        )

    def wait(self, spec: JobSpec) -> None:
        """Poll until Succeeded; raise on Failed, a pod Pending too long after admission, too
        long in a queue (when limited), the deadline (`spec.timeout_s`), or an API that stays
        unavailable."""
        job = self._job(spec)
        self._deadline = job.deadline or self._now() + dt.timedelta(seconds=spec.timeout_s)
        try:
            self._wait(job)
        except ApiUnavailable as exc:
            if exc.at_deadline:
                raise JobTimeout(f"{self._timeout_message(job)}; at the time, {exc}") from exc
            raise
        except JobFailed:
            raise
        except Exception as exc:
            if http_status(exc) is None:
                raise
            # A final answer (401, 403, ...): one line for the step log, not the client's dump.
            raise self._refusal(job, exc, f" while the launcher waited for {job.what}") from exc
        finally:
            self._deadline = None

    def logs(self, spec: JobSpec, tail: int = 50) -> dict[str, list[str]]:
        """The last `tail` lines of each replica's current container."""
        job = self._job(spec)
        return {job.kind.replica_key(pod): self._read_log(job, pod, tail) for pod in self._pods(job)}

    def cancel(self, spec: JobSpec) -> None:
        """Delete the job (Foreground: its pods go first); a job already gone is fine. Retried
        within a pod's termination grace (:data:`CANCEL_RETRY_BUDGET_S`): a launcher told to stop
        is killed then, and a delete still being retried would leave the job and its GPUs running
        unsaid (was: the whole API retry budget, 300 s)."""
        self._delete(spec, min(spec.kubernetes.api_retry_budget_seconds, CANCEL_RETRY_BUDGET_S))

    def _delete(self, spec: JobSpec, budget_s: float | None = None) -> None:
        """Delete the job, its API calls retried for `budget_s` (None: the API retry budget, as
        for a re-creation, which no signal hurries)."""
        if spec.kind == AUTO and spec.name not in self._jobs:
            return  # discovery never answered, so nothing was created
        job = self._job(spec)
        if job.refused:
            return  # its create was refused: nothing of this attempt exists
        try:
            job.custom(
                "delete",
                self.custom.delete_namespaced_custom_object,
                job.name,
                propagation_policy="Foreground",
                budget_s=budget_s,
            )
            self._log(f"kftrain: deleted {job.what}")
        except Exception as exc:
            status = http_status(exc)
            if status is None:
                raise
            if status != 404:
                raise self._refusal(job, exc) from None

    # -- waiting --------------------------------------------------------------------------

    def _wait(self, job: _Job) -> None:
        k8s = job.spec.kubernetes
        pending_limit = dt.timedelta(seconds=k8s.pending_timeout_seconds)
        queue_limit = k8s.queue_timeout_seconds
        kind = job.kind
        admission = _Admission(kind)
        while True:
            obj = self._get(job)
            if obj is None:
                raise JobFailed(f"{job.what} was deleted while the launcher waited for it")
            self._show_progress(job, obj)
            if _condition(obj, kind.succeeded):
                self._streams.finish()
                self._log(f"kftrain: {job.what} succeeded")
                return
            failed = _condition(obj, kind.failed)
            if failed:
                self._streams.finish()
                evidence = self._evidence(job, since=admission.admitted_at or _created(obj), seen=admission.pods)
                note = self._restart_or_why_not(job, evidence[0], failed)
                if note is None:
                    admission = _Admission(kind)
                    continue
                raise JobFailed(self._failure_message(job, failed, evidence, note))
            pods = self._pods(job)
            # The API server's clock, which stamped every time compared with it below.
            now = self._now() + job.clock_offset
            why_queued = admission.queued(obj, pods)
            if why_queued:
                admitted_at = admission.admitted_at  # entering the queue forgets it
                requeued = admitted_at is not None and admission.seen_pods and is_suspended(obj, kind)
                if admission.enter_queue(obj, now):
                    if requeued:  # Kueue evicted it: it re-admits the job itself, the pods resume
                        # The events since its last admission: an earlier eviction's are not this one's.
                        why = failures.classify([], self._event_list(job, job.name, admitted_at))
                        self._log(
                            f"kftrain: {job.what} went back to the queue ({why}); when it is admitted again, "
                            f"{_what_resumes(job.spec)}"
                        )
                    self._log(
                        f"kftrain: {job.what} is queued in {queue_of(obj, kind)}: {why_queued}; "
                        "the Pending clock starts when it is admitted"
                    )
                waited = now - admission.queued_since
                if queue_limit and waited.total_seconds() > queue_limit:
                    raise JobFailed(
                        f"{job.what} waited {int(waited.total_seconds())}s in {queue_of(obj, kind)} ({why_queued}) "
                        f"without being admitted (kubernetes.queue_timeout_seconds={queue_limit}). "
                        f"Events: {self._events(job, job.name)}"
                    )
            elif (queued_for := admission.admit(obj, now)) is not None:
                self._log(
                    f"kftrain: {job.what} admitted from {queue_of(obj, kind)} after "
                    f"{max(0, int(queued_for.total_seconds()))}s"
                )
            elastic = k8s.elastic
            running = sum(1 for pod in pods if pod.status.phase == "Running")
            # An elastic job trains on min_replicas or more: the replicas the cluster cannot place
            # yet are what it scales up to, not a stuck job.
            short_handed = elastic.enabled and running >= elastic.min_replicas
            recreated = False
            for pod in pods:
                phase = pod.status.phase
                if phase == "Pending" and not why_queued and short_handed:
                    if not admission.said_elastic:
                        admission.said_elastic = True
                        self._log(
                            f"kftrain: {job.what} trains on {running} replica(s); those Pending join when the "
                            f"cluster places them (kubernetes.elastic.min_replicas={elastic.min_replicas})"
                        )
                elif phase == "Pending" and not why_queued:
                    waited = now - admission.pending_since(pod)
                    if waited > pending_limit:
                        recreated = self._recreate_pending(job, pod, waited)
                        break
                elif phase in ("Running", "Succeeded", "Failed"):
                    self._stream(job, pod)
            if recreated:
                admission = _Admission(kind)
                continue
            # Pods seen since admission and gone now are being recreated (an evicted pod, a JobSet
            # restart): their clock starts when they went, not at the job's creation.
            admission.pods = {pod.metadata.name: pod for pod in pods}  # as they were when last seen alive
            if pods:
                admission.pods_last_seen = now
            elif not why_queued and now - (started := admission.pods_started(now)) > pending_limit:
                if started == admission.pods_last_seen:
                    since = "its pods were deleted"
                else:
                    since = "it was admitted" if admission.from_queue else "it was created"
                waited = now - started
                raise JobFailed(
                    f"{job.what} has no pods {int(waited.total_seconds())}s after {since} "
                    f"(kubernetes.pending_timeout_seconds={k8s.pending_timeout_seconds}): the operator did not "
                    f"create them (a ResourceQuota, a webhook, or a gang scheduler the job does not name). "
                    f"Events: {self._events(job, job.name)}"
                )
            if self._now() > self._deadline:
                queued = ""
                if why_queued:  # the whole time, or since a re-queue: the cluster's capacity, not the run
                    queued = (
                        f"; it was still queued in {queue_of(obj, kind)} ({why_queued}), not admitted since "
                        f"{admission.queued_since}"
                    )
                raise JobTimeout(self._timeout_message(job) + queued)
            self._sleep(k8s.poll_seconds)

    def _show_progress(self, job: _Job, obj: dict[str, Any]) -> None:
        """Print the job's reported progress when it changed since the last poll."""
        snapshot = progress_of(obj)
        if snapshot is not None and snapshot != self._progress.get(job.name):
            self._progress[job.name] = snapshot
            self._log(progress_message(job.what, snapshot))

    # -- failures by cause ----------------------------------------------------------------

    def _evidence(
        self, job: _Job, since: dt.datetime | None = None, seen: dict[str, Any] | None = None
    ) -> tuple[failures.Diagnosis, list[Any], dict[str, list[str]]]:
        """The cause of the job's failure, its pods, and the last log lines of each pod that ended
        with a non-zero exit code (by pod name). Events not after `since` (this attempt's
        admission) are an earlier attempt's: the job and its pods keep their names when re-created
        or re-admitted, and events outlive them by an hour. A pod in `seen` (this attempt's pods
        as last listed) that is gone now counts as it was last seen, with the log lines streamed
        from it: the operator deletes a crash-looping replica's pod as it marks the job Failed."""
        try:
            listed = self._pods(job)
        except Exception as exc:  # the pods are evidence, not the answer
            return failures.Diagnosis(failures.UNKNOWN, f"replica pods unavailable: {describe(exc)}"), [], {}
        listed = _latest_restart(listed)
        names = {pod.metadata.name for pod in listed}
        gone = [pod for name, pod in (seen or {}).items() if name not in names]
        pods = sorted(_latest_restart([*listed, *gone]), key=lambda pod: _replica_order(job.kind.replica_key(pod)))
        pod_dicts = [_as_dict(pod) for pod in pods]
        logs = {
            pod.metadata.name: (
                self._read_log(job, pod, 400)
                if pod.metadata.name in names
                else self._streams.tail(pod) or ["(its pod was deleted before its log could be read)"]
            )
            for pod, as_dict in zip(pods, pod_dicts, strict=True)
            if pod.status.phase == "Failed" or failures.exit_code_of(as_dict) not in (None, 0)
        }
        events = self._event_list(job, job.name, since)
        for pod in pods:
            events += self._event_list(job, pod.metadata.name, since)
        return failures.classify(pod_dicts, events, logs), pods, logs

    def _restart_or_why_not(
        self, job: _Job, diagnosis: failures.Diagnosis, failed: dict[str, Any] | None = None
    ) -> str | None:
        """Re-create the failed job when its cause's budget allows (None), else say why not."""
        field = f"kubernetes.max_restarts_by_cause.{diagnosis.cause}"
        allowed = failures.restarts_allowed(job.spec.kubernetes.max_restarts_by_cause, diagnosis.cause)
        done = job.restarts.get(diagnosis.cause, 0)
        if failed is not None and _ended_by_deadline(failed):
            # The operator stopped it at activeDeadlineSeconds: the ranks' SIGTERM looks like a
            # preemption, but the limit is the job's own, and a re-created job would get it afresh.
            # That is the run's time (`job.timeout_seconds`, the time left of it on a re-created
            # job) unless kubernetes.active_deadline_seconds was set shorter.
            own = job.spec.kubernetes.active_deadline_seconds
            if not own or self._seconds_left() <= DEADLINE_SLACK_S:
                said = f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip(": ")
                raise JobTimeout(
                    f"{job.what} failed: {said}; the run's time is up "
                    f"({job.spec.timeout_s:.0f}s, {job.spec.timeout_field})"
                )
            return (
                f"not re-created: its own activeDeadlineSeconds ({own}s, kubernetes.active_deadline_seconds) ended it"
            )
        if allowed == 0:
            return f"not re-created ({field} is 0)"
        if allowed != failures.UNLIMITED and done >= allowed:
            return f"not re-created: its {allowed} re-creation(s) for {diagnosis.cause} are spent ({field})"
        if self._deadline_passed():
            return (
                f"not re-created: the job's deadline has passed ({job.spec.timeout_s:.0f}s, {job.spec.timeout_field})"
            )
        job.restarts[diagnosis.cause] = done + 1
        if allowed == failures.UNLIMITED:
            left = f"unlimited ({field} is -1) until the deadline, {self._seconds_left():.0f}s from now"
        else:
            left = f"{allowed - done - 1} of {allowed} left ({field})"
        ended = "failed" if failed is not None else "cannot run"  # a replica stuck Pending: the job never failed
        self._log(
            f"kftrain: {job.what} {ended}: {diagnosis}; re-creating it (re-creation {done + 1} for "
            f"{diagnosis.cause}, {left}); {_what_resumes(job.spec)}"
        )
        self._delete(job.spec)
        self._wait_deleted(job)
        if self._deadline_passed():  # spent waiting for the deletion: no job is made to idle
            return (
                f"not re-created after all: the job's deadline ({job.spec.timeout_s:.0f}s, {job.spec.timeout_field}) "
                "passed while the failed job was being deleted"
            )
        self._create(job, job.manifest(self._now()), ours=True)
        return None

    def _deadline_passed(self) -> bool:
        return self._deadline is not None and self._now() > self._deadline

    def _seconds_left(self) -> float:
        return max(0.0, (self._deadline - self._now()).total_seconds()) if self._deadline else 0.0

    def _timeout_message(self, job: _Job) -> str:
        # Said before the delete: run_job deletes it next, and adds a note if that fails.
        return f"{job.what} did not finish within {job.spec.timeout_s:.0f}s ({job.spec.timeout_field}); deleting it"

    # -- API calls, all through the retry -------------------------------------------------

    def _api(
        self,
        spec: JobSpec,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        text: bool = False,
        budget_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Every API call of the backend: retried (:class:`ApiRetry`) for `budget_s`, else
        `kubernetes.api_retry_budget_seconds`, and its answer checked to be a Kubernetes object
        (:func:`api_call`; `text`: a log read, whose answer is text)."""
        if budget_s is None:
            budget_s, limit = spec.kubernetes.api_retry_budget_seconds, None
        else:  # a shorter budget than the setting: said as what it is
            limit = f"(a cancel's {budget_s:g}s, within a stopped pod's termination grace)"
        retry = ApiRetry(budget_s, now=self._now, sleep=self._sleep, log=self._log, rng=self._rng, limit=limit)
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
        return retry.call(what, api_call, what, fn, *args, text=text, stop_at=self._deadline, **kwargs)

    def _create(self, job: _Job, manifest: dict[str, Any], ours: bool = False) -> dict[str, Any] | None:
        """Create the job: None when created, else the job of that name that exists (409).
        `ours`: no other launcher can hold the name (we just deleted the old job), so a 409 means
        our own create took effect and its answer was lost: that job, if it is this attempt's, is
        as good as created."""
        quota_since: dt.datetime | None = None
        while True:
            try:
                before = self._now()
                created = job.custom("create", self.custom.create_namespaced_custom_object, manifest)
                job.clock_offset = _clock_offset(created, before, self._now())
                return None
            except Exception as exc:
                if _over_quota(exc) and not _quota_of_nothing(exc):
                    if quota_since is None:
                        quota_since = self._now()
                        self._log(
                            f"kftrain: {job.what} cannot be created yet{_status_message(exc)}; waiting for the "
                            "quota to free as other jobs end (at most kubernetes.queue_timeout_seconds, and the "
                            f"run's {job.spec.timeout_field})"
                        )
                    if self._may_wait_for_quota(job, quota_since):
                        self._wait_for_quota(job, quota_since, exc)
                        # The time left shrank while it waited: the job's deadline says so.
                        manifest = job.manifest(self._now()) if job.deadline is not None else manifest
                        continue
                if http_status(exc) != 409:
                    job.refused = http_status(exc) is not None
                    raise
                break
        existing = self._get(job)
        if existing is None:  # gone again in between: one more try decides
            job.custom("create", self.custom.create_namespaced_custom_object, manifest)
            return None
        if ours and not _deleting(existing) and not _condition(existing, job.kind.failed):
            return None
        return existing

    def _wait_for_quota(self, job: _Job, since: dt.datetime, exc: BaseException) -> None:
        """One poll's wait for a ResourceQuota to free, no later than the run's deadline; past it,
        the run's timeout (no job is created to idle for the second it would have left)."""
        poll = job.spec.kubernetes.poll_seconds
        if job.deadline is not None:
            left = (job.deadline - self._now()).total_seconds()
            if left <= poll:
                self._sleep(max(0.0, left))
                raise JobTimeout(
                    f"{job.what} could not be created within the run's time ({job.spec.timeout_s:.0f}s, "
                    f"{job.spec.timeout_field}): a ResourceQuota of namespace {job.namespace} refused it for "
                    f"{(self._now() - since).total_seconds():.0f}s{_status_message(exc)}"
                ) from None
        self._sleep(poll)

    def _may_wait_for_quota(self, job: _Job, since: dt.datetime) -> bool:
        """Whether a create a ResourceQuota refused may wait on: within `kubernetes.queue_timeout_seconds`
        (a quota is a queue by another name) since `since` (the run's deadline is the caller's)."""
        limit = job.spec.kubernetes.queue_timeout_seconds
        return not (limit and (self._now() - since).total_seconds() > limit)

    def _get(self, job: _Job) -> dict[str, Any] | None:
        try:
            return job.custom("get", self.custom.get_namespaced_custom_object, job.name)
        except Exception as exc:
            if http_status(exc) == 404:
                return None
            raise

    def _wait_deleted(self, job: _Job) -> None:
        """Wait until the deleted job is gone (Foreground: its pods first, each within its
        termination grace period), at most that period and :data:`DELETION_SLACK_S`."""
        grace = job.spec.kubernetes.termination_grace_seconds
        timeout_s = grace + DELETION_SLACK_S
        end = self._now() + dt.timedelta(seconds=timeout_s)
        while self._get(job) is not None:
            if self._deadline_passed():  # the run's time is up: the caller says so, not this wait
                return
            if self._now() > end:
                raise JobFailed(
                    f"old {job.what} was not deleted within {timeout_s:.0f}s (its pods' termination grace, "
                    f"kubernetes.termination_grace_seconds={grace}, and {DELETION_SLACK_S}s): a pod stuck "
                    f"Terminating (on a lost node) holds it; `kubectl -n {job.namespace} get pods -l "
                    f"{job.kind.pod_selector(job.name)}` shows it, `kubectl delete pod --force` frees it"
                )
            self._sleep(job.spec.kubernetes.poll_seconds)

    def _adopt(self, job: _Job, obj: dict[str, Any] | None) -> None:
        """Add this launcher pod to the job's owners, so cancelling the retried run deletes it."""
        if obj is None or job.owner is None:
            return
        owners = obj.get("metadata", {}).get("ownerReferences") or []
        if any(o.get("uid") == job.owner["uid"] for o in owners):
            return
        patch = {"metadata": {"ownerReferences": [*owners, job.owner]}}
        try:
            job.custom("patch", self.custom.patch_namespaced_custom_object, job.name, patch)
        except Exception as exc:
            # A role without `patch` must not cost the job it re-attached to, which may have
            # trained for hours (was: the refusal failed the step, whose cancel deleted the job):
            # it runs on as a job without this owner does, said.
            if http_status(exc) not in (401, 403):
                raise
            self._log(
                f"kftrain: warning: {job.what} was not made this launcher pod's ({describe(exc)}: the launcher's "
                f"role lacks `patch` on {job.kind.plural}); it is followed all the same; if the launcher pod dies "
                "before it deletes the job, the job runs on until its activeDeadlineSeconds"
            )

    def _pods(self, job: _Job) -> list[Any]:
        pods = job.api(
            f"list pods of job {job.ref}",
            self.core.list_namespaced_pod,
            job.namespace,
            label_selector=job.kind.pod_selector(job.name),
        )
        return sorted(pods.items, key=lambda pod: _replica_order(job.kind.replica_key(pod)))

    def _events(self, job: _Job, obj_name: str) -> str:
        """Events of an object, for an error message: never the reason the message is lost."""
        try:
            events = self._list_events(job, obj_name)
        except Exception as exc:
            return f"unavailable ({describe(exc)})"
        return "; ".join(f"{e.reason}: {e.message}" for e in events) or "none"

    def _list_events(self, job: _Job, obj_name: str) -> list[Any]:
        return job.api(
            f"list events of {job.namespace}/{obj_name}",
            self.core.list_namespaced_event,
            job.namespace,
            field_selector=f"involvedObject.name={obj_name}",
        ).items

    def _event_list(self, job: _Job, obj_name: str, since: dt.datetime | None = None) -> list[failures.Event]:
        """An object's events as evidence of a cause, those last seen at or before `since` left
        out; none when they cannot be listed."""
        try:
            events = self._list_events(job, obj_name)
        except Exception:  # evidence, not the answer: the cause is then read from the rest
            return []
        return [
            failures.Event(obj_name, e.reason or "", e.message or "")
            for e in events
            if since is None or (when := _event_time(e)) is None or when > since  # whole seconds: at `since` is before
        ]

    def _pod_log(self, job: _Job, pod: Any, read: Callable[..., Any] | None = None, **options: Any) -> Any:
        """The log of one pod's training container (`options`: tail_lines, follow, ...), through
        `read` (the client's method, or a wrapper of it that reads the answer within the retry)."""
        return job.api(
            f"read log of pod {job.namespace}/{pod.metadata.name}",
            read or self.core.read_namespaced_pod_log,
            pod.metadata.name,
            job.namespace,
            container=_container(job, pod),
            text=True,
            **options,
        )

    def _read_log(self, job: _Job, pod: Any, tail: int) -> list[str]:
        def read_text(*args: Any, **kwargs: Any) -> str:
            # The raw bytes, read within the retry: the client decodes strictly (one byte of another
            # encoding lost the whole tail) and parses a tail that happens to be JSON (`null`: None).
            return _log_text(self.core.read_namespaced_pod_log(*args, _preload_content=False, **kwargs))

        try:
            return self._pod_log(job, pod, read_text, tail_lines=tail).splitlines()
        except Exception as exc:
            return [f"(log unavailable: {describe(exc)})"]

    def _stream(self, job: _Job, pod: Any) -> None:
        """Follow the replica's log into the step's log (once per container instance, again when
        its stream ended while it runs)."""

        def open_stream(since_seconds: int | None) -> Any:
            since = {} if since_seconds is None else {"since_seconds": since_seconds}
            return self._pod_log(
                job,
                pod,
                follow=True,
                timestamps=True,
                _preload_content=False,
                _request_timeout=STREAM_TIMEOUT_S,
                **since,
            )

        self._streams.follow(pod, job.kind.replica_key(pod), _container(job, pod), open_stream)

    # -- error messages -------------------------------------------------------------------

    def _failure_message(
        self,
        job: _Job,
        cond: dict[str, Any],
        evidence: tuple[failures.Diagnosis, list[Any], dict[str, list[str]]],
        note: str,
    ) -> str:
        """The step's error: the Failed condition, the cause and why the job was not re-created
        (one line), then the failing replica's last log lines."""
        diagnosis, pods, logs = evidence
        first = f"{job.what} failed: {cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip()
        lines = [f"{first}; cause: {diagnosis}; {note}"]
        failed = [pod for pod in pods if pod.metadata.name in logs]
        # The replica the cause names (`pod NAME: ...`, `pod NAME container C: ...`, `event on
        # NAME: ...`), else the first to fail in replica order: a worker's own error beside the
        # master the operator then stopped.
        named = [
            pod
            for pod in pods
            if re.search(rf"\b(pod|event on) {re.escape(pod.metadata.name)}( container \S+)?:", diagnosis.evidence)
        ]
        for pod in (named or failed)[:1]:
            key, excerpt = job.kind.replica_key(pod), failure_excerpt(logs.get(pod.metadata.name, []))
            code = failures.exit_code_of(_as_dict(pod))
            ended = f"exited with code {code}" if code is not None else "has no exit code (its pod is gone or stopped)"
            lines.append(
                f"replica {key} (pod {pod.metadata.name}) {ended}; "
                + ("last log lines:" if excerpt else "no log lines")
            )
            lines += [f"  [{key}] {line}" for line in excerpt]
        return "\n".join(lines)

    def _recreate_pending(self, job: _Job, pod: Any, waited: dt.timedelta) -> bool:
        """A replica Pending past the limit: True when its cause has a re-creation left (an image
        pull, `kubernetes.max_restarts_by_cause.image_pull`: the operator never marks such a job
        Failed, so the budget is spent here) and the job was re-created, else JobFailed naming it."""
        message = self._pending_message(job, pod, waited)
        diagnosis = failures.classify([_as_dict(pod)])
        if diagnosis.cause != failures.IMAGE_PULL:
            raise JobFailed(message)
        note = self._restart_or_why_not(job, diagnosis)
        if note is not None:
            raise JobFailed(f"{message}; {note}")
        return True

    def _pending_message(self, job: _Job, pod: Any, waited: dt.timedelta) -> str:
        reasons = []  # an init container's too: the pod waits on it (Init:ImagePullBackOff)
        for cs in [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]:
            waiting = cs.state.waiting if cs.state else None
            if waiting:
                reasons.append(f"{waiting.reason}: {waiting.message or ''}".rstrip(": "))
        detail = f" ({'; '.join(reasons)})" if reasons else ""
        return (
            f"replica {job.kind.replica_key(pod)} (pod {pod.metadata.name}) of {job.what} has been Pending "
            f"for {int(waited.total_seconds())}s (kubernetes.pending_timeout_seconds="
            f"{job.spec.kubernetes.pending_timeout_seconds}){detail}. Events: {self._events(job, pod.metadata.name)}"
        )


def progress_message(what: str, snapshot: Snapshot) -> str:
    """The launcher's step-log line for a job's reported progress (rank 0's own line, prefixed)."""
    return f"kftrain: {what} progress: {snapshot.line()}"


class NotKubernetesAnswer(JobFailed):
    """The API server answered a call with something that is not a Kubernetes object: an auth
    proxy's login page, an empty body, another service at the kubeconfig's address."""


def api_call(what: str, fn: Callable[..., Any], *args: Any, text: bool = False, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, a `kubernetes.client` API method, with its answer checked: an object
    call (custom objects, lists, discovery) must get a Kubernetes object, else
    :class:`NotKubernetesAnswer` names the server and what it sent instead; `text` (a log read)
    takes any text. `what` names the call (`get PyTorchJob team/kftrain-...`).

    Why here: on a 200 answer that is not JSON the client returns the body as a `str` for a
    custom-object call, and fails building a model (`V1PodList`) with a bare ValueError; both
    would reach the caller as an AttributeError or a message about a field it never set."""
    try:
        answer = fn(*args, **kwargs)
    except ValueError as exc:
        # The models' own validation of a deserialized answer raises a plain ValueError; the
        # client's checks of our arguments raise ApiValueError (a subclass): a bug, kept as is.
        if type(exc) is not ValueError:
            raise
        raise NotKubernetesAnswer(_not_kubernetes(what, fn, _last_body(fn))) from None
    if text and isinstance(answer, str):
        return answer
    if isinstance(answer, (str, bytes)) or (isinstance(answer, (dict, list)) and not _is_object(answer)):
        raise NotKubernetesAnswer(_not_kubernetes(what, fn, answer))
    return answer  # a client model, built from a JSON object with its required fields, or a log stream


def _is_object(answer: Any) -> bool:
    """A Kubernetes object as JSON (the job, a Status): a mapping with a `kind`."""
    return isinstance(answer, dict) and bool(answer.get("kind"))


def _api_client(fn: Callable[..., Any]) -> Any:
    """The API client behind the bound `kubernetes.client` method `fn` (None when `fn` is not one:
    a test's stand-in)."""
    return getattr(getattr(fn, "__self__", None), "api_client", None)


def _last_body(fn: Callable[..., Any]) -> Any:
    """The body of the answer the API client behind `fn` received last (None without one)."""
    return getattr(getattr(_api_client(fn), "last_response", None), "data", None)


def _not_kubernetes(what: str, fn: Callable[..., Any], body: Any) -> str:
    """The one line for an answer that is not a Kubernetes object: the server, the call, what the
    answer looks like (never its content: a login page may echo a user name or a token)."""
    host = getattr(getattr(_api_client(fn), "configuration", None), "host", None)
    server = f"the API server at {redact(host)}" if isinstance(host, str) and host else "the API server"
    return (
        f"{server} answered {what!r} with something that is not a Kubernetes object ({_looks_like(body)}); "
        "check the kubeconfig's server and credentials"
    )


def _looks_like(body: Any) -> str:
    """What an answer that is not a Kubernetes object is, in a few words."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str):
        stripped = body.strip()
        if not stripped:
            return "an empty body"
        if stripped.startswith("<"):
            return "an HTML page: a login or proxy page?"
        try:
            body = json.loads(stripped)
        except ValueError:
            return "text that is not JSON"
    if isinstance(body, dict):
        return "a JSON object without a kind" if body else "an empty JSON object"
    if isinstance(body, list):
        return "a JSON array"
    if body is None:
        return "no body the client could read as the object"
    return f"a JSON {type(body).__name__}"


class JobStatusError(KftrainError, LookupError):
    """`kftrain job status`: the job is not there, or the API refused to show it."""


def _missing(files: str | None) -> bool:
    """Whether none of the kubeconfig files (KUBECONFIG's list, else the default one) exists."""
    paths = files.split(os.pathsep) if files else [os.path.expanduser("~/.kube/config")]
    return not any(os.path.exists(p) for p in paths if p)


#: What to check where `job status` reached no Kubernetes API.
_CHECK_CONTEXT = "check the kubeconfig's current context (KUBECONFIG, `kubectl config current-context`)"


def _api_host(custom_api: Any) -> str:
    """` at <host>` of the client's API server, or '' where it does not say."""
    host = getattr(getattr(getattr(custom_api, "api_client", None), "configuration", None), "host", "")
    return f" at {host}" if host else ""


def _status_body(exc: BaseException) -> dict[str, Any] | None:
    """The Kubernetes Status object a refusal carries in its body, or None (a web page, nothing)."""
    try:
        body = json.loads(getattr(exc, "body", None) or "")
    except (ValueError, TypeError):
        return None
    return body if isinstance(body, dict) and body.get("kind") == "Status" else None


def _kubernetes_status(exc: BaseException) -> bool:
    """Whether a refusal is the Kubernetes API's own (a Status object), or carries no body to tell."""
    return not getattr(exc, "body", None) or _status_body(exc) is not None


def _kind_not_served(exc: BaseException) -> bool:
    """Whether a 404 says the resource type is not served (no such CRD: a Status naming no object),
    not that the object is missing (a Status whose details name it)."""
    body = _status_body(exc)
    return body is not None and not (body.get("details") or {}).get("name")


class ClusterConfigError(KftrainError, RuntimeError):
    """No Kubernetes API to talk to: not in a pod, and no usable kubeconfig."""


def load_cluster_config() -> str | None:
    """Configure the Kubernetes client for this pod's cluster (in-cluster), else for the
    kubeconfig's current context; return that context's namespace (None in a pod: its
    service-account namespace is used). ClusterConfigError saying what to do when neither works."""
    import yaml
    from kubernetes import config

    try:
        config.load_incluster_config()
        return None
    except config.ConfigException:
        pass
    files = os.environ.get("KUBECONFIG") or None  # read now: the client library reads it once, at import
    try:
        config.load_kube_config(config_file=files)
        _, active = config.list_kube_config_contexts(config_file=files)
    except (config.ConfigException, yaml.YAMLError, OSError, ValueError, TypeError, KeyError) as exc:
        reason = yaml_problem(exc)  # never the kubeconfig's lines: they hold tokens and keys
        raise ClusterConfigError(
            f"no Kubernetes cluster to talk to: not in a pod, and the kubeconfig "
            f"({files or '~/.kube/config'}{', no such file' if _missing(files) else ''}) is not usable ({reason}); "
            "point KUBECONFIG at a kubeconfig file or choose a context (kubectl config use-context)"
        ) from None
    return (active or {}).get("context", {}).get("namespace")


def _clients() -> tuple[Any, Any]:
    """The CustomObjectsApi of the cluster :func:`load_cluster_config` finds, and the namespace it gives."""
    from kubernetes import client

    namespace = load_cluster_config()
    return client.CustomObjectsApi(), namespace


def job_state(obj: dict[str, Any], kind: JobKind) -> str:
    """The job's latest true condition (`Running`, `Succeeded`, `Suspended`, ...), else `Created`.

    A TrainJob has no `Running` condition (Kubeflow Trainer sets `Suspended`, `Complete` and
    `Failed` alone): until it completes or fails, and while no queue holds it, its child Jobs'
    counts (`status.jobsStatus`) say whether it runs (was: `Created (no condition yet)` for a
    TrainJob that trained)."""
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    latest = None
    if conds:
        # The latest transition; at the same second, the one the operator appended last.
        _, _, latest = max((str(c.get("lastTransitionTime") or ""), i, c) for i, c in enumerate(conds))
    ended = latest is not None and latest["type"] in (kind.succeeded, kind.failed)
    running = kind is TRAINJOB_KIND and not ended and not is_suspended(obj, kind)
    if running and (children := _child_jobs_state(obj)):
        return children
    if latest is None:
        resumed = _condition(obj, kind.suspended, status="False")  # a queue let it go: no pods yet
        return (
            f"Admitted ({resumed.get('reason') or 'resumed'}), no pods yet" if resumed else "Created (no condition yet)"
        )
    reason = f" ({latest['reason']})" if latest.get("reason") and latest["reason"] != latest["type"] else ""
    return f"{latest['type']}{reason}"


def _child_jobs_state(obj: dict[str, Any]) -> str | None:
    """A TrainJob's state from its child Jobs' counts: `Running` when every one with pods is
    ready, `Starting` while some of them wait for their pods; None when it has no child Job yet."""
    jobs = [j for j in (obj.get("status") or {}).get("jobsStatus") or [] if isinstance(j, dict)]

    def count(job: dict[str, Any], key: str) -> int:  # the CRD's int32; anything else (a half-written status): 0
        value = job.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    counts = {key: sum(count(j, key) for j in jobs) for key in ("active", "ready", "succeeded", "failed")}
    if not any(counts.values()):
        return None
    each = ", ".join(f"{j.get('name', '?')} {count(j, 'ready')}/{count(j, 'active')}" for j in jobs)
    if counts["active"] and counts["ready"] < counts["active"]:
        return f"Starting (child Jobs ready: {each}; the others' pods are pending or starting)"
    if counts["active"]:
        return f"Running (child Jobs ready: {each})"
    return f"Finishing (child Jobs succeeded: {counts['succeeded']}, failed: {counts['failed']})"


def job_status(
    name: str,
    namespace: str = "",
    kind: str = AUTO,
    custom_api: Any = None,
    now: Callable[[], dt.datetime] = _now,
) -> str:
    """What `kftrain job status NAME` prints: the job's kind, state and reported progress (the
    same line rank 0 logged and the launcher printed). `kind` `auto` looks for the name among the
    kinds the cluster serves, TrainJob first. Raises :class:`JobStatusError` when there is no such
    job or the API refuses."""
    context_namespace = None
    if custom_api is None:
        custom_api, context_namespace = _clients()
    namespace = namespace or context_namespace or current_namespace()
    kinds = [BY_NAME[kind]] if kind != AUTO else list(AUTO_PREFERENCE)
    obj, found = None, None
    refused = ""  # auto: a kind the account may not read, said if no other kind has the job
    for k in kinds:
        try:
            get = custom_api.get_namespaced_custom_object
            obj = api_call(
                f"get {k.crd_kind} {namespace}/{name}",
                get,
                k.group,
                k.version,
                namespace,
                k.plural,
                name,
                _request_timeout=REQUEST_TIMEOUT_S,  # a server that takes the connection and never answers
            )
            found = k
            break
        except NotKubernetesAnswer:
            raise  # its own line: not a refusal to read this job
        except Exception as exc:
            status = http_status(exc)
            if status == 404 and not _kubernetes_status(exc):  # a web server's page, not the API's answer
                raise JobStatusError(
                    f"the server{_api_host(custom_api)} does not answer as a Kubernetes API (a 404 page of another "
                    f"kind): {_CHECK_CONTEXT}"
                ) from None
            if status == 404 and kind != AUTO and _kind_not_served(exc):
                raise JobStatusError(
                    f"the cluster does not serve {k.crd_kind}s ({k.crd} is not installed): install its operator, "
                    "or ask for the other kind (--kind)"
                ) from None
            if status == 404:  # no such job, or (auto) the cluster does not serve the kind
                continue
            if status is None and isinstance(exc, CONNECTION_ERRORS):  # no answer: no kind of job is to blame
                raise JobStatusError(
                    f"cannot reach the Kubernetes API server{_api_host(custom_api)} ({unreachable(exc)}): "
                    f"{_CHECK_CONTEXT} and that the cluster is up"
                ) from None
            hint = " (your account lacks RBAC to read it)" if status == 403 else ""
            line = f"cannot read {k.crd_kind} {namespace}/{name}: {describe(exc)}{hint}"
            if status == 403 and kind == AUTO:
                refused = refused or line
                continue
            raise JobStatusError(line) from None
    if refused and found is None:
        raise JobStatusError(f"{refused}; if the job is of the other kind, say which (--kind)")
    if obj is None or found is None:
        what = " or ".join(k.crd_kind for k in kinds)
        raise JobStatusError(
            f"no {what} named {name!r} in namespace {namespace!r}: check the name (the training step's log "
            "names its job) and --namespace"
        )
    lines = [f"{found.crd_kind} {namespace}/{name}: {job_state(obj, found)}"]
    snapshot = progress_of(obj)
    if snapshot is None:
        where = (
            "status.trainerStatus; the controller needs its TrainJobStatus feature gate on"
            if found.name == TRAINJOB_KIND.name
            else f"the {PROGRESS_ANNOTATION} annotation; the pods' service account needs the kftrain-trainer Role"
        )
        lines.append(f"progress: none reported yet (rank 0 reports to {where})")
    else:
        age = max(0, int(now().timestamp()) - snapshot.time)
        lines.append(f"progress: {snapshot.line()}")
        lines.append(f"reported: {stamp(snapshot.time)} ({format_seconds(age)} ago)")
    return "\n".join(lines)


def _what_resumes(spec: JobSpec) -> str:
    """What a re-created (or re-admitted) job starts from, as the launcher says it."""
    if spec.resumes is None:
        return "your command resumes only if it saves and loads its own checkpoints"
    if spec.resumes == "checkpoint":
        return "the trainer resumes from its latest checkpoint"
    if spec.resumes == "resume_from":
        return (
            "the trainer starts again from checkpoint.resume_from's checkpoint, not from its own "
            "(checkpoint.enabled, checkpoint.resume)"
        )
    return (
        "the trainer reads no checkpoint (checkpoint.enabled or checkpoint.resume is off): training starts "
        "again from step 0"
    )


def _quota_of_nothing(exc: BaseException) -> bool:
    """Whether the quota a refusal names allows none of what was asked (`limited: ...=0`): no job's
    end frees it."""
    limits = re.findall(r"=(\d+)", _status_message(exc).partition("limited:")[2])
    return bool(limits) and all(int(n) == 0 for n in limits)


def _over_quota(exc: BaseException) -> bool:
    """Whether a refusal is a ResourceQuota's (`exceeded quota: ...`): on a shared cluster it frees
    as other jobs end, unlike a missing permission."""
    return http_status(exc) == 403 and "exceeded quota" in _status_message(exc)


def _status_message(exc: BaseException) -> str:
    """The API server's own explanation of a refusal (a webhook's denial, a validation error), from
    the Status object in the response body; empty when there is none."""
    body = getattr(exc, "body", None)
    if not body:
        return ""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        return ""
    return f": {message}" if message else ""


def _clock_offset(created: Any, before: dt.datetime, after: dt.datetime) -> dt.timedelta:
    """The API server's clock minus ours, from the creationTimestamp of an object created between
    `before` and `after` (our clock): zero when the stamp falls in that span (it has whole seconds).
    Off-cluster the two clocks can be minutes apart, and a pod created this second looked Pending
    for as long."""
    stamp = _created(created) if isinstance(created, dict) else None
    if stamp is None:
        return dt.timedelta(0)
    early, late = before - dt.timedelta(seconds=1), after + dt.timedelta(seconds=1)
    if early <= stamp <= late:
        return dt.timedelta(0)
    return stamp - (before + (after - before) / 2)


#: The label JobSet puts on the pods of each restart of the whole set (failurePolicy.maxRestarts).
JOBSET_RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"


def _latest_restart(pods: list[Any]) -> list[Any]:
    """The pods of the JobSet's latest restart (all of them when the pods carry no such label): a
    restart's older pods, still listed or remembered, are not evidence of the failure now."""

    def attempt(pod: Any) -> int:
        value = ((pod.metadata.labels or {}) if pod.metadata else {}).get(JOBSET_RESTART_LABEL, "")
        return int(value) if str(value).isdigit() else -1

    latest = max((attempt(pod) for pod in pods), default=-1)
    return [pod for pod in pods if attempt(pod) in (latest, -1)]


def _container(job: _Job, pod: Any) -> str:
    """The container whose log is the pod's: the training container, or, in a pod without one (a
    TrainJob runtime's dataset or model initializer), the pod's own first container."""
    names = [cs.name for cs in (pod.status.container_statuses if pod.status else None) or []]
    spec = getattr(pod, "spec", None)
    names += [c.name for c in (getattr(spec, "containers", None) or []) if c.name not in names]
    return job.kind.container if job.kind.container in names or not names else names[0]


def _deleting(obj: dict[str, Any]) -> bool:
    """Whether the API server is deleting `obj` (its Foreground deletion waits for its pods)."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _ended_by_deadline(failed: dict[str, Any]) -> bool:
    """Whether a Failed condition says the job's own activeDeadlineSeconds ended it: the Training
    Operator's "...was active longer than specified deadline", a `DeadlineExceeded` reason."""
    text = f"{failed.get('reason') or ''} {failed.get('message') or ''}".lower()
    return "deadlineexceeded" in text or "longer than specified deadline" in text or "deadline exceeded" in text


def _log_text(answer: Any) -> str:
    """A log read's answer as text: the bytes of an unread response decoded with replacement
    (`_preload_content=False`), or the text a stand-in gives."""
    if isinstance(answer, str):
        return answer
    try:
        data = getattr(answer, "data", None)
    finally:
        release = getattr(answer, "release_conn", None)
        if callable(release):
            release()
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data if isinstance(data, str) else ""


def _as_dict(obj: Any) -> dict[str, Any]:
    """A client model (`V1Pod`) as the API's JSON (camelCase keys), what the classifier reads."""
    if isinstance(obj, dict):
        return obj
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


def _parse_time(value: Any) -> dt.datetime:
    """A timestamp as an aware datetime: one without a zone (an annotation someone edited) is UTC,
    as everything the API server writes is."""
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.timezone.utc)
