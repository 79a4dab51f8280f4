"""The Kubernetes launcher with TrainJobs (Kubeflow Trainer v2), and `job.kind: auto`, against the
FAKE API object (tests/fake_kube.py).

No API server can run here: the fake plays the Trainer controller, JobSet, the Job controller
and Kueue from a script, returns real kubernetes client models and raises the real
`ApiException`. Its TrainJob side is as unkind as a cluster: no status until the controller
writes one, JobSet pod names with random suffixes (a recreated pod has a new name), a log read
for the wrong container is a 400, a missing runtime is the webhook's 403, a kind the cluster
does not serve is a 404.
"""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest

from tests.fake_kube import FakeCluster, launcher
from tests.unit.test_launch_kubernetes import RealClientCheck
from trainer.config import load_config
from trainer.launch.backend import JobCancelled, JobFailed, JobTimeout, run_job
from trainer.launch.job import training_job

pytestmark = pytest.mark.timeout(60)
NAME = "kftrain-0123456789ab"
PYTORCHJOB_CRD, TRAINJOB_CRD = "pytorchjobs.kubeflow.org", "trainjobs.trainer.kubeflow.org"


def make(cluster: FakeCluster, owner_uid: str = "uid-1", kind: str = "trainjob", **overrides):
    cfg = load_config(overrides={"kubernetes.poll_seconds": 0.001, "job.kind": kind, **overrides})
    spec = training_job(cfg, NAME, "s3://bucket/ds", "s3://bucket/model")
    lines: list[str] = []
    backend = launcher(cluster, owner_uid, lines.append)
    return backend, spec, lines


def nodes_running(c: FakeCluster) -> None:
    if not c.pods:
        c.add_pod(NAME, "node", 0, "Running", logs=["[rank 0] epoch 1 loss 0.4"])
        c.add_pod(NAME, "node", 1, "Running", logs=["[rank 1] final parameter digest abc"])


def complete(c: FakeCluster) -> None:
    c.set_condition(NAME, "Complete", "AllJobsCompleted", "jobset completed successfully")


def test_a_trainjob_is_created_and_its_nodes_logs_streamed_until_complete():
    cluster = FakeCluster(kind="trainjob")
    backend, spec, lines = make(cluster)
    cluster.timeline = [lambda c: None, nodes_running, nodes_running, complete]
    run_job(backend, replace(spec, timeout_s=60))
    job = cluster.jobs[NAME]
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "[node-0-0] [rank 0] epoch 1 loss 0.4" in lines
    assert "[node-0-1] [rank 1] final parameter digest abc" in lines
    assert f"kftrain: TrainJob {NAME} succeeded" in lines
    assert ("delete", NAME) not in cluster.calls


def test_succeeded_is_not_a_trainjob_condition():
    """A TrainJob is done at `Complete`: a launcher that waited for PyTorchJob's `Succeeded`
    would wait until its deadline."""
    cluster = FakeCluster(kind="trainjob")
    backend, spec, _ = make(cluster)
    cluster.timeline = [nodes_running, lambda c: c.set_condition(NAME, "Succeeded"), complete]
    run_job(backend, replace(spec, timeout_s=60))
    assert cluster.polls == 3


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_a_restarted_launcher_whose_role_cannot_patch_the_job_follows_it_all_the_same(kind):
    """Was: the refused `patch` (adding the new launcher as an owner) failed the step, whose
    cancel deleted the job it had re-attached to, hours of training with it."""
    cluster = FakeCluster(kind=kind)
    first, spec, _ = make(cluster, owner_uid="uid-1", kind=kind)
    first.submit(spec)
    second, spec, lines = make(cluster, owner_uid="uid-2", kind=kind)
    cluster.fail_next("patch", status=403, times=50)
    cluster.timeline = [nodes_running if kind == "trainjob" else running_pods, complete_either]
    run_job(second, replace(spec, timeout_s=60))
    assert NAME in cluster.jobs and not any(c[0] == "delete" for c in cluster.calls)
    assert any("was not made this launcher pod's ((403) Forbidden" in line for line in lines)


