"""Rank 0's progress reports (trainer/job_status.py) against FAKE API objects.

No API server or Kubeflow Trainer controller can run here. The PyTorchJob reports go to
tests/fake_kube.py's fake cluster (or a fake API object that fails on purpose); the TrainJob
reports go through an injected `urlopen` that plays the controller's status server: it checks
the request as the v2.3.0 server does (POST, path, Bearer token) and applies `trainerStatus` to
the fake cluster's TrainJob. What is tested: the payloads (validated against the vendored schema
in test_progress.py's helper), the rate limit, that a failing or hanging destination never
breaks or holds training (and is logged once), and that the launcher and `kftrain job status`
show the line rank 0 logged.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import threading
import time
import urllib.error
from dataclasses import replace

import pytest
import torch
from kubernetes.client import ApiException

from tests.fake_kube import FakeCluster, launcher
from tests.unit.test_progress import check_trainer_status
from trainer.config import load_config
from trainer.job_status import (
    JOB_NAMESPACE_ENV,
    PYTORCHJOB_NAME_ENV,
    SERVER_CA_ENV,
    SERVER_TOKEN_ENV,
    SERVER_URL_ENV,
    TRAINJOB_NAME_ENV,
    PyTorchJobAnnotationSink,
    Reporter,
    TrainJobStatusSink,
    reporter_from_env,
)
from trainer.launch.job import training_job
from trainer.launch.kubernetes import job_status
from trainer.progress import PROGRESS_ANNOTATION, Progress, Snapshot, stamp

pytestmark = pytest.mark.timeout(60)
NAME, NS = "kftrain-0123456789ab", "team"
STATUS_URL = (
    "https://kubeflow-trainer-controller-manager.kubeflow.svc:10443"
    f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs/{NAME}/status"
)


def snap(step: int, total: int = 10, **kw) -> Snapshot:
    return Snapshot(
        step=step, total_steps=total, epoch=0, loss=1.0 / step, learning_rate=1e-3, time=1_767_225_600 + step, **kw
    )


def submitted_job(kind: str = "pytorchjob") -> FakeCluster:
    cluster = FakeCluster(namespace=NS, kind=kind)
    cfg = load_config(overrides={"kubernetes.poll_seconds": 0.001, "job.kind": kind})
    launcher(cluster).submit(training_job(cfg, NAME, "s3://bucket/ds", "s3://bucket/model"))
    return cluster


class FlakyApi:
    """A FAKE CustomObjectsApi that refuses the first reports in the ways a cluster does (a 500,
    a connection reset, a 403 before the RoleBinding exists), then applies them to `cluster`."""

    def __init__(self, cluster: FakeCluster, failures: list[BaseException]) -> None:
        self.cluster, self.failures, self.calls = cluster, list(failures), 0

    def patch_namespaced_custom_object(self, *args, **kwargs):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.cluster.patch_namespaced_custom_object(*args, **kwargs)


def until(condition, timeout_s: float = 10.0) -> None:
    """Real time for the reporter's thread to catch up."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def train(progress: Progress, steps: int) -> None:
    """What the training loop does with progress: a step at a time, then close."""
    for step in range(1, steps + 1):
        progress.step(step, 0, torch.tensor(2.0), 1e-3)
    progress.close()


def progress_for(reporter, total: int) -> Progress:
    return Progress(
        total_steps=total, items_per_step=8, item_name="samples", flops_per_step=0, peak_flops=0,
        interval=1, device=torch.device("cpu"), enabled=True, reporter=reporter,
    )  # fmt: skip


