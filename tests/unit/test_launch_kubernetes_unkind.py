"""The Kubernetes launcher against a cluster that behaves as real ones do on a bad day.

The cluster is the FAKE API object of tests/fake_kube.py (no API server can run here): jobs, pods,
logs and events in memory, on a fake clock, with faults injected per call. Each test here is a
class of what a probe of the launcher found (2026-12-04): cancellation arriving at any moment, the
job's own deadline, answers lost or refused around a 409, a job still being deleted, pods that
are recreated, logs that are not clean UTF-8, and calls that must never wait forever.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
from dataclasses import replace

import pytest

from tests.fake_kube import FakeCluster, api_error
from tests.unit.test_launch_failures import torchrun_summary
from tests.unit.test_launch_kubernetes import NAME, make, running_then
from trainer.launch.backend import JobCancelled, JobFailed, JobTimeout, run_job
from trainer.launch.logstream import MAX_LINE_BYTES, LogStreams

pytestmark = pytest.mark.timeout(60)
POD = f"{NAME}-master-0"


def earlier_attempt(cluster: FakeCluster, spec, condition: str = "") -> None:
    """The job as a retried step finds it: created by the earlier attempt's launcher, with
    `condition` (Failed) when given; the calls it made are forgotten."""
    make(cluster, owner_uid="uid-earlier")[0].submit(spec)
    if condition:
        cluster.set_condition(NAME, condition, "PyTorchJobFailed", "1 Master replica(s) failed")
    cluster.calls.clear()


def creates(cluster: FakeCluster) -> int:
    return sum(1 for call, _ in cluster.calls if call == "create")


def preempted_once(c: FakeCluster) -> None:
    """The first attempt: the master runs, is preempted, and the job Failed; later attempts succeed."""
    if creates(c) > 1:
        if POD not in c.pods:
            c.add_pod(NAME, "master", 0, "Running")
        else:
            c.set_condition(NAME, "Succeeded")
        return
    if POD not in c.pods:
        c.add_pod(NAME, "master", 0, "Running")
        return
    if "Failed" not in str(c.jobs[NAME].get("status")):
        c.add_pod(NAME, "master", 0, "Failed", exit_code=143, logs=["[rank 0] SIGTERM: checkpoint committed"])
        c.disrupt(NAME, "master", 0, condition="PreemptionByScheduler", message="preempted")
        c.set_condition(NAME, "Failed", "PyTorchJobFailed", "1 Master replica(s) failed")


# -- cancellation is never swallowed -------------------------------------------------------------


class SigtermDuring(FakeCluster):
    """SIGTERM (KFP cancels the run) arrives during the first call `call` made after the job failed,
    while the launcher gathers the evidence its `except Exception` guards."""

    def __init__(self, call: str, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.call, self.signum, self.fired = call, signum, False

    def _call(self, timeout, call, name, do):
        failed = NAME in self.jobs and "Failed" in str(self.jobs[NAME].get("status"))
        if call == self.call and failed and not self.fired:
            self.fired = True
            signal.raise_signal(self.signum)
        return super()._call(timeout, call, name, do)


@pytest.mark.parametrize(
    ("call", "signum"),
    [
        ("list_pods", signal.SIGTERM),
        ("read_log", signal.SIGTERM),
        ("list_events", signal.SIGTERM),
        # The terminal of a `kftrain run --local` closing: the step stops as on SIGTERM (was: killed
        # at once, the job's cancel never made).
        ("list_pods", signal.SIGHUP),
    ],
)
def test_sigterm_while_the_launcher_reads_a_failure_s_evidence_cancels_the_job(call, signum):
    cluster = SigtermDuring(call, signum)
    backend, spec, lines = make(cluster)
    cluster.timeline = [preempted_once]
    with pytest.raises(JobCancelled, match=f"launcher received {signal.Signals(signum).name}; job cancelled"):
        run_job(backend, replace(spec, timeout_s=600))
    assert cluster.fired and creates(cluster) == 1, lines  # not re-created after the cancel
    assert NAME not in cluster.jobs


# -- the job's own deadline ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("PyTorchJobFailed", f"Job {NAME} has failed because it was active longer than specified deadline"),
        ("DeadlineExceeded", "TrainJob exceeded its active deadline"),
    ],
)
def test_a_job_ended_by_its_own_deadline_is_not_re_created_as_a_preemption(reason, message):
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.active_deadline_seconds": 3600, "kubernetes.poll_seconds": 60})

    def operator(c: FakeCluster) -> None:
        if POD not in c.pods:
            c.add_pod(NAME, "master", 0, "Running")
        elapsed = (c.clock - dt.datetime.fromisoformat(c.jobs[NAME]["metadata"]["creationTimestamp"])).total_seconds()
        if elapsed >= 3600 and "Failed" not in str(c.jobs[NAME].get("status")):
            # The operator at activeDeadlineSeconds: running pods deleted, the ranks stop on SIGTERM.
            c.add_pod(NAME, "master", 0, "Failed", exit_code=143, logs=["[rank 0] SIGTERM: checkpoint committed"])
            c.set_condition(NAME, "Failed", reason, message)

    cluster.timeline = [operator]
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=4 * 3600))
    assert "not re-created: its own activeDeadlineSeconds (3600s, kubernetes.active_deadline_seconds) ended it" in str(
        err.value
    )
    assert creates(cluster) == 1


def test_a_re_created_job_gets_no_more_than_the_run_s_time_left():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.active_deadline_seconds": 3600, "kubernetes.poll_seconds": 60})
    created = []
    original = cluster.create_namespaced_custom_object

    def create(group, version, namespace, plural, body, _request_timeout=None):
        created.append((cluster.clock, body["spec"]["runPolicy"]["activeDeadlineSeconds"]))
        return original(group, version, namespace, plural, body, _request_timeout)

    cluster.create_namespaced_custom_object = create
    cluster.timeline = [preempted_once]
    run_job(backend, replace(spec, timeout_s=3000))  # the run's time, shorter than the job's own limit
    (t0, first), (t1, second) = created
    assert first == 3000 and second == 3000 - (t1 - t0).total_seconds()


# -- 409: our own answer lost, a job being deleted, refusals after it ------------------------------


@pytest.mark.parametrize("path", ["re-created after a preemption", "replacing a Failed job"])
def test_a_create_whose_answer_was_lost_is_as_good_as_created(path):
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    if path == "replacing a Failed job":  # a retried step finds the old attempt Failed
        earlier_attempt(cluster, spec, "Failed")
        cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
        cluster.fail_next("create", status=409)  # the first create finds the old job (as it would anyway)
        cluster.fail_next("create", exc=ConnectionResetError, applied=True)  # the replacement's answer lost
    else:
        cluster.timeline = [preempted_once]
        original = cluster.create_namespaced_custom_object

        def create(*args, **kwargs):
            if creates(cluster) == 1:  # the re-creation: it takes effect, the answer is lost
                cluster.fail_next("create", exc=ConnectionResetError, applied=True)
            return original(*args, **kwargs)

        cluster.create_namespaced_custom_object = create
    run_job(backend, replace(spec, timeout_s=3600))
    assert f"kftrain: PyTorchJob {NAME} succeeded" in lines
    assert sum(1 for call, _ in cluster.calls if call == "create") == 3  # the lost one, retried: 409


def test_a_retried_step_waits_for_its_last_attempt_s_job_to_be_deleted_then_creates_its_own():
    cluster = FakeCluster(deletion_seconds=120)  # the old pods' termination grace
    backend, spec, lines = make(cluster, **{"kubernetes.poll_seconds": 5})
    earlier_attempt(cluster, spec)
    cluster.delete_namespaced_custom_object("kubeflow.org", "v1", "team", "pytorchjobs", NAME)  # its run_job's cancel
    cluster.calls.clear()
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(backend, replace(spec, timeout_s=3600))
    replacing = lines.index(f"kftrain: PyTorchJob team/{NAME} exists and is being deleted; replacing it")
    assert f"kftrain: created PyTorchJob team/{NAME}" in lines[replacing:]  # was: the replacement unsaid
    assert creates(cluster) == 2 and not any("re-attaching" in line for line in lines)


@pytest.mark.parametrize("grace", [60, 600])
def test_re_creation_waits_for_the_old_pods_termination_grace(grace):
    cluster = FakeCluster(deletion_seconds=grace + 30)  # Foreground: each pod within its grace period
    backend, spec, lines = make(
        cluster, **{"kubernetes.termination_grace_seconds": grace, "kubernetes.poll_seconds": 5}
    )
    cluster.timeline = [preempted_once]
    run_job(backend, replace(spec, timeout_s=4 * 3600))
    assert f"kftrain: PyTorchJob {NAME} succeeded" in lines


def test_no_job_is_re_created_once_the_wait_for_the_old_ones_deletion_spent_the_run_s_time():
    """Was: created after the deadline (activeDeadlineSeconds 1), its pods scheduled for nothing."""
    cluster = FakeCluster(deletion_seconds=300)  # longer than the run has left
    backend, spec, _ = make(cluster, **{"kubernetes.termination_grace_seconds": 60, "kubernetes.poll_seconds": 5})
    cluster.timeline = [preempted_once]
    with pytest.raises(
        JobFailed, match=r"not re-created after all: the job's deadline \(200s, job.timeout_seconds\) passed"
    ):
        run_job(backend, replace(spec, timeout_s=200))
    assert creates(cluster) == 1


def test_a_deletion_that_never_completes_says_what_holds_it():
    cluster = FakeCluster(deletion_seconds=10**6)  # a pod stuck Terminating on a lost node
    backend, spec, _ = make(cluster, **{"kubernetes.termination_grace_seconds": 60, "kubernetes.poll_seconds": 5})
    cluster.timeline = [preempted_once]
    with pytest.raises(JobFailed, match=r"not deleted within 360s .* stuck Terminating .* --force"):
        run_job(backend, replace(spec, timeout_s=4 * 3600))


@pytest.mark.parametrize(
    ("call", "status", "words"),
    [
        (
            "get",
            403,
            f"refused 'get PyTorchJob team/{NAME}': (403) Forbidden (the run's service account lacks RBAC for that "
            "call in namespace team: `kubectl apply -k deploy/rbac/standalone` or `deploy/rbac/multi-user` grants",
        ),
        # A 403 on patch is followed all the same (test_launch_kubernetes_trainjob.py).
        ("patch", 422, f"refused 'patch PyTorchJob team/{NAME}': (422) Unprocessable Entity"),
    ],
)
def test_a_refusal_after_a_409_is_one_line_naming_the_call(call, status, words):
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    earlier_attempt(cluster, spec)  # a retried step's job, running
    cluster.fail_next(call, status=status)
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=3600))
    assert str(err.value).startswith(f"the Kubernetes API {words}"), str(err.value)
    assert "\n" not in str(err.value)


def test_a_webhook_refusing_the_replacement_of_a_failed_job_is_one_line_with_its_words():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    earlier_attempt(cluster, spec, "Failed")
    cluster.fail_next("create", status=409)  # the first create finds the old job (as it would anyway)
    denial = api_error(422)
    denial.body = '{"kind": "Status", "message": "admission webhook \\"quota.example\\" denied the request: no GPUs"}'
    cluster.fail_next("create", exc=denial)
    with pytest.raises(
        JobFailed, match=r"refused 'create PyTorchJob team/.*': \(422\) .*: admission webhook .* no GPUs$"
    ):
        run_job(backend, replace(spec, timeout_s=3600))


# -- pods that go and come back --------------------------------------------------------------------


def test_a_running_job_whose_pods_are_briefly_gone_is_waited_for_not_failed():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, **{"kubernetes.poll_seconds": 60, "kubernetes.pending_timeout_seconds": 900})

    def script(c: FakeCluster) -> None:
        age = c.polls * 60
        if age < 1200 or age >= 1260:
            c.add_pod(NAME, "master", 0, "Running")
        else:  # evicted; the operator creates the replacement a poll later
            c.pods.pop(POD, None)
        if age >= 1500:
            c.set_condition(NAME, "Succeeded")

    cluster.timeline = [script]
    run_job(backend, replace(spec, timeout_s=3600))
    assert f"kftrain: PyTorchJob {NAME} succeeded" in lines


def test_pods_gone_for_longer_than_the_pending_limit_fail_counting_from_when_they_went():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 60, "kubernetes.pending_timeout_seconds": 300})

    def script(c: FakeCluster) -> None:
        if c.polls * 60 < 1200:
            c.add_pod(NAME, "master", 0, "Running")
        else:
            c.pods.pop(POD, None)

    cluster.timeline = [script]
    with pytest.raises(JobFailed, match=r"has no pods 3\d\ds after its pods were deleted"):
        run_job(backend, replace(spec, timeout_s=7200))


# -- logs as they come, calls that cannot hang ------------------------------------------------


@pytest.mark.parametrize(
    ("tail", "shown"),
    [
        (["loss nan at step 3", "caf\udce9 au lait"], "caf\ufffd au lait"),  # one Latin-1 byte
        (["null"], "null"),  # a tail that is JSON: kept as text
        (['{"level": "error", "msg": "boom"}'], '{"level": "error", "msg": "boom"}'),
    ],
)
def test_a_failed_replica_s_log_tail_is_read_as_the_bytes_it_holds(tail, shown):
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)

    def fail(c: FakeCluster) -> None:
        c.add_pod(NAME, "master", 0, "Failed", exit_code=1, logs=tail)
        c.set_condition(NAME, "Failed", "PyTorchJobFailed", "1 Master replica(s) failed")

    cluster.timeline = [fail]
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=600))
    assert f"  [master-0] {shown}" in str(err.value).splitlines(), str(err.value)
    assert "log unavailable" not in str(err.value)


def test_every_api_call_log_streams_included_carries_a_request_timeout():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    earlier_attempt(cluster, spec)  # re-attach: get, patch too
    cluster.timeline = [preempted_once]
    run_job(backend, replace(spec, timeout_s=3600))
    kinds = {call for call, _ in cluster.calls}
    assert {"create", "get", "patch", "delete", "list_pods", "list_events", "read_log"} <= kinds
    assert cluster.untimed == []


class OneStream:
    """A log stream of `data`, in chunks as the API sends them, then its end or `error`."""

    def __init__(self, data: bytes, error: Exception | None = None) -> None:
        self.data, self.error = data, error

    def stream(self, amt: int):
        yield from (self.data[i : i + amt] for i in range(0, len(self.data), amt))
        if self.error:
            raise self.error

    def release_conn(self) -> None:
        pass


def test_a_log_without_newlines_is_written_in_pieces_as_it_comes():
    lines: list[str] = []
    streams = LogStreams(lines.append)
    pod = type("Pod", (), {})()
    pod.metadata = type("Meta", (), {"uid": "u1", "name": "p"})()
    pod.status = type("Status", (), {"container_statuses": []})()
    bar = b"".join(b"\r%3d%%|####" % (i % 100) for i in range(60_000))  # a progress bar, 600 kB
    streams.follow(pod, "master-0", "pytorch", lambda since: OneStream(bar + b"\ndone\n"))
    streams.finish()
    assert len(lines) > 5 and all(len(line) <= MAX_LINE_BYTES + 4096 + 20 for line in lines)
    assert "".join(line.removeprefix("[master-0] ") for line in lines[:-1]).encode() == bar
    assert lines[-1] == "[master-0] done"


@pytest.mark.parametrize(
    ("reason", "code", "cause"), [("Error", 1, "cause: user_error"), ("OOMKilled", 137, "cause: oom")]
)
def test_a_crash_looping_replica_s_pod_deleted_with_the_failure_still_names_its_cause(reason, code, cause):
    """The defaults (restartPolicy OnFailure, backoffLimit 3, cleanPodPolicy Running): the kubelet
    restarts the crashing container in its pod; past the backoff limit the operator deletes the
    Running pods and marks the job Failed in one reconcile, before the launcher reads anything."""
    from kubernetes import client as k8s

    cluster = FakeCluster()
    backend, spec, _ = make(cluster)

    def crash_loop(c: FakeCluster) -> None:
        c.add_pod(NAME, "master", 0, "Running", restarts=3, logs=["[rank 0] ValueError: bad column 'label'"])
        status = c.pods[POD].status.container_statuses[0]
        status.state = k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(reason="CrashLoopBackOff"))
        status.last_state = k8s.V1ContainerState(
            terminated=k8s.V1ContainerStateTerminated(exit_code=code, reason=reason)
        )

    def backoff_limit(c: FakeCluster) -> None:
        c.pods.pop(POD)
        c.set_condition(
            NAME,
            "Failed",
            "PyTorchJobFailed",
            f"Job {NAME} has failed because it has reached the specified backoff limit",
        )

    cluster.timeline = [crash_loop, crash_loop, backoff_limit]
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=3600))
    message = str(err.value)
    assert cause in message, message
    assert "  [master-0] [rank 0] ValueError: bad column 'label'" in message.splitlines()  # the streamed lines


@pytest.mark.parametrize("zone", ["Z", "+08:00", "-03:30"])
def test_a_log_stream_that_ends_while_the_replica_runs_is_opened_again_from_where_it_stopped(zone):
    cluster = FakeCluster()
    cluster.log_zone = zone  # containerd stamps in the node's local time
    backend, spec, lines = make(cluster)

    def start(c: FakeCluster) -> None:
        c.add_pod(NAME, "master", 0, "Running", logs=["step 1"])

    def more(c: FakeCluster) -> None:  # the same container logs on; each stream ends (an idle timeout)
        backend._streams.finish()  # this poll's stream has sent what there was
        c.pod_logs[POD].append(f"step {len(c.pod_logs[POD]) + 1}")

    cluster.timeline = [start, more, more, more, lambda c: c.set_condition(NAME, "Succeeded")]
    run_job(backend, replace(spec, timeout_s=600))
    assert [line for line in lines if line.startswith("[master-0]")] == [f"[master-0] step {i}" for i in range(1, 5)]
    reads = [c for c in cluster.calls if c[0] == "read_log"]
    assert len(reads) >= 4, reads  # opened again, and nothing written twice


def running_pod(uid: str = "u", sidecar_running: bool = False, trainer_running: bool = True):
    from kubernetes import client as k8s

    def status(name: str, running: bool):
        state = k8s.V1ContainerState(
            running=k8s.V1ContainerStateRunning() if running else None,
            terminated=None if running else k8s.V1ContainerStateTerminated(exit_code=0),
        )
        return k8s.V1ContainerStatus(name=name, image="i", image_id="", ready=running, restart_count=0, state=state)

    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", uid=uid),
        status=k8s.V1PodStatus(
            container_statuses=[status("istio-proxy", sidecar_running), status("pytorch", trainer_running)]
        ),
    )


def stamped(lines, error=None) -> OneStream:
    """A stream of `(stamp, text)` lines with the kubelet's timestamps, then its end or `error`."""
    return OneStream(b"".join(f"2026-01-01T00:00:{s} ".encode() + text + b"\n" for s, text in lines), error)


