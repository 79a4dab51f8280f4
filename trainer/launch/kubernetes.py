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
- the job has an ownerReference to the launcher pod, so cancelling the run (which deletes the
  pod) deletes the job; SIGTERM and every error path delete it too (`run_job`);
- Failed fails the step, with the condition's reason and the failing replica's last log lines;
- a pod Pending past `kubernetes.pending_timeout_seconds` fails the step with its events
  (`Insufficient nvidia.com/gpu`, `ErrImagePull`, ...) instead of waiting forever;
- the deadline is a real wall-clock deadline (`job.timeout_seconds`), not a per-request timeout;
- every replica's log streams into the step's log with a `[master-0]` / `[worker-1]` prefix,
  one stream per pod uid and container restart, so a pod the operator deleted and recreated
  under the same name (restartPolicy ExitCode) is streamed again;
- transient API errors (5xx, 429, connection resets) are retried (`trainer/launch/retry.py`)
  within `kubernetes.api_retry_budget_seconds`: only a final answer fails the step and deletes
  the job (the Failed condition, a 4xx, the deadline, or the budget spent);
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

import collections
import datetime as dt
import json
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.launch.backend import JobFailed, JobTimeout, failure_excerpt, print_line
from trainer.launch.jobkind import (
    JOB_NAME_LABEL,
    PYTORCHJOB_KIND,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    JobKind,
    NoJobKindServed,
    choose_kind,
)
from trainer.launch.pytorchjob import KUEUE_QUEUE_LABEL, owner_reference
from trainer.launch.retry import ApiRetry, ApiUnavailable, describe, http_status
from trainer.launch.spec import AUTO, POD_NAME_ENV, POD_UID_ENV, JobSpec, require_object_store

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
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

    def queued(self, job: dict[str, Any], pods: list[Any]) -> str | None:
        """Why the job is queued, or None when it is admitted."""
        self.seen_pods = self.seen_pods or bool(pods)
        if is_suspended(job, self.kind):
            return "suspended until the queue admits it"
        # Gang schedulers (Volcano) make the operator delay pod creation until the job's
        # PodGroup is admitted: no pods yet and a schedulingPolicy means queued, not stuck.
        if self.kind.gang_scheduled(job) and not self.seen_pods:
            return "no pods until the gang scheduler admits its PodGroup"
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
            created = (job.get("metadata") or {}).get("creationTimestamp")
            self.admitted_at = _parse_time(created) if created else now
        queued_for = self.admitted_at - self.queued_since if was_queued else None
        self.queued_since = None
        return queued_for

    def pending_since(self, pod: Any) -> dt.datetime:
        """When a Pending pod's clock started: its creation, but never before admission."""
        created = pod.metadata.creation_timestamp
        return max(created, self.admitted_at) if self.from_queue and self.admitted_at else created


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
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            custom_api, core_api = client.CustomObjectsApi(), client.CoreV1Api()
        self.custom, self.core = custom_api, core_api
        self._home = namespace or current_namespace()  # the launcher pod's own namespace
        self._owner = owner if owner is not None else launcher_owner()
        self._log = log or print_line
        self._now, self._sleep, self._rng = now, sleep, rng
        self._deadline: dt.datetime | None = None  # while waiting: retries stop here too
        # One stream per (pod uid, container restarts): a pod recreated under the same name
        # has a new uid and so a new stream; the replica prefix comes from its labels.
        self._streams: dict[tuple[str, int], threading.Thread] = {}
        self._tails: dict[str, collections.deque] = {}
        self._kinds: dict[str, JobKind] = {}  # job name -> kind, `auto` resolved once

    def job_kind(self, spec: JobSpec) -> JobKind:
        """The kind of `spec`'s job; `auto` asks the cluster once (API discovery, retried)."""
        if spec.name not in self._kinds:
            try:
                self._kinds[spec.name] = choose_kind(spec.kind, lambda k: self._served(spec, k))
            except NoJobKindServed as exc:
                raise JobFailed(str(exc)) from None
        return self._kinds[spec.name]

    def _what(self, spec: JobSpec) -> str:
        """`PyTorchJob <name>` / `TrainJob <name>`, for log lines and errors."""
        return f"{self.job_kind(spec).crd_kind} {spec.name}"

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

    def namespace(self, spec: JobSpec) -> str:
        """Where the job lives: the config's namespace, else the launcher's own."""
        return spec.kubernetes.namespace or self._home

    def owner(self, spec: JobSpec) -> dict[str, Any] | None:
        """The launcher pod as the job's owner, only in the pod's own namespace: Kubernetes treats
        a cross-namespace owner as absent and would garbage-collect the job at once."""
        return self._owner if self.namespace(spec) == self._home else None

    def manifest(self, spec: JobSpec) -> dict[str, Any]:
        """The validated job for `spec` (preflight raises before anything is sent)."""
        require_object_store(spec.artifact_uris)
        kind = self.job_kind(spec)
        manifest = kind.build(spec, self.namespace(spec), self.owner(spec))
        kind.validate(manifest)
        return manifest

    # -- the JobBackend interface ---------------------------------------------------------

    def submit(self, spec: JobSpec) -> None:
        """Create the job; re-attach to it if it exists (replace it if it already Failed)."""
        manifest = self.manifest(spec)
        ns = self.namespace(spec)
        try:
            self._create(spec, manifest)
            self._log(f"kftrain: created {self.job_kind(spec).crd_kind} {ns}/{spec.name}")
            return
        except JobFailed:
            raise
        except Exception as exc:
            # 409 also when our own create took effect but its answer was lost and the retry
            # found the job: re-attaching to it is right either way.
            status = http_status(exc)
            if status != 409:
                hint = f" (is the {self.job_kind(spec).crd} CRD installed?)" if status == 404 else ""
                detail = _status_message(exc)
                raise JobFailed(
                    f"cannot create {self.job_kind(spec).crd_kind} {ns}/{spec.name}: {describe(exc)}{hint}{detail}"
                ) from None
        existing = self._get(spec)
        if existing is not None and _condition(existing, self.job_kind(spec).failed):
            # A retried step asks for a new attempt, not for the old failure again.
            self._log(f"kftrain: {self.job_kind(spec).crd_kind} {ns}/{spec.name} exists and Failed; replacing it")
            self.cancel(spec)
            self._wait_deleted(spec)
            self._create(spec, manifest)
            return
        self._log(f"kftrain: {self.job_kind(spec).crd_kind} {ns}/{spec.name} already exists; re-attaching to it")
        self._adopt(spec, existing)

    def wait(self, spec: JobSpec) -> None:
        """Poll until Succeeded; raise on Failed, a pod Pending too long after admission, too
        long in a queue (when limited), the deadline, or an API that stays unavailable."""
        timeout_s = spec.timeout_s
        self._deadline = self._now() + dt.timedelta(seconds=timeout_s)
        try:
            self._wait(spec, timeout_s)
        except ApiUnavailable as exc:
            if exc.at_deadline:
                raise JobTimeout(f"{self._timeout_message(spec, timeout_s)}; at the time, {exc}") from exc
            raise
        except JobFailed:
            raise
        except Exception as exc:
            status = http_status(exc)
            if status is None:
                raise
            # A final answer (401, 403, ...): one line for the step log, not the client's dump.
            hint = " (the run's service account lacks RBAC in the job's namespace)" if status == 403 else ""
            raise JobFailed(
                f"the Kubernetes API refused a call while the launcher waited for {self._what(spec)}: "
                f"{describe(exc)}{hint}"
            ) from exc
        finally:
            self._deadline = None

    def logs(self, spec: JobSpec, tail: int = 50) -> dict[str, list[str]]:
        """The last `tail` lines of each replica's current container."""
        out = {}
        for pod in self._pods(spec):
            out[self.job_kind(spec).replica_key(pod)] = self._read_log(spec, pod.metadata.name, tail)
        return out

    def cancel(self, spec: JobSpec) -> None:
        """Delete the job (Foreground: its pods go first); a job already gone is fine."""
        if spec.kind == AUTO and spec.name not in self._kinds:
            return  # discovery never answered, so nothing was created
        ns = self.namespace(spec)
        try:
            self._api(
                spec,
                f"delete job {ns}/{spec.name}",
                self.custom.delete_namespaced_custom_object,
                self.job_kind(spec).group,
                self.job_kind(spec).version,
                ns,
                self.job_kind(spec).plural,
                spec.name,
                propagation_policy="Foreground",
            )
            self._log(f"kftrain: deleted {self._what(spec)}")
        except Exception as exc:
            if http_status(exc) != 404:
                raise

    # -- waiting --------------------------------------------------------------------------

    def _wait(self, spec: JobSpec, timeout_s: float) -> None:
        pending_limit = dt.timedelta(seconds=spec.kubernetes.pending_timeout_seconds)
        queue_limit = spec.kubernetes.queue_timeout_seconds
        kind = self.job_kind(spec)
        admission = _Admission(kind)
        while True:
            job = self._get(spec)
            if job is None:
                raise JobFailed(f"{self._what(spec)} was deleted while the launcher waited for it")
            if _condition(job, kind.succeeded):
                self._finish_streams()
                self._log(f"kftrain: {self._what(spec)} succeeded")
                return
            failed = _condition(job, kind.failed)
            if failed:
                self._finish_streams()
                raise JobFailed(self._failure_message(spec, failed))
            pods = self._pods(spec)
            now = self._now()
            why_queued = admission.queued(job, pods)
            if why_queued:
                if admission.enter_queue(job, now):
                    self._log(
                        f"kftrain: {self._what(spec)} is queued in {queue_of(job, kind)}: {why_queued}; "
                        "the Pending clock starts when it is admitted"
                    )
                waited = now - admission.queued_since
                if queue_limit and waited.total_seconds() > queue_limit:
                    raise JobFailed(
                        f"{self._what(spec)} waited {int(waited.total_seconds())}s in "
                        f"{queue_of(job, kind)} "
                        f"without being admitted (kubernetes.queue_timeout_seconds={queue_limit}). "
                        f"Events: {self._events(spec, spec.name)}"
                    )
            elif (queued_for := admission.admit(job, now)) is not None:
                self._log(
                    f"kftrain: {self._what(spec)} admitted from {queue_of(job, kind)} after "
                    f"{max(0, int(queued_for.total_seconds()))}s"
                )
            for pod in pods:
                phase = pod.status.phase
                if phase == "Pending" and not why_queued:
                    waited = now - admission.pending_since(pod)
                    if waited > pending_limit:
                        raise JobFailed(self._pending_message(spec, pod, waited))
                elif phase in ("Running", "Succeeded", "Failed"):
                    self._stream(spec, pod)
            if not pods and not why_queued and now - admission.admitted_at > pending_limit:
                since = "admitted" if admission.from_queue else "created"
                raise JobFailed(
                    f"{self._what(spec)} has no pods "
                    f"{int((now - admission.admitted_at).total_seconds())}s "
                    f"after it was {since} (kubernetes.pending_timeout_seconds="
                    f"{spec.kubernetes.pending_timeout_seconds}): the operator did not create them (a "
                    f"ResourceQuota, a webhook, or a gang scheduler the job does not name). "
                    f"Events: {self._events(spec, spec.name)}"
                )
            if now > self._deadline:
                raise JobTimeout(self._timeout_message(spec, timeout_s))
            self._sleep(spec.kubernetes.poll_seconds)

    def _timeout_message(self, spec: JobSpec, timeout_s: float) -> str:
        return f"{self._what(spec)} did not finish within {timeout_s:.0f}s (job.timeout_seconds); it has been deleted"

    # -- API calls, all through the retry -------------------------------------------------

    def _api(self, spec: JobSpec, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        retry = ApiRetry(
            spec.kubernetes.api_retry_budget_seconds, now=self._now, sleep=self._sleep, log=self._log, rng=self._rng
        )
        return retry.call(what, fn, *args, stop_at=self._deadline, **kwargs)

    def _create(self, spec: JobSpec, manifest: dict[str, Any]) -> None:
        ns = self.namespace(spec)
        self._api(
            spec,
            f"create job {ns}/{spec.name}",
            self.custom.create_namespaced_custom_object,
            self.job_kind(spec).group,
            self.job_kind(spec).version,
            ns,
            self.job_kind(spec).plural,
            manifest,
        )

    def _get(self, spec: JobSpec) -> dict[str, Any] | None:
        ns = self.namespace(spec)
        try:
            return self._api(
                spec,
                f"get job {ns}/{spec.name}",
                self.custom.get_namespaced_custom_object,
                self.job_kind(spec).group,
                self.job_kind(spec).version,
                ns,
                self.job_kind(spec).plural,
                spec.name,
            )
        except Exception as exc:
            if http_status(exc) == 404:
                return None
            raise

    def _wait_deleted(self, spec: JobSpec, timeout_s: float = 300) -> None:
        end = self._now() + dt.timedelta(seconds=timeout_s)
        while self._get(spec) is not None:
            if self._now() > end:
                raise JobFailed(f"old {self._what(spec)} was not deleted within {timeout_s:.0f}s")
            self._sleep(spec.kubernetes.poll_seconds)

    def _adopt(self, spec: JobSpec, job: dict[str, Any] | None) -> None:
        """Add this launcher pod to the job's owners, so cancelling the retried run deletes it."""
        owner = self.owner(spec)
        if job is None or owner is None:
            return
        owners = job.get("metadata", {}).get("ownerReferences") or []
        if any(o.get("uid") == owner["uid"] for o in owners):
            return
        patch = {"metadata": {"ownerReferences": [*owners, owner]}}
        ns = self.namespace(spec)
        self._api(
            spec,
            f"patch job {ns}/{spec.name}",
            self.custom.patch_namespaced_custom_object,
            self.job_kind(spec).group,
            self.job_kind(spec).version,
            ns,
            self.job_kind(spec).plural,
            spec.name,
            patch,
        )

    def _pods(self, spec: JobSpec) -> list[Any]:
        ns = self.namespace(spec)
        pods = self._api(
            spec,
            f"list pods of job {ns}/{spec.name}",
            self.core.list_namespaced_pod,
            ns,
            label_selector=self.job_kind(spec).pod_selector(spec.name),
        )
        return sorted(pods.items, key=self.job_kind(spec).replica_key)

    def _events(self, spec: JobSpec, obj_name: str) -> str:
        """Events of an object, for an error message: never the reason the message is lost."""
        ns = self.namespace(spec)
        try:
            events = self._api(
                spec,
                f"list events of {ns}/{obj_name}",
                self.core.list_namespaced_event,
                ns,
                field_selector=f"involvedObject.name={obj_name}",
            ).items
        except Exception as exc:
            return f"unavailable ({describe(exc)})"
        return "; ".join(f"{e.reason}: {e.message}" for e in events) or "none"

    def _read_log(self, spec: JobSpec, pod_name: str, tail: int) -> list[str]:
        ns = self.namespace(spec)
        try:
            text = self._api(
                spec,
                f"read log of pod {ns}/{pod_name}",
                self.core.read_namespaced_pod_log,
                pod_name,
                ns,
                container=self.job_kind(spec).container,
                tail_lines=tail,
            )
        except Exception as exc:
            return [f"(log unavailable: {describe(exc)})"]
        return text.splitlines()

    # -- log streaming --------------------------------------------------------------------

    def _stream(self, spec: JobSpec, pod: Any) -> None:
        name = pod.metadata.name
        # One stream per container instance: a container restarted by its restartPolicy, or a
        # pod recreated under the same name (new uid), gets a new stream (the old one ended
        # with the old container).
        restarts = sum(cs.restart_count or 0 for cs in pod.status.container_statuses or [])
        instance = (pod.metadata.uid or name, restarts)
        if instance in self._streams:
            return
        key = self.job_kind(spec).replica_key(pod)
        tail = self._tails.setdefault(key, collections.deque(maxlen=200))
        ns = self.namespace(spec)

        def follow() -> None:
            try:
                resp = self._api(
                    spec,
                    f"read log of pod {ns}/{name}",
                    self.core.read_namespaced_pod_log,
                    name,
                    ns,
                    container=self.job_kind(spec).container,
                    follow=True,
                    _preload_content=False,
                )
                buf = b""
                for chunk in resp.stream(4096):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for raw in lines:
                        line = raw.decode("utf-8", "replace")
                        tail.append(line)
                        self._log(f"[{key}] {line}")
                if buf:
                    tail.append(buf.decode("utf-8", "replace"))
                    self._log(f"[{key}] {tail[-1]}")
                resp.release_conn()
            except Exception as exc:  # a log stream must never fail the launcher
                self._log(f"[{key}] (log stream ended: {describe(exc)})")

        thread = threading.Thread(target=follow, name=f"logs-{key}", daemon=True)
        self._streams[instance] = thread
        thread.start()

    def _finish_streams(self, timeout_s: float = 10) -> None:
        end = time.monotonic() + timeout_s  # real time: threads join in real time, not the API clock
        for thread in list(self._streams.values()):
            thread.join(timeout=max(0.0, end - time.monotonic()))

    # -- error messages -------------------------------------------------------------------

    def _failure_message(self, spec: JobSpec, cond: dict[str, Any]) -> str:
        lines = [f"{self._what(spec)} failed: {cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip()]
        try:
            pods = self._pods(spec)
        except Exception as exc:  # the job's Failed condition is the answer; pods are evidence
            return "\n".join([*lines, f"(replica pods unavailable: {describe(exc)})"])
        for pod in pods:
            code = _exit_code(pod)
            if pod.status.phase == "Failed" or code not in (None, 0):
                key = self.job_kind(spec).replica_key(pod)
                lines.append(f"replica {key} (pod {pod.metadata.name}) exited with code {code}; last log lines:")
                logs = self._read_log(spec, pod.metadata.name, 400)
                lines += [f"  [{key}] {line}" for line in failure_excerpt(logs)]
                break
        return "\n".join(lines)

    def _pending_message(self, spec: JobSpec, pod: Any, waited: dt.timedelta) -> str:
        reasons = []
        for cs in pod.status.container_statuses or []:
            waiting = cs.state.waiting if cs.state else None
            if waiting:
                reasons.append(f"{waiting.reason}: {waiting.message or ''}".rstrip(": "))
        detail = f" ({'; '.join(reasons)})" if reasons else ""
        return (
            f"replica {self.job_kind(spec).replica_key(pod)} (pod {pod.metadata.name}) of {self._what(spec)} "
            "has been Pending "
            f"for {int(waited.total_seconds())}s (kubernetes.pending_timeout_seconds="
            f"{spec.kubernetes.pending_timeout_seconds}){detail}. Events: {self._events(spec, pod.metadata.name)}"
        )


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


def _exit_code(pod: Any) -> int | None:
    for cs in pod.status.container_statuses or []:
        for state in (cs.state, cs.last_state):
            if state is not None and state.terminated is not None:
                return state.terminated.exit_code
    return None


def _parse_time(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
