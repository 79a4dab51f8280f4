"""The Kubernetes launcher's logic against a FAKE API object (tests/fake_kube.py).

No Kubernetes API server can run on the test machines; the fake returns real kubernetes
client models and plays the Training Operator's part from a script. What is tested is the
launcher's own behaviour: create, re-attach, wait, Failed, Pending, timeout, cancel, SIGTERM,
replica-prefixed log streaming (per pod uid), transient API errors retried vs final ones
failing, queued (suspended / gang-scheduled) jobs, and the progress rank 0 reports on the job
(printed by the launcher and `kftrain job status`). Time is the fake's clock: the launcher's
`sleep` advances it, so retry budgets and queue times of hours run in milliseconds.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import time
from dataclasses import replace

import pytest
import urllib3

from tests.fake_kube import T0, FakeCluster, api_error, launcher
from trainer.config import load_config
from trainer.errors import one_line
from trainer.launch.backend import JobCancelled, JobFailed, JobTimeout, run_job
from trainer.launch.job import training_job
from trainer.launch.preflight import ManifestError
from trainer.launch.retry import ApiUnavailable

pytestmark = pytest.mark.timeout(60)
NAME = "kftrain-0123456789ab"


def make(cluster: FakeCluster, owner_uid: str = "uid-1", **overrides):
    cfg = load_config(overrides={"kubernetes.poll_seconds": 0.001, **overrides})
    spec = training_job(cfg, NAME, "s3://bucket/ds", "s3://bucket/model")
    lines: list[str] = []
    backend = launcher(cluster, owner_uid, lines.append)
    return backend, spec, lines


def running_then(final):
    def start(c: FakeCluster) -> None:
        if f"{NAME}-master-0" not in c.pods:
            c.add_pod(NAME, "master", 0, "Running", logs=["[rank 0] epoch 0 loss 2.3", "[rank 0] epoch 1 loss 0.4"])
            c.add_pod(NAME, "worker", 0, "Running", logs=["[rank 1] final parameter digest abc"])

    return [start, start, final]


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


# -- transient vs final ----------------------------------------------------------------------


def retry_sleeps(cluster: FakeCluster) -> list[float]:
    """The launcher's sleeps that were retry backoffs, not polls (polls are 0.001 s here)."""
    return [s for s in cluster.sleeps if s > 0.01]


def inject_at_first_poll(call: str, **fault):
    """A timeline step that schedules a fault once the job runs, then plays the usual script."""
    script = running_then(lambda c: c.set_condition(NAME, "Succeeded"))

    def first(c: FakeCluster) -> None:
        c.fail_next(call, **fault)
        script[0](c)

    return [first, *script[1:]]


# -- queued is not stuck ---------------------------------------------------------------------


def queue_script(queued_polls: int, after: list) -> list:
    """Kueue holds the job for `queued_polls` polls of 100 s, admits it, then `after` plays."""
    return [*[lambda c: c.advance(100)] * queued_polls, lambda c: c.admit(NAME), *after]


# -- logs by pod uid -------------------------------------------------------------------------


