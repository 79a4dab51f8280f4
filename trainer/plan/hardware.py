"""What the plan assumes of the hardware: GPU types (memory, dense bf16 peak) and the interconnect.

The numbers are the vendors' published specifications (dense bf16 Tensor Core throughput, no
2:4 sparsity; NVLink bandwidth per GPU, both directions summed as NVIDIA states it):

- H100 SXM 80 GB: 989 TFLOP/s bf16, 900 GB/s NVLink (NVIDIA H100 Tensor Core GPU datasheet).
- H100 PCIe 80 GB: 756 TFLOP/s bf16, PCIe Gen5 x16 (128 GB/s) (same datasheet).
- H100 NVL 94 GB: 835 TFLOP/s bf16, PCIe Gen5 x16 (same datasheet).
- H200 SXM 141 GB: 989 TFLOP/s bf16, 900 GB/s NVLink (NVIDIA H200 datasheet; same compute as H100).
- H200 NVL 141 GB: 835 TFLOP/s bf16, PCIe Gen5 x16 (same datasheet).
- A100 SXM 40/80 GB: 312 TFLOP/s bf16, 600 GB/s NVLink (NVIDIA A100 datasheet); the PCIe cards:
  the same compute, PCIe Gen4 x16 (64 GB/s).
- L40S 48 GB: 362 TFLOP/s bf16 (NVIDIA L40S datasheet), PCIe Gen4 x16 only (64 GB/s).
- L4 24 GB: 121 TFLOP/s bf16 (NVIDIA L4 datasheet), PCIe Gen4 x16 (64 GB/s).
- A10G 24 GB: 125 TFLOP/s bf16 (AWS G5 / NVIDIA A10 datasheet), PCIe Gen4 x16 (64 GB/s).

Memory is the device's as the driver reports it (nvidia-smi's total in MiB / 1024), in GiB, the unit
`kubernetes.gpu_memory_gb` and `--gpu-memory` take: an "80 GB" A100 holds 81,920 MiB = 80 GiB, an
"80 GB" H100 81,559 MiB = 79.6 GiB (reading the datasheets' GB as 10**9 bytes undercounts by 7%).

The PCIe and NVL cards are planned with their PCIe link between GPUs: their NVLink bridges join
pairs (or fours) of cards, not the node, and a ring over the node's GPUs crosses PCIe.

A link's usable bandwidth for a collective is less than its marketing number: nccl-tests reports
"bus bandwidth" (the per-link rate a ring achieves, NCCL docs: PERFORMANCE.md), which on an
8 x H100 NVLink node reaches about 450 GB/s of the 900. :data:`NVLINK_EFFICIENCY` and
:data:`NETWORK_EFFICIENCY` carry that discount into the model.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from trainer.errors import KftrainError


class HardwareError(KftrainError, ValueError):
    """An unknown GPU type or a bad interconnect figure."""


class AmbiguousGpu(HardwareError):
    """A GPU model that comes in more than one size (`A100`): the message says which to name."""


class MigSlice(HardwareError):
    """A MIG slice of a GPU (`H100 MIG 1g.10gb`): no type of the table fits it; its memory can be given instead."""

    def __init__(self, message: str, gb: str | None) -> None:
        super().__init__(message)
        self.gib = None if gb is None else f"{int(gb) * 1e9 / 2**30:.1f}"
        """The slice's memory in GiB (the unit `--gpu-memory` takes), where its profile names its GB
        (`1g.10gb`: "9.3"); else None."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type: its memory, dense bf16 and fp32 peaks and NVLink (or PCIe) bandwidth per GPU."""

    name: str
    memory_gib: float  # GiB, as the driver reports the device (see the module docstring)
    bf16_tflops: float
    nvlink_gbps: float  # GB/s per GPU (bytes, not bits), as in the datasheets
    #: Plain fp32 (no TF32: kftrain leaves `allow_tf32` off, so an fp32 run's matmuls run at this rate).
    fp32_tflops: float

    def tflops(self, bf16: bool) -> float:
        """The dense peak a run computes at: bf16 autocast's, or plain fp32's."""
        return self.bf16_tflops if bf16 else self.fp32_tflops


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("H100-80GB", 79.6, 989.0, 900.0, 67.0),
        GpuSpec("H100-PCIe-80GB", 79.6, 756.0, 128.0, 51.0),
        GpuSpec("H100-NVL-94GB", 93.6, 835.0, 128.0, 60.0),
        GpuSpec("H200-141GB", 140.4, 989.0, 900.0, 67.0),
        GpuSpec("H200-NVL-141GB", 140.4, 835.0, 128.0, 60.0),
        GpuSpec("A100-80GB", 80.0, 312.0, 600.0, 19.5),
        GpuSpec("A100-40GB", 40.0, 312.0, 600.0, 19.5),
        GpuSpec("A100-PCIe-80GB", 80.0, 312.0, 64.0, 19.5),
        GpuSpec("A100-PCIe-40GB", 40.0, 312.0, 64.0, 19.5),
        GpuSpec("L40S", 45.0, 362.0, 64.0, 91.6),
        GpuSpec("L4", 22.5, 121.0, 64.0, 30.3),
        GpuSpec("A10G", 22.5, 125.0, 64.0, 31.2),
    )
}

