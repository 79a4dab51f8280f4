"""The Kubernetes launcher with the REAL kubernetes client against an API server address that
accepts connections and never answers (a half-open connection to a dead API server or load
balancer node). No API server can run here; this socket is the one thing a real cluster does that
the fake API object cannot: block a call. Every call must give up on its own, so that the retry
budget and the job's deadline still end the step."""

from __future__ import annotations

import socket
import threading
from dataclasses import replace

import pytest

from trainer.config import load_config
from trainer.launch import kubernetes as k8s_launcher
from trainer.launch.backend import JobFailed, run_job
from trainer.launch.job import training_job

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def silent_api_server():
    """An address that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_call_to_an_api_server_that_never_answers_gives_up_and_the_step_fails(silent_api_server, monkeypatch):
    from kubernetes import client

    monkeypatch.setattr(k8s_launcher, "REQUEST_TIMEOUT_S", (0.5, 0.5))
    configuration = client.Configuration(host=silent_api_server)
    configuration.retries = 0  # urllib3's own retries would only multiply the wait
    api = client.ApiClient(configuration)
    backend = k8s_launcher.KubernetesBackend(
        custom_api=client.CustomObjectsApi(api), core_api=client.CoreV1Api(api), namespace="team", owner=None
    )
    cfg = load_config(overrides={"kubernetes.api_retry_budget_seconds": 2})
    spec = training_job(cfg, "kftrain-0123456789ab", "s3://bucket/ds", "s3://bucket/model")
    with pytest.raises(JobFailed, match=r"'create job team/kftrain-0123456789ab' kept failing for \ds .*timed out"):
        run_job(backend, replace(spec, timeout_s=600))