def follow_all(streams_sent, pod=None):
    """Each of `streams_sent` opened in turn for one running container: (lines written, sinceSeconds asked)."""
    asked: list[int | None] = []
    lines: list[str] = []
    streams = LogStreams(lines.append)

    def open_stream(since):
        asked.append(since)
        return streams_sent[len(asked) - 1]

    for _ in streams_sent:
        streams.follow(pod or running_pod(), "master-0", "pytorch", open_stream)
        streams.finish()
    return lines, asked


def test_a_re_opened_stream_writes_each_line_once_by_its_timestamp_and_text():
    ns = "000000000"
    lines, asked = follow_all(
        [
            stamped(
                [(f"01.5{ns[:8]}Z", b"a"), (f"02.{ns}Z", b"b"), (f"02.{ns}Z", b"c")], ConnectionResetError("reset")
            ),
            # From `sinceSeconds` ago: again what was written, then what is new (stdout and stderr
            # interleave: a new line may carry an older stamp than the last one written).
            stamped(
                [
                    (f"01.5{ns[:8]}Z", b"a"),
                    (f"02.{ns}Z", b"b"),
                    (f"02.{ns}Z", b"c"),
                    (f"02.{ns}Z", b"d"),
                    (f"01.9{ns[:8]}Z", b"x"),
                    (f"03.{ns}+08:00", b"e"),
                ]
            ),
        ]
    )
    assert asked[0] is None and asked[1] >= 5  # from before the last line, with a margin
    assert lines == [
        "[master-0] a",
        "[master-0] b",
        "[master-0] c",
        "[master-0] (log stream ended: ConnectionResetError: reset; it is opened again while the container runs)",
        "[master-0] d",
        "[master-0] x",
        "[master-0] e",
    ]