#: The words of a product name that name a card rather than the SXM module (other peaks and links),
#: as the plan's names spell them.
CARD_FORMS = {"PCIE": "PCIe", "NVL": "NVL"}


def _parts(name: str) -> tuple[str, str, str]:
    """The model (`H100`), the card form (`PCIe`, `NVL`, or '' for the SXM module, whatever else
    the name says of it) and the memory in GB ('' where the name has none) a GPU's name holds:
    the plan's own (`A100-PCIe-40GB`) or the driver's (`NVIDIA A100 80GB PCIe`, `NVIDIA H100 NVL`)."""
    words = re.split(r"[\s_-]+", name.strip().upper().removeprefix("NVIDIA").strip())
    models = {spec.split("-")[0].upper() for spec in GPUS}
    model = next((w for w in words if w in models), "")
    form = next((CARD_FORMS[w] for w in words if w in CARD_FORMS), "")
    gb = next((w[:-2] for w in words if re.fullmatch(r"\d+GB", w)), "")
    return model, form, gb


_SPEC_PARTS = {spec: _parts(spec) for spec in GPUS}
#: A MIG profile in a device's name (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`) or a resource's (`mig-3g.40gb`).
_MIG_PROFILE = re.compile(r"\b(?:MIG[\s_-]*)?(?P<g>\d+)G\.(?P<gb>\d+)GB\b")

#: The fraction of a link's datasheet bandwidth a ring collective achieves (nccl-tests bus
#: bandwidth of about 450 of 900 GB/s on NVLink 4; about 90% of line rate on InfiniBand/RoCE).
NVLINK_EFFICIENCY = 0.5
NETWORK_EFFICIENCY = 0.9


def _datasheet_gb(spec: GpuSpec) -> str:
    """The memory a datasheet gives the type, in its GB (10**9 bytes, rounded to a whole number)."""
    return str(round(spec.memory_gib * 2**30 / 1e9))


def gpu_spec(name: str) -> GpuSpec:
    """The GPU type `name`, case-insensitive: the plan's name (`H200-141GB`), a short one (`h200`),
    or the driver's as `nvidia-smi` and `torch.cuda.get_device_name` print it (`NVIDIA H100 80GB
    HBM3`, `NVIDIA A100-SXM4-40GB`, `NVIDIA H100 NVL`): the model, the card (`PCIe`, `NVL`; none:
    the SXM module) and, where it comes in two sizes, the GB."""
    key = name.strip().upper()
    if mig := _MIG_PROFILE.search(key) or re.search(r"\bMIG\b", key):
        # A slice has a part of the GPU's memory and of its compute, and no NVLink: no row here fits it.
        raise MigSlice(
            f"{name!r} is a MIG slice of a GPU, which the plan has no figures for (a part of the GPU's "
            "memory and compute, no NVLink)",
            mig["gb"] if mig.re is _MIG_PROFILE else None,
        )
    for spec_name in GPUS:
        if spec_name.upper() == key:
            return GPUS[spec_name]
    # A model whose memory is left out is the one size it comes in (`h200`, `H100 PCIe`).
    model, form, gb = _parts(name)
    # A type of one size names none (`L4`): a name giving its datasheet GB (`L4 24GB`) is that type.
    sized = [
        spec
        for spec, (m, f, g) in _SPEC_PARTS.items()
        if (m, f) == (model, form) and (not gb or g == gb or (not g and _datasheet_gb(GPUS[spec]) == gb))
    ]
    if model and len(sized) == 1:
        return GPUS[sized[0]]
    if model and not gb and len(sized) > 1:
        raise AmbiguousGpu(f"the {' '.join(filter(None, (model, form)))} comes as {' and '.join(sized)}; name one")
    raise HardwareError(
        f"--gpu {name!r}: not a GPU type the plan knows ({', '.join(GPUS)}, or the name nvidia-smi prints for "
        "one); give its memory with --gpu-memory instead"
    )