def until(condition, timeout_s: float = 5.0) -> None:
    """Real time for a log-stream thread to catch up (it runs beside the fake clock)."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_success_streams_replica_logs_and_leaves_cleanup_to_the_policy():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded", "JobSucceeded"))
    run_job(backend, replace(spec, timeout_s=60))
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
    run_job(second, replace(spec, timeout_s=60))
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
        run_job(backend, replace(spec, timeout_s=60))
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
        run_job(backend, replace(spec, timeout_s=3600))
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
        run_job(backend, replace(spec, timeout_s=3600))


@pytest.mark.parametrize(("budget", "creates"), [(0, 1), (2, 3)])
def test_an_image_pull_budget_re_creates_a_job_whose_pods_cannot_pull(budget, creates):
    """The operator never marks such a job Failed (its pods stay Pending): the budget is spent on
    the Pending limit (was: never read, whatever kubernetes.max_restarts_by_cause.image_pull said)."""
    cluster = FakeCluster()
    backend, spec, lines = make(
        cluster,
        **{"kubernetes.pending_timeout_seconds": 60, "kubernetes.max_restarts_by_cause": {"image_pull": budget}},
    )

    def pull_fails(c: FakeCluster) -> None:
        if f"{NAME}-master-0" not in c.pods and NAME in c.jobs:
            c.add_pod(NAME, "master", 0, "Pending", waiting=("ImagePullBackOff", "Back-off pulling image"), age_s=120)

    cluster.timeline = [pull_fails] * 50
    with pytest.raises(JobFailed) as info:
        run_job(backend, replace(spec, timeout_s=36000))
    assert [c for c in cluster.calls if c[0] == "create"] == [("create", NAME)] * creates
    said = "is 0)" if budget == 0 else f"its {budget} re-creation(s) for image_pull are spent"
    assert "ImagePullBackOff: Back-off pulling image" in str(info.value) and said in str(info.value), info.value
    assert NAME not in cluster.jobs
    # A job whose pods never started did not fail (was: "failed: image_pull ...; re-creating it").
    recreated = [line for line in lines if "re-creating it" in line]
    assert len(recreated) == creates - 1 and all(f"PyTorchJob {NAME} cannot run: " in x for x in recreated)


def test_a_job_without_pods_for_too_long_is_reported():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.pending_timeout_seconds": 60})
    cluster.timeline = [lambda c: c.advance(30)]
    # Not queued (no suspend, no schedulingPolicy): no pods past the limit is stuck, as before.
    with pytest.raises(JobFailed, match="has no pods 60s after it was created .* the operator did not create them"):
        run_job(backend, replace(spec, timeout_s=3600))


def test_wall_clock_deadline_deletes_the_job():
    cluster = FakeCluster()
    # Polls of 0.1 s (on the fake's clock): a dozen of them reach the deadline, not a thousand.
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 0.1})
    cluster.timeline = running_then(lambda c: None)  # runs forever
    with pytest.raises(JobTimeout, match="did not finish within 1s"):
        run_job(backend, replace(spec, timeout_s=1))
    assert ("delete", NAME) in cluster.calls and NAME not in cluster.jobs


def test_sigterm_deletes_the_job_before_any_other_call():
    """A KFP run's termination signals the step's whole process group (Argo's executor): KFP's
    launcher and the `sh -ec` wrapper exit at once, and the container with them about a second
    later, killing this process. So the delete is the first call after the signal: no log or
    event read may come before it."""
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    signalled_at: list[int] = []

    def terminate(c: FakeCluster) -> None:
        signalled_at.append(len(c.calls))
        signal.raise_signal(signal.SIGTERM)

    cluster.timeline = [running_then(lambda c: None)[0], terminate]
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(JobCancelled):
        run_job(backend, replace(spec, timeout_s=60))
    assert NAME not in cluster.jobs
    assert cluster.calls[signalled_at[0]] == ("delete", NAME), cluster.calls[signalled_at[0] :]
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's handler is removed again


def test_rbac_errors_fail_clearly_and_leave_nothing():
    cluster = FakeCluster()
    cluster.fail_next("create", status=403)
    backend, spec, _ = make(cluster)
    with pytest.raises(
        JobFailed, match="refused 'create PyTorchJob team/kftrain-0123456789ab': \\(403\\) Forbidden \\(the run's"
    ):
        run_job(backend, replace(spec, timeout_s=60))
    assert not cluster.jobs


def test_a_refused_create_says_nothing_of_a_job_that_may_still_run():
    """The service account that may not create a job usually may not delete one either: the
    cancel's refusal once added "it may still run: delete it by hand" about a job never made."""
    cluster = FakeCluster()
    cluster.fail_next("create", status=403)
    cluster.fail_next("delete", status=403)
    backend, spec, _ = make(cluster)
    with pytest.raises(JobFailed) as info:
        run_job(backend, replace(spec, timeout_s=60))
    assert not getattr(info.value, "__notes__", None), info.value.__notes__
    assert ("delete", NAME) not in cluster.calls and not cluster.jobs


@pytest.mark.parametrize("field", ["job.timeout_seconds", "timeout_seconds"], ids=["config", "byo-component"])
def test_a_timeout_names_the_setting_the_limit_came_from(field):
    """(was: `job.timeout_seconds` for the pytorchjob component too, which has no config)"""
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 0.1})
    cluster.timeline = running_then(lambda c: None)  # runs forever
    with pytest.raises(JobTimeout) as info:
        run_job(backend, replace(spec, timeout_s=1, timeout_field=field))
    assert str(info.value).endswith(f"did not finish within 1s ({field}); deleting it")


def test_a_delete_the_api_refuses_is_one_line_naming_the_call():
    """After a timeout: the step's error says the job may still run, and why, in one line (was:
    "(403) (the lines above it in the log say more)"; and the timeout said it "has been deleted")."""
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 0.1})
    cluster.timeline = running_then(lambda c: None)  # runs forever
    cluster.fail_next("delete", status=403)
    with pytest.raises(JobTimeout) as info:
        run_job(backend, replace(spec, timeout_s=1))
    assert str(info.value).endswith("did not finish within 1s (job.timeout_seconds); deleting it")
    (note,) = info.value.__notes__
    assert note.startswith(
        "cancelling the job failed too, so it may still run: delete it by hand (the Kubernetes API refused "
        "'delete PyTorchJob team/kftrain-0123456789ab': (403) Forbidden (the run's service account lacks RBAC"
    ), note