def test_a_long_line_the_runtime_split_is_written_without_the_kubelet_s_stamps_inside_it():
    from trainer.launch.logstream import RUNTIME_PIECE_BYTES

    line = bytes(range(65, 91)) * (3 * RUNTIME_PIECE_BYTES // 26 + 10)  # three pieces and a bit
    pieces = [line[i : i + RUNTIME_PIECE_BYTES] for i in range(0, len(line), RUNTIME_PIECE_BYTES)]
    stamped = b"".join(f"2026-01-01T00:00:0{i}.000000000+02:00 ".encode() + p for i, p in enumerate(pieces))
    lines, _ = follow_all([OneStream(stamped + b"\n")])
    assert "".join(x.removeprefix("[master-0] ") for x in lines).encode() == line


def test_a_stream_the_api_refuses_is_said_once_and_not_opened_again():
    lines, asked = follow_all([stamped([], api_error(403))] * 3)
    assert len(asked) == 1
    assert lines == ["[master-0] (log stream refused: (403) Forbidden; the replica's log is not followed)"]


def test_a_finished_container_beside_a_running_sidecar_is_read_once_more_and_then_not_again():
    """Its stream may have ended before it did: read once more from its last line, writing
    nothing twice; then never again, though its pod (a sidecar) still runs."""
    pod = running_pod(sidecar_running=True, trainer_running=False)
    lines, asked = follow_all([OneStream(b"2026-01-01T00:00:01.000000000Z done\n")] * 3, pod)
    assert len(asked) == 2 and asked[0] is None and lines == ["[master-0] done"]


def test_the_last_lines_of_a_container_that_ended_after_its_stream_was_cut_are_written():
    """Was: the stream cut during a quiet evaluation, the container ending before the next poll:
    its last lines (the evaluation's results, the final digest) never reached the step's log."""
    lines: list[str] = []
    streams = LogStreams(lines.append)
    sent = [
        stamped([("01.000000000Z", b"step 1"), ("02.000000000Z", b"evaluating...")], ConnectionResetError("cut")),
        stamped(
            [("01.000000000Z", b"step 1"), ("02.000000000Z", b"evaluating..."), ("09.000000000Z", b"accuracy 0.97")]
        ),
    ]
    opened: list[int | None] = []

    def open_stream(since):
        opened.append(since)
        return sent[len(opened) - 1]

    for pod in (running_pod(), running_pod(trainer_running=False), running_pod(trainer_running=False)):
        streams.follow(pod, "master-0", "pytorch", open_stream)
        streams.finish()
    assert [line for line in lines if "log stream ended" not in line] == [
        "[master-0] step 1",
        "[master-0] evaluating...",
        "[master-0] accuracy 0.97",
    ]
    assert len(opened) == 2


@pytest.mark.parametrize("apart_s", [1200, -1200, 0])
def test_the_pending_clock_is_the_api_server_s_when_the_launcher_s_clock_is_apart(apart_s):
    """Off-cluster (a kubeconfig), the launcher's clock may be minutes from the server's, which
    stamps every time the launcher compares: the job's creationTimestamp tells them apart."""
    from tests.fake_kube import launcher

    cluster = FakeCluster()
    _, spec, lines = make(cluster, **{"kubernetes.poll_seconds": 60, "kubernetes.pending_timeout_seconds": 900})
    backend = launcher(cluster, log=lines.append)
    backend._now = lambda: cluster.clock + dt.timedelta(seconds=apart_s)

    def script(c: FakeCluster) -> None:
        if c.polls * 60 < 600:  # Pending for 10 minutes (ContainerCreating), then running
            c.add_pod(NAME, "master", 0, "Pending", waiting=("ContainerCreating", ""))
        elif c.polls * 60 < 900:
            c.add_pod(NAME, "master", 0, "Running")
        else:
            c.set_condition(NAME, "Succeeded")

    cluster.timeline = [script]
    run_job(backend, replace(spec, timeout_s=3600))
    assert f"kftrain: PyTorchJob {NAME} succeeded" in lines


def test_a_timeout_spent_in_the_queue_says_the_job_was_never_admitted():
    cluster = FakeCluster(kueue=True)
    backend, spec, _ = make(cluster, **{"kubernetes.queue": "team-a", "kubernetes.poll_seconds": 60})
    cluster.timeline = [lambda c: None]
    with pytest.raises(JobTimeout, match=r"within 600s .*; it was still queued in queue team-a .*, not admitted since"):
        run_job(backend, replace(spec, timeout_s=600))


def test_sigterm_while_run_job_deletes_a_failed_job_lets_the_deletion_finish():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    original = cluster.delete_namespaced_custom_object

    def delete(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)  # KFP cancels the run just as the launcher cleans up
        return original(*args, **kwargs)

    cluster.delete_namespaced_custom_object = delete
    cluster.timeline = [
        lambda c: (
            c.add_pod(NAME, "master", 0, "Failed", exit_code=1, logs=["[rank 0] ValueError: bad data"]),
            c.set_condition(NAME, "Failed", "PyTorchJobFailed", "1 Master replica(s) failed"),
        )
    ]
    with pytest.raises(JobFailed, match="cause: user_error"):  # the failure, not the signal
        run_job(backend, replace(spec, timeout_s=600))
    assert NAME not in cluster.jobs


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c-again", "then-sigterm"])
def test_ctrl_c_then_another_signal_while_run_job_cancels_lets_the_cancel_finish(second):
    """A terminal's Ctrl-C reaches the whole process group: the launcher is interrupted, and the
    CLI stops the step as well while it cancels (was: that second signal interrupted the cancel,
    so the ranks' last lines were never passed on)."""
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)
    original = cluster.delete_namespaced_custom_object

    def delete(*args, **kwargs):
        signal.raise_signal(second)
        return original(*args, **kwargs)

    cluster.delete_namespaced_custom_object = delete
    cluster.timeline = [lambda c: c.add_pod(NAME, "master", 0, "Running"), lambda c: signal.raise_signal(signal.SIGINT)]
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with pytest.raises(KeyboardInterrupt):
        run_job(backend, replace(spec, timeout_s=600))
    assert NAME not in cluster.jobs  # the deletion ran to its end
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# -- round two: what an earlier part of the same attempt leaves behind --------------------------


