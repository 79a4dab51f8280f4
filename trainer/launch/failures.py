"""Why a job failed: its cause, read from the evidence the cluster and the trainer leave behind.

The launcher re-creates a job that failed for an infrastructure cause (the trainer resumes from
its latest checkpoint by itself) and fails the step, naming the cause, for a fault in the run
(`kubernetes.max_restarts_by_cause` holds the budget of each). The evidence, all from the API:

- pod conditions: `DisruptionTarget` (Kubernetes >= 1.26, `k8s.io/api/core/v1` types.go) with
  reason `PreemptionByScheduler` (the scheduler preempted the pod for a higher priority one),
  `EvictionByEvictionAPI` (a drain, a descheduler), `DeletionByTaintManager` (a `NoExecute`
  taint, e.g. `node.kubernetes.io/unreachable`: the node is gone), `DeletionByPodGC` (the pod's
  node no longer exists) or `TerminationByKubelet` (node-pressure eviction, graceful node
  shutdown); Kueue's `TerminationTarget` condition on the pods it stops when it evicts their
  Workload (reason `WorkloadEvictedDueToPreempted`, ...);
- pod `status.reason`: `Evicted` (node-pressure eviction: the kubelet sets the phase Failed and a
  message "The node was low on resource: memory. ..."), `NodeLost` (the node controller, when the
  node stops answering), `Shutdown` / `Terminated` (graceful node shutdown);
- containers' `state` and `lastState`: `terminated.reason: OOMKilled` (the cgroup's OOM killer),
  `waiting.reason` `ErrImagePull` / `ImagePullBackOff` / `InvalidImageName` / `ErrImageNeverPull`;
- events: the scheduler's `Preempted` on the victim pod, the kubelet's `Evicted`, the taint
  manager's `TaintManagerEviction`, and Kueue's `Stopped` on the job (jobframework's
  `ReasonStopped`) when it evicts the job's Workload, with the eviction's message (the Workload's
  `Evicted` condition, reason `Preempted`: "Preempted to accommodate a workload ...");
- the trainer's exit code (:mod:`trainer.exit_codes`). The container runs torchrun, which exits 1
  whatever its child exited with, and prints the child's code in its `ChildFailedError` summary
  ("Root Cause (first observed failure): ... exitcode  : 3 (pid: 42)"): that code is read from the
  failed replica's log, the container's own exit code otherwise.

One replica's fault shows up on every other rank as a failed collective, so the evidence is
ranked: what happened to a pod (node lost, preempted, OOMKilled, image pull) outranks what the
trainer reported, a process's own fault (a non-finite loss, an error in the run) outranks the
failed collectives it leaves its peers in, and a diagnosis names the pod it comes from
(:meth:`Diagnosis.rank` has the two exceptions: a stop signal's exit code, and a container's bare
exit 1).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainer import exit_codes
from trainer.k8s_formats import plain

PREEMPTED = "preempted"
NODE_LOST = "node_lost"
OOM = "oom"
IMAGE_PULL = "image_pull"
COLLECTIVE_TIMEOUT = "collective_timeout"
NONFINITE = "nonfinite"
USER_ERROR = "user_error"
UNKNOWN = "unknown"

#: Every cause, strongest evidence first (the order a diagnosis is chosen in).
CAUSES = (NODE_LOST, PREEMPTED, OOM, IMAGE_PULL, NONFINITE, USER_ERROR, COLLECTIVE_TIMEOUT, UNKNOWN)
#: Unlimited re-creations (still bounded by `job.timeout_seconds`, the job's deadline).
UNLIMITED = -1
#: Re-creations of a failed job per cause, unless `kubernetes.max_restarts_by_cause` says otherwise.
#: A preemption says nothing about the run, so it is retried as long as the deadline allows; a lost
#: node a few times (a cluster losing nodes over and over has a problem a retry does not fix); a
#: collective timeout once (a hung peer, or a bug that hangs every time); the rest would fail the
#: same way again with the same config.
DEFAULT_MAX_RESTARTS = {
    PREEMPTED: UNLIMITED,
    NODE_LOST: 3,
    OOM: 0,
    IMAGE_PULL: 0,
    COLLECTIVE_TIMEOUT: 1,
    NONFINITE: 0,
    USER_ERROR: 0,
    UNKNOWN: 0,
}
#: What each cause means, for the step's error line and the docs.
MEANING = {
    PREEMPTED: "preempted or evicted",
    NODE_LOST: "a node was lost",
    OOM: "out of memory (OOMKilled)",
    IMAGE_PULL: "the image could not be pulled",
    COLLECTIVE_TIMEOUT: "a collective timed out (a hung or lost peer)",
    NONFINITE: "the loss became non-finite",
    USER_ERROR: "an error in the run (config, data or code)",
    UNKNOWN: "no known cause in the pods, events or exit codes",
}

#: `DisruptionTarget` reasons (k8s.io/api/core/v1) and Kueue's, by the cause they mean.
_DISRUPTION_REASONS = {
    "PreemptionByScheduler": PREEMPTED,
    "EvictionByEvictionAPI": PREEMPTED,
    "TerminationByKubelet": PREEMPTED,  # node-pressure eviction; a node shutdown says so in status.reason
    "DeletionByTaintManager": NODE_LOST,
    "DeletionByPodGC": NODE_LOST,
}
#: Pod `status.reason` values, by cause.
_POD_REASONS = {
    "Evicted": PREEMPTED,
    "Preempting": PREEMPTED,
    "NodeLost": NODE_LOST,
    "Shutdown": NODE_LOST,
    "Terminated": NODE_LOST,
    "NodeShutdown": NODE_LOST,
}
#: Event reasons, by cause (Kueue's `Stopped` only when its message says preempted or evicted).
_EVENT_REASONS = {
    "Preempted": PREEMPTED,
    "Evicted": PREEMPTED,
    "TaintManagerEviction": NODE_LOST,
    "NodeNotReady": NODE_LOST,
}
#: The kubelet's node-pressure eviction message names a container that used more than it requested
#: ("Container pytorch was using 60Gi, request is 8Gi, has larger consumption of memory"): the run's
#: own use, which a re-created job repeats, not a preemption. Memory is the run's out-of-memory; a
#: disk over its request, an error in the run's settings.
_OVER_REQUEST = re.compile(
    r"Container (?P<container>\S+) was using \S+, request is \S+, "
    r"has larger consumption of (?P<what>memory|ephemeral-storage)"
)
#: The kubelet's eviction of a pod over a local-storage limit it set itself (an emptyDir's
#: `sizeLimit`, kftrain's /dev/shm `dshm` among them; a container's or the pod's ephemeral-storage
#: limit): the run's settings, which a re-created job hits again, not a preemption.
_OVER_LIMIT = re.compile(
    r'Usage of EmptyDir volume "[^"]+" exceeds the limit'
    r"|Container (?P<container>\S+) exceeded its local ephemeral storage limit"
    r"|Pod ephemeral local storage usage exceeds the total limit of containers"
)
#: The training container of each job kind (pytorchjob.CONTAINER, trainjob.CONTAINER; not imported:
#: they need the Kubernetes clients): a sidecar over its own request is not the run's doing.
TRAINING_CONTAINERS = ("pytorch", "node")
_IMAGE_PULL_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
_KUEUE_STOPPED = re.compile(r"\b(preempted|evicted|node failures?)\b", re.IGNORECASE)
#: torchrun's ChildFailedError summary: the root cause's exit code (negative: a signal).
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\)")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_NCCL_WATCHDOG = "Watchdog caught collective operation timeout"
#: What NCCL logs as it aborts a rank whose collective failed: a peer gone or hung (not its
#: warnings of a healthy run, nor a CUDA error of the rank's own: a device-side assert is its bug).
_NCCL_FAILURE = re.compile(
    r"Watchdog caught|watchdog thread terminated with exception|Heartbeat monitor timed out|watchdog got stuck|"
    r"Some NCCL operations have failed|ncclRemoteError|remote process exited|DistBackendError"
)
_EXIT_CODE_CAUSES = {
    exit_codes.NONFINITE_LOSS: NONFINITE,
    exit_codes.COLLECTIVE_TIMEOUT: COLLECTIVE_TIMEOUT,
    exit_codes.USER_ERROR: USER_ERROR,
    exit_codes.TERMINATED_CHECKPOINTED: PREEMPTED,
}


@dataclass(frozen=True)
class Diagnosis:
    """Why a job failed: one of :data:`CAUSES` and the evidence that says so."""

    cause: str
    evidence: str
    source: str = "pod"
    """What it was read from: `pod` (a pod's status, an event), `process` (the training process's
    own exit code or log line), `container` (only the container's exit code, which a torchrun
    container sets to 1 whatever its process did) or `abort` (a process's SIGABRT with no NCCL
    failure in its log: a crash, or NCCL's abort of it after a peer's failure)."""

    def rank(self) -> float:
        """How strong the evidence is (lower: stronger): :data:`CAUSES` order, except what only an
        exit code says, which ranks after a process's own report of its failure: a container's
        bare exit 1 (torchrun's, whatever its process did), and a stop signal's exit 143, which
        does not say who sent the signal. A preemption's SIGTERM reaches every rank together and
        leaves pod evidence; the 143 of a pod beside another's failure is more likely the operator
        deleting the running pods of a job that already failed (a hung peer among them)."""
        if self.source != "pod" and self.cause == PREEMPTED:
            return CAUSES.index(COLLECTIVE_TIMEOUT) + 0.75
        if self.source in ("container", "abort") and self.cause == USER_ERROR:
            return CAUSES.index(COLLECTIVE_TIMEOUT) + 0.5
        return CAUSES.index(self.cause)

    def __str__(self) -> str:
        return f"{self.cause} ({MEANING[self.cause]}): {self.evidence}"


@dataclass(frozen=True)
class Event:
    """One event as the API lists it: the object it is about, its reason and message."""

    object: str
    reason: str
    message: str = ""


#: Events every healthy pod or job has (Normal events of the kubelet, the scheduler and the
#: controllers): no part of why a job failed.
_ROUTINE_REASONS = frozenset(
    {
        "Scheduled",
        "Pulling",
        "Pulled",
        "Created",
        "Started",
        "Killing",
        "SuccessfulCreate",
        "SuccessfulDelete",
        "AddedInterface",
        "JobRunning",
        "Completed",
    }
)


def root_cause_exit_code(log_lines: Iterable[str]) -> int | None:
    """The exit code of the first failed training process, from torchrun's `ChildFailedError`
    summary in a replica's log (the last one printed), else None."""
    code = None
    in_root = False
    for line in log_lines:
        if _ROOT_CAUSE.search(line):
            in_root = True
        elif in_root and (m := _EXITCODE.match(line)):
            code, in_root = int(m.group(1)), False
    return code


def other_failure_codes(log_lines: Iterable[str]) -> list[int]:
    """The exit codes of the failed training processes torchrun's last summary lists besides its
    root cause (its `Failures:` section; `<NO_OTHER_FAILURES>`: none)."""
    codes: list[int] = []
    listing = False
    for line in log_lines:
        if line.strip() == "Failures:":
            codes, listing = [], True
        elif _ROOT_CAUSE.search(line):
            listing = False
        elif listing and (m := _EXITCODE.match(line)):
            codes.append(int(m.group(1)))
    return codes


def before_torchrun_summary(log_lines: list[str]) -> list[str]:
    """The lines a log holds before torchrun's own report of a failed process: its summary (a
    rule of `=`, then `<entrypoint> FAILED`) and the traceback of its `ChildFailedError` before
    it. What is left is what the processes themselves printed, which says why they failed where
    torchrun says only which one died and how."""
    for i in range(len(log_lines) - 1, 0, -1):
        if log_lines[i].rstrip().endswith(" FAILED") and set(log_lines[i - 1].strip()) == {"="}:
            end = i - 1
            if end and "ChildFailedError" in log_lines[end - 1]:
                starts = [k for k in range(end) if log_lines[k].startswith("Traceback (most recent call last)")]
                end = starts[-1] if starts else end - 1
            return log_lines[:end]
    return log_lines


def _training_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The statuses of the pod's training container (:data:`TRAINING_CONTAINERS`); where none is
    named so, all of its containers'. A sidecar (a service mesh's proxy, a log shipper) ends as the
    pod ends, with its own exit code and reason, and the kubelet lists statuses by name: its exit
    is not the run's."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return [c for c in statuses if c.get("name") in TRAINING_CONTAINERS] or statuses