def test_a_pytorchjob_gets_the_annotation_and_failures_never_break_training(caplog):
    cluster = submitted_job()
    user_annotations = {"team.example.com/owner": "ana"}  # kubernetes.annotations: the patch keeps them
    cluster.jobs[NAME]["metadata"]["annotations"] = dict(user_annotations)
    api = FlakyApi(cluster, [ApiException(status=500), ConnectionResetError("reset by peer"), ApiException(403)])
    reporter = Reporter(PyTorchJobAnnotationSink(NAME, NS, api), interval_s=0)
    progress = progress_for(reporter, total=50)
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        for step in range(1, 51):  # must not raise though the first reports fail
            progress.step(step, 0, torch.tensor(2.0), 1e-3)
        until(lambda: reporter.sent)  # a failed report is tried again: the API recovers
        progress.close()
    annotations = cluster.jobs[NAME]["metadata"]["annotations"]
    assert Snapshot.from_annotation(annotations[PROGRESS_ANNOTATION]) == progress.last
    assert {k: v for k, v in annotations.items() if k != PROGRESS_ANNOTATION} == user_annotations
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ApiException 500" in warnings[0], warnings
    assert f"PyTorchJob {NS}/{NAME}" in warnings[0] and "training goes on" in warnings[0]
    assert reporter.failures == min(3, api.calls) and reporter.sent == api.calls - reporter.failures


def test_reports_are_rate_limited_to_the_latest_snapshot():
    sent: list[Snapshot] = []

    class Sink:
        what = "a list"

        def send(self, s):
            sent.append(s)

    reporter = Reporter(Sink(), interval_s=60)
    for step in range(1, 101):
        reporter.submit(snap(step, 100))
    reporter.close()  # the latest one goes out now, not a minute later
    assert 1 <= len(sent) <= 2 and sent[-1].step == 100


def test_a_hanging_destination_holds_neither_a_step_nor_the_end_of_training():
    release = threading.Event()

    class Hang:
        what = "a server that never answers"

        def send(self, s):
            release.wait(30)

    reporter = Reporter(Hang(), interval_s=0, close_timeout_s=0.2)
    progress = progress_for(reporter, total=20)
    start = time.monotonic()
    train(progress, 20)
    assert time.monotonic() - start < 5
    release.set()


class StatusServer:
    """A FAKE of Kubeflow Trainer v2.3.0's status server, as an injected `urlopen`: POST to
    `/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status` with the pod's
    projected token as a Bearer credential; the body's `trainerStatus` is applied to the fake
    cluster's TrainJob (the controller's server-side apply). Token checks stand in for the OIDC
    verification: the current token file's content is the only valid one."""

    def __init__(self, cluster: FakeCluster, token_file) -> None:
        self.cluster, self.token_file, self.requests = cluster, token_file, []

    def __call__(self, request, timeout=None, context=None):
        self.requests.append((request, timeout, context))
        prefix = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/"
        path = request.full_url.split(".svc:10443", 1)[1]
        assert request.get_method() == "POST" and path.startswith(prefix) and path.endswith("/status")
        ns, _, name, _ = path.removeprefix(prefix).split("/")
        if request.get_header("Authorization") != f"Bearer {self.token_file.read_text().strip()}":
            raise urllib.error.HTTPError(request.full_url, 403, "Forbidden", {}, io.BytesIO(b"{}"))
        body = json.loads(request.data)
        check_trainer_status(body["trainerStatus"])  # else the API server answers 422
        assert request.get_header("Content-type") == "application/json"
        self.cluster.jobs[name].setdefault("status", {})["trainerStatus"] = body["trainerStatus"]
        return io.BytesIO(request.data)


def test_a_trainjob_status_is_posted_to_the_status_server_with_the_current_token(tmp_path, monkeypatch):
    cluster = submitted_job("trainjob")
    token = tmp_path / "token"
    token.write_text("jwt-1\n")
    server = StatusServer(cluster, token)
    contexts = []
    monkeypatch.setattr("ssl.create_default_context", lambda cafile=None: contexts.append(cafile) or "ctx")
    sink = TrainJobStatusSink(STATUS_URL, str(tmp_path / "ca.crt"), str(token), urlopen=server)
    sink.send(snap(3))
    token.write_text("jwt-2\n")  # the kubelet rotated it: the next request carries the new one
    sink.send(snap(4))
    assert [r.get_header("Authorization") for r, _, _ in server.requests] == ["Bearer jwt-1", "Bearer jwt-2"]
    assert contexts == [str(tmp_path / "ca.crt")]  # the controller's CA, loaded once
    assert all(timeout == 5.0 and context == "ctx" for _, timeout, context in server.requests)
    status = cluster.jobs[NAME]["status"]["trainerStatus"]
    assert Snapshot.from_trainer_status(status) == snap(4)
    token.write_text("someone-else")
    server.token_file = tmp_path / "other"
    (tmp_path / "other").write_text("valid")
    with pytest.raises(urllib.error.HTTPError):
        sink.send(snap(5))  # a refusal raises here; the Reporter logs it once and goes on


