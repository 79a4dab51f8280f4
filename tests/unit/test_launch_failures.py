"""Failures by cause (trainer/launch/failures.py) and their budgets in the Kubernetes launcher.

The classification table feeds pod statuses and events shaped as the API serves them (camelCase
JSON); where each shape comes from is cited on its row. The budget tests run the real
KubernetesBackend against the FAKE API of tests/fake_kube.py (no API server runs on the test
machines): the fake plays the operator, the scheduler and the kubelet from a script.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.fake_kube import FakeCluster, launcher
from trainer import exit_codes
from trainer.config import ConfigError, load_config
from trainer.launch import failures
from trainer.launch.backend import JobFailed, JobTimeout, run_job
from trainer.launch.failures import Event, before_torchrun_summary, classify, root_cause_exit_code
from trainer.launch.job import training_job

pytestmark = pytest.mark.timeout(60)
NAME = "kftrain-0123456789ab"
POD = f"{NAME}-worker-0"


def pod(name=POD, phase="Failed", conditions=(), reason=None, message=None, state=None, last_state=None, sidecars=()):
    """A pod as `GET /api/v1/namespaces/<ns>/pods/<name>` returns it (only what the classifier reads);
    `sidecars`: (name, state, lastState) of other containers, listed by name as the kubelet does."""
    containers = [
        {"name": "pytorch", "restartCount": 0, "state": state or {}, "lastState": last_state or {}},
        *({"name": n, "restartCount": 0, "state": st or {}, "lastState": last or {}} for n, st, last in sidecars),
    ]
    status = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False"}, *conditions],
        "containerStatuses": sorted(containers, key=lambda c: c["name"]),
    }
    if reason:
        status["reason"], status["message"] = reason, message
    return {"metadata": {"name": name}, "status": status}


def exited(code, reason="Error"):
    return {"terminated": {"exitCode": code, "reason": reason}}


def disruption(reason, message):
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}


MASTER_POD = f"{NAME}-master-0"
USER_ERROR_LINE = "[rank 1] training failed: data.text_column 'body' is not a column"
WATCHDOG_LINE = (
    "[rank0]:[E101 00:10:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600083 "
    "milliseconds before timing out."
)


def torchrun_summary(exitcode, *others):
    """The end of a replica's log when a training process fails: torchrun's ChildFailedError
    summary (torch/distributed/elastic/multiprocessing/errors/__init__.py, torch 2.13), with the
    exit codes of `others` failed in the same poll."""
    listed = [
        line
        for i, code in enumerate(others, 1)
        for line in (f"[{i}]:", f"  rank      : {i} (local_rank: {i})", f"  exitcode  : {code} (pid: {60 + i})")
    ]
    return [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "trainer.train FAILED",
        "------------------------------------------------------------",
        "Failures:",
        *(listed or ["  <NO_OTHER_FAILURES>"]),
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-01-01_00:10:00",
        "  host      : kftrain-0123456789ab-worker-0",
        "  rank      : 1 (local_rank: 0)",
        f"  exitcode  : {exitcode} (pid: 57)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ]


#: Kueue's eviction message when it preempts a Workload (pkg/scheduler/preemption, the Workload's
#: `Evicted` condition with reason `Preempted`).
KUEUE_PREEMPTED = (
    "Preempted to accommodate a workload (UID: 9f54, JobUID: a20d) due to prioritization in the ClusterQueue"
)

# (case, pods, events, logs by pod name, expected cause)
CASES = [
    (
        # kube-scheduler's preemption (pkg/scheduler/framework/preemption): DisruptionTarget with
        # reason PreemptionByScheduler and "<schedulerName>: preempting to accommodate a higher
        # priority pod"; the container got SIGTERM (143).
        "scheduler preemption",
        [
            pod(
                conditions=[
                    disruption(
                        "PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod"
                    )
                ],
                state=exited(143),
            )
        ],
        [Event(POD, "Preempted", "Preempted by team/urgent-0 on node gpu-node-3")],
        {},
        failures.PREEMPTED,
    ),
    (
        # A drain (kubectl drain, a descheduler) through the Eviction API: reason EvictionByEvictionAPI.
        "eviction API (drain)",
        [pod(conditions=[disruption("EvictionByEvictionAPI", "Eviction API: evicting")], state=exited(143))],
        [],
        {},
        failures.PREEMPTED,
    ),
    (
        # Node-pressure eviction (kubelet eviction manager): phase Failed, status.reason Evicted, the
        # "low on resource" message, and DisruptionTarget TerminationByKubelet; the pod within its
        # request: another tenant's pressure, a preemption.
        "kubelet node-pressure eviction",
        [
            pod(
                conditions=[disruption("TerminationByKubelet", "The node was low on resource: memory. ")],
                reason="Evicted",
                message="The node was low on resource: memory. Threshold quantity: 100Mi, available: 92Mi. ",
                state=exited(137),
            )
        ],
        [Event(POD, "Evicted", "The node was low on resource: memory.")],
        {},
        failures.PREEMPTED,
    ),
    (
        # The same eviction of a pod the kubelet names as over its memory request: the run's own
        # use, which a re-created job repeats (was: preempted, re-created 40 times to the deadline).
        "kubelet eviction of a pod over its memory request",
        [
            pod(
                conditions=[disruption("TerminationByKubelet", "The node was low on resource: memory. ")],
                reason="Evicted",
                message="The node was low on resource: memory. Threshold quantity: 100Mi, available: 92Mi. "
                "Container pytorch was using 61Gi, request is 32Gi, has larger consumption of memory. ",
                state=exited(137),
            )
        ],
        [Event(POD, "Evicted", "Container pytorch was using 61Gi, request is 32Gi, has larger consumption of memory.")],
        {},
        failures.OOM,
    ),
    (
        # A sidecar over its own request (a service mesh's proxy) is not the run's doing: a preemption.
        "kubelet eviction of a pod whose sidecar is over its request",
        [
            pod(
                reason="Evicted",
                message="The node was low on resource: memory. Threshold quantity: 100Mi, available: 92Mi. "
                "Container istio-proxy was using 2Gi, request is 128Mi, has larger consumption of memory. ",
                state=exited(137),
            )
        ],
        [],
        {},
        failures.PREEMPTED,
    ),
    (
        # Over its ephemeral-storage request (checkpoints staged on the node's disk): the run's settings.
        "kubelet eviction of a pod over its disk request",
        [
            pod(
                reason="Evicted",
                message="The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 2Gi. "
                "Container pytorch was using 80Gi, request is 0, has larger consumption of ephemeral-storage. ",
            )
        ],
        [],
        {},
        failures.USER_ERROR,
    ),
    # The kubelet's local-storage limit evictions (pkg/kubelet/eviction: emptyDir sizeLimit, a
    # container's or the pod's ephemeral-storage limit): limits the run set, hit again on every
    # re-creation (was: preempted, re-created without end).
    *(
        (
            f"kubelet eviction over a limit: {what}",
            [pod(conditions=[disruption("TerminationByKubelet", message)], reason="Evicted", message=message)],
            [Event(POD, "Evicted", message)],
            {},
            cause,
        )
        for what, message, cause in (
            ("/dev/shm", 'Usage of EmptyDir volume "dshm" exceeds the limit "2Gi". ', failures.USER_ERROR),
            ("a scratch volume", 'Usage of EmptyDir volume "scratch" exceeds the limit "10Gi". ', failures.USER_ERROR),
            (
                "the container's",
                'Container pytorch exceeded its local ephemeral storage limit "10Gi". ',
                failures.USER_ERROR,
            ),
            (
                "the pod's",
                "Pod ephemeral local storage usage exceeds the total limit of containers 10Gi. ",
                failures.USER_ERROR,
            ),
            (
                "a sidecar's",
                'Container istio-proxy exceeded its local ephemeral storage limit "1Gi". ',
                failures.PREEMPTED,
            ),
        )
    ),
    (
        # Graceful node shutdown (kubelet nodeshutdown manager): status.reason Terminated, its message,
        # DisruptionTarget TerminationByKubelet: the node is going away, not the pod's own doing.
        "graceful node shutdown",
        [
            pod(
                conditions=[
                    disruption("TerminationByKubelet", "Pod was terminated in response to imminent node shutdown.")
                ],
                reason="Terminated",
                message="Pod was terminated in response to imminent node shutdown.",
            )
        ],
        [],
        {},
        failures.NODE_LOST,
    ),
    (
        # The taint-eviction controller after node.kubernetes.io/unreachable:NoExecute: DeletionByTaintManager.
        "unreachable node (taint manager)",
        [
            pod(
                phase="Running",
                conditions=[disruption("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")],
            )
        ],
        [Event(POD, "TaintManagerEviction", f"Marking for deletion Pod team/{POD}")],
        {},
        failures.NODE_LOST,
    ),
    (
        # PodGC when the pod's node object is gone: DeletionByPodGC.
        "node deleted (pod GC)",
        [pod(conditions=[disruption("DeletionByPodGC", "PodGC: node no longer exists")])],
        [],
        {},
        failures.NODE_LOST,
    ),
    (
        # The node lifecycle controller's older marking of pods on an unresponsive node.
        "node lost (status.reason NodeLost)",
        [
            pod(
                phase="Unknown",
                reason="NodeLost",
                message=f"Node gpu-node-3 which was running pod {POD} is unresponsive",
            )
        ],
        [],
        {},
        failures.NODE_LOST,
    ),
    (
        # The cgroup OOM killer: state.terminated.reason OOMKilled, exit 137; the other rank sees
        # its collective fail, which the OOM outranks.
        "OOMKilled, the peer's collective failed",
        [
            pod(state=exited(137, "OOMKilled")),
            pod(name=f"{NAME}-master-0", state=exited(1)),
        ],
        [],
        {f"{NAME}-master-0": torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.OOM,
    ),
    (
        # An OOM that the operator already restarted: the evidence is in lastState.
        "OOMKilled in lastState",
        [
            pod(
                phase="Running",
                state={"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                last_state=exited(137, "OOMKilled"),
            )
        ],
        [],
        {},
        failures.OOM,
    ),
    (
        # kubelet image pull failures: state.waiting.reason ErrImagePull, then ImagePullBackOff.
        "image pull back-off",
        [
            pod(
                phase="Pending",
                state={
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "registry.example/kftrain:nope"',
                    }
                },
            )
        ],
        [],
        {},
        failures.IMAGE_PULL,
    ),
    (
        "image pull error",
        [
            pod(
                phase="Pending",
                state={
                    "waiting": {
                        "reason": "ErrImagePull",
                        "message": "rpc error: code = NotFound desc = failed to pull and unpack image "
                        '"registry.example/kftrain:nope"',
                    }
                },
            )
        ],
        [],
        {},
        failures.IMAGE_PULL,
    ),
    (
        # Kueue evicting the job's Workload (Evicted condition, reason Preempted, the message of
        # Kueue's preemption) and stopping the job: its job reconciler records an event with reason
        # `Stopped` (pkg/controller/jobframework/events.go, ReasonStopped) carrying that message.
        "Kueue preemption",
        [],
        [
            Event(
                NAME,
                "Stopped",
                KUEUE_PREEMPTED,
            )
        ],
        {},
        failures.PREEMPTED,
    ),
    (
        # Kueue's pod integration marks the pods of an evicted Workload before it stops them
        # (pkg/controller/jobs/pod tests: TerminationTarget, WorkloadEvictedDueToPreempted).
        "Kueue stops a pod (TerminationTarget)",
        [
            pod(
                conditions=[
                    {
                        "type": "TerminationTarget",
                        "status": "True",
                        "reason": "WorkloadEvictedDueToPreempted",
                        "message": "Preempted to accommodate a higher priority Workload",
                    }
                ],
                state=exited(143),
            )
        ],
        [],
        {},
        failures.PREEMPTED,
    ),
    (
        "trainer: non-finite loss (exit 3 through torchrun)",
        [pod(state=exited(1))],
        [],
        {POD: ["[rank 1] training failed: non-finite loss", *torchrun_summary(exit_codes.NONFINITE_LOSS)]},
        failures.NONFINITE,
    ),
    (
        "trainer: collective timeout (exit 4 through torchrun)",
        [pod(state=exited(1))],
        [],
        {POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.COLLECTIVE_TIMEOUT,
    ),
    (
        # NCCL's watchdog aborts the process before the trainer can exit with its code (SIGABRT, -6).
        "NCCL watchdog abort",
        [pod(state=exited(1))],
        [],
        {
            POD: [
                "[rank1]:[E101 00:10:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                "ran for 600083 milliseconds before timing out.",
                *torchrun_summary(-6),
            ]
        },
        failures.COLLECTIVE_TIMEOUT,
    ),
    (
        "trainer: user error (exit 1 through torchrun)",
        [pod(state=exited(1))],
        [],
        {POD: ["[rank 0] training failed: data.text_column 'body' is not a column", *torchrun_summary(1)]},
        failures.USER_ERROR,
    ),
    # One rank's own fault leaves its peers in a collective that fails: the fault is the cause, so
    # a run that would fail the same way is not re-created for a "collective timeout".
    (
        "one rank's error, its peer's collective failed",
        [pod(state=exited(1)), pod(name=MASTER_POD, state=exited(1))],
        [],
        {POD: [USER_ERROR_LINE, *torchrun_summary(1)], MASTER_POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.USER_ERROR,
    ),
    (
        "one rank's error, its peer's NCCL watchdog fired",
        [pod(name=MASTER_POD, state=exited(1)), pod(state=exited(1))],
        [],
        {MASTER_POD: [WATCHDOG_LINE, *torchrun_summary(-6)], POD: [USER_ERROR_LINE, *torchrun_summary(1)]},
        failures.USER_ERROR,
    ),
    (
        "one rank's non-finite loss, its peer's collective failed",
        [pod(state=exited(1)), pod(name=MASTER_POD, state=exited(1))],
        [],
        {POD: torchrun_summary(exit_codes.NONFINITE_LOSS), MASTER_POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.NONFINITE,
    ),
    (
        # torchrun's container exits 1 whatever its process did: with no report in the log (it
        # could not be read), that 1 does not outrank the peer's own report.
        "a peer's exit 1 with an unreadable log, a collective timed out",
        [pod(state=exited(1)), pod(name=MASTER_POD, state=exited(1))],
        [],
        {
            POD: ["(log unavailable: 500 Internal Server Error)"],
            MASTER_POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT),
        },
        failures.COLLECTIVE_TIMEOUT,
    ),
    (
        # When a job fails, the operator deletes its running pods (cleanPodPolicy: Running): their
        # SIGTERM ends in 143 (kftrain's torchrun), which must not make the failure a preemption.
        "one rank's error, a peer stopped by the operator's clean-up (143)",
        [pod(state=exited(1)), pod(name=MASTER_POD, state=exited(exit_codes.TERMINATED_CHECKPOINTED))],
        [],
        {POD: [USER_ERROR_LINE, *torchrun_summary(1)], MASTER_POD: ["[rank 0] stopping at step 12 (SIGTERM)"]},
        failures.USER_ERROR,
    ),
    (
        # A peer's collective timed out; the hung pod, deleted by the operator once the job failed,
        # ends in 143: the timeout's budget (1) holds, not a preemption's (unlimited).
        "a collective timed out, the hung peer stopped by the operator's clean-up (143)",
        [pod(state=exited(exit_codes.TERMINATED_CHECKPOINTED)), pod(name=MASTER_POD, state=exited(1))],
        [],
        {MASTER_POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.COLLECTIVE_TIMEOUT,
    ),
    (
        "a bare exit 1 (log unreadable), a peer stopped by the operator's clean-up (143)",
        [pod(state=exited(1)), pod(name=MASTER_POD, state=exited(exit_codes.TERMINATED_CHECKPOINTED))],
        [],
        {POD: ["(log unavailable: 500 Internal Server Error)"]},
        failures.USER_ERROR,
    ),
    (
        # Every rank stopped on the signal together: a preemption whose pod evidence is gone.
        "every replica stopped by SIGTERM after the checkpoint (143)",
        [pod(state=exited(exit_codes.TERMINATED_CHECKPOINTED)), pod(name=MASTER_POD, state=exited(143))],
        [],
        {MASTER_POD: ["[rank 0] stopped by SIGTERM at step 40: checkpoint committed 3.10s after the signal"]},
        failures.PREEMPTED,
    ),
    # A training process killed by a signal is its own failure, not its peers' (was: unknown, ranked
    # below the collective its peer then failed, and the job re-created to be killed again).
    (
        "a rank killed by SIGKILL (the OOM killer, the container alive), its peer's collective failed",
        [pod(state=exited(1)), pod(name=MASTER_POD, state=exited(1))],
        [],
        {POD: torchrun_summary(-9), MASTER_POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.OOM,
    ),
    (
        "a rank killed by SIGKILL, the master's own exit 1",
        [pod(name=MASTER_POD, state=exited(1)), pod(state=exited(1))],
        [],
        {POD: torchrun_summary(-9), MASTER_POD: torchrun_summary(1)},
        failures.OOM,
    ),
    (
        "a rank crashed (SIGBUS: /dev/shm full), its peer's collective failed",
        [pod(state=exited(1)), pod(name=MASTER_POD, state=exited(1))],
        [],
        {POD: torchrun_summary(-7), MASTER_POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.USER_ERROR,
    ),
    # NCCL aborts the peers of a failed rank (TORCH_NCCL_ASYNC_ERROR_HANDLING): SIGABRT with its
    # lines is the collective's failure; without them, below any process's own report.
    (
        "a rank's own error, its peer aborted by NCCL (SIGABRT, NCCL's lines)",
        [pod(name=MASTER_POD, state=exited(1)), pod(state=exited(1))],
        [],
        {
            MASTER_POD: [
                "[rank0]:[E101 ProcessGroupNCCL.cpp:1484] [PG 0 Rank 0] Process group watchdog thread terminated "
                "with exception: NCCL error: remote process exited or there was a network error",
                *torchrun_summary(-6),
            ],
            POD: [USER_ERROR_LINE, *torchrun_summary(1)],
        },
        failures.USER_ERROR,
    ),
    (
        "a collective timed out, its peer aborted with no NCCL line",
        [pod(name=MASTER_POD, state=exited(1)), pod(state=exited(1))],
        [],
        {MASTER_POD: torchrun_summary(-6), POD: torchrun_summary(exit_codes.COLLECTIVE_TIMEOUT)},
        failures.COLLECTIVE_TIMEOUT,
    ),
    (
        "a rank aborted by NCCL's heartbeat monitor alone (a hung peer)",
        [pod(state=exited(1))],
        [],
        {POD: ["[rank1]:[E101 ProcessGroupNCCL.cpp:1423] Heartbeat monitor timed out!", *torchrun_summary(-6)]},
        failures.COLLECTIVE_TIMEOUT,
    ),
    ("a rank's SIGSEGV alone", [pod(state=exited(1))], [], {POD: torchrun_summary(-11)}, failures.USER_ERROR),
    # Two processes of one pod failed in one poll: the root cause is the lower rank, here the one
    # NCCL aborted; the other's own exit code says why (was: a collective's failure, re-created).
    (
        "a pod's rank aborted by NCCL as the root cause, its other rank's own error beside it",
        [pod(state=exited(1))],
        [],
        {POD: [WATCHDOG_LINE, *torchrun_summary(-6, exit_codes.NONFINITE_LOSS)]},
        failures.NONFINITE,
    ),
    # NCCL's warnings of a healthy run are no failure, and a CUDA error is the rank's own bug.
    (
        "a rank's SIGABRT beside NCCL's barrier warning",
        [pod(state=exited(1))],
        [],
        {
            POD: [
                "[rank1]:[W101 ProcessGroupNCCL.cpp:4715] [PG ID 0 PG GUID 0 Rank 1] using GPU 1 to perform barrier "
                "as devices used by this process are currently unknown.",
                *torchrun_summary(-6),
            ]
        },
        failures.USER_ERROR,
    ),
    (
        "a rank's device-side assert, which NCCL's watchdog reports as it aborts",
        [pod(state=exited(1))],
        [],
        {
            POD: [
                "[rank1]:[E101 ProcessGroupNCCL.cpp:1484] [PG 0 Rank 1] Process group watchdog thread terminated with "
                "exception: CUDA error: device-side assert triggered",
                *torchrun_summary(-6),
            ]
        },
        failures.USER_ERROR,
    ),
    (
        "a container's exit 1 alone",
        [pod(state=exited(1))],
        [],
        {},
        failures.USER_ERROR,
    ),
    (
        "trainer: terminated after a checkpoint (143), no other evidence",
        [pod(state=exited(exit_codes.TERMINATED_CHECKPOINTED))],
        [],
        {},
        failures.PREEMPTED,
    ),
    # A sidecar (Istio's proxy in a multi-user Kubeflow, a log shipper) ends with the pod, on its own
    # terms; the kubelet lists it before `pytorch` by name. Only the training container's exit is the run's.
    (
        "a sidecar's stop signal listed before the training container's error",
        [pod(state=exited(1), sidecars=[("istio-proxy", None, exited(143))])],
        [],
        {},
        failures.USER_ERROR,
    ),
    (
        "a sidecar that exited cleanly listed before the training container's error",
        [pod(state=exited(1), sidecars=[("istio-proxy", exited(0), None)])],
        [],
        {},
        failures.USER_ERROR,
    ),
    (
        "a sidecar's old error listed before the training container's stop after a checkpoint",
        [pod(state=exited(exit_codes.TERMINATED_CHECKPOINTED), sidecars=[("fluent-bit", None, exited(1))])],
        [],
        {},
        failures.PREEMPTED,
    ),
    (
        "a sidecar killed for its own memory beside the training container's error",
        [pod(state=exited(1), sidecars=[("istio-proxy", None, exited(137, "OOMKilled"))])],
        [],
        {},
        failures.USER_ERROR,
    ),
    (
        "a sidecar's image that cannot be pulled",
        [pod(phase="Pending", sidecars=[("istio-proxy", {"waiting": {"reason": "ImagePullBackOff"}}, None)])],
        [],
        {},
        failures.IMAGE_PULL,
    ),
    (
        "SIGKILL with nothing to say why",
        [pod(state=exited(137))],
        [Event(POD, "Killing", "Stopping container pytorch")],
        {},
        failures.UNKNOWN,
    ),
    ("no evidence at all", [], [], {}, failures.UNKNOWN),
]


@pytest.mark.parametrize(("pods", "events", "logs", "cause"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_cause_is_classified_from_realistic_statuses(pods, events, logs, cause):
    diagnosis = classify(pods, events, logs)
    assert diagnosis.cause == cause, diagnosis
    assert diagnosis.evidence  # the step's message says what it is based on


def test_torchruns_summary_gives_the_root_causes_exit_code():
    assert root_cause_exit_code(torchrun_summary(3)) == 3
    assert root_cause_exit_code(["exitcode  : 9"]) is None  # not inside a root-cause block
    assert root_cause_exit_code([]) is None


def test_defaults_cover_every_cause():
    assert set(failures.DEFAULT_MAX_RESTARTS) == set(failures.CAUSES) == set(failures.MEANING)
    assert failures.DEFAULT_MAX_RESTARTS[failures.PREEMPTED] == failures.UNLIMITED
    assert failures.DEFAULT_MAX_RESTARTS[failures.USER_ERROR] == 0


@pytest.mark.parametrize(
    ("budgets", "named"),
    [
        ({"preemption": 1}, "kubernetes.max_restarts_by_cause.preemption: not a cause"),
        ({"oom": -2}, "kubernetes.max_restarts_by_cause.oom: must be an integer >= -1"),
        ({"node_lost": True}, "kubernetes.max_restarts_by_cause.node_lost"),
    ],
)
def test_bad_budgets_are_refused_naming_the_field(budgets, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(overrides={"kubernetes.max_restarts_by_cause": budgets})


# -- budgets in the launcher (FAKE API) --------------------------------------------------------


def make(cluster: FakeCluster, budgets=None, timeout_s=600):
    overrides = {"kubernetes.poll_seconds": 1.0}
    if budgets is not None:
        overrides["kubernetes.max_restarts_by_cause"] = budgets
    cfg = load_config(overrides=overrides)
    spec = replace(training_job(cfg, NAME, "s3://bucket/ds", "s3://bucket/model"), timeout_s=timeout_s)
    lines: list[str] = []
    return launcher(cluster, "uid-1", lines.append), spec, lines


def running(c: FakeCluster) -> None:
    if f"{NAME}-master-0" not in c.pods:
        c.add_pod(NAME, "master", 0, "Running", logs=["[rank 0] step 10"])
        c.add_pod(NAME, "worker", 0, "Running", logs=["[rank 1] step 10"])


def preempted(c: FakeCluster) -> None:
    """The scheduler preempts the worker; the operator gives up on the job (restartPolicy Never)."""
    c.add_pod(NAME, "worker", 0, "Failed", exit_code=143, logs=["[rank 1] SIGTERM: checkpoint committed"])
    c.disrupt(
        NAME,
        "worker",
        0,
        condition="PreemptionByScheduler",
        message="default-scheduler: preempting to accommodate a higher priority pod",
    )
    c.set_condition(NAME, "Failed", "JobFailed", f"PyTorchJob {NAME} is failed because 1 Worker replica(s) failed.")


def user_error(c: FakeCluster) -> None:
    c.add_pod(
        NAME, "worker", 0, "Failed", exit_code=1, logs=["[rank 1] training failed: bad column", *torchrun_summary(1)]
    )
    c.set_condition(NAME, "Failed", "JobFailed", f"PyTorchJob {NAME} is failed because 1 Worker replica(s) failed.")


def node_lost(c: FakeCluster) -> None:
    c.add_pod(NAME, "worker", 0, "Running")
    c.disrupt(
        NAME, "worker", 0, reason="NodeLost", message=f"Node gpu-node-3 which was running pod {POD} is unresponsive"
    )
    c.set_condition(NAME, "Failed", "JobFailed", f"PyTorchJob {NAME} is failed because 1 Worker replica(s) failed.")


def succeeded(c: FakeCluster) -> None:
    running(c)
    c.set_condition(NAME, "Succeeded", "JobSucceeded")


def test_a_preempted_job_is_recreated_under_its_name_and_then_succeeds():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = [running, preempted, running, succeeded]
    run_job(backend, spec)
    creates_and_deletes = [c for c in cluster.calls if c[0] in ("create", "delete")]
    assert creates_and_deletes == [("create", NAME), ("delete", NAME), ("create", NAME)]
    restart = next(line for line in lines if "re-creating it" in line)
    assert "failed: preempted (preempted or evicted)" in restart
    assert "PreemptionByScheduler" in restart
    assert "unlimited (kubernetes.max_restarts_by_cause.preempted is -1) until the deadline" in restart
    assert lines[-1] == f"kftrain: PyTorchJob {NAME} succeeded"


def test_a_user_error_is_not_retried_and_the_step_names_the_cause():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    cluster.timeline = [running, user_error]
    with pytest.raises(JobFailed) as info:
        run_job(backend, spec)
    first = str(info.value).splitlines()[0]
    assert "cause: user_error (an error in the run (config, data or code))" in first
    assert "not re-created (kubernetes.max_restarts_by_cause.user_error is 0)" in first
    assert [c[0] for c in cluster.calls if c[0] == "create"] == ["create"]
    assert not any("re-creating" in line for line in lines)


def test_a_spent_budget_fails_with_the_cause_named():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, budgets={"node_lost": 2})
    cluster.timeline = [running, node_lost] * 3
    with pytest.raises(JobFailed) as info:
        run_job(backend, spec)
    restarts = [line for line in lines if "re-creating it" in line]
    assert len(restarts) == 2
    assert "1 of 2 left" in restarts[0] and "0 of 2 left" in restarts[1]
    first = str(info.value).splitlines()[0]
    assert "cause: node_lost (a node was lost): pod" in first and "NodeLost" in first
    assert "its 2 re-creation(s) for node_lost are spent (kubernetes.max_restarts_by_cause.node_lost)" in first
    assert [c[0] for c in cluster.calls if c[0] == "create"] == ["create"] * 3


@pytest.mark.parametrize("annotation", ["", "not json", "[1]", '{"node_lost": "x", "bogus": 9}'])
def test_a_retried_launcher_spends_the_run_s_budget_not_a_fresh_one(annotation):
    """The re-creations are the run's (annotation kftrain.io/restarts on the job): a launcher KFP
    retries re-attaches to a job re-created once for a lost node and has one of two left. An
    annotation that does not parse counts as none: it must not stop the run."""
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, budgets={"node_lost": 2})

    def launcher_dies(c: FakeCluster) -> None:
        raise KeyboardInterrupt  # the launcher pod is gone; its job stays

    cluster.timeline = [running, node_lost, running, launcher_dies]
    with pytest.raises(KeyboardInterrupt):
        backend.submit(spec)
        backend.wait(replace(spec))  # the same job, described again: its run state stays
    annotations = cluster.jobs[NAME]["metadata"]["annotations"]
    assert annotations["kftrain.io/restarts"] == '{"node_lost": 1}'
    assert annotations["kftrain.io/deadline"] == "2026-01-01T00:10:00Z"  # submitted at T0, 600 s
    if annotation:
        cluster.jobs[NAME]["metadata"]["annotations"]["kftrain.io/restarts"] = annotation
    retried, _, retried_lines = make(cluster, budgets={"node_lost": 2})
    cluster.timeline, cluster.polls = [running, node_lost, running, node_lost], 0
    with pytest.raises(JobFailed) as info:
        run_job(retried, spec)
    restarts = [line for line in retried_lines if "re-creating it" in line]
    if annotation:  # unreadable: the retried launcher starts from none, as without the annotation
        assert len(restarts) == 2 and "1 of 2 left" in restarts[0]
        assert "its 2 re-creation(s) for node_lost are spent" in str(info.value)
        return
    assert len(restarts) == 1 and "re-creation 2 for node_lost, 0 of 2 left" in restarts[0]
    assert "its 2 re-creation(s) for node_lost are spent" in str(info.value)
    # First launcher: create, re-create; the retried one: its create (409: re-attach), re-create.
    assert [c[0] for c in cluster.calls if c[0] == "create"] == ["create"] * 4


def test_each_cause_has_its_own_budget():
    # One node loss and one preemption with node_lost: 1: both re-created, the budgets do not mix.
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, budgets={"node_lost": 1})
    cluster.timeline = [running, node_lost, running, preempted, running, succeeded]
    run_job(backend, spec)
    restarts = [line for line in lines if "re-creating it" in line]
    assert [r.split("failed: ")[1].split(" ")[0] for r in restarts] == ["node_lost", "preempted"]


def test_unlimited_preemptions_stop_at_the_deadline():
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, timeout_s=30)

    def preempted_later(c: FakeCluster) -> None:
        c.advance(10)  # each new job runs 10 s before the next preemption
        preempted(c)

    cluster.timeline = [running, preempted_later]  # preempted at every poll after the first
    with pytest.raises(JobFailed, match=r"not re-created: the job's deadline has passed \(30s, job.timeout_seconds\)"):
        run_job(backend, spec)
    # preempted at 11 s and 21 s (a 1 s poll first): re-created; at 31 s the deadline has passed
    assert sum("re-creating it" in line for line in lines) == 2


@pytest.mark.parametrize("on", ["job", "pod"])
def test_an_earlier_attempt_s_preemption_event_does_not_explain_this_attempt_s_failure(on):
    """Events outlive the job and pods they are about, and a re-created job keeps their names: a
    preemption event of attempt 1, still listed, must not make attempt 2's OOM a preemption
    (unlimited re-creations). The one of attempt 2 itself still counts."""
    cluster = FakeCluster()
    backend, spec, lines = make(cluster)
    obj = NAME if on == "job" else f"{NAME}-worker-0"

    def preempted_with_event(c: FakeCluster) -> None:
        c.post_event(obj, "Preempted", "Preempted by a higher-priority workload")
        c.advance(1)
        preempted(c)

    def oom(c: FakeCluster) -> None:
        c.advance(30)
        c.add_pod(NAME, "worker", 0, "Failed", exit_code=137, terminated_reason="OOMKilled")
        c.set_condition(NAME, "Failed", "JobFailed", f"PyTorchJob {NAME} is failed because 1 Worker replica(s) failed.")

    cluster.timeline = [running, preempted_with_event, lambda c: c.advance(5), running, oom]
    with pytest.raises(JobFailed) as info:
        run_job(backend, spec)
    assert "cause: oom" in str(info.value).splitlines()[0], str(info.value)
    restarts = [line for line in lines if "re-creating it" in line]
    assert len(restarts) == 1 and "failed: preempted" in restarts[0]


@pytest.mark.parametrize("explicit_deadline", [0, 86400], ids=["from-timeout", "explicit-longer"])
def test_a_re_created_job_gets_the_time_left_and_a_retried_launcher_keeps_the_first_deadline(explicit_deadline):
    """job.timeout_seconds is the run's, not each attempt's: a job re-created after a preemption
    carries the first attempt's deadline, with the server-side activeDeadlineSeconds of the time
    left (also when kubernetes.active_deadline_seconds is set), and a launcher KFP retries
    re-attaches to it and times out at that same deadline."""
    cluster = FakeCluster()
    backend, spec, lines = make(cluster, timeout_s=600)
    spec = replace(spec, kubernetes=replace(spec.kubernetes, active_deadline_seconds=explicit_deadline))

    def preempted_later(c: FakeCluster) -> None:
        c.advance(200)
        preempted(c)

    def launcher_dies(c: FakeCluster) -> None:
        c.advance(100)
        raise KeyboardInterrupt  # the launcher pod is gone; the job stays (as the owner is not deleted)

    cluster.timeline = [running, preempted_later, running, launcher_dies]
    with pytest.raises(KeyboardInterrupt):
        backend.submit(spec)
        backend.wait(spec)
    job = cluster.jobs[NAME]
    deadline = job["metadata"]["annotations"]["kftrain.io/deadline"]
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == pytest.approx(600 - 201, abs=2)
    # KFP retries the step: a new launcher finds the job running and re-attaches to it.
    retried, _, retried_lines = make(cluster, timeout_s=600)
    cluster.timeline = [running]
    started = cluster.clock
    with pytest.raises(JobTimeout):
        run_job(retried, spec)
    assert any("re-attaching to it" in line for line in retried_lines)
    assert (cluster.clock - started).total_seconds() < 600 - 300 + 5  # the first deadline, not a fresh 600 s
    assert NAME not in cluster.jobs  # deleted at the deadline
    assert deadline.endswith("Z")


def test_a_job_kueue_sends_back_to_the_queue_is_reported_with_its_cause():
    # Kueue preempts by suspending the job (its pods go); it re-admits the job itself, so the
    # launcher only reports it and waits: no re-creation, no budget spent.
    cluster = FakeCluster(kueue=True)
    backend, spec, lines = make(cluster)
    cfg_spec = replace(spec, kubernetes=replace(spec.kubernetes, queue="team-queue"))

    def evict(c: FakeCluster) -> None:
        c.events[NAME] = [
            (
                "Stopped",
                KUEUE_PREEMPTED,
            )
        ]
        c.suspend(NAME)

    cluster.timeline = [lambda c: c.admit(NAME), running, evict, lambda c: c.admit(NAME), running, succeeded]
    run_job(backend, cfg_spec)
    back = next(line for line in lines if "went back to the queue" in line)
    assert "preempted (preempted or evicted): event on" in back
    assert [c[0] for c in cluster.calls if c[0] == "create"] == ["create"]


#: torchrun's own traceback of the ChildFailedError it raises, printed before its summary.
AGENT_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/app/trainer/torchrun.py", line 25, in main',
    "    torchrun(argv)",
    '  File ".../torch/distributed/launcher/api.py", line 383, in launch_agent',
    "    raise ChildFailedError(",
]
RANKS_SAID = ["[rank1]:W step 3", "terminate called after throwing an instance of 'gloo::IoException'"]


@pytest.mark.parametrize(
    "log",
    [
        [*RANKS_SAID, *torchrun_summary(-6)],  # the summary (its first line: the exception's)
        [*RANKS_SAID, *AGENT_TRACEBACK, *torchrun_summary(-6)],  # and torchrun's traceback before it
    ],
    ids=["summary", "traceback-and-summary"],
)
def test_what_the_processes_printed_is_the_log_before_torchrun_s_report(log):
    assert before_torchrun_summary(log) == RANKS_SAID
    assert before_torchrun_summary(RANKS_SAID) == RANKS_SAID  # no failure reported: all of it


def test_the_training_containers_are_the_manifests_own():
    from trainer.launch import pytorchjob, trainjob

    assert failures.TRAINING_CONTAINERS == (pytorchjob.CONTAINER, trainjob.CONTAINER)


@pytest.mark.parametrize(
    ("vmstat", "count"),
    [
        ("nr_free_pages 12\noom_kill 7\npgfault 3\n", 7),
        ("nr_free_pages 12\n", None),  # a kernel before 4.13
        ("oom_kill many\n", None),
        (None, None),  # no /proc (not Linux)
    ],
)
def test_the_oom_killers_count_is_read_from_vmstat_where_the_kernel_keeps_it(tmp_path, vmstat, count):
    path = tmp_path / "vmstat"
    if vmstat is not None:
        path.write_text(vmstat)
    assert failures.oom_kill_count(str(path)) == count


@pytest.mark.parametrize(
    ("signum", "oom_kills", "said"),
    [
        (9, None, "SIGKILL (most likely the kernel's out-of-memory killer: lower the batch"),
        (9, 2, "SIGKILL (the kernel's out-of-memory killer, which killed 2 process(es) meanwhile: lower the batch"),
        (9, 0, "SIGKILL (not the out-of-memory killer, which killed nothing meanwhile: sent from outside"),
        (11, 0, "SIGSEGV"),
        (11, None, "SIGSEGV"),
        (77, None, "signal 77"),
    ],
)
def test_a_sigkill_is_blamed_on_the_oom_killer_only_where_it_killed(signum, oom_kills, said):
    """A `kill -9` from a user or a script was told "lower the batch" (an out-of-memory kill is the
    likeliest SIGKILL only while nothing says otherwise: the kernel's count says)."""
    found = failures.killed_by(signum, oom_kills)
    assert found.startswith(said) and (found == said) == (signum != 9), found


def test_an_unexplained_failure_shows_the_events_it_could_not_read():
    """A reason not known here may still say why (a quota refusing the job's pods): shown, the
    last three (was: "no pod, event or exit code explains it", the quota event hidden)."""
    events = [Event("kftrain-x", "FailedCreate", f"exceeded quota: gpu-quota ({i})") for i in range(4)]
    routine = [Event("kftrain-x-worker-0", reason, "") for reason in ("Scheduled", "Pulled", "Created", "Started")]
    diagnosis = classify([], events + routine, {})  # the routine events of a pod's start are not shown
    assert diagnosis.cause == failures.UNKNOWN
    assert diagnosis.evidence == (
        "no pod, event or exit code explains it (events: kftrain-x: FailedCreate: exceeded quota: gpu-quota (1); "
        "kftrain-x: FailedCreate: exceeded quota: gpu-quota (2); "
        "kftrain-x: FailedCreate: exceeded quota: gpu-quota (3))"
    )
    assert classify([], [], {}).evidence == "no pod, event or exit code explains it"
