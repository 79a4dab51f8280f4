"""One description of a distributed training job, and the environment each replica gets.

The environment follows the Kubeflow Training Operator v1.9 (PyTorchJob) exactly, so the same
command behaves the same in a pod and in a local process. The only local difference is the
master's address: ``<job>-master-0`` is a Kubernetes Service name, which a local backend maps to
the loopback address.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from trainer.config import KubernetesConfig

MASTER = "master"
WORKER = "worker"
DEFAULT_PORT = 23456
#: The launcher pod's name and uid, set by the pipeline (kfp.kubernetes.use_field_path_as_env)
#: so the PyTorchJob can name that pod as its owner.
POD_NAME_ENV, POD_UID_ENV = "KFTRAIN_POD_NAME", "KFTRAIN_POD_UID"
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


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
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """Pod and scheduling settings used when the job runs as a PyTorchJob."""

    def __post_init__(self) -> None:
        if len(self.name) > 63 or not _DNS_1035.match(self.name):
            raise ValueError(
                f"job name {self.name!r} must be a DNS-1035 label: at most 63 lower-case letters, "
                "digits and '-', starting with a letter and ending with a letter or digit"
            )
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1 (the Master), got {self.replicas}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if not self.command:
            raise ValueError("command must not be empty")

    @property
    def world_size(self) -> int:
        """Training processes in the job."""
        return self.replicas * self.nproc_per_node

    def replicas_by_rank(self) -> list[tuple[str, int]]:
        """(replica type, index) in node-rank order: master 0, then workers 0..N-2."""
        return [(MASTER, 0)] + [(WORKER, i) for i in range(self.replicas - 1)]

    @property
    def elastic(self) -> bool:
        """An elastic job: Worker replicas only, c10d rendezvous between min and max replicas."""
        return self.kubernetes.elastic.enabled

    def master_service(self) -> str:
        """The Service name the operator gives the Master pod."""
        return f"{self.name}-{MASTER}-0"


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
        "PYTHONUNBUFFERED": "1",
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


def torchrun_command(module: str, args: list[str] | tuple[str, ...], python: str = "python") -> tuple[str, ...]:
    """`python -m torch.distributed.run -m MODULE ARGS`: torchrun reads the job shape from `PET_*`."""
    return (python, "-m", "torch.distributed.run", "-m", module, *args)