def test_preflight_failure_submits_nothing():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.tolerations": [{"key": "gpu", "efect": "NoSchedule"}]})
    with pytest.raises(ManifestError, match="tolerations\\[0\\]: Additional properties are not allowed \\('efect'"):
        run_job(backend, replace(spec, timeout_s=60))
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
    run_job(backend, replace(spec, timeout_s=60))
    assert "[master-0] attempt 1: step 10" in lines
    assert "[master-0] attempt 2: resumed at step 10" in lines


def test_the_launcher_calls_the_real_client_api_correctly():
    cluster = FakeCluster()
    check = RealClientCheck(cluster)
    backend, spec, lines = make(cluster)
    backend.custom = backend.core = check
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(backend, replace(spec, timeout_s=60))
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
    backend, spec, lines = make(cluster, **{"kubernetes.namespace": "gpu-jobs"})
    backend._home = "kubeflow-user"  # the launcher pod runs elsewhere
    backend.submit(spec)
    assert "ownerReferences" not in cluster.jobs[NAME]["metadata"]
    assert any(
        "warning" in line and "runs in namespace gpu-jobs, not in the launcher pod's kubeflow-user" in line
        for line in lines
    )


@pytest.mark.parametrize("owned", [True, False], ids=["owned", "no-pod-env"])
def test_a_job_without_an_owner_is_created_with_a_warning_saying_what_it_costs(owned):
    """A pipeline of the user's own that leaves out launcher_task_options gives the launcher no
    pod name and uid: the job is created anyway, with one warning that says so and how to fix it."""
    cluster = FakeCluster()
    lines: list[str] = []
    backend = launcher(cluster, "uid-1" if owned else None, lines.append)
    spec = make(cluster)[1]
    backend.submit(spec)
    warned = [line for line in lines if "warning" in line]
    if owned:
        assert not warned
        return
    assert len(warned) == 1, lines
    assert "KFTRAIN_POD_NAME and KFTRAIN_POD_UID are not set" in warned[0]
    assert "launcher_task_options" in warned[0] and "job.timeout_seconds" in warned[0]
    assert "ownerReferences" not in cluster.jobs[NAME]["metadata"]


@pytest.mark.parametrize(
    ("call", "fault"),
    [
        ("get", {"status": 503, "times": 8}),  # an API server restart during the wait
        ("get", {"status": 500, "times": 2}),
        ("get", {"exc": TimeoutError, "times": 2}),
        ("list_pods", {"exc": ConnectionResetError, "times": 3}),
        ("list_pods", {"exc": urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError())}),
        ("list_pods", {"status": 504, "times": 2}),
    ],
)
def test_transient_api_errors_while_waiting_are_retried_and_the_job_survives(call, fault):
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = inject_at_first_poll(call, **fault)
    run_job(backend, replace(spec, timeout_s=3600))
    assert NAME in cluster.jobs and ("delete", NAME) not in cluster.calls
    retries = [line for line in lines if line.startswith("kftrain: API ")]
    assert len(retries) == fault.get("times", 1)
    what = "get PyTorchJob team/" if call == "get" else "list pods of job team/"
    assert all(what + NAME in line and "retrying in" in line for line in retries)
    sleeps = retry_sleeps(cluster)
    # capped exponential backoff with jitter: 1, 2, 4, ... 30 s, each scaled by 0.5-1.0
    assert all(0.5 * min(30, 2**i) <= s <= min(30, 2**i) for i, s in enumerate(sleeps)), sleeps


def test_a_503_storm_logs_the_status_and_backs_off():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = inject_at_first_poll("get", status=503, times=8)
    run_job(backend, replace(spec, timeout_s=3600))
    assert any(line.startswith(f"kftrain: API get PyTorchJob team/{NAME} returned 503; retrying in") for line in lines)
    sleeps = retry_sleeps(cluster)
    assert len(sleeps) == 8 and max(sleeps) <= 30 and sleeps[-1] >= 15  # grew to the cap's half at least


def test_429_waits_as_long_as_retry_after_says():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = inject_at_first_poll("get", status=429, times=2, headers={"Retry-After": "7"})
    run_job(backend, replace(spec, timeout_s=3600))
    assert retry_sleeps(cluster) == [7.0, 7.0]
    assert f"kftrain: API get PyTorchJob team/{NAME} returned 429; retrying in 7.0s (Retry-After)" in lines


