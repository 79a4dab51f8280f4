"""The Kubernetes launcher's logic against a FAKE API object (tests/fake_kube.py).

No Kubernetes API server can run on the test machines; the fake returns real kubernetes
client models and plays the Training Operator's part from a script. What is tested is the
launcher's own behaviour: create, re-attach, wait, Failed, Pending, timeout, cancel, SIGTERM,
and replica-prefixed log streaming.
"""

from __future__ import annotations

import signal

import pytest

from tests.fake_kube import FakeCluster
from trainer.config import load_config
from trainer.launch.backend import JobCancelled, JobFailed, JobTimeout, run_job
from trainer.launch.job import training_job
from trainer.launch.kubernetes import KubernetesBackend
from trainer.launch.preflight import ManifestError
from trainer.launch.pytorchjob import owner_reference

pytestmark = pytest.mark.timeout(60)
NAME = "kftrain-0123456789ab"


def make(cluster: FakeCluster, owner_uid: str = "uid-1", **overrides):
    cfg = load_config(overrides={"kubernetes.poll_seconds": 0.001, **overrides})
    spec = training_job(cfg, NAME, "s3://bucket/ds", "s3://bucket/model")
    lines: list[str] = []
    backend = KubernetesBackend(
        custom_api=cluster,
        core_api=cluster,
        namespace=cluster.namespace,
        owner=owner_reference("launcher-pod", owner_uid),
        log=lines.append,
        now=cluster.now,
        sleep=cluster.sleep,
    )
    return backend, spec, lines


def running_then(final):
    def start(c: FakeCluster) -> None:
        if f"{NAME}-master-0" not in c.pods:
            c.add_pod(NAME, "master", 0, "Running", logs=["[rank 0] epoch 0 loss 2.3", "[rank 0] epoch 1 loss 0.4"])
            c.add_pod(NAME, "worker", 0, "Running", logs=["[rank 1] final parameter digest abc"])

    return [start, start, final]


def test_success_streams_replica_logs_and_leaves_cleanup_to_the_policy():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded", "JobSucceeded"))
    run_job(backend, spec, timeout_s=60)
    job = cluster.jobs[NAME]
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert "[master-0] [rank 0] epoch 1 loss 0.4" in lines
    assert "[worker-0] [rank 1] final parameter digest abc" in lines
    assert ("delete", NAME) not in cluster.calls  # TTL and cleanPodPolicy clean up, not the launcher
    assert [c for c in cluster.calls if c[0] == "create"] == [("create", NAME)]


def test_a_restarted_launcher_reattaches_instead_of_creating_a_second_job():
    cluster = FakeCluster()
    first, spec, _ = make(cluster, owner_uid="uid-1")
    first.submit(spec)  # the first launcher pod dies here, its job runs on
    second, spec, lines = make(cluster, owner_uid="uid-2")
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(second, spec, timeout_s=60)
    assert len(cluster.jobs) == 1
    assert any("re-attaching" in line for line in lines)
    owners = [o["uid"] for o in cluster.jobs[NAME]["metadata"]["ownerReferences"]]
    assert owners == ["uid-1", "uid-2"]  # cancelling the retried run deletes the job too


def test_a_retry_replaces_a_job_that_already_failed():
    cluster = FakeCluster()
    first, spec, _ = make(cluster)
    first.submit(spec)
    cluster.set_condition(NAME, "Failed", "JobFailed")
    second, spec, lines = make(cluster, owner_uid="uid-2")
    second.submit(spec)
    assert [c[0] for c in cluster.calls if c[0] in ("create", "delete")] == [
        "create",
        "create",
        "delete",
        "create",
    ]
    assert "Failed" not in str(cluster.jobs[NAME]["status"])


