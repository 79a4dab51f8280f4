"""One description of a distributed training job, and the environment each replica gets.

The environment follows the Kubeflow Training Operator v1.9 (PyTorchJob) or Kubeflow Trainer
v2.3 (TrainJob) exactly, so the same command behaves the same in a pod and in a local process.
The only local difference is the master's address: ``<job>-master-0`` and
``<job>-node-0-0.<job>`` are Kubernetes DNS names, which a local backend maps to loopback.

Two contracts (`replica_env` for v1, `replica_env_v2` for v2):

- PyTorchJob (Training Operator v1.9.4, `pkg/controller.v1/pytorch/envvar.go`): every container
  gets `PYTHONUNBUFFERED=1`, `MASTER_ADDR` = `PET_MASTER_ADDR` = `<job>-master-0`,
  `MASTER_PORT` = `PET_MASTER_PORT`, `WORLD_SIZE` (replicas x nprocPerNode), `RANK` =
  `PET_NODE_RANK` (a node rank), `PET_NPROC_PER_NODE`, `PET_NNODES`.
- TrainJob (Kubeflow Trainer v2.3.0, tag `v2.3.0` = commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab,
  `pkg/runtime/framework/plugins/torch/torch.go` `EnforceMLPolicy`, names from
  `pkg/constants/constants.go`): only the trainer container named `node` gets
  `PET_NNODES` (`trainer.numNodes`), `PET_NPROC_PER_NODE` (`trainer.numProcPerNode`; unset it is
  `auto`, which becomes the CPU count of `resourcesPerNode` when no GPU is requested),
  `PET_NODE_RANK` (from the pod's `batch.kubernetes.io/job-completion-index` annotation, a fieldRef),
  `PET_MASTER_ADDR` = `<job>-node-0-0.<job>` (`fmt.Sprintf("%s-%s-0-0.%s", name, "node", name)`:
  the first pod of the JobSet's `node` job, under the JobSet's headless-Service subdomain) and
  `PET_MASTER_PORT` = `29500` (`constants.ContainerTrainerPort`, also added as a container port).
  No `MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE` or `PYTHONUNBUFFERED`; a user env var with
  one of the five `PET_*` names is refused by the webhook (`TorchRunReservedEnvNames`).

torchrun reads `PET_*` and sets `RANK`/`WORLD_SIZE`/`LOCAL_RANK` for its workers, so training
started through torchrun (`torchrun_command`) runs unchanged under both.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field

from trainer.config import AUTO, JOB_KINDS, PYTORCHJOB, TRAINJOB, ConfigError, KubernetesConfig, check_plain_env
from trainer.errors import redact_url
from trainer.storage import REMOTE_SCHEMES, parse_uri

MASTER = "master"
WORKER = "worker"
#: The TrainJob's trainer replicated job and its container (Trainer v2 `constants.Node`).
NODE = "node"
DEFAULT_PORT = 23456
#: Trainer v2's rendezvous port (`constants.ContainerTrainerPort`): fixed, not configurable.
TRAINJOB_PORT = 29500
#: The Job controller's random pod-name suffix, as JobSet's webhook counts it (`-abcde`).
_POD_SUFFIX = "-abcde"
#: Settings of a PyTorchJob that a v2.3.0 TrainJob has no field for (they belong to the
#: ClusterTrainingRuntime there), with the value that means "not set": anything else is refused
#: for a TrainJob instead of silently dropped.
PYTORCHJOB_ONLY = {
    "priority_class": "",
    "min_available": 0,
    "scheduling_queue": "",
    "schedule_timeout_seconds": 0,
    "clean_pod_policy": "Running",
    "ttl_seconds_after_finished": 86400,
    "backoff_limit": 3,
    "restart_policy": "OnFailure",
}
#: The pod's name (Kubernetes sets HOSTNAME to it) and its node's (each replica's env sets this
#: one from ``spec.nodeName``): how the health checks name a straggler's pod and node.
POD_ENV, NODE_ENV = "HOSTNAME", "KFTRAIN_NODE_NAME"
#: Pod and Service names are DNS labels: at most 63 characters.
MAX_NAME = 63
#: The launcher pod's name and uid, set by the pipeline (kfp.kubernetes.use_field_path_as_env)
#: so the PyTorchJob can name that pod as its owner.
POD_NAME_ENV, POD_UID_ENV = "KFTRAIN_POD_NAME", "KFTRAIN_POD_UID"
#: Python's unbuffered output, `1` in every replica (the operator's, or kftrain's for a TrainJob):
#: each log line reaches the pod's log at once.
UNBUFFERED_ENV = "PYTHONUNBUFFERED"
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


@dataclass(kw_only=True, frozen=True, slots=True)
class JobSpec:
    """A PyTorchJob-shaped job: one Master and `replicas - 1` Workers running `command`."""

    name: str
    """Job name: a DNS-1035 label of at most 63 characters (it prefixes pod and Service names)."""
    image: str
    """Container image of every replica."""
    command: tuple[str, ...]
    """The container command of every replica (a torchrun invocation)."""
    replicas: int = 1
    """Replicas in total, the Master included."""
    nproc_per_node: int = 1
    """Processes torchrun starts per replica."""
    port: int = DEFAULT_PORT
    """The Master's rendezvous port."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra, non-secret environment for every replica."""
    timeout_s: int = 3600
    """Wall-clock limit of the whole job."""
    timeout_field: str = "job.timeout_seconds"
    """The setting `timeout_s` comes from, as errors name it (the BYO component's `timeout_seconds`)."""
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """Pod and scheduling settings used when the job runs as a PyTorchJob."""
    artifact_uris: dict[str, str] = field(default_factory=dict)
    """What the replicas read and write (`dataset`, `model`, ...): on a cluster, object-store URIs."""
    kind: str = PYTORCHJOB
    """One of :data:`JOB_KINDS` (checked where the value enters: `job.kind` of the config, or the
    BYO launcher's `kind`): `pytorchjob`, `trainjob`, or `auto` (resolved by the backend)."""
    resumes: str | None = None
    """What a re-created job continues from, as the launcher says it: kftrain's trainer's latest
    checkpoint (`checkpoint`), the checkpoint `checkpoint.resume_from` names (`resume_from`: its
    own are not read), or step 0 (`start`); None: a command of the user's own, which resumes only
    if it saves and loads its checkpoints."""

    def __post_init__(self) -> None:
        self._check_types()
        longest = MAX_NAME - len(self.longest_replica_suffix())
        if len(self.name) > longest or not _DNS_1035.fullmatch(self.name):
            raise ValueError(
                f"job name {self.name!r} must be a DNS-1035 label of at most {longest} characters (lower-case "
                "letters, digits and '-', starting with a letter and ending with a letter or digit): the "
                f"{self._namer()} names each replica's pod `<job>{self.longest_replica_suffix()}`, a DNS label "
                f"of at most {MAX_NAME} characters"
            )
        if self.kind in (TRAINJOB, AUTO):
            self._check_trainjob_fits()
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1 (the Master), got {self.replicas}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")

    def _check_types(self) -> None:
        """Each field of the type it is declared with, or a ValueError naming it: a spec built in
        Python is not read through the config's checks (was: `command="python train.py"` became
        one argument per letter, `replicas="2"` a TypeError deep inside)."""

        def text(value: object) -> bool:
            return isinstance(value, str)

        def whole(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def texts(value: object) -> bool:
            return isinstance(value, dict) and all(text(k) and text(v) for k, v in value.items())

        if text(self.command):
            raise ValueError(
                f"JobSpec.command: a list of arguments such as {self.command.split()!r}, not one string "
                f"{self.command!r}"
            )
        wrong = [
            (name, what)
            for name, ok, what in [
                ("name", text(self.name), "text"),
                ("image", text(self.image), "text"),
                (
                    "command",
                    isinstance(self.command, tuple | list)
                    and all(map(text, self.command))
                    and bool(self.command[:1] and self.command[0].strip()),
                    "a list of text whose first is the program to run",
                ),
                ("replicas", whole(self.replicas), "a whole number"),
                ("nproc_per_node", whole(self.nproc_per_node), "a whole number"),
                ("port", whole(self.port) and 0 < self.port < 65536, "a port number, 1 to 65535"),
                ("env", texts(self.env), "a mapping of text to text"),
                ("timeout_s", whole(self.timeout_s) and self.timeout_s > 0, "a whole number of seconds above 0"),
                ("timeout_field", text(self.timeout_field), "text"),
                ("kubernetes", isinstance(self.kubernetes, KubernetesConfig), "a KubernetesConfig"),
                ("artifact_uris", texts(self.artifact_uris), "a mapping of text to text"),
                ("kind", self.kind in JOB_KINDS, f"one of {', '.join(JOB_KINDS)}"),
            ]
            if not ok
        ]
        if not wrong:
            # Plain environment is visible in the job object: a token there is refused, as in the config.
            check_plain_env(
                self.env,
                "JobSpec.env",
                "kubernetes.extra_env's `valueFrom.secretKeyRef` takes a Secret's key; a local job's replicas also "
                "inherit the launching process's own environment",
            )
            return
        name, what = wrong[0]
        value = getattr(self, name)
        if name in ("env", "artifact_uris") and isinstance(value, dict):  # values unshown: a secret, say
            key = next(k for k, v in value.items() if not (text(k) and text(v)))
            if not text(key):
                raise ValueError(f"JobSpec.{name}: its names must be text, got {key!r} ({type(key).__name__})")
            raise ValueError(f"JobSpec.{name}[{key!r}]: must be text, got {type(value[key]).__name__}")
        raise ValueError(f"JobSpec.{name}: must be {what}, got {value!r}")

    def _namer(self) -> str:
        return {PYTORCHJOB: "operator", TRAINJOB: "JobSet", AUTO: "operator (or JobSet)"}[self.kind]

    def _check_trainjob_fits(self) -> None:
        """A TrainJob (v2.3.0) has no elastic mode and no field for some PyTorchJob settings:
        refuse them by name rather than create a job that silently ignores them."""
        why = "a TrainJob may be created (job.kind " + repr(self.kind) + ")"
        if self.elastic:
            raise ValueError(
                f"kubernetes.elastic.enabled: true is not supported when {why}: Trainer v2.3.0 has no elastic "
                "PyTorch (its torch plugin says so); use job.kind: pytorchjob"
            )
        # Every such setting at once: one run to learn them all, not one a run.
        unfit = [
            (f"kubernetes.{name}", getattr(self.kubernetes, name), unset)
            for name, unset in PYTORCHJOB_ONLY.items()
            if getattr(self.kubernetes, name) != unset
        ]
        if unfit:
            fields = ", ".join(f"{field}: {value!r}" for field, value, _ in unfit)
            leave = ", ".join(f"{field} at {unset!r}" for field, _, unset in unfit)
            raise ValueError(
                f"{fields}: no TrainJob v2.3.0 field for {'it' if len(unfit) == 1 else 'them'} ({why}); the "
                f"ClusterTrainingRuntime (kubernetes.runtime {self.kubernetes.runtime!r}) sets "
                f"{'it' if len(unfit) == 1 else 'them'}: leave {leave}, or use job.kind: pytorchjob"
            )

    @property
    def world_size(self) -> int:
        """Training processes in the job."""
        return self.replicas * self.nproc_per_node

    def replicas_by_rank(self, kind: str | None = None) -> list[tuple[str, int]]:
        """(replica type, index) in node-rank order: for a PyTorchJob master 0, then workers
        0..N-2; for a TrainJob the `node` job's pods 0..N-1 (`kind` overrides `self.kind`)."""
        if (kind or self.kind) == TRAINJOB:
            return [(NODE, i) for i in range(self.replicas)]
        return [(MASTER, 0)] + [(WORKER, i) for i in range(self.replicas - 1)]

    @property
    def elastic(self) -> bool:
        """An elastic job: Worker replicas only, c10d rendezvous between min and max replicas."""
        return self.kubernetes.elastic.enabled

    def longest_replica_suffix(self) -> str:
        """The longest suffix the cluster appends to the job's name in a pod or Service name.

        PyTorchJob: `-<replica type>-<index>` (the operator's pod and Service names). TrainJob: the
        JobSet names the node job `<job>-node-0` and its indexed pods `<job>-node-0-<i>-<5 random>`,
        and JobSet's webhook holds that longest pod name to a DNS-1035 label. `auto` must fit both.
        """
        if self.kind == TRAINJOB:
            return f"-{NODE}-0-{self.replicas - 1}{_POD_SUFFIX}"
        if self.elastic:  # Workers only, as many as the range allows
            v1 = f"-{WORKER}-{max(self.kubernetes.elastic.max_replicas, self.replicas) - 1}"
        else:
            v1 = f"-{WORKER}-{self.replicas - 2}" if self.replicas > 1 else f"-{MASTER}-0"
        if self.kind == AUTO:
            return max(v1, f"-{NODE}-0-{self.replicas - 1}{_POD_SUFFIX}", key=len)
        return v1

    def master_service(self, kind: str | None = None) -> str:
        """The DNS name of the rank-0 node: the Master's Service (PyTorchJob), or the first node
        pod's hostname under the JobSet's subdomain (TrainJob)."""
        if (kind or self.kind) == TRAINJOB:
            return f"{self.name}-{NODE}-0-0.{self.name}"
        return f"{self.name}-{MASTER}-0"


def require_object_store(uris: dict[str, str]) -> None:
    """Pods share no file system: every artifact a replica reads or writes on a cluster must be
    an object-store URI. `uris` maps what each one is (a flag or field name) to the URI."""
    for what, uri in uris.items():
        scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
        if scheme and scheme.strip() == scheme and scheme not in (*REMOTE_SCHEMES, "file"):
            # parse_uri's forms would offer local paths too (a space around it: parse_uri says so)
            raise ConfigError(
                f"{what} {redact_url(uri)!r}: not an object store kftrain writes to; use s3://bucket/key or "
                "minio://bucket/key"
            )
        try:
            remote = parse_uri(uri).is_remote
        except ValueError as exc:
            raise ConfigError(f"{what}: {exc}") from None
        if not remote:
            raise ConfigError(
                f"{what} {uri!r} is a local path, which each pod would see as its own empty disk: "
                "use an object-store URI (s3://bucket/key or minio://bucket/key)"
            )


def require_pod_paths(uris: dict[str, str]) -> None:
    """What the pods only read (the data source, a base model, a tokenizer) may be a path inside
    their image, but only an absolute one: a relative path or `~` would be resolved against this
    machine's folder and home, not the pod's. `uris` maps each field to its value."""
    for what, uri in uris.items():
        if "://" in uri or (os.path.isabs(uri) and not uri.startswith("~")):
            continue
        raise ConfigError(
            f"{what} {uri!r} is a path on this machine, which the cluster's pods cannot read: upload it to the "
            "object store and give its s3:// URI, or give the absolute path where the image holds it"
        )


def job_name(identity: str, prefix: str = "kftrain") -> str:
    """A deterministic DNS-1035 job name for one task (`components.runtime.task_identity`):
    a retry of the task finds the same job, another task gets another one."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return f"{prefix}-{digest}"


def replica_env(spec: JobSpec, replica_type: str, index: int, master_addr: str | None = None) -> dict[str, str]:
    """The variables the Training Operator injects into every container of one replica's pod.

    `master_addr` replaces the Master's Service name (a local backend passes the loopback address).
    """
    if replica_type == MASTER:
        if index != 0:
            raise ValueError("there is exactly one Master replica (index 0)")
        node_rank = 0
    elif replica_type == WORKER:
        if not 0 <= index < spec.replicas - 1:
            raise ValueError(f"worker index {index} out of range for {spec.replicas - 1} workers")
        node_rank = index + 1
    else:
        raise ValueError(f"unknown replica type {replica_type!r}")
    addr = master_addr or spec.master_service()
    return {
        UNBUFFERED_ENV: "1",
        "MASTER_ADDR": addr,
        "PET_MASTER_ADDR": addr,
        "MASTER_PORT": str(spec.port),
        "PET_MASTER_PORT": str(spec.port),
        # A node rank, not a process rank: torchrun turns it into per-process RANKs.
        "RANK": str(node_rank),
        "PET_NODE_RANK": str(node_rank),
        "WORLD_SIZE": str(spec.world_size),
        "PET_NPROC_PER_NODE": str(spec.nproc_per_node),
        "PET_NNODES": str(spec.replicas),
    }


def replica_env_v2(spec: JobSpec, node_rank: int, master_addr: str | None = None) -> dict[str, str]:
    """The variables Kubeflow Trainer v2.3.0's torch plugin injects into the trainer container of
    node `node_rank` of a TrainJob (see the module docstring for where each comes from).

    `master_addr` replaces `<job>-node-0-0.<job>` (a local backend passes the loopback address).
    """
    if not 0 <= node_rank < spec.replicas:
        raise ValueError(f"node rank {node_rank} out of range for {spec.replicas} nodes")
    return {
        "PET_NNODES": str(spec.replicas),
        "PET_NPROC_PER_NODE": str(spec.nproc_per_node),
        "PET_NODE_RANK": str(node_rank),
        "PET_MASTER_ADDR": master_addr or spec.master_service(TRAINJOB),
        "PET_MASTER_PORT": str(TRAINJOB_PORT),
    }


def torchrun_command(module: str, args: list[str] | tuple[str, ...], python: str = "python") -> tuple[str, ...]:
    """`python -m trainer.torchrun -m MODULE ARGS`: torchrun, which reads the job shape from `PET_*`, and
    exits with 143 rather than 1 when SIGTERM stopped it (:mod:`trainer.torchrun`)."""
    return (python, "-m", "trainer.torchrun", "-m", module, *args)


def _operator_env() -> frozenset[str]:
    """Variables the job's operator sets in every replica (Training Operator v1.9's full set for a
    PyTorchJob, elastic included; Trainer v2's five `PET_*` are among them) and torchrun sets in
    every process it starts: a user value is either overwritten or overrides the rendezvous."""
    probe = JobSpec(name="probe", image="probe", command=("probe",), replicas=2, port=DEFAULT_PORT)
    names = set(replica_env(probe, "master", 0)) - {UNBUFFERED_ENV}  # ours too (TrainJob), harmless
    names |= {"PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_RDZV_CONF", "PET_MAX_RESTARTS"}
    names |= {"PET_STANDALONE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"}
    names |= {"ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"}
    names |= {"TORCHELASTIC_RUN_ID"}
    return frozenset(names)


#: Environment a user may not set in a replica: the operator's and torchrun's (see :func:`_operator_env`).
OPERATOR_ENV = _operator_env()


def reserved_env(name: str) -> bool:
    """Whether a local replica leaves `name` of the shell that starts it: a pod has the operator's
    alone, and a shell's (kftrain started inside a torchrun or a pod) would change how the job
    forms. Every `PET_*` and `TORCHELASTIC_*` is torchrun's (TORCHELASTIC_USE_AGENT_STORE makes rank
    0 a client of a store no one hosts)."""
    return name in OPERATOR_ENV or name.startswith(("PET_", "TORCHELASTIC_"))