@dataclass(frozen=True)
class Interconnect:
    """The links collectives run over: within a node and between nodes.

    `intra_node_gbps` and `inter_node_gbps` are usable bandwidths in GB/s (bytes): per GPU
    within a node (NVLink), and per node to the network (all of a node's NICs together: 8 x
    400 Gb/s NICs are 400 GB/s, one 400 Gb/s NIC is 50 GB/s). `latency_us` is the alpha of
    the alpha-beta model, per message step. `overlap` is the fraction of the backward pass a
    gradient reduction can hide behind: 1 where the collectives run on their own engine (NCCL
    on a CUDA stream), 0 where they compete with compute for the same cores (gloo on the CPU).
    `gather_gbps` and `gather_latency_us`: where all-gather and reduce-scatter reach a lower
    bus bandwidth or a higher latency than all-reduce (gloo's do, bench/README.md), theirs;
    None: the same figures as all-reduce. `call_overhead_us`: a fixed cost per collective
    call the alpha-beta terms do not hold (FSDP2's copies into and out of its buffers, its
    hooks, and on an oversubscribed CPU the wait for the peer to be scheduled); 0 on GPUs,
    where the calls are queued ahead of the work.
    """

    intra_node_gbps: float = 450.0
    inter_node_gbps: float = 50.0 * NETWORK_EFFICIENCY
    latency_us: float = 10.0
    overlap: float = 1.0
    gather_gbps: float | None = None
    gather_latency_us: float | None = None
    call_overhead_us: float = 0.0

    def __post_init__(self) -> None:
        for name in ("intra_node_gbps", "inter_node_gbps"):
            if not getattr(self, name) > 0:
                raise HardwareError(f"interconnect {name}: must be > 0 GB/s, got {getattr(self, name)}")
        if self.latency_us < 0 or not 0 <= self.overlap <= 1:
            raise HardwareError(
                f"interconnect: latency_us must be >= 0 and overlap in [0, 1], got {self.latency_us}, {self.overlap}"
            )

    def as_dict(self) -> dict:
        """Plain mapping, for the plan's record."""
        return asdict(self)


def default_interconnect(gpu: GpuSpec | None, network_gbits: float = 400.0) -> Interconnect:
    """The interconnect assumed when none is given: for a GPU type, its NVLink at
    :data:`NVLINK_EFFICIENCY` within the node and `network_gbits` per node (`plan.network_gbits`:
    one 400 Gb/s NIC by default) at :data:`NETWORK_EFFICIENCY` between nodes, 10 us per step,
    collectives overlapped; on the
    CPU (gloo over loopback), what bench/plan_accuracy.py fitted on a 2-core machine shared with
    other work (all-reduce 0.5-0.7 GB/s and 150-300 us; all-gather and reduce-scatter 0.27-0.54
    GB/s and 0.6-1.7 ms; 10-18 ms per collective call beyond them), not overlapped, and between
    nodes at most what `network_gbits` carries (was: the loopback's figure whatever the network):
    measure your own with the same script."""
    if gpu is None:
        return Interconnect(
            intra_node_gbps=0.6,
            inter_node_gbps=min(0.6, network_gbits / 8 * NETWORK_EFFICIENCY),
            latency_us=150.0,
            overlap=0.0,
            gather_gbps=0.3,
            gather_latency_us=1000.0,
            call_overhead_us=10_000.0,
        )
    return Interconnect(
        intra_node_gbps=gpu.nvlink_gbps * NVLINK_EFFICIENCY,
        inter_node_gbps=network_gbits / 8 * NETWORK_EFFICIENCY,
        latency_us=10.0,
        overlap=1.0,
    )