def test_failed_job_fails_the_step_with_reason_and_the_failing_replicas_last_lines():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)

    def fail(c: FakeCluster) -> None:
        c.add_pod(
            NAME,
            "worker",
            0,
            "Failed",
            exit_code=1,
            logs=["loading shard", "RuntimeError: CUDA error: out of memory"],
        )
        c.set_condition(
            NAME,
            "Failed",
            "JobFailed",
            "PyTorchJob kftrain-0123456789ab is failed because 1 Worker replica(s) failed.",
        )

    cluster.timeline = [fail]
    with pytest.raises(JobFailed) as info:
        run_job(backend, spec, timeout_s=60)
    message = str(info.value)
    assert "failed: JobFailed: PyTorchJob kftrain-0123456789ab is failed because 1 Worker" in message
    assert "replica worker-0 (pod kftrain-0123456789ab-worker-0) exited with code 1" in message
    assert "[worker-0] RuntimeError: CUDA error: out of memory" in message
    assert NAME not in cluster.jobs  # deleted, so no pod keeps a GPU


def test_pods_pending_too_long_fail_the_step_with_their_events():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.pending_timeout_seconds": 300})

    def pending(c: FakeCluster) -> None:
        if f"{NAME}-master-0" not in c.pods:
            c.add_pod(NAME, "master", 0, "Pending")
            c.events[f"{NAME}-master-0"] = [
                ("FailedScheduling", "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")
            ]
        c.advance(100)

    cluster.timeline = [pending]
    with pytest.raises(JobFailed) as info:
        run_job(backend, spec, timeout_s=3600)
    message = str(info.value)
    assert "replica master-0" in message and "Pending for" in message
    assert "kubernetes.pending_timeout_seconds=300" in message
    assert "FailedScheduling: 0/4 nodes are available: 4 Insufficient nvidia.com/gpu." in message
    assert NAME not in cluster.jobs


def test_image_pull_errors_are_reported():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.pending_timeout_seconds": 60})
    cluster.timeline = [
        lambda c: c.add_pod(
            NAME, "master", 0, "Pending", waiting=("ImagePullBackOff", "Back-off pulling image"), age_s=120
        )
    ]
    with pytest.raises(JobFailed, match="ImagePullBackOff: Back-off pulling image"):
        run_job(backend, spec, timeout_s=3600)


def test_a_job_without_pods_for_too_long_is_reported():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.pending_timeout_seconds": 60})
    cluster.timeline = [lambda c: c.advance(30)]
    # Not queued (no suspend, no schedulingPolicy): no pods past the limit is stuck, as before.
    with pytest.raises(JobFailed, match="has no pods 60s after it was created .* the operator did not create them"):
        run_job(backend, spec, timeout_s=3600)


def test_wall_clock_deadline_deletes_the_job():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    cluster.timeline = running_then(lambda c: None)  # runs forever
    with pytest.raises(JobTimeout, match="did not finish within 0s"):
        run_job(backend, spec, timeout_s=0.2)
    assert ("delete", NAME) in cluster.calls and NAME not in cluster.jobs


def test_sigterm_deletes_the_job():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    cluster.timeline = [lambda c: None, lambda c: signal.raise_signal(signal.SIGTERM)]
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(JobCancelled):
        run_job(backend, spec, timeout_s=60)
    assert NAME not in cluster.jobs
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's handler is removed again


def test_rbac_errors_fail_clearly_and_leave_nothing():
    cluster = FakeCluster()
    cluster.fail_next("create", status=403)
    backend, spec, _ = make(cluster)
    with pytest.raises(JobFailed, match="cannot create PyTorchJob team/kftrain-0123456789ab: \\(403\\)"):
        run_job(backend, spec, timeout_s=60)
    assert not cluster.jobs


def test_preflight_failure_submits_nothing():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.tolerations": [{"key": "gpu", "efect": "NoSchedule"}]})
    with pytest.raises(ManifestError, match="tolerations\\[0\\]: Additional properties are not allowed \\('efect'"):
        run_job(backend, spec, timeout_s=60)
    assert not [c for c in cluster.calls if c[0] == "create"]