def test_a_jobset_restart_s_earlier_preemption_does_not_decide_a_later_failure():
    from tests.unit.test_launch_kubernetes_trainjob import make as make_trainjob

    cluster = FakeCluster(kind="trainjob")
    backend, spec, lines = make_trainjob(cluster)
    steps = iter(range(10**6))

    def script(c: FakeCluster) -> None:
        n = next(steps)
        if n == 0:
            c.add_pod(NAME, "node", 0, "Running")
            c.add_pod(NAME, "node", 1, "Running")
        elif n == 1:  # node 0 preempted
            c.add_pod(NAME, "node", 0, "Failed", exit_code=143, logs=["SIGTERM: checkpoint committed"])
            c.disrupt(NAME, "node", 0, condition="PreemptionByScheduler", message="preempted")
        elif n == 2:  # JobSet's failurePolicy restart: every pod recreated under a new name
            c.recreate_pod(NAME, "node", 0, "Running")
            c.recreate_pod(NAME, "node", 1, "Running")
        elif n == 3:  # then the run's own error
            c.add_pod(NAME, "node", 0, "Failed", exit_code=1, logs=["[rank 0] ValueError: no column 'label'"])
            c.set_condition(NAME, "Failed", "ReachedMaxRestarts", "jobset failed due to reaching max restarts")

    cluster.timeline = [script]
    with pytest.raises(JobFailed, match="cause: user_error") as err:
        run_job(backend, replace(spec, timeout_s=3600))
    assert creates(cluster) == 1 and "ValueError: no column 'label'" in str(err.value)