@pytest.mark.parametrize(
    "fault",
    [
        {"exc": ConnectionResetError, "times": 2},
        {"status": 503, "times": 3},
        {"exc": urllib3.exceptions.MaxRetryError(None, "/apis", reason=ConnectionRefusedError())},
    ],
)
def test_transient_errors_on_create_are_retried(fault):
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.fail_next("create", **fault)
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(backend, replace(spec, timeout_s=3600))
    assert [c for c in cluster.calls if c[0] == "create"] == [("create", NAME)] * (fault.get("times", 1) + 1)
    assert f"kftrain: created PyTorchJob team/{NAME}" in lines


def test_a_create_whose_answer_was_lost_reattaches_to_the_job_it_made():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.fail_next("create", exc=ConnectionResetError, applied=True)  # created, then the reply is lost
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(backend, replace(spec, timeout_s=3600))
    assert len(cluster.jobs) == 1 and any("re-attaching" in line for line in lines)
    assert ("delete", NAME) not in cluster.calls


@pytest.mark.parametrize("status", [400, 401, 403, 422])
def test_a_final_4xx_on_create_fails_at_once_without_retrying(status):
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.fail_next("create", status=status, times=5)
    with pytest.raises(
        JobFailed, match=rf"the Kubernetes API refused 'create PyTorchJob team/{NAME}': \({status}\) \w"
    ):
        run_job(backend, replace(spec, timeout_s=60))
    assert [c for c in cluster.calls if c[0] == "create"] == [("create", NAME)]
    assert not retry_sleeps(cluster) and not any(line.startswith("kftrain: API") for line in lines)


def test_a_final_4xx_while_waiting_fails_and_deletes_the_job():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    cluster.timeline = inject_at_first_poll("get", status=403, times=5)  # RBAC revoked mid-run
    with pytest.raises(
        JobFailed,
        match=rf"refused 'get PyTorchJob team/{NAME}' while .*: \(403\) Forbidden \(the run's service account lacks",
    ):
        run_job(backend, replace(spec, timeout_s=3600))
    assert not retry_sleeps(cluster) and NAME not in cluster.jobs


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ({"status": 503}, r"\(503\) Service Unavailable"),
        ({"exc": ConnectionRefusedError("[Errno 111] Connection refused")}, "ConnectionRefusedError: .*refused"),
    ],
)
def test_an_outage_longer_than_the_budget_fails_naming_the_call_and_deletes_the_job(fault, cause):
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.api_retry_budget_seconds": 120})
    cluster.timeline = inject_at_first_poll("get", times=10_000, **fault)
    with pytest.raises(ApiUnavailable) as info:
        run_job(backend, replace(spec, timeout_s=3600))
    pattern = (
        rf"Kubernetes API call 'get PyTorchJob team/{NAME}' kept failing for 12\ds "
        rf"\(kubernetes.api_retry_budget_seconds=120\); last error: {cause}"
    )
    assert re.search(pattern, str(info.value)), str(info.value)
    assert 100 <= sum(retry_sleeps(cluster)) <= 121
    assert NAME not in cluster.jobs  # the delete is a different call: it went through


def test_retry_after_beyond_the_budget_is_a_final_answer():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.api_retry_budget_seconds": 60})
    cluster.timeline = inject_at_first_poll("get", status=429, headers={"Retry-After": "600"})
    # Was: "kept failing for 0s", where the server's answer was to wait longer than is left.
    with pytest.raises(
        ApiUnavailable,
        match=r"failed, and the server asked to wait 600s, past what is left \(60s .*last error: \(429\) Too Many",
    ):
        run_job(backend, replace(spec, timeout_s=3600))
    assert not retry_sleeps(cluster)


def test_retries_stop_at_the_jobs_deadline():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)  # budget 300 s, deadline 100 s
    cluster.timeline = inject_at_first_poll("get", status=503, times=10_000)
    with pytest.raises(JobTimeout, match=r"did not finish within 100s .* kept failing .* until the job's deadline"):
        run_job(backend, replace(spec, timeout_s=100))
    assert cluster.clock - T0 <= dt.timedelta(seconds=101)
    assert NAME not in cluster.jobs


def test_a_failing_cancel_does_not_hide_why_the_step_failed():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.api_retry_budget_seconds": 30})

    def fail(c: FakeCluster) -> None:
        c.set_condition(NAME, "Failed", "JobFailed", "1 Worker replica(s) failed.")
        c.fail_next("delete", status=503, times=10_000)

    cluster.timeline = [fail]
    with pytest.raises(JobFailed, match="failed: JobFailed: 1 Worker") as info:
        run_job(backend, replace(spec, timeout_s=3600))
    assert any("cancelling the job failed too" in note for note in info.value.__notes__)
    # The step's last line, the one a user reads, says the job may still run and names it.
    last = one_line(info.value)
    assert last.startswith(f"PyTorchJob {NAME} failed"), last
    assert "cancelling the job failed too, so it may still run: delete it by hand" in last, last
    assert f"delete PyTorchJob team/{NAME}" in last and "\n" not in last, last


