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


def test_a_call_to_an_api_server_that_never_answers_gives_up_and_the_step_fails(
    silent_api_server, monkeypatch, tmp_path
):
    # The launcher's own clients, from a kubeconfig as off-cluster: its timeouts and retries.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{silent_api_server}"}}}}]
users: [{{name: u, user: {{token: not-a-real-token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: team}}}}]
current-context: x
"""
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(k8s_launcher, "REQUEST_TIMEOUT_S", (0.5, 0.5))  # the name the launcher reads
    backend = k8s_launcher.KubernetesBackend(namespace="team", owner=None)
    cfg = load_config(overrides={"kubernetes.api_retry_budget_seconds": 2})
    spec = training_job(cfg, "kftrain-0123456789ab", "s3://bucket/ds", "s3://bucket/model")
    assert backend.custom.api_client.configuration.retries == 0  # ApiRetry's retries only, not urllib3's too
    with pytest.raises(
        JobFailed, match=r"'create PyTorchJob team/kftrain-0123456789ab' kept failing for \d+s .*timed out"
    ):
        run_job(backend, replace(spec, timeout_s=600))