def test_pods_of_an_earlier_jobset_restart_still_listed_are_not_evidence():
    from trainer.launch.kubernetes import JOBSET_RESTART_LABEL, _latest_restart

    cluster = FakeCluster(kind="trainjob")
    for index, attempt in ((0, "0"), (1, "1"), (2, "1")):
        cluster.add_pod(NAME, "node", index, "Failed" if attempt == "0" else "Running")
        cluster.pods[cluster.pod_name(NAME, "node", index)].metadata.labels[JOBSET_RESTART_LABEL] = attempt
    latest = _latest_restart(list(cluster.pods.values()))
    assert [p.metadata.labels[JOBSET_RESTART_LABEL] for p in latest] == ["1", "1"]


@pytest.mark.parametrize(
    ("worker", "code", "cause"),
    [
        ({"exit_code": 1, "logs": ["kftrain-error: train: shard 17 is corrupt"]}, 1, "user_error"),
        # Container-level evidence (`pod NAME container C: ...`; was: the master's log shown).
        (
            {"exit_code": 137, "terminated_reason": "OOMKilled", "logs": ["[rank 1] step 400 shard 17 is corrupt"]},
            137,
            "oom",
        ),
        ({"exit_code": 1, "logs": ["[rank 1] shard 17 is corrupt", *torchrun_summary(-9)]}, 1, "oom"),
    ],
    ids=["its own error", "OOMKilled", "a rank SIGKILLed"],
)
def test_the_error_shows_the_log_of_the_replica_its_cause_names(worker, code, cause):
    cluster = FakeCluster()
    backend, spec, _ = make(cluster)

    def fail(c: FakeCluster) -> None:  # the worker's own failure; the operator then stops the master
        c.add_pod(NAME, "master", 0, "Failed", exit_code=143, logs=["[rank 0] stopped by SIGTERM at step 401"])
        c.add_pod(NAME, "worker", 0, "Failed", **worker)
        c.set_condition(NAME, "Failed", "PyTorchJobFailed", "1 Worker replica(s) failed")

    cluster.timeline = [fail]
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=600))
    message = str(err.value)
    assert f"pod {NAME}-worker-0" in message.splitlines()[0] and f"cause: {cause}" in message.splitlines()[0]
    assert f"replica worker-0 (pod {NAME}-worker-0) exited with code {code}" in message
    assert "shard 17 is corrupt" in message and "stopped by SIGTERM" not in message
    assert creates(cluster) == 1  # not re-created: it would fail the same way