def test_a_pod_waiting_on_its_init_container_says_why():
    """Was: "has been Pending for 300s" with no reason, for a pod whose init container could not pull."""
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.pending_timeout_seconds": 300})

    def pending(c: FakeCluster) -> None:
        c.add_pod(NAME, "master", 0, "Pending", init_waiting=("ImagePullBackOff", 'Back-off pulling image "fetch:1"'))
        c.advance(100)

    cluster.timeline = [pending]
    with pytest.raises(JobFailed) as info:
        run_job(backend, replace(spec, timeout_s=3600))
    assert (
        'Pending for 300s (kubernetes.pending_timeout_seconds=300) (ImagePullBackOff: Back-off pulling image "fetch:1")'
        in str(info.value)
    )


def test_a_queued_job_is_reported_and_its_pending_clock_starts_at_admission():
    cluster = FakeCluster(kueue=True)
    backend, spec, lines = make(cluster, **{"kubernetes.queue": "team-a", "kubernetes.pending_timeout_seconds": 300})

    def pending(c: FakeCluster) -> None:
        c.add_pod(NAME, "master", 0, "Pending")
        c.advance(100)

    cluster.timeline = queue_script(
        20,  # 2000 s in the queue: far past pending_timeout_seconds
        [
            lambda c: c.advance(100),  # admitted, the operator has not made pods yet: 200 s
            lambda c: c.advance(100),
            pending,
            lambda c: c.add_pod(NAME, "master", 0, "Running", logs=["[rank 0] epoch 1 loss 0.4"]),
            lambda c: c.set_condition(NAME, "Succeeded"),
        ],
    )
    run_job(backend, replace(spec, timeout_s=7200))
    queued = [line for line in lines if " is queued in " in line]
    assert queued == [
        f"kftrain: PyTorchJob {NAME} is queued in queue team-a (kueue.x-k8s.io/queue-name): suspended until "
        "the queue admits it; the Pending clock starts when it is admitted"
    ]
    assert [line for line in lines if " admitted from " in line] == [
        f"kftrain: PyTorchJob {NAME} admitted from queue team-a (kueue.x-k8s.io/queue-name) after 2000s"
    ]
    assert "[master-0] [rank 0] epoch 1 loss 0.4" in lines and ("delete", NAME) not in cluster.calls


@pytest.mark.parametrize(
    ("after_admission", "message"),
    [
        ([lambda c: c.advance(100)], r"has no pods 30\ds after it was admitted"),
        (
            [lambda c: (c.add_pod(NAME, "master", 0, "Pending"), c.advance(100))],
            r"replica master-0 .* has been Pending for 30\ds \(kubernetes.pending_timeout_seconds=300\)",
        ),
    ],
)
def test_after_admission_the_pending_limit_applies_as_before(after_admission, message):
    cluster = FakeCluster(kueue=True)
    backend, spec, _ = make(cluster, **{"kubernetes.queue": "team-a", "kubernetes.pending_timeout_seconds": 300})
    cluster.timeline = queue_script(20, after_admission)
    with pytest.raises(JobFailed, match=message):
        run_job(backend, replace(spec, timeout_s=7200))
    assert cluster.clock - T0 < dt.timedelta(seconds=2000 + 500)  # failed ~300 s after admission
    assert NAME not in cluster.jobs


def test_the_queue_limit_when_set_fails_naming_the_queue():
    cluster = FakeCluster(kueue=True)
    backend, spec, _ = make(cluster, **{"kubernetes.queue": "team-a", "kubernetes.queue_timeout_seconds": 600})
    cluster.events[NAME] = [("Suspended", "Workload is waiting for quota")]
    cluster.timeline = [lambda c: c.advance(100)]  # never admitted
    with pytest.raises(JobFailed) as info:
        run_job(backend, replace(spec, timeout_s=7200))
    assert re.search(
        rf"PyTorchJob {NAME} waited 6\d\ds in queue team-a \(kueue.x-k8s.io/queue-name\) \(suspended until the "
        r"queue admits it\) without being admitted "
        r"\(kubernetes.queue_timeout_seconds=600\). Events: Suspended: Workload is waiting for quota",
        str(info.value),
    ), str(info.value)
    assert NAME not in cluster.jobs