@pytest.mark.parametrize(
    ("env", "sink_type", "logged"),
    [
        ({SERVER_URL_ENV: STATUS_URL, SERVER_CA_ENV: "/ca", SERVER_TOKEN_ENV: "/t"}, TrainJobStatusSink, ""),
        (  # Trainer's variables win: a TrainJob pod carries kftrain's too
            {SERVER_URL_ENV: STATUS_URL, TRAINJOB_NAME_ENV: NAME, JOB_NAMESPACE_ENV: NS},
            TrainJobStatusSink,
            "",
        ),
        ({PYTORCHJOB_NAME_ENV: NAME, JOB_NAMESPACE_ENV: NS}, PyTorchJobAnnotationSink, ""),
        ({TRAINJOB_NAME_ENV: NAME, JOB_NAMESPACE_ENV: NS}, None, "TrainJobStatus feature gate"),
        ({PYTORCHJOB_NAME_ENV: NAME}, None, ""),  # no namespace: the manifest was not kftrain's
        ({}, None, ""),  # a local run: no job object
    ],
)
def test_the_environment_chooses_where_reports_go(env, sink_type, logged, caplog):
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        reporter = reporter_from_env(env)
    if sink_type is None:
        assert reporter is None
    else:
        assert isinstance(reporter.sink, sink_type)
        reporter.close()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert (logged in messages) if logged else not messages


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_the_log_the_launcher_and_job_status_show_one_line(kind, tmp_path, caplog):
    """Rank 0 trains and reports (to the annotation or the status server); the launcher waiting
    on the job prints the line rank 0 logged, and so does `kftrain job status`."""
    cluster = submitted_job(kind)
    if kind == "trainjob":
        token = tmp_path / "token"
        token.write_text("jwt")
        sink = TrainJobStatusSink(
            STATUS_URL.replace("https", "http"), "", str(token), urlopen=StatusServer(cluster, token)
        )
    else:
        sink = PyTorchJobAnnotationSink(NAME, NS, cluster)
    progress = progress_for(Reporter(sink, interval_s=0), total=6)
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        for step in (1, 2, 3):
            progress.step(step, 0, torch.tensor(2.0), 1e-3)
        progress.reporter.close()  # what was submitted has reached the job
    logged = caplog.records[-1].getMessage()

    lines: list[str] = []
    backend = launcher(cluster, log=lines.append)
    cfg = load_config(overrides={"kubernetes.poll_seconds": 0.001, "job.kind": kind})
    spec = replace(training_job(cfg, NAME, "s3://bucket/ds", "s3://bucket/model"), timeout_s=60)
    cluster.timeline = [
        lambda c: None,
        lambda c: c.set_condition(NAME, "Succeeded" if kind == "pytorchjob" else "Complete"),
    ]
    backend.wait(spec)
    shown = [line for line in lines if " progress: " in line]
    assert shown == [f"kftrain: {'PyTorchJob' if kind == 'pytorchjob' else 'TrainJob'} {NAME} progress: {logged}"]

    when = dt.datetime.fromtimestamp(progress.last.time + 75, dt.timezone.utc)
    out = job_status(NAME, NS, kind, custom_api=cluster, now=lambda: when).splitlines()
    assert out[1:] == [f"progress: {logged}", f"reported: {stamp(progress.last.time)} (1m15s ago)"]