def test_an_elastic_job_training_on_its_minimum_is_not_failed_for_the_replicas_still_pending():
    cluster = FakeCluster()
    backend, spec, lines = make(
        cluster,
        **{
            "kubernetes.poll_seconds": 60,
            "job.replicas": 4,
            "train.batch_size": 48,
            "kubernetes.elastic": {"enabled": True, "min_replicas": 2, "max_replicas": 4},
        },
    )

    def script(c: FakeCluster) -> None:
        for i in (0, 1):
            c.add_pod(NAME, "worker", i, "Running")
        for i in (2, 3):  # no GPUs for them for an hour
            c.add_pod(NAME, "worker", i, "Pending", waiting=("ContainerCreating", ""))
        if c.polls * 60 > 3600:
            c.set_condition(NAME, "Succeeded")

    cluster.timeline = [script]
    run_job(backend, replace(spec, timeout_s=4 * 3600))
    assert f"kftrain: PyTorchJob {NAME} succeeded" in lines
    assert sum("those Pending join when the cluster places them" in line for line in lines) == 1


@pytest.mark.parametrize("edited", ["2026-01-01T06:00:00", "2026-01-01", "soon"])
def test_a_hand_edited_deadline_annotation_is_read_or_ignored_never_a_traceback(edited):
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    earlier_attempt(cluster, spec)
    cluster.jobs[NAME]["metadata"]["annotations"]["kftrain.io/deadline"] = edited
    cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    run_job(backend, replace(spec, timeout_s=10**6))
    assert f"kftrain: PyTorchJob {NAME} succeeded" in lines


def test_a_trainjob_initializer_s_own_container_log_is_read_and_streamed():
    from kubernetes import client as k8s

    from tests.unit.test_launch_kubernetes_trainjob import make as make_trainjob

    cluster = FakeCluster(kind="trainjob")
    backend, spec, lines = make_trainjob(cluster)
    pod = f"{NAME}-dataset-initializer-0-0-x7k2p"

    def initializer(phase: str, code: int | None) -> k8s.V1Pod:
        state = k8s.V1ContainerState(
            running=k8s.V1ContainerStateRunning() if code is None else None,
            terminated=k8s.V1ContainerStateTerminated(exit_code=code, reason="Error") if code is not None else None,
        )
        labels = {
            "jobset.sigs.k8s.io/jobset-name": NAME,
            "jobset.sigs.k8s.io/replicatedjob-name": "dataset-initializer",
        }
        status = k8s.V1ContainerStatus(
            name="dataset-initializer", image="i", image_id="", ready=code is None, restart_count=0, state=state
        )
        return k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=pod, uid="uid-init", creation_timestamp=cluster.clock, labels=labels),
            status=k8s.V1PodStatus(phase=phase, container_statuses=[status]),
        )

    original = cluster.read_namespaced_pod_log

    def read_log(name, namespace, container=None, **options):  # the real API: one of the pod's containers
        if name == pod:
            if container != "dataset-initializer":
                raise api_error(400)
            container = cluster.k["container"]  # let the fake serve it
        return original(name, namespace, container=container, **options)

    cluster.read_namespaced_pod_log = read_log
    polls = iter(range(10**6))

    def script(c: FakeCluster) -> None:
        c.pod_logs[pod] = ["downloading s3://bucket/ds", "ERROR: NoCredentialsError: Unable to locate credentials"]
        if next(polls) < 2:
            c.pods[pod] = initializer("Running", None)
        else:
            c.pods[pod] = initializer("Failed", 1)
            c.set_condition(NAME, "Failed", "FailedJobs", "jobset failed due to one or more job failures")

    cluster.timeline = [script]
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=600))
    assert "Unable to locate credentials" in str(err.value) and "log unavailable" not in str(err.value)
    assert any(line.endswith("downloading s3://bucket/ds") for line in lines)  # streamed too


def test_what_the_launcher_keeps_of_a_replica_s_lines_is_bounded_not_the_lines_themselves():
    """64 replicas printing long lines: the de-duplication window keeps hashes, and a pod's last
    lines (a deleted pod's evidence) keep the first TAIL_LINE_CHARS of each line."""
    from trainer.launch.logstream import SEEN_LINES, TAIL_LINE_CHARS

    streams = LogStreams(lambda line: None)
    pod = running_pod()
    long_line = b"x" * 50_000
    data = b"".join(
        f"2026-01-01T00:00:{i % 60:02d}.{i:09d}Z ".encode() + long_line + b"\n" for i in range(SEEN_LINES + 5)
    )
    streams.follow(pod, "master-0", "pytorch", lambda since: OneStream(data))
    streams.finish()
    (instance,) = streams._instances.values()
    assert len(instance.seen) == SEEN_LINES and all(isinstance(h, int) for h in instance.seen)
    tail = streams.tail(pod)
    assert len(tail) == 400 and all(len(line) == TAIL_LINE_CHARS for line in tail)