def test_logs_returns_each_replicas_tail():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    backend.submit(spec)
    cluster.add_pod(NAME, "master", 0, "Running", logs=[f"line {i}" for i in range(100)])
    assert backend.logs(spec, tail=2) == {"master-0": ["line 98", "line 99"]}


def test_a_restarted_container_gets_its_log_streamed_again():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)

    def first(c: FakeCluster) -> None:
        c.add_pod(NAME, "master", 0, "Running", logs=["attempt 1: step 10"])

    def restarted(c: FakeCluster) -> None:  # restartPolicy OnFailure: same pod, new container
        c.add_pod(NAME, "master", 0, "Running", logs=["attempt 2: resumed at step 10"], restarts=1)

    cluster.timeline = [first, first, restarted, restarted, lambda c: c.set_condition(NAME, "Succeeded")]
    run_job(backend, spec, timeout_s=60)
    assert "[master-0] attempt 1: step 10" in lines
    assert "[master-0] attempt 2: resumed at step 10" in lines


class RealClientCheck:
    """Sends every call the launcher makes through the REAL kubernetes client methods first (their
    transport stubbed out: no API server can run here), so a wrong method name, argument or
    keyword fails the test, and records the HTTP request each call would make; then answers
    from the fake cluster."""

    def __init__(self, cluster: FakeCluster) -> None:
        from kubernetes import client

        self.cluster, self.requests = cluster, []
        api_client = client.ApiClient()

        def call_api(resource_path, method, path_params=None, query_params=None, header_params=None, body=None, **kw):
            path = resource_path
            for key, value in (path_params or {}).items():
                path = path.replace("{" + key + "}", str(value))
            self.requests.append((method, path, dict(query_params or []), body))

        api_client.call_api = call_api
        self.real = [client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)]

    def __getattr__(self, name):
        real = next(getattr(api, name) for api in self.real if hasattr(api, name))

        def call(*args, **kwargs):
            real(*args, **kwargs)  # raises on an argument the real client does not take
            return getattr(self.cluster, name)(*args, **kwargs)

        return call


def test_the_launcher_calls_the_real_client_api_correctly():
    cluster = FakeCluster()
    check = RealClientCheck(cluster)
    backend, spec, lines = make(cluster)
    backend.custom = backend.core = check
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(backend, spec, timeout_s=60)
    again, _, _ = make(cluster, owner_uid="uid-2")  # a restarted launcher re-attaches (PATCH)
    again.custom = again.core = check
    again.submit(spec)
    backend.cancel(spec)
    jobs = "/apis/kubeflow.org/v1/namespaces/team/pytorchjobs"
    seen = {(m, p) for m, p, _, _ in check.requests}
    assert ("POST", jobs) in seen
    assert ("GET", f"{jobs}/{NAME}") in seen
    assert ("DELETE", f"{jobs}/{NAME}") in seen
    assert ("PATCH", f"{jobs}/{NAME}") in seen
    assert ("GET", "/api/v1/namespaces/team/pods") in seen
    assert any(m == "GET" and p.startswith("/api/v1/namespaces/team/pods/") and p.endswith("/log") for m, p in seen)
    pods_query = next(q for m, p, q, _ in check.requests if p == "/api/v1/namespaces/team/pods")
    assert pods_query == {"labelSelector": f"training.kubeflow.org/job-name={NAME}"}
    delete_query = next(q for m, p, q, _ in check.requests if m == "DELETE")
    assert delete_query == {"propagationPolicy": "Foreground"}  # pods go with the job


def test_no_owner_reference_across_namespaces():
    """A job in another namespace than the launcher pod must not name the pod as its owner:
    Kubernetes would treat the owner as absent and delete the job right away."""
    cluster = FakeCluster(namespace="gpu-jobs")
    backend, spec, _ = make(cluster, **{"kubernetes.namespace": "gpu-jobs"})
    backend._home = "kubeflow-user"  # the launcher pod runs elsewhere
    backend.submit(spec)
    assert "ownerReferences" not in cluster.jobs[NAME]["metadata"]