def complete_either(c: FakeCluster) -> None:
    c.set_condition(NAME, "Complete" if c.kind == "trainjob" else "Succeeded", "Done", "done")


def test_a_restarted_launcher_reattaches_and_adds_itself_as_owner():
    cluster = FakeCluster(kind="trainjob")
    first, spec, _ = make(cluster, owner_uid="uid-1")
    first.submit(spec)
    second, spec, lines = make(cluster, owner_uid="uid-2")
    cluster.timeline = [nodes_running, complete]
    run_job(second, replace(spec, timeout_s=60))
    assert [c for c in cluster.calls if c[0] == "create"] == [("create", NAME), ("create", NAME)]
    assert any("TrainJob team/kftrain-0123456789ab already exists; re-attaching" in line for line in lines)
    assert [o["uid"] for o in cluster.jobs[NAME]["metadata"]["ownerReferences"]] == ["uid-1", "uid-2"]


def test_a_retry_replaces_a_trainjob_that_already_failed():
    cluster = FakeCluster(kind="trainjob")
    first, spec, _ = make(cluster)
    first.submit(spec)
    cluster.set_condition(NAME, "Failed", "FailedJobs", "jobset failed")
    second, spec, _ = make(cluster, owner_uid="uid-2")
    second.submit(spec)
    assert [c[0] for c in cluster.calls if c[0] in ("create", "delete")] == ["create", "create", "delete", "create"]
    assert "status" not in cluster.jobs[NAME]  # a fresh job: the controller has not written one yet


def test_failed_trainjob_fails_the_step_with_reason_and_the_failing_nodes_last_lines():
    cluster = FakeCluster(kind="trainjob")
    backend, spec, _ = make(cluster)

    def fail(c: FakeCluster) -> None:
        c.add_pod(NAME, "node", 0, "Running", logs=["fine"])
        c.add_pod(NAME, "node", 1, "Failed", exit_code=1, logs=["loading", "RuntimeError: CUDA error: out of memory"])
        c.set_condition(NAME, "Failed", "FailedJobs", "jobset failed: job kftrain-0123456789ab-node-0 failed")

    cluster.timeline = [fail]
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=60))
    msg = str(err.value)
    assert msg.startswith(f"TrainJob {NAME} failed: FailedJobs: jobset failed")
    assert f"replica node-0-1 (pod {cluster.pod_name(NAME, 'node', 1)}) exited with code 1" in msg
    assert "[node-0-1] RuntimeError: CUDA error: out of memory" in msg
    assert NAME not in cluster.jobs  # a failed job is deleted (its pods' GPUs freed)


def test_deadline_exceeded_on_the_server_is_a_failure_with_its_reason():
    cluster = FakeCluster(kind="trainjob")
    backend, spec, _ = make(cluster)
    cluster.timeline = [lambda c: c.set_condition(NAME, "Failed", "DeadlineExceeded", "TrainJob exceeded its deadline")]
    with pytest.raises(JobFailed, match="TrainJob kftrain-0123456789ab failed: DeadlineExceeded"):
        run_job(backend, replace(spec, timeout_s=60))
    assert NAME not in cluster.jobs


def test_a_suspended_trainjob_is_queued_then_admitted_and_the_pending_clock_starts_at_admission():
    cluster = FakeCluster(kind="trainjob", kueue=True)
    backend, spec, lines = make(cluster, **{"kubernetes.queue": "team-a-gpu", "kubernetes.pending_timeout_seconds": 60})

    def wait(c: FakeCluster) -> None:
        c.advance(3600)  # an hour in the queue: not a Pending pod

    def admit(c: FakeCluster) -> None:
        c.admit(NAME)
        c.add_pod(NAME, "node", 0, "Pending")
        c.add_pod(NAME, "node", 1, "Pending")

    def start(c: FakeCluster) -> None:
        c.add_pod(NAME, "node", 0, "Running", logs=["go"])
        c.add_pod(NAME, "node", 1, "Running", logs=["go"])

    cluster.timeline = [wait, wait, admit, start, complete]
    run_job(backend, replace(spec, timeout_s=3 * 3600))
    assert cluster.jobs[NAME]["spec"]["suspend"] is False
    queued = [line for line in lines if "is queued in" in line]
    assert queued == [
        f"kftrain: TrainJob {NAME} is queued in queue team-a-gpu (kueue.x-k8s.io/queue-name): suspended until "
        "the queue admits it; the Pending clock starts when it is admitted"
    ]
    assert any("admitted from queue team-a-gpu" in line and "after 7200s" in line for line in lines)


