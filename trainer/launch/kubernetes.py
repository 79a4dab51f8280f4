"""Run a job as a Kubeflow PyTorchJob: submit, re-attach, wait, stream logs, cancel.

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
- every replica's log streams into the step's log with a `[master-0]` / `[worker-1]` prefix.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.launch.backend import JobFailed, JobTimeout, failure_excerpt
from trainer.launch.preflight import validate_pytorchjob
from trainer.launch.pytorchjob import GROUP, PLURAL, VERSION, owner_reference, pytorchjob_manifest
from trainer.launch.spec import POD_NAME_ENV, POD_UID_ENV, JobSpec, require_object_store

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


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


def _status(exc: Exception) -> int | None:
    return getattr(exc, "status", None)


def _condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _replica_key(pod: Any) -> str:
    labels = pod.metadata.labels or {}
    return f"{labels.get(REPLICA_TYPE_LABEL, 'pod')}-{labels.get(REPLICA_INDEX_LABEL, pod.metadata.name)}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class KubernetesBackend:
    """PyTorchJobs through the Kubernetes API.

    `custom_api` / `core_api` are a `kubernetes.client.CustomObjectsApi` and `CoreV1Api` (the
    in-cluster or kubeconfig client by default); tests pass a fake object with the same methods.
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
        self._log = log or (lambda line: print(line, flush=True))
        self._now, self._sleep = now, sleep
        self._streams: dict[tuple[str, int], threading.Thread] = {}
        self._tails: dict[str, collections.deque] = {}

    def namespace(self, spec: JobSpec) -> str:
        """Where the job lives: the config's namespace, else the launcher's own."""
        return spec.kubernetes.namespace or self._home

    def owner(self, spec: JobSpec) -> dict[str, Any] | None:
        """The launcher pod as the job's owner, only in the pod's own namespace: Kubernetes treats
        a cross-namespace owner as absent and would garbage-collect the job at once."""
        return self._owner if self.namespace(spec) == self._home else None

    def manifest(self, spec: JobSpec) -> dict[str, Any]:
        """The validated PyTorchJob for `spec` (preflight raises before anything is sent)."""
        require_object_store(spec.artifact_uris)
        manifest = pytorchjob_manifest(spec, self.namespace(spec), self.owner(spec))
        validate_pytorchjob(manifest)
        return manifest

    # -- the JobBackend interface ---------------------------------------------------------

    def submit(self, spec: JobSpec) -> None:
        manifest = self.manifest(spec)
        ns = self.namespace(spec)
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
            self._log(f"kftrain: created PyTorchJob {ns}/{spec.name}")
            return
        except Exception as exc:
            if _status(exc) != 409:
                raise JobFailed(f"cannot create PyTorchJob {ns}/{spec.name}: {exc}") from None
        existing = self._get(spec)
        if existing is not None and _condition(existing, "Failed"):
            # A retried step asks for a new attempt, not for the old failure again.
            self._log(f"kftrain: PyTorchJob {ns}/{spec.name} exists and Failed; replacing it")
            self.cancel(spec)
            self._wait_deleted(spec)
            self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
            return
        self._log(f"kftrain: PyTorchJob {ns}/{spec.name} already exists; re-attaching to it")
        self._adopt(spec, existing)

    def wait(self, spec: JobSpec, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending_limit = dt.timedelta(seconds=spec.kubernetes.pending_timeout_seconds)
        while True:
            job = self._get(spec)
            if job is None:
                raise JobFailed(f"PyTorchJob {spec.name} was deleted while the launcher waited for it")
            if _condition(job, "Succeeded"):
                self._finish_streams()
                self._log(f"kftrain: PyTorchJob {spec.name} succeeded")
                return
            failed = _condition(job, "Failed")
            if failed:
                self._finish_streams()
                raise JobFailed(self._failure_message(spec, failed))
            pods = self._pods(spec)
            for pod in pods:
                phase = pod.status.phase
                if phase == "Pending":
                    waited = self._now() - pod.metadata.creation_timestamp
                    if waited > pending_limit:
                        raise JobFailed(self._pending_message(spec, pod, waited))
                elif phase in ("Running", "Succeeded", "Failed"):
                    self._stream(spec, pod)
            if not pods:
                created = job.get("metadata", {}).get("creationTimestamp")
                if created and self._now() - _parse_time(created) > pending_limit:
                    raise JobFailed(
                        f"PyTorchJob {spec.name} has no pods after {pending_limit}: it may be suspended "
                        f"by a queue (Kueue) or blocked by quota. Events: {self._events(spec, spec.name)}"
                    )
            if time.monotonic() > deadline:
                raise JobTimeout(
                    f"PyTorchJob {spec.name} did not finish within {timeout_s:.0f}s (job.timeout_seconds); "
                    "it has been deleted"
                )
            self._sleep(spec.kubernetes.poll_seconds)

    def logs(self, spec: JobSpec, tail: int = 50) -> dict[str, list[str]]:
        out = {}
        for pod in self._pods(spec):
            out[_replica_key(pod)] = self._read_log(spec, pod.metadata.name, tail)
        return out

    def cancel(self, spec: JobSpec) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace(spec), PLURAL, spec.name, propagation_policy="Foreground"
            )
            self._log(f"kftrain: deleted PyTorchJob {spec.name}")
        except Exception as exc:
            if _status(exc) != 404:
                raise

    # -- helpers --------------------------------------------------------------------------

    def _get(self, spec: JobSpec) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace(spec), PLURAL, spec.name)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise

    def _wait_deleted(self, spec: JobSpec, timeout_s: float = 300) -> None:
        end = time.monotonic() + timeout_s
        while self._get(spec) is not None:
            if time.monotonic() > end:
                raise JobFailed(f"old PyTorchJob {spec.name} was not deleted within {timeout_s:.0f}s")
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
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace(spec), PLURAL, spec.name, patch)

    def _pods(self, spec: JobSpec) -> list[Any]:
        pods = self.core.list_namespaced_pod(self.namespace(spec), label_selector=f"{JOB_NAME_LABEL}={spec.name}")
        return sorted(pods.items, key=_replica_key)

    def _events(self, spec: JobSpec, obj_name: str) -> str:
        events = self.core.list_namespaced_event(
            self.namespace(spec), field_selector=f"involvedObject.name={obj_name}"
        ).items
        return "; ".join(f"{e.reason}: {e.message}" for e in events) or "none"

    def _read_log(self, spec: JobSpec, pod_name: str, tail: int) -> list[str]:
        try:
            text = self.core.read_namespaced_pod_log(
                pod_name, self.namespace(spec), container="pytorch", tail_lines=tail
            )
        except Exception as exc:
            return [f"(log unavailable: {exc})"]
        return text.splitlines()

    def _stream(self, spec: JobSpec, pod: Any) -> None:
        name = pod.metadata.name
        # One stream per container instance: a container restarted by its restartPolicy gets a
        # new stream (the old one ended with the old container).
        instance = (name, sum(cs.restart_count or 0 for cs in pod.status.container_statuses or []))
        if instance in self._streams:
            return
        key = _replica_key(pod)
        tail = self._tails.setdefault(key, collections.deque(maxlen=200))

        def follow() -> None:
            try:
                resp = self.core.read_namespaced_pod_log(
                    name, self.namespace(spec), container="pytorch", follow=True, _preload_content=False
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
                self._log(f"[{key}] (log stream ended: {exc})")

        thread = threading.Thread(target=follow, name=f"logs-{key}", daemon=True)
        self._streams[instance] = thread
        thread.start()

    def _finish_streams(self, timeout_s: float = 10) -> None:
        end = time.monotonic() + timeout_s
        for thread in self._streams.values():
            thread.join(timeout=max(0.0, end - time.monotonic()))

    def _failure_message(self, spec: JobSpec, cond: dict[str, Any]) -> str:
        lines = [f"PyTorchJob {spec.name} failed: {cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip()]
        for pod in self._pods(spec):
            code = _exit_code(pod)
            if pod.status.phase == "Failed" or code not in (None, 0):
                key = _replica_key(pod)
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
            f"replica {_replica_key(pod)} (pod {pod.metadata.name}) of PyTorchJob {spec.name} has been Pending "
            f"for {int(waited.total_seconds())}s (kubernetes.pending_timeout_seconds="
            f"{spec.kubernetes.pending_timeout_seconds}){detail}. Events: {self._events(spec, pod.metadata.name)}"
        )


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