def test_a_stream_past_its_read_timeout_is_opened_again_without_a_word():
    from urllib3.exceptions import ReadTimeoutError

    quiet = ReadTimeoutError(None, "/log", "Read timed out.")
    ns = "000000000"
    lines, asked = follow_all(
        [stamped([(f"01.{ns}Z", b"a")], quiet), stamped([(f"01.{ns}Z", b"a"), (f"09.{ns}Z", b"b")])]
    )
    assert len(asked) == 2 and lines == ["[master-0] a", "[master-0] b"]


@pytest.mark.parametrize(
    ("edited", "counted"),
    [
        ('{"node_lost": 2, "preempted": 1}', {"node_lost": 2, "preempted": 1}),
        ('{"node_lost": true}', {}),  # was: 1 re-creation (a bool is an int to Python)
        ('{"node_lost": -1, "oom": 1.0, "nope": 3}', {}),
        ("[1]", {}),
        ("not json", {}),
    ],
)
def test_a_hand_edited_restarts_annotation_counts_only_whole_numbers_of_known_causes(edited, counted):
    from trainer.launch.kubernetes import RESTARTS_ANNOTATION, _restarts_of

    assert _restarts_of({"metadata": {"annotations": {RESTARTS_ANNOTATION: edited}}}) == counted


# -- a shared cluster's preemptions, quotas and queues (a probe, 2026-12-06) ---------------------


def ended_at_its_deadline(c: FakeCluster) -> None:
    """The operator: the job runs until its activeDeadlineSeconds, then it is Failed with the
    deadline's reason (the ranks stopped by SIGTERM); the first one is preempted at 600 s."""
    job = c.jobs[NAME]
    if POD not in c.pods:
        c.add_pod(NAME, "master", 0, "Running")
    if "Failed" in str(job.get("status")):
        return
    elapsed = (c.clock - dt.datetime.fromisoformat(job["metadata"]["creationTimestamp"])).total_seconds()
    if creates(c) == 1 and elapsed >= 600:
        c.add_pod(NAME, "master", 0, "Failed", exit_code=143, logs=["[rank 0] SIGTERM: checkpoint committed"])
        c.disrupt(NAME, "master", 0, condition="PreemptionByScheduler", message="preempted")
        c.set_condition(NAME, "Failed", "PyTorchJobFailed", "1 Master replica(s) failed")
    elif elapsed >= job["spec"]["runPolicy"]["activeDeadlineSeconds"]:
        c.add_pod(NAME, "master", 0, "Failed", exit_code=143, logs=["[rank 0] SIGTERM: checkpoint committed"])
        c.set_condition(NAME, "Failed", "DeadlineExceeded", "active longer than specified deadline")


@pytest.mark.parametrize("own", [0, 3600])  # none, or the run's whole time
def test_a_job_ended_at_the_run_s_own_deadline_is_a_timeout_of_the_run(own):
    """A re-created job the operator ended at the time left of the run was reported as ended by
    `kubernetes.active_deadline_seconds` (which was not set, or longer), with the value of the
    run's whole time and the first job's cause (preempted)."""
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.active_deadline_seconds": own, "kubernetes.poll_seconds": 30})
    cluster.timeline = [ended_at_its_deadline]
    with pytest.raises(JobTimeout) as err:
        run_job(backend, replace(spec, timeout_s=3600))
    message = str(err.value)
    assert "DeadlineExceeded" in message and "the run's time is up (3600s, job.timeout_seconds)" in message
    assert "active_deadline_seconds" not in message and "preempted" not in message, message
    assert creates(cluster) == 2 and NAME not in cluster.jobs


def quota_refusal(limit: int = 5):
    """A ResourceQuota's 403, as the API server answers it (its Status message in the body)."""
    exc = api_error(403)
    exc.body = json.dumps(
        {
            "kind": "Status",
            "message": f'pytorchjobs.kubeflow.org "{NAME}" is forbidden: exceeded quota: team-quota, requested: '
            f"count/pytorchjobs.kubeflow.org=1, used: count/pytorchjobs.kubeflow.org={limit}, limited: "
            f"count/pytorchjobs.kubeflow.org={limit}",
            "reason": "Forbidden",
            "code": 403,
        }
    )
    return exc


@pytest.mark.parametrize("when", ["submitted", "re-created after a preemption"])
def test_a_create_a_quota_refuses_waits_for_the_quota_to_free(when):
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, **{"kubernetes.poll_seconds": 30})
    if when == "submitted":
        cluster.fail_next("create", exc=quota_refusal(), times=4)
        cluster.timeline = running_then(lambda c: c.set_condition(NAME, "Succeeded"))
    else:

        def quota_after_preemption(c: FakeCluster) -> None:
            if creates(c) == 1 and "Failed" not in str(c.jobs[NAME].get("status")) and POD in c.pods:
                c.fail_next("create", exc=quota_refusal(), times=4)  # another team's jobs took the room
            preempted_once(c)

        cluster.timeline = [quota_after_preemption] * 12
    run_job(backend, replace(spec, timeout_s=3600))
    said = [line for line in lines if "cannot be created yet" in line]
    assert len(said) == 1 and "exceeded quota: team-quota" in said[0], lines
    assert sum(1 for call, _ in cluster.calls if call == "create") >= 5