def _terminated(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The container's terminated states, the current one first."""
    states = (container.get("state") or {}, container.get("lastState") or {})
    return [s["terminated"] for s in states if s.get("terminated")]


def _eviction(cause: str, *messages: str) -> str:
    """`cause`, unless an eviction's message says the pod used more than it requested
    (:data:`_OVER_REQUEST`) or than a limit of its own (:data:`_OVER_LIMIT`)."""
    if cause != PREEMPTED:
        return cause
    for message in messages:
        for m in _OVER_REQUEST.finditer(message or ""):
            if m["container"] in TRAINING_CONTAINERS:
                return OOM if m["what"] == "memory" else USER_ERROR
        for m in _OVER_LIMIT.finditer(message or ""):
            if m["container"] is None or m["container"] in TRAINING_CONTAINERS:  # None: a pod's or a volume's
                return USER_ERROR
    return cause


def _pod_evidence(pod: Mapping[str, Any]) -> list[Diagnosis]:
    """Every cause a pod's status shows."""
    name = (pod.get("metadata") or {}).get("name", "?")
    status = pod.get("status") or {}
    found: list[Diagnosis] = []
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        reason = cond.get("reason", "")
        if cond.get("type") == "DisruptionTarget" and reason in _DISRUPTION_REASONS:
            cause = _DISRUPTION_REASONS[reason]
            if reason == "TerminationByKubelet" and status.get("reason") in _POD_REASONS:
                cause = _POD_REASONS[status["reason"]]
            cause = _eviction(cause, cond.get("message", ""), status.get("message", ""))
            found.append(Diagnosis(cause, f"pod {name}: DisruptionTarget {reason}: {cond.get('message', '')}".rstrip()))
        elif cond.get("type") == "TerminationTarget" and reason.startswith("WorkloadEvicted"):
            # Kueue stopping a pod whose Workload it evicted (`WorkloadEvictedDueToPreempted`, ...)
            found.append(
                Diagnosis(PREEMPTED, f"pod {name}: TerminationTarget {reason}: {cond.get('message', '')}".rstrip(": "))
            )
    reason = status.get("reason")
    if reason in _POD_REASONS:
        cause = _eviction(_POD_REASONS[reason], status.get("message", ""))
        found.append(Diagnosis(cause, f"pod {name}: {reason}: {status.get('message', '')}".rstrip()))
    for container in _training_containers(pod):
        for term in _terminated(container):
            if term.get("reason") == "OOMKilled":
                found.append(
                    Diagnosis(
                        OOM, f"pod {name} container {container.get('name')}: OOMKilled (exit {term.get('exitCode')})"
                    )
                )
    # Any image the pod cannot pull (an init container's or a sidecar's too) keeps it from running.
    status_lists = (status.get("initContainerStatuses") or [], status.get("containerStatuses") or [])
    for container in (c for statuses in status_lists for c in statuses):
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in _IMAGE_PULL_WAITING:
            found.append(
                Diagnosis(
                    IMAGE_PULL,
                    f"pod {name} container {container.get('name')}: {waiting['reason']}: "
                    f"{waiting.get('message', '')}".rstrip(": "),
                )
            )
    return found


def _event_evidence(event: Event) -> Diagnosis | None:
    cause = _EVENT_REASONS.get(event.reason)
    if event.reason == "Stopped" and _KUEUE_STOPPED.search(event.message or ""):
        cause = NODE_LOST if "node failure" in event.message.lower() else PREEMPTED
    if cause is None:
        return None
    cause = _eviction(cause, event.message)
    return Diagnosis(cause, f"event on {event.object}: {event.reason}: {event.message}".rstrip(": "))


def exit_code_of(pod: Mapping[str, Any]) -> int | None:
    """The pod's training container's exit code (current state, else the last one), if it ended."""
    for container in _training_containers(pod):
        for term in _terminated(container):
            if term.get("exitCode") is not None:
                return int(term["exitCode"])
    return None


def _exit_evidence(pod: Mapping[str, Any], log_lines: list[str]) -> Diagnosis | None:
    name = (pod.get("metadata") or {}).get("name", "?")
    code = root_cause_exit_code(log_lines)
    # Failures seen in one poll: the root cause is the lowest rank, maybe the one NCCL aborted
    # after another process of the pod failed by itself, whose exit code then says how.
    own = [c for c in other_failure_codes(log_lines) if c > 0] if code == -signal.SIGABRT else []
    # NCCL's watchdog aborts the process on a timed-out collective (TORCH_NCCL_ASYNC_ERROR_HANDLING),
    # before the trainer can exit with its own code: the child dies of SIGABRT, the log says why.
    for line in [] if own else log_lines:
        if _NCCL_WATCHDOG in line:
            return Diagnosis(COLLECTIVE_TIMEOUT, f"pod {name}: {line.strip()[:300]}", "process")
    where = f"pod {name}: the training process exited with code {code} (torchrun's root cause)"
    if own:
        code, where = own[0], f"pod {name}: a training process exited with code {own[0]} (torchrun's failures)"
    source = "process"
    if code is None:
        source = "container"
        code = exit_code_of(pod)
        where = f"pod {name}: exit code {code}"
    if code in (None, 0):
        return None
    if code < 0:  # torchrun's root cause was killed by a signal
        said = f"{where} (killed by {killed_by(-code)})"
        if -code == signal.SIGABRT:
            # NCCL aborts a rank whose peer failed or hung (TORCH_NCCL_ASYNC_ERROR_HANDLING): the
            # collective's failure where its log shows NCCL's, else a crash, below any own report.
            cuda = any("CUDA error" in line for line in log_lines)  # the rank's own bug
            if not cuda and any(_NCCL_FAILURE.search(line) for line in log_lines):
                return Diagnosis(COLLECTIVE_TIMEOUT, said, "process")
            return Diagnosis(USER_ERROR, said, "abort")
        return Diagnosis(_SIGNAL_CAUSES.get(-code, USER_ERROR), said, source)
    cause = _EXIT_CODE_CAUSES.get(code, UNKNOWN)
    meaning = {
        exit_codes.TERMINATED_CHECKPOINTED: " (terminated by SIGTERM after committing a checkpoint)",
        exit_codes.NONFINITE_LOSS: " (non-finite loss)",
        exit_codes.COLLECTIVE_TIMEOUT: " (collective timeout)",
    }.get(code, "")
    return Diagnosis(cause, where + meaning, source)


#: A training process killed by a signal, by cause: SIGKILL with no other evidence is the kernel's
#: out-of-memory killer (a container limit kills the whole container, OOMKilled, only where the
#: cgroup kills as a group), SIGTERM a stop from outside; any other (SIGSEGV, SIGBUS) a crash of
#: the run, which a new job would repeat (SIGABRT: :func:`_exit_evidence`).
_SIGNAL_CAUSES = {signal.SIGKILL: OOM, signal.SIGTERM: PREEMPTED}


#: Where Linux counts the processes its out-of-memory killer has killed since boot, a cgroup's
#: limit included (`oom_kill` in /proc/vmstat, Linux 4.13 and later).
VMSTAT = "/proc/vmstat"


def oom_kill_count(vmstat: str = VMSTAT) -> int | None:
    """How many processes the kernel's out-of-memory killer has killed on this machine since boot,
    or None where the kernel does not say (not Linux, an older kernel, no /proc)."""
    try:
        with open(vmstat, encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def killed_by(signum: int, oom_kills: int | None = None) -> str:
    """How a process killed by signal `signum` is said: its name, and for SIGKILL the likely sender,
    from `oom_kills`, the processes the out-of-memory killer killed on the machine while the process
    ran (None: not known, as from a pod's log, where the container's OOMKilled says it instead)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
    if signum != signal.SIGKILL:
        return name
    fix = "lower the batch or the model, or give it more memory"
    if oom_kills is None:
        return f"{name} (most likely the kernel's out-of-memory killer: {fix})"
    if oom_kills:
        return f"{name} (the kernel's out-of-memory killer, which killed {oom_kills} process(es) meanwhile: {fix})"
    return (
        f"{name} (not the out-of-memory killer, which killed nothing meanwhile: sent from outside, as `kill -9` does)"
    )


def classify(
    pods: Iterable[Mapping[str, Any]],
    events: Iterable[Event] = (),
    logs: Mapping[str, list[str]] | None = None,
) -> Diagnosis:
    """The cause of a failed job, from its pods (API JSON, camelCase), the events of the job and
    its pods, and the last log lines of each pod (by pod name). The strongest evidence wins
    (:data:`CAUSES` order); :data:`UNKNOWN` when nothing says why."""
    logs, events = logs or {}, list(events)
    found: list[Diagnosis] = []
    for pod in pods:
        found += _pod_evidence(pod)
        exit_found = _exit_evidence(pod, logs.get((pod.get("metadata") or {}).get("name", ""), []))
        if exit_found:
            found.append(exit_found)
    found += [d for d in map(_event_evidence, events) if d]
    if not found:
        # Events of reasons not known here may still say it (a quota refusing the pods): shown,
        # not the routine ones of every pod's start.
        telling = [e for e in events if e.reason not in _ROUTINE_REASONS]
        shown = "; ".join(f"{e.object}: {e.reason}: {e.message}" for e in telling[-3:])
        return Diagnosis(UNKNOWN, "no pod, event or exit code explains it" + (f" (events: {shown})" if shown else ""))
    return min(found, key=Diagnosis.rank)


def budget_check(budgets: Mapping[str, int], field: str) -> None:
    """Refuse an unknown cause or a budget below -1 (`field` names the config field), as a
    ValueError the config turns into its own error."""
    for cause, limit in budgets.items():
        if cause not in DEFAULT_MAX_RESTARTS:
            raise ValueError(f"{field}.{plain(cause)}: not a cause; the causes are {', '.join(DEFAULT_MAX_RESTARTS)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < UNLIMITED:
            raise ValueError(
                f"{field}.{plain(cause)}: must be an integer >= -1 (-1: unlimited until the deadline), got {limit!r}"
            )


def restarts_allowed(budgets: Mapping[str, int], cause: str) -> int:
    """How many re-creations `cause` gets (:data:`UNLIMITED`: as many as the deadline allows)."""
    return budgets.get(cause, DEFAULT_MAX_RESTARTS[cause])