def test_preempted_trainjob_goes_back_to_the_queue_and_its_new_pods_are_streamed():
    cluster = FakeCluster(kind="trainjob", kueue=True)
    backend, spec, lines = make(cluster, **{"kubernetes.queue": "q"})

    def admit_and_run(c: FakeCluster) -> None:
        c.admit(NAME)
        c.add_pod(NAME, "node", 0, "Running", logs=["first run"])

    def preempt(c: FakeCluster) -> None:
        c.suspend(NAME)

    def readmit(c: FakeCluster) -> None:
        c.admit(NAME)
        c.add_pod(NAME, "node", 0, "Running", logs=["second run"])  # a new pod, a new random name

    cluster.timeline = [lambda c: None, admit_and_run, preempt, readmit, complete]
    run_job(backend, replace(spec, timeout_s=600))
    assert "[node-0-0] first run" in lines and "[node-0-0] second run" in lines
    assert len([line for line in lines if "is queued in" in line]) == 2


def test_a_node_pod_pending_too_long_after_admission_fails_with_its_events():
    cluster = FakeCluster(kind="trainjob")
    backend, spec, _ = make(cluster, **{"kubernetes.pending_timeout_seconds": 60})

    def pending(c: FakeCluster) -> None:
        c.add_pod(NAME, "node", 1, "Pending", age_s=120)
        c.events[c.pod_name(NAME, "node", 1)] = [("FailedScheduling", "0/4 nodes: 4 Insufficient nvidia.com/gpu")]

    cluster.timeline = [pending]
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=600))
    assert f"replica node-0-1 (pod {cluster.pod_name(NAME, 'node', 1)}) of TrainJob {NAME} has been Pending" in str(
        err.value
    )
    assert "Insufficient nvidia.com/gpu" in str(err.value)


def test_cancel_sigterm_deletes_the_trainjob():
    cluster = FakeCluster(kind="trainjob")
    backend, spec, lines = make(cluster)
    cluster.timeline = [nodes_running, lambda c: signal.raise_signal(signal.SIGTERM)]
    with pytest.raises(JobCancelled):
        run_job(backend, replace(spec, timeout_s=60))
    assert NAME not in cluster.jobs and not cluster.pods
    assert f"kftrain: deleted TrainJob {NAME}" in lines


def test_transient_api_errors_are_retried_and_a_lost_create_answer_reattaches():
    cluster = FakeCluster(kind="trainjob")
    backend, spec, lines = make(cluster)
    cluster.fail_next("create", status=503, applied=True)  # created, but the answer was lost
    cluster.fail_next("get", status=429, headers={"Retry-After": "7"})
    cluster.fail_next("list_pods", exc=ConnectionResetError)
    cluster.fail_next("read_log", status=500)
    cluster.timeline = [nodes_running, nodes_running, complete]
    run_job(backend, replace(spec, timeout_s=600))
    assert len(cluster.jobs) == 1 and any("re-attaching" in line for line in lines)
    assert 7 in cluster.sleeps  # Retry-After honoured
    assert f"kftrain: TrainJob {NAME} succeeded" in lines


def test_a_runtime_the_cluster_lacks_is_refused_with_the_webhooks_words():
    cluster = FakeCluster(kind="trainjob", runtimes=("torch-distributed",))
    backend, spec, _ = make(cluster, **{"kubernetes.runtime": "torch-cuda-128"})
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=60))
    assert "refused 'create TrainJob team/kftrain-0123456789ab': (403) Forbidden: admission webhook" in str(err.value)
    assert 'clustertrainingruntimes.trainer.kubeflow.org "torch-cuda-128" not found' in str(err.value)
    assert not cluster.jobs