def test_a_quota_that_never_frees_ends_at_the_run_s_deadline_as_its_timeout():
    """With no queue_timeout_seconds (the default), the wait at submit had no end (a review)."""
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 300})
    cluster.fail_next("create", exc=quota_refusal(), times=10_000)
    with pytest.raises(JobTimeout, match=r"could not be created within the run's time \(3600s, job.timeout_seconds\)"):
        run_job(backend, replace(spec, timeout_s=3600))
    assert sum(cluster.sleeps) == pytest.approx(3600) and NAME not in cluster.jobs
    assert creates(cluster) == 12  # at 0, 300, ..., 3300 s: none once the run's time is up


def test_a_quota_of_nothing_is_not_waited_for():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 60})
    cluster.fail_next("create", exc=quota_refusal(limit=0), times=10)
    with pytest.raises(JobFailed, match="ResourceQuota of namespace team allows none of it"):
        run_job(backend, replace(spec, timeout_s=3600))
    assert sum(cluster.sleeps) == 0


def test_a_quota_that_never_frees_ends_the_run_naming_the_quota_not_rbac():
    cluster = FakeCluster()
    backend, spec, _ = make(cluster, **{"kubernetes.poll_seconds": 30, "kubernetes.queue_timeout_seconds": 600})
    cluster.fail_next("create", exc=quota_refusal(), times=1000)
    with pytest.raises(JobFailed) as err:
        run_job(backend, replace(spec, timeout_s=3600))
    message = str(err.value)
    assert "ResourceQuota of namespace" in message and "RBAC" not in message, message
    assert 600 <= sum(cluster.sleeps) <= 700 and NAME not in cluster.jobs


@pytest.mark.parametrize(
    ("resumes", "said"),
    [
        ("checkpoint", "the trainer resumes from its latest checkpoint"),
        ("start", "reads no checkpoint (checkpoint.enabled or checkpoint.resume is off): training starts again"),
        ("resume_from", "starts again from checkpoint.resume_from's checkpoint, not from its own"),
        (None, "your command resumes only if it saves and loads its own checkpoints"),
    ],
)
def test_a_re_created_job_is_said_to_resume_only_where_it_does(resumes, said):
    """With checkpoints off, the launcher promised a resume from the latest checkpoint."""
    from trainer.config import load_config
    from trainer.launch.job import training_job

    for overrides, expected in [
        ({}, "checkpoint"),
        ({"checkpoint.enabled": False}, "start"),
        ({"checkpoint.resume": False, "checkpoint.resume_from": "s3://bucket/runs/r/checkpoints"}, "resume_from"),
    ]:
        built = training_job(load_config(overrides=overrides), NAME, "s3://bucket/ds", "s3://bucket/model")
        assert built.resumes == expected, overrides
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = [preempted_once] * 8
    run_job(backend, replace(spec, timeout_s=600, resumes=resumes))
    assert any("re-creating it" in line and said in line for line in lines), lines


def test_a_requeued_job_names_its_latest_eviction_not_an_earlier_one():
    """The line said the first eviction's cause for every later one (the job's events were read
    from its creation, not from its last admission)."""
    from tests.unit.test_launch_kubernetes import queue_script

    cluster = FakeCluster(kueue=True)
    backend, spec, lines = make(cluster, **{"kubernetes.queue": "team-a", "kubernetes.pending_timeout_seconds": 300})
    start = running_then(lambda c: None)[0]

    def evicted(reason: str):
        def evict(c: FakeCluster) -> None:
            c.post_event(NAME, "Stopped", reason)
            c.suspend(NAME)

        return evict

    cluster.timeline = queue_script(
        1,
        [
            start,
            start,
            evicted("Workload evicted due to node failures"),
            *queue_script(
                1,
                [
                    start,
                    start,
                    evicted("Preempted to accommodate a workload (UID: 1) due to fair sharing within the cohort"),
                    *queue_script(1, running_then(lambda c: c.set_condition(NAME, "Succeeded"))),
                ],
            ),
        ],
    )
    run_job(backend, replace(spec, timeout_s=7200))
    back = [line for line in lines if "went back to the queue" in line]
    assert len(back) == 2, lines
    assert "node_lost" in back[0] and "preempted" in back[1] and "node_lost" not in back[1], back


def test_a_re_creation_rides_out_a_minute_of_api_trouble_on_its_delete():
    """Only a stopped launcher's cancel is hurried (a pod's termination grace): the delete of a
    re-creation is retried for the API budget (a review: the 20 s cancel budget failed a step a
    minute of 503s would not have)."""
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)

    def failed_then_trouble(c: FakeCluster) -> None:
        preempted_once(c)
        if "Failed" in str(c.jobs.get(NAME, {}).get("status")) and not c.__dict__.get("troubled"):
            c.__dict__["troubled"] = True
            c.fail_next("delete", status=503, times=6)  # backoff 1+2+4+8+16+30 s, past 20 s

    cluster.timeline = [failed_then_trouble] * 12
    run_job(backend, replace(spec, timeout_s=3600))
    assert creates(cluster) == 2 and f"kftrain: PyTorchJob {NAME} succeeded" in lines


def test_a_long_line_read_again_after_its_container_ended_is_not_written_twice():
    """Output without newlines (a `\\r` progress bar) is written in pieces, the first stamped:
    the ended container's last read skips a written line's unstamped pieces too (a review)."""
    from trainer.launch.logstream import MAX_LINE_BYTES

    sent = b"2026-01-01T00:00:01.000000000Z " + b"#" * (2 * MAX_LINE_BYTES) + b"\n"
    sent += b"2026-01-01T00:00:02.000000000Z done\n"
    lines: list[str] = []
    streams = LogStreams(lines.append)
    for pod in (running_pod(), running_pod(trainer_running=False)):
        streams.follow(pod, "master-0", "pytorch", lambda since: OneStream(sent))
        streams.finish()
    assert [len(line) for line in lines] == [len(lines[0]), len(lines[1]), len("[master-0] done")]
    assert "".join(line.removeprefix("[master-0] ") for line in lines[:2]) == "#" * (2 * MAX_LINE_BYTES)
