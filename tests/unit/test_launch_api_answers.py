"""Answers of the Kubernetes API that are not Kubernetes objects, through the REAL kubernetes client.

The "API server" here is a STAND-IN: urllib3's `PoolManager.urlopen` (the client's transport) is
replaced by a function that answers every request 200 with a body that is not a Kubernetes
object, as an auth proxy's login page, a misconfigured ingress or another service at the
kubeconfig's address do; everything above the socket (the client's request building and its
deserialization of the answer) is the real client's. No API server can run on the test machines,
and a unit test opens no connection. What is tested: every kind of call the launcher's backend
makes (create, get, delete, list, discovery) and `kftrain job status` end with one line that
names the server, the call and what the answer looks like (trainer/launch/kubernetes.py
`api_call`), never a traceback.
"""

from __future__ import annotations

import io

import pytest
import urllib3

from trainer.config import load_config
from trainer.launch.job import training_job
from trainer.launch.kubernetes import KubernetesBackend, NotKubernetesAnswer, job_status

pytestmark = pytest.mark.timeout(60)
NAME = "kftrain-0123456789ab"
NS = "team"
SERVER = "https://k8s.example.test:6443"

#: What the stand-in answers (content type, body), and how the error line describes it.
ANSWERS = {
    "login page": (
        "text/html",
        b"<!DOCTYPE html><html><body>Sign in</body></html>",
        "an HTML page: a login or proxy page?",
    ),
    "empty body": ("text/plain", b"", "an empty body"),
    "plain text": ("text/plain", b"ok", "text that is not JSON"),
    "empty object": ("application/json", b"{}", "an empty JSON object"),
    "object without kind": ("application/json", b'{"hello": "world"}', "a JSON object without a kind"),
    "array": ("application/json", b"[1, 2]", "a JSON array"),
}


@pytest.fixture
def answer(monkeypatch) -> list[tuple[str, bytes]]:
    """The STAND-IN server: every request the client sends gets 200 and `answer[0]` (content
    type, body)."""
    answer = [("text/plain", b"")]

    def urlopen(self, method, url, body=None, headers=None, preload_content=True, **kwargs):
        content_type, data = answer[0]
        return urllib3.HTTPResponse(
            body=io.BytesIO(data),
            headers={"content-type": content_type, "content-length": str(len(data))},
            status=200,
            reason="OK",
            preload_content=preload_content,
        )

    monkeypatch.setattr(urllib3.PoolManager, "urlopen", urlopen)
    return answer


def backend_for() -> KubernetesBackend:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = SERVER
    api = client.ApiClient(configuration)
    return KubernetesBackend(
        custom_api=client.CustomObjectsApi(api), core_api=client.CoreV1Api(api), namespace=NS, owner=None
    )


def spec_for(kind: str):
    cfg = load_config(overrides={"job.kind": kind, "kubernetes.poll_seconds": 0.001})
    return training_job(cfg, NAME, "s3://bucket/ds", "s3://bucket/model")


#: Each kind of call the backend makes: (job.kind, what the backend is asked, the call named).
OPERATIONS = {
    "create": ("pytorchjob", lambda b, s: b.submit(s), f"create PyTorchJob {NS}/{NAME}"),
    "get": ("pytorchjob", lambda b, s: b.wait(s), f"get PyTorchJob {NS}/{NAME}"),
    "delete": ("pytorchjob", lambda b, s: b.cancel(s), f"delete PyTorchJob {NS}/{NAME}"),
    "list pods": ("pytorchjob", lambda b, s: b.logs(s), f"list pods of job {NS}/{NAME}"),
    "discovery": ("auto", lambda b, s: b.submit(s), "discover trainer.kubeflow.org/v1alpha1"),
}


@pytest.mark.parametrize("body", list(ANSWERS))
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_every_backend_call_names_an_answer_that_is_not_a_kubernetes_object(answer, operation, body):
    content_type, data, looks = ANSWERS[body]
    answer[0] = (content_type, data)
    kind, do, call = OPERATIONS[operation]
    with pytest.raises(NotKubernetesAnswer) as caught:
        do(backend_for(), spec_for(kind))
    message = str(caught.value)
    assert message == (
        f"the API server at {SERVER} answered {call!r} with something that is not a Kubernetes "
        f"object ({looks}); check the kubeconfig's server and credentials"
    )
    assert "Sign in" not in message  # the page's text is not echoed: a login page may hold a user's name


@pytest.mark.parametrize("body", list(ANSWERS))
def test_job_status_command_prints_one_line_for_an_answer_that_is_not_a_kubernetes_object(
    answer, body, tmp_path, monkeypatch, capsys
):
    from pipelines.cli import main

    content_type, data, looks = ANSWERS[body]
    answer[0] = (content_type, data)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{SERVER}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: team}}]\n"
        "users: [{name: u, user: {token: not-a-real-token}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: the kubeconfig is used
    assert main(["job", "status", NAME]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"kftrain: error: the API server at {SERVER} answered 'get TrainJob {NS}/{NAME}' with something "
        f"that is not a Kubernetes object ({looks}); check the kubeconfig's server and credentials"
    ]
    assert "not-a-real-token" not in err


def test_job_status_still_reads_a_real_kubernetes_object(answer):
    from kubernetes import client

    answer[0] = ("application/json", b'{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "status": {}}')
    configuration = client.Configuration()
    configuration.host = SERVER
    custom = client.CustomObjectsApi(client.ApiClient(configuration))
    out = job_status(NAME, NS, "pytorchjob", custom_api=custom).splitlines()
    assert out[0] == f"PyTorchJob {NS}/{NAME}: Created (no condition yet)"