def test_a_gang_scheduled_job_without_pods_is_queued_not_stuck():
    cluster = FakeCluster()
    overrides = {"kubernetes.scheduling_queue": "gpu", "kubernetes.min_available": 2}
    backend, spec, lines = make(cluster, **{"kubernetes.pending_timeout_seconds": 300, **overrides})
    # Volcano: the operator makes no pods until the PodGroup is admitted (here after 2000 s).
    cluster.timeline = [
        *[lambda c: c.advance(100)] * 20,
        *running_then(lambda c: c.set_condition(NAME, "Succeeded")),
    ]
    run_job(backend, replace(spec, timeout_s=7200))
    assert any(
        "is queued in queue gpu (runPolicy.schedulingPolicy.queue): no pods until the gang scheduler" in line
        for line in lines
    )
    assert any("admitted from queue gpu" in line for line in lines)


def test_a_preempted_job_is_reported_queued_again_and_readmitted():
    cluster = FakeCluster(kueue=True)
    backend, spec, lines = make(cluster, **{"kubernetes.queue": "team-a", "kubernetes.pending_timeout_seconds": 300})
    start = running_then(lambda c: None)[0]
    cluster.timeline = queue_script(
        3,
        [
            start,
            start,
            lambda c: c.suspend(NAME),  # Kueue preempts: pods deleted, job suspended again
            *queue_script(20, running_then(lambda c: c.set_condition(NAME, "Succeeded"))),
        ],
    )
    run_job(backend, replace(spec, timeout_s=7200))
    assert len([line for line in lines if " is queued in " in line]) == 2
    assert len([line for line in lines if " admitted from " in line]) == 2


def test_a_pod_recreated_under_the_same_name_gets_its_log_streamed():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, **{"kubernetes.restart_policy": "ExitCode"})

    def first(c: FakeCluster) -> None:
        if f"{NAME}-master-0" not in c.pods:
            c.add_pod(NAME, "master", 0, "Running", logs=["attempt 1: step 10"])

    def recreated(c: FakeCluster) -> None:
        until(lambda: "[master-0] attempt 1: step 10" in lines)  # the old pod's stream has been read
        old_uid = c.pods[f"{NAME}-master-0"].metadata.uid
        # exit 137 is retryable under ExitCode: the operator deletes the pod and makes a new one
        c.recreate_pod(NAME, "master", 0, "Running", logs=["attempt 2: resumed at step 10"])
        assert c.pods[f"{NAME}-master-0"].metadata.uid != old_uid

    cluster.timeline = [first, first, recreated, lambda c: None, lambda c: c.set_condition(NAME, "Succeeded")]
    run_job(backend, replace(spec, timeout_s=60))
    assert "[master-0] attempt 1: step 10" in lines
    assert "[master-0] attempt 2: resumed at step 10" in lines  # same replica prefix, new stream


@pytest.mark.parametrize(
    "fault",
    [
        {"status": 400},  # e.g. `container "pytorch" in pod ... is waiting to start`
        {"exc": RuntimeError("stream decoder failed")},
    ],
)
def test_a_failing_log_stream_never_fails_the_launcher(fault):
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.fail_next("read_log", **fault)
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(backend, replace(spec, timeout_s=60))
    assert any("(log stream ended:" in line for line in lines)
    assert NAME in cluster.jobs and ("delete", NAME) not in cluster.calls


def test_replicas_are_listed_in_replica_order_not_text_order():
    from trainer.launch.kubernetes import _replica_order

    names = ["worker-10", "master-0", "worker-2", "node-0-10", "node-0-9", "worker-1"]
    assert sorted(names, key=_replica_order) == [
        "master-0",
        "node-0-9",
        "node-0-10",
        "worker-1",
        "worker-2",
        "worker-10",
    ]


# -- progress on the job: the launcher's line and `kftrain job status` ---------------------


def test_the_launcher_prints_reported_progress_once_per_change():
    from trainer.progress import PROGRESS_ANNOTATION, Snapshot

    cluster = FakeCluster()
    backend, spec, lines = make(cluster)

    def report(step):
        def play(c: FakeCluster) -> None:  # what rank 0's reporter does (tests/unit/test_job_status.py)
            note = Snapshot(step=step, total_steps=4, loss=0.5, time=1_767_225_600 + step).annotation()
            c.patch_namespaced_custom_object(
                "kubeflow.org",
                "v1",
                c.namespace,
                "pytorchjobs",
                NAME,
                {"metadata": {"annotations": {PROGRESS_ANNOTATION: note}}},
            )

        return play

    cluster.timeline = [report(1), lambda c: None, report(3), lambda c: c.set_condition(NAME, "Succeeded")]
    run_job(backend, replace(spec, timeout_s=60))
    assert [line for line in lines if "progress:" in line] == [
        f"kftrain: PyTorchJob {NAME} progress: step 1/4 (25%) loss 0.5000",
        f"kftrain: PyTorchJob {NAME} progress: step 3/4 (75%) loss 0.5000",
    ]


