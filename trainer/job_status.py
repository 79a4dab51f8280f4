"""Rank 0's progress on the job object, where cluster tools look.

Each log interval's :class:`~trainer.progress.Snapshot` goes to the job that runs this process:

- **TrainJob** (Kubeflow Trainer v2.3, KEP-2779): with the controller's `TrainJobStatus` feature
  gate on, the `TrainJobStatus` runtime plugin gives every trainer container
  `KUBEFLOW_TRAINER_SERVER_URL` (the controller's status server,
  `https://<service>.<ns>.svc:<port>/apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`),
  `KUBEFLOW_TRAINER_SERVER_CA_CERT` (the CA of its TLS certificate) and
  `KUBEFLOW_TRAINER_SERVER_TOKEN` (a projected service-account token whose audience is that
  TrainJob, valid an hour and rotated by the kubelet, so it is read again for every request). The
  pod POSTs `{"trainerStatus": {...}}` there with the token as a Bearer credential; the controller
  checks the token (signature, audience, namespace) and server-side-applies
  `status.trainerStatus`. The pod's service account needs no RBAC for this.
- **PyTorchJob** (Training Operator v1, which has no such field): a merge patch of the job's
  `kftrain.io/progress` annotation through the API server. The pod finds its job through
  `KFTRAIN_PYTORCHJOB_NAME` / `KFTRAIN_JOB_NAMESPACE` (the manifest sets them from the operator's
  pod label and the pod's namespace, through the downward API); its service account needs `get`
  and `patch` on `pytorchjobs` (deploy/rbac: the `kftrain-trainer` Role).

Reporting never slows or fails training: :class:`Reporter` keeps only the latest snapshot and
sends it from its own thread, at most once every `interval_s` (and the last one at close); a
failed report is logged once, then counted, and tried again at the next turn unless a newer
one replaced it.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from trainer.progress import PROGRESS_ANNOTATION, Snapshot

log = logging.getLogger("kftrain.train")
#: What Kubeflow Trainer v2.3's TrainJobStatus plugin sets in every trainer container.
SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
SERVER_CA_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
SERVER_TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
#: What kftrain's manifests set through the downward API (trainer/launch/pytorchjob.py, trainjob.py).
PYTORCHJOB_NAME_ENV = "KFTRAIN_PYTORCHJOB_NAME"
TRAINJOB_NAME_ENV = "KFTRAIN_TRAINJOB_NAME"
JOB_NAMESPACE_ENV = "KFTRAIN_JOB_NAMESPACE"
#: Least seconds between two reports. The status server shares one client (5 QPS, burst 10 by
#: default) among all TrainJobs, and the Kubeflow SDK's reporter throttles to 5 s; every 10 s is
#: fresh enough for a job that runs for hours.
REPORT_INTERVAL_S = 10.0
#: One report's HTTP or API timeout.
REPORT_TIMEOUT_S = 5.0


class Sink(Protocol):
    """One destination of reports; `send` may block and raise (the reporter's thread calls it)."""

    what: str

    def send(self, snapshot: Snapshot) -> None: ...


class TrainJobStatusSink:
    """POSTs `{"trainerStatus": ...}` to Kubeflow Trainer's status server (KEP-2779)."""

    def __init__(
        self,
        url: str,
        ca_file: str,
        token_file: str,
        timeout_s: float = REPORT_TIMEOUT_S,
        urlopen: Callable[..., Any] = urllib.request.urlopen,
    ) -> None:
        self.url, self.ca_file, self.token_file, self.timeout_s = url, ca_file, token_file, timeout_s
        self._urlopen = urlopen
        self._context: ssl.SSLContext | None = None
        self.what = f"the TrainJob's status ({url})"

    @staticmethod
    def payload(snapshot: Snapshot) -> dict[str, Any]:
        """The request body: the server's `UpdateTrainJobStatusRequest`."""
        return {"trainerStatus": snapshot.trainer_status()}

    def send(self, snapshot: Snapshot) -> None:
        """One POST; raises on a refusal (HTTP >= 400) or a transport error."""
        token = Path(self.token_file).read_text().strip()  # rotated by the kubelet: read every time
        request = urllib.request.Request(
            self.url,
            data=json.dumps(self.payload(snapshot)).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method="POST",
        )
        kwargs: dict[str, Any] = {"timeout": self.timeout_s}
        if self.url.startswith("https:"):
            if self._context is None:
                self._context = ssl.create_default_context(cafile=self.ca_file or None)
            kwargs["context"] = self._context
        with self._urlopen(request, **kwargs) as response:
            response.read()


class PyTorchJobAnnotationSink:
    """Merge-patches the PyTorchJob's `kftrain.io/progress` annotation."""

    def __init__(self, name: str, namespace: str, custom_api: Any = None) -> None:
        self.name, self.namespace, self._api = name, namespace, custom_api
        self.what = f"the annotation {PROGRESS_ANNOTATION} of PyTorchJob {namespace}/{name}"

    @staticmethod
    def patch(snapshot: Snapshot) -> dict[str, Any]:
        """The merge patch: this one annotation, the job's others untouched."""
        return {"metadata": {"annotations": {PROGRESS_ANNOTATION: snapshot.annotation()}}}

    def send(self, snapshot: Snapshot) -> None:
        """One PATCH through the Kubernetes API (the in-cluster client, made on first use)."""
        from trainer.launch import pytorchjob

        if self._api is None:
            from kubernetes import client, config

            config.load_incluster_config()
            self._api = client.CustomObjectsApi()
        self._api.patch_namespaced_custom_object(
            pytorchjob.GROUP,
            pytorchjob.VERSION,
            self.namespace,
            pytorchjob.PLURAL,
            self.name,
            self.patch(snapshot),
            _request_timeout=REPORT_TIMEOUT_S,
        )


class Reporter:
    """Sends the latest submitted snapshot to `sink` from a daemon thread: at most one report
    every `interval_s` seconds, the newest one when several came in between, and the last one at
    :meth:`close`. `submit` never blocks on the sink and nothing here raises into training."""

    def __init__(
        self,
        sink: Sink,
        interval_s: float = REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        close_timeout_s: float = 2 * REPORT_TIMEOUT_S,
    ) -> None:
        self.sink, self.interval_s, self.clock, self.close_timeout_s = sink, interval_s, clock, close_timeout_s
        #: Reports sent, and reports that failed.
        self.sent = self.failures = 0
        self._pending: Snapshot | None = None
        self._last_send: float | None = None
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="kftrain-progress-report", daemon=True)
        self._thread.start()

    def submit(self, snapshot: Snapshot) -> None:
        """Queue `snapshot` (replacing one not yet sent) and return."""
        with self._cond:
            self._pending = snapshot
            self._cond.notify()

    def close(self) -> None:
        """Send what is pending now (not waiting for the interval), then stop the thread; gives up
        after `close_timeout_s` so a hung server cannot hold the end of training."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(self.close_timeout_s)

    def _next(self) -> Snapshot | None:
        """Wait for a snapshot that is due; None when closed with nothing pending."""
        with self._cond:
            while True:
                if self._pending is not None:
                    wait = (
                        0.0
                        if self._closing or self._last_send is None
                        else (self._last_send + self.interval_s - self.clock())
                    )
                    if wait <= 0:
                        snapshot, self._pending = self._pending, None
                        self._last_send = self.clock()
                        return snapshot
                    self._cond.wait(wait)
                elif self._closing:
                    return None
                else:
                    self._cond.wait()

    def _run(self) -> None:
        retried_at_close = False
        while (snapshot := self._next()) is not None:
            try:
                self.sink.send(snapshot)
                self.sent += 1
            except Exception as exc:  # whatever the server or the network does, training goes on
                self.failures += 1
                if self.failures == 1:
                    log.warning(
                        "progress not reported to %s: %s (training goes on; later failures are not logged)",
                        self.sink.what,
                        _describe(exc),
                    )
                with self._cond:
                    # Try it again after the interval unless a newer one came; once more at close
                    # (the last report says the run finished), not in a loop.
                    if self._pending is None and not (self._closing and retried_at_close):
                        self._pending = snapshot
                        retried_at_close = self._closing


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    text = str(exc).splitlines()[0] if str(exc) else ""
    name = type(exc).__name__
    return f"{name} {status}: {text}" if status else f"{name}: {text}"


def reporter_from_env(
    environ: Mapping[str, str] | None = None, interval_s: float = REPORT_INTERVAL_S
) -> Reporter | None:
    """The reporter of the job this process runs in, from its environment: the TrainJob status
    server when Kubeflow Trainer set one, else the PyTorchJob's annotation when kftrain's manifest
    named the job; None where there is no job object (a local run) or no way to reach it."""
    env = os.environ if environ is None else environ
    if env.get(SERVER_URL_ENV):
        sink: Sink = TrainJobStatusSink(env[SERVER_URL_ENV], env.get(SERVER_CA_ENV, ""), env.get(SERVER_TOKEN_ENV, ""))
    elif env.get(PYTORCHJOB_NAME_ENV) and env.get(JOB_NAMESPACE_ENV):
        sink = PyTorchJobAnnotationSink(env[PYTORCHJOB_NAME_ENV], env[JOB_NAMESPACE_ENV])
    else:
        if env.get(TRAINJOB_NAME_ENV):
            log.info(
                "progress is not reported to TrainJob %s's status: %s is unset (enable the Kubeflow Trainer "
                "controller's TrainJobStatus feature gate, v2.3 or later)",
                env[TRAINJOB_NAME_ENV],
                SERVER_URL_ENV,
            )
        return None
    return Reporter(sink, interval_s=interval_s)