def test_trainjob_on_a_cluster_without_trainer_v2_names_the_crd():
    cluster = FakeCluster(kind="trainjob", served=(PYTORCHJOB_CRD,))
    backend, spec, _ = make(cluster)
    with pytest.raises(JobFailed, match=f"\\(404\\) Not Found \\(is the {TRAINJOB_CRD} CRD installed\\?\\)"):
        run_job(backend, replace(spec, timeout_s=60))


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        ((PYTORCHJOB_CRD, TRAINJOB_CRD), "TrainJob"),  # both: the newer API
        ((TRAINJOB_CRD,), "TrainJob"),
        ((PYTORCHJOB_CRD,), "PyTorchJob"),
        ((), None),
    ],
)
def test_auto_picks_the_kind_from_api_discovery(served, expected):
    kind = {"TrainJob": "trainjob", "PyTorchJob": "pytorchjob", None: "pytorchjob"}[expected]
    cluster = FakeCluster(kind=kind, served=served)
    backend, spec, lines = make(cluster, kind="auto")
    if expected is None:
        with pytest.raises(JobFailed) as err:
            run_job(backend, replace(spec, timeout_s=60))
        assert not getattr(err.value, "__notes__", [])  # cancel had nothing to delete, and did not fail
        assert f"serves neither {TRAINJOB_CRD} (trainer.kubeflow.org/v1alpha1) nor {PYTORCHJOB_CRD}" in str(err.value)
        assert not cluster.jobs
        return
    backend.submit(spec)
    assert cluster.jobs[NAME]["kind"] == expected
    assert lines[-1] == f"kftrain: created {expected} team/{NAME}"


def test_auto_discovery_is_retried_asked_once_and_a_refusal_fails_clearly():
    cluster = FakeCluster(kind="pytorchjob", served=(PYTORCHJOB_CRD,))
    backend, spec, _ = make(cluster, kind="auto")
    cluster.fail_next("discover", status=503)
    cluster.timeline = [lambda c: c.set_condition(NAME, "Succeeded")]
    run_job(backend, replace(spec, timeout_s=60))
    discovered = [c for c in cluster.calls if c[0] == "discover"]
    # trainer.kubeflow.org/v1alpha1 twice (503, then 404), kubeflow.org/v1 once; never again while waiting.
    assert discovered == [
        ("discover", "trainer.kubeflow.org/v1alpha1"),
        ("discover", "trainer.kubeflow.org/v1alpha1"),
        ("discover", "kubeflow.org/v1"),
    ]
    refused = FakeCluster(kind="pytorchjob")
    backend, spec, _ = make(refused, kind="auto")
    refused.fail_next("discover", status=403)
    with pytest.raises(JobFailed, match="API discovery of trainer.kubeflow.org/v1alpha1 failed: \\(403\\)"):
        backend.submit(spec)


def test_the_trainjob_launcher_calls_the_real_client_api_correctly():
    cluster = FakeCluster(kind="trainjob")
    check = RealClientCheck(cluster)
    backend, spec, _ = make(cluster, kind="auto")
    backend.custom = backend.core = check
    cluster.timeline = [nodes_running, complete]
    run_job(backend, replace(spec, timeout_s=60))
    backend.cancel(spec)
    jobs = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs"
    seen = {(m, p) for m, p, _, _ in check.requests}
    assert ("GET", "/apis/trainer.kubeflow.org/v1alpha1") in seen  # discovery
    assert {("POST", jobs), ("GET", f"{jobs}/{NAME}"), ("DELETE", f"{jobs}/{NAME}")} <= seen
    pods_query = next(q for m, p, q, _ in check.requests if p == "/api/v1/namespaces/team/pods")
    assert pods_query == {"labelSelector": f"jobset.sigs.k8s.io/jobset-name={NAME}"}
    log_query = next(q for m, p, q, _ in check.requests if p.endswith("/log"))
    assert log_query["container"] == "node"