def test_job_status_names_the_job_its_state_and_that_no_progress_came_yet():
    from trainer.launch.kubernetes import job_status

    for kind, expect, state in (
        ("pytorchjob", "PyTorchJob", "Running (JobRunning)"),
        ("trainjob", "TrainJob", "Running (child Jobs ready: node 1/1)"),
    ):
        cluster = FakeCluster(kind=kind)
        backend, spec, _ = make(cluster, **{"job.kind": kind})
        backend.submit(spec)
        if kind == "trainjob":  # no Running condition: its child Jobs say it runs
            cluster.set_child_jobs(NAME, active=1, ready=1)
        else:
            cluster.set_condition(NAME, "Running", "JobRunning")
        out = job_status(NAME, cluster.namespace, "auto", custom_api=cluster).splitlines()
        assert out[0] == f"{expect} team/{NAME}: {state}"
        hint = "TrainJobStatus feature gate" if kind == "trainjob" else "kftrain-trainer Role"
        assert out[1].startswith("progress: none reported yet") and hint in out[1]


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (None, "no TrainJob or PyTorchJob named 'nope' in namespace 'team'"),
        ({"status": 403}, "cannot read TrainJob team/nope: (403) Forbidden (your account lacks RBAC to read it)"),
        # No answer at all (was: "cannot read TrainJob ...: MaxRetryError: HTTPSConnectionPool(host=...", of a
        # kind the user never named, with no fix).
        (
            {"exc": ConnectionRefusedError(111, "Connection refused")},
            "cannot reach the Kubernetes API server (Connection refused): check the kubeconfig's current context",
        ),
        (
            {"exc": urllib3.exceptions.MaxRetryError(None, "/apis", OSError(-2, "Name or service not known"))},
            "cannot reach the Kubernetes API server (Name or service not known): check the kubeconfig",
        ),
    ],
    ids=["missing", "forbidden", "refused", "no-such-host"],
)
def test_job_status_errors_are_one_line_that_says_what_to_fix(fault, message):
    from trainer.launch.kubernetes import JobStatusError, job_status

    cluster = FakeCluster()  # serves PyTorchJobs only: the TrainJob lookup is a 404 first
    if fault:
        cluster.fail_next("get", **fault)
    with pytest.raises(JobStatusError, match=re.escape(message)):
        job_status("nope", "team", "auto", custom_api=cluster)


def _cond(kind: str, status: str = "True", reason: str = "", at: str = "2026-01-01T00:00:00Z") -> dict:
    return {"type": kind, "status": status, "reason": reason, "lastTransitionTime": at}


def _children(active: int = 0, ready: int = 0, succeeded: int = 0, failed: int = 0) -> list[dict]:
    return [
        {"name": "node", "active": active, "ready": ready, "succeeded": succeeded, "failed": failed, "suspended": 0}
    ]