@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
@pytest.mark.parametrize(("status", "headers"), [(500, None), (429, {"Retry-After": "60"})])
def test_a_cancel_whose_delete_keeps_failing_gives_up_within_a_pods_termination_grace(kind, status, headers):
    """A launcher told to stop is killed after its pod's grace (30 s by default): the delete is
    retried within it, and the step says to delete the job by hand (was: retried for the whole
    300 s API budget, the launcher killed first, the job left running unsaid)."""
    cluster = FakeCluster(kind=kind)
    backend, spec, _ = make(cluster, kind=kind)

    def stop(c: FakeCluster) -> None:
        c.fail_next("delete", status=status, headers=headers, times=10_000)
        signal.raise_signal(signal.SIGTERM)

    cluster.timeline = [nodes_running if kind == "trainjob" else running_pods, stop]
    before = []
    with pytest.raises(JobCancelled) as info:
        cluster.timeline.insert(1, lambda c: before.append(c.clock))
        run_job(backend, replace(spec, timeout_s=3600))
    assert (cluster.clock - before[0]).total_seconds() <= 30
    assert any(
        "cancelling the job failed too, so it may still run: delete it by hand" in n for n in info.value.__notes__
    )


def running_pods(c: FakeCluster) -> None:
    if not c.pods:
        c.add_pod(NAME, "master", 0, "Running", logs=["[rank 0] epoch 1 loss 0.4"])
        c.add_pod(NAME, "worker", 0, "Running", logs=["[rank 1] final parameter digest abc"])


@pytest.mark.parametrize(
    "message",
    [
        "0/4 nodes are available: 2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable",
        "pre-filter plugin Coscheduling: cannot find enough sibling pods, current pods number: 1, "
        "minMember of group: 2",
    ],
    ids=["volcano", "coscheduling"],
)
def test_pods_a_gang_scheduler_holds_for_their_group_are_queued_not_stuck(message):
    """A runtime's podGroupPolicy holds the TrainJob's pods until the whole group fits: queued,
    as a PyTorchJob's gang wait is (was: failed as Pending after kubernetes.pending_timeout_seconds);
    kubernetes.queue_timeout_seconds still bounds it."""
    cluster = FakeCluster(kind="trainjob")
    backend, spec, lines = make(cluster, **{"kubernetes.pending_timeout_seconds": 60, "kubernetes.poll_seconds": 30})

    def held(c: FakeCluster) -> None:
        for index in (0, 1):
            c.add_pod(NAME, "node", index, "Pending", unschedulable=message)

    cluster.timeline = [held] * 10 + [nodes_running_again, complete]
    run_job(backend, replace(spec, timeout_s=3600))
    assert any(f"TrainJob {NAME} is queued in" in line and "whole group" in line for line in lines), lines
    assert any(f"TrainJob {NAME} admitted from" in line for line in lines)
    cluster = FakeCluster(kind="trainjob")
    backend, spec, _ = make(cluster, **{"kubernetes.queue_timeout_seconds": 120, "kubernetes.poll_seconds": 30})
    cluster.timeline = [held] * 20
    with pytest.raises(JobFailed, match=r"waited \d+s in a queue .* without being admitted") as err:
        run_job(backend, replace(spec, timeout_s=3600))
    assert message in str(err.value)  # the scheduler's own words: a group that can never fit reads the same
    # Without a queue limit, the run's time bounds it, and says the scheduler's words too.
    cluster = FakeCluster(kind="trainjob")
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 30})
    cluster.timeline = [held] * 20
    with pytest.raises(JobTimeout, match="it was still queued in a queue") as err:
        run_job(backend, replace(spec, timeout_s=300))
    assert message in str(err.value)


def nodes_running_again(c: FakeCluster) -> None:
    for index in (0, 1):
        c.add_pod(NAME, "node", index, "Running", logs=[f"[rank {index}] step 1"])