# A TrainJob's state as Kubeflow Trainer v2.3 writes it (conditions Suspended, Complete and Failed
# alone; child Jobs' counts in jobsStatus): (spec.suspend, conditions, jobsStatus, the state shown).
RESUMED = [_cond("Suspended", "False", "Resumed")]
RUNNING = "Running (child Jobs ready: node 1/1)"
TRAINJOB_STATES = {
    "just created": (False, [], [], "Created (no condition yet)"),
    "held by Kueue": (True, [_cond("Suspended", reason="Suspended")], [], "Suspended"),
    "admitted, no child Job yet": (False, RESUMED, [], "Admitted (Resumed), no pods yet"),
    "counts not numbers": (False, [], [{"name": "node", "active": "1", "ready": None}], "Created (no condition yet)"),
    "admitted, pods pending": (
        False,
        RESUMED,
        _children(active=1),
        "Starting (child Jobs ready: node 0/1; the others' pods are pending or starting)",
    ),
    "training": (False, RESUMED, _children(active=1, ready=1), RUNNING),
    "training, never queued": (False, [], _children(active=1, ready=1), RUNNING),
    "completed": (False, [_cond("Complete", reason="Done")], _children(succeeded=1), "Complete (Done)"),
    "failed": (False, [_cond("Failed", reason="FailedJobs")], _children(failed=1), "Failed (FailedJobs)"),
    "child done, no condition": (False, [], _children(succeeded=1), "Finishing (child Jobs succeeded: 1, failed: 0)"),
    "re-queued by Kueue": (
        True,
        [_cond("Suspended", reason="Suspended", at="2026-01-01T00:05:00Z")],
        _children(active=1, ready=1),
        "Suspended",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", TRAINJOB_STATES, ids=list(TRAINJOB_STATES))
def test_a_trainjob_state_comes_from_its_conditions_and_child_jobs(case):
    """Was: `Created (no condition yet)` for a TrainJob that trained, as Trainer sets no `Running`."""
    from trainer.launch.jobkind import TRAINJOB_KIND
    from trainer.launch.kubernetes import job_state

    suspend, conditions, children, state = TRAINJOB_STATES[case]
    obj = {"spec": {"suspend": suspend}, "status": {"conditions": conditions, "jobsStatus": children}}
    assert job_state(obj, TRAINJOB_KIND) == state


def test_job_status_auto_looks_at_the_other_kind_when_one_kind_is_forbidden():
    """Was: a 403 on TrainJobs ended `kftrain job status NAME` though the job, a PyTorchJob, was
    readable; where neither kind has it, the refusal is said with the way round it."""
    from trainer.launch.kubernetes import JobStatusError, job_status

    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    backend.submit(spec)
    cluster.set_condition(NAME, "Running", "JobRunning")
    cluster.fail_next("get", status=403)  # the TrainJob lookup, first
    assert (
        job_status(NAME, "team", "auto", custom_api=cluster).splitlines()[0]
        == f"PyTorchJob team/{NAME}: Running (JobRunning)"
    )
    cluster.fail_next("get", status=403)
    with pytest.raises(
        JobStatusError,
        match=r"cannot read TrainJob team/nope: \(403\) .*; if the job is of the other kind, say which \(--kind\)",
    ):
        job_status("nope", "team", "auto", custom_api=cluster)


def status_refusal(body: str):
    exc = api_error(404)
    exc.body = body
    return exc


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        # A web server that is no Kubernetes API (was: "no such job", a fix that could not work).
        ("auto", "<html><body>404 Not Found</body></html>", "does not answer as a Kubernetes API"),
        # The resource type not served: a Status naming no object (was: "no such job").
        (
            "pytorchjob",
            json.dumps({"kind": "Status", "reason": "NotFound", "details": {}, "code": 404}),
            "the cluster does not serve PyTorchJobs",
        ),
        # A job that is not there: a Status naming it.
        (
            "pytorchjob",
            json.dumps({"kind": "Status", "reason": "NotFound", "details": {"name": "nope"}, "code": 404}),
            "no PyTorchJob named 'nope' in namespace 'team'",
        ),
    ],
    ids=["not-kubernetes", "not-served", "no-such-job"],
)
def test_job_status_tells_a_missing_job_from_a_missing_kind_and_a_web_page(kind, body, message):
    from trainer.launch.kubernetes import JobStatusError, job_status

    cluster = FakeCluster()
    cluster.fail_next("get", exc=status_refusal(body), times=2)
    with pytest.raises(JobStatusError, match=re.escape(message)):
        job_status("nope", "team", kind, custom_api=cluster)


def test_job_status_asks_with_a_request_timeout():
    """A server that takes the connection and never answers held `job status` forever."""
    from trainer.launch.kubernetes import JobStatusError, job_status
    from trainer.launch.retry import REQUEST_TIMEOUT_S

    cluster = FakeCluster()
    seen = []
    original = cluster.get_namespaced_custom_object

    def get(*args, _request_timeout=None):
        seen.append(_request_timeout)
        return original(*args, _request_timeout=_request_timeout)

    cluster.get_namespaced_custom_object = get
    with pytest.raises(JobStatusError, match="no TrainJob or PyTorchJob named 'nope'"):
        job_status("nope", "team", "auto", custom_api=cluster)
    assert seen and all(t == REQUEST_TIMEOUT_S for t in seen)


@pytest.mark.parametrize(
    ("kubeconfig", "reason"),
    [
        (None, "No configuration found"),
        ("garbage: [", "while parsing"),
        ("apiVersion: v1\nkind: Config\ncontexts: []\n", "current-context"),
    ],
    ids=["missing", "not-yaml", "no-context"],
)
def test_no_usable_kubeconfig_is_one_line_saying_what_to_do(tmp_path, monkeypatch, kubeconfig, reason):
    """Outside a pod with no usable kubeconfig, `kftrain job status` and the Kubernetes backend
    end on one line, not the client library's traceback."""
    from trainer.launch.kubernetes import ClusterConfigError, load_cluster_config

    path = tmp_path / "kubeconfig"
    if kubeconfig is not None:
        path.write_text(kubeconfig)
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ClusterConfigError) as err:
        load_cluster_config()
    message = str(err.value)
    assert message.startswith("no Kubernetes cluster to talk to") and reason in message and "\n" not in message
    assert message.endswith("point KUBECONFIG at a kubeconfig file or choose a context (kubectl config use-context)")
    # The file it read, and whether there is one (was: "No configuration found", naming no file).
    assert f"the kubeconfig ({path}{', no such file' if kubeconfig is None else ''}) is not usable" in message
