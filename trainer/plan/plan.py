"""The plan: memory per rank, step time, scaling, cost and verdicts for a config, before a run.

Memory per rank (bytes), for the model the task builds (:mod:`trainer.plan.shapes`):

- parameters: as built (fp32; a LoRA run's frozen base in bf16 on GPUs); 1/N of them under
  FSDP (FSDP2 shards every parameter along dim 0).
- gradients: one fp32 per trainable parameter. DDP keeps them in its all-reduce buckets for the
  whole run (the trainer sets ``gradient_as_bucket_view``: no second copy); FSDP keeps 1/N.
- optimizer: AdamW's exp_avg and exp_avg_sq, each of the parameter's dtype and shape (fp32),
  for the trainable parameters only (1/N under FSDP).
- activations: what autograd saves for backward in one micro-batch (traced, see
  :mod:`trainer.plan.shapes`; with activation checkpointing the units' inputs plus one unit
  recomputed), plus the largest saved tensor again: its gradient exists beside it in backward.
- communication: FSDP's unsharded buffers: the root's parameters (kept from forward to
  backward), two units' parameters (the one running and the one prefetched) and one unit's
  unsharded gradient before its reduce-scatter; none under DDP (the buckets are the gradients,
  reduced in place).
- other: on a GPU, :data:`GPU_OVERHEAD_BYTES` (the CUDA context with cuBLAS workspaces, NCCL's
  buffers, the caching allocator's fragmentation); 0 on the CPU.

The peak is their sum: the end of forward (all activations) with DDP's gradient buckets or the
previous step's optimizer state resident, which the measured peak of the probe checks.

Time: per rank, compute (the probe's measured time per item, or on a GPU type the task's FLOPs
at :data:`DEFAULT_MFU` of the bf16 peak) for that rank's share of the global batch (the global
batch stays ``train.batch_size`` at every N), plus the exposed communication of
:mod:`trainer.plan.comms` (DDP: the bucketed all-reduce of the gradients once per optimizer step,
hidden behind the last micro-step's backward up to the interconnect's overlap, never less than
the last bucket; FSDP: an all-gather of every unit in forward and again in backward per
micro-step and a reduce-scatter of the gradients, hidden behind compute up to the overlap),
plus the probe's data wait.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.config import Config
from trainer.plan.comms import all_gather, all_reduce, buckets, reduce_scatter
from trainer.plan.hardware import GpuSpec, HardwareError, Interconnect, default_interconnect, gpu_spec
from trainer.plan.probe import ProbeResult
from trainer.plan.shapes import (
    ActivationTrace,
    ModelShape,
    PlanError,
    build_on_meta,
    model_shape,
    planning_manifest,
    trace_activations,
)
from trainer.progress import format_memories, format_memory

GiB = 1024**3
#: Per-GPU memory outside the training tensors: the CUDA context and cuBLAS/cuDNN workspaces
#: (about 0.5-0.8 GiB on Hopper), NCCL's channel buffers and the caching allocator's slack.
GPU_OVERHEAD_BYTES = int(1.5 * GiB)
#: Model FLOPs utilisation assumed on a GPU when no probe ran on that GPU: about what
#: well-tuned data-parallel GPT training reaches (PaLM reports 46%, Chowdhery et al. 2022;
#: Megatron-LM 41-52%, Narayanan et al. 2021); small models reach less.
DEFAULT_MFU = 0.4
#: FLOPs a step spends per weight (and token): the forward's 2, the backward's by `train.method`: a
#: full update computes the gradients of the activations and of the weights (2 + 2); LoRA skips the
#: frozen weights' (2). Activation checkpointing runs the forward again in backward: a full
#: update's step becomes 4/3 of its compute (Korthikanti et al. 2022 measure about this), LoRA's 3/2.
FORWARD_FLOPS_PER_WEIGHT = 2
BACKWARD_FLOPS_PER_WEIGHT = {"full": 4, "lora": 2}


def _step_flops(method: str, recompute: bool) -> tuple[float, float]:
    """(a step's compute with activation checkpointing `recompute` against without it, the
    backward's share of that compute, the recomputed forward included)."""
    forward, backward = FORWARD_FLOPS_PER_WEIGHT, BACKWARD_FLOPS_PER_WEIGHT[method]
    again = forward if recompute else 0
    return (forward + backward + again) / (forward + backward), (backward + again) / (forward + backward + again)


#: A share of the device's memory past which a plan that fits says it has little headroom (the
#: caching allocator's fragmentation alone often takes several percent).
TIGHT_FIT = 0.9
#: Eager PyTorch launches every kernel from the CPU, each taking about this long whatever its size;
#: a small model's step is bound by the launches, not by the GPU's FLOP rate.
KERNEL_LAUNCH_S = 6e-6
#: Kernels per parameter tensor per micro-step: its forward op, the backward's two (the input's and
#: the weight's gradients) and its share of the optimizer's update.
KERNELS_PER_TENSOR = 4
#: What else a step launches and waits for once (the loss, the optimizer's bookkeeping, the batch's copy).
STEP_OVERHEAD_S = 2e-4


def launch_floor(shape: ModelShape, cfg: Config) -> float:
    """The least time a GPU step takes in eager PyTorch, in seconds: its kernel launches."""
    per_micro = KERNELS_PER_TENSOR * shape.param_tensors * KERNEL_LAUNCH_S
    return cfg.train.grad_accum_steps * per_micro + STEP_OVERHEAD_S


@dataclass
class MemoryBreakdown:
    """Bytes per rank at the step's peak, by what holds them."""

    parameters: int = 0
    """The parameters as built, trainable and frozen (1/N of them under FSDP)."""
    gradients: int = 0
    """One fp32 per trainable parameter (1/N under FSDP)."""
    optimizer: int = 0
    """AdamW's exp_avg and exp_avg_sq of the trainable parameters (1/N under FSDP)."""
    activations: int = 0
    """What autograd saves for backward in one micro-batch, plus the largest saved tensor again (its gradient)."""
    communication: int = 0
    """FSDP's unsharded parameter and gradient buffers; 0 under DDP."""
    other: int = 0
    """On a GPU, :data:`GPU_OVERHEAD_BYTES` (CUDA context, NCCL buffers, allocator slack); 0 on the CPU."""

    @property
    def total(self) -> int:
        """All of it: what must fit in the device's memory."""
        return self.parameters + self.gradients + self.optimizer + self.activations + self.communication + self.other

    @property
    def tensors(self) -> int:
        """The part an allocator's peak counter sees (all but `other`): what a probe measures."""
        return self.total - self.other

    def as_dict(self) -> dict[str, int]:
        """Plain mapping with the total."""
        return {**dataclasses.asdict(self), "total": self.total}


@dataclass
class Alternative:
    """A change to the config and the memory per rank it would need."""

    change: str
    memory: MemoryBreakdown
    fits: bool | None

    def __iter__(self):  # unpacks as (change, memory, fits)
        return iter((self.change, self.memory, self.fits))


@dataclass
class ScalePoint:
    """The predicted run on `nodes` nodes."""

    nodes: int
    gpus: int
    step_seconds: float | None
    compute_seconds: float | None
    comm_seconds: float | None
    items_per_second: float | None
    efficiency: float | None
    eta_seconds: float | None
    gpu_hours: float | None
    cost: float | None
    memory_total: int = 0


@dataclass
class Plan:
    """What `kftrain plan` predicts for a config; see the module docstring for the model."""

    memory: MemoryBreakdown
    capacity_bytes: int | None
    fits: bool | None
    alternatives: list[Alternative] = field(default_factory=list)
    scaling: list[ScalePoint] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    world_size: int = 1
    nodes: int = 1
    per_node: int = 1
    strategy: str = "ddp"
    device: str = "cpu"
    item_name: str = "samples"
    total_steps: int | None = None
    timeout_seconds: int | None = None
    shape: dict[str, Any] = field(default_factory=dict)
    activation_trace: dict[str, Any] = field(default_factory=dict)
    probe: dict[str, Any] | None = None
    interconnect: dict[str, Any] = field(default_factory=dict)

    # -- records -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able mapping; :meth:`from_dict` reads it back."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["memory"] = dataclasses.asdict(self.memory)
        out["alternatives"] = [
            {"change": a.change, "memory": dataclasses.asdict(a.memory), "fits": a.fits} for a in self.alternatives
        ]
        out["scaling"] = [dataclasses.asdict(p) for p in self.scaling]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """The plan :meth:`to_dict` wrote."""
        data = dict(data)
        data["memory"] = MemoryBreakdown(**data["memory"])
        data["alternatives"] = [
            Alternative(a["change"], MemoryBreakdown(**a["memory"]), a["fits"]) for a in data.get("alternatives", [])
        ]
        data["scaling"] = [ScalePoint(**p) for p in data.get("scaling", [])]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def point(self, nodes: int) -> ScalePoint | None:
        """The scaling point of `nodes` nodes, if predicted."""
        return next((p for p in self.scaling if p.nodes == nodes), None)

    def refusal(self, cfg: Config) -> str | None:
        """Why `--strict` refuses the run `cfg` describes: it cannot fit, or its predicted ETA
        exceeds `job.timeout_seconds`; None when neither."""
        if self.fits is False:
            fitting = [a.change for a in self.alternatives if a.fits]
            way = f"; what would fit: {'; '.join(fitting)}" if fitting else "; no single change considered fits"
            return (
                f"predicted peak memory per rank {format_memory(self.memory.total)} exceeds the device's "
                f"{format_memory(self.capacity_bytes or 0)}{way}"
            )
        split = self.world_size * cfg.train.grad_accum_steps
        if cfg.train.batch_size % split:
            return (
                f"train.batch_size {cfg.train.batch_size} does not divide by {self.world_size} ranks x "
                f"train.grad_accum_steps {cfg.train.grad_accum_steps}: the trainer would refuse it"
            )
        here = self.point(self.nodes)
        timeout = cfg.job.timeout_seconds
        if here is not None and here.eta_seconds is not None and timeout and here.eta_seconds > timeout:
            return (
                f"predicted training time {_duration(here.eta_seconds)} on {self.nodes} node(s) exceeds "
                f"job.timeout_seconds {timeout} ({_duration(timeout)}); raise it, use more nodes or fewer steps"
            )
        return None

    def unchecked(self, cfg: Config) -> list[str]:
        """What :meth:`refusal` could not check for want of a figure: the memory (no device memory
        known) and the time (no step time predicted, with `job.timeout_seconds` set)."""
        gaps = []
        if self.fits is None:
            gaps.append("memory (give a GPU type or its memory: --gpu / --gpu-memory, plan.gpu)")
        here = self.point(self.nodes)
        if cfg.job.timeout_seconds and (here is None or here.eta_seconds is None):
            how = "give a GPU type, or --probe" if self.capacity_bytes or cfg.kubernetes.gpus_per_node else "--probe"
            gaps.append(f"time against job.timeout_seconds (no step time predicted: {how})")
        return gaps

    def metrics(self) -> dict[str, float]:
        """Flat numbers for KFP metrics."""
        m = self.memory
        out: dict[str, float] = {
            f"memory_{k}_gib": v / GiB for k, v in (*dataclasses.asdict(m).items(), ("total", m.total))
        }
        if self.capacity_bytes is not None:
            out["capacity_gib"] = self.capacity_bytes / GiB
        if self.fits is not None:
            out["fits"] = float(self.fits)
        for p in self.scaling:
            for key in ("step_seconds", "items_per_second", "efficiency", "eta_seconds", "gpu_hours", "cost"):
                value = getattr(p, key)
                if value is not None:
                    out[f"nodes{p.nodes}_{key}"] = float(value)
        return out

    def _memory_share(self) -> str:
        """` (40 GiB of it, ...)` when the plan is for less of the GPU's memory than it has."""
        try:
            whole = gpu_spec(self.device).memory_gib * GiB
        except HardwareError:  # "GPU" or "cpu": no table entry
            return ""
        if self.capacity_bytes is None or self.capacity_bytes >= int(whole):
            return ""
        return f" ({self.capacity_bytes / GiB:g} GiB of it, kubernetes.gpu_memory_gb or --gpu-memory)"

    def markdown(self) -> str:
        """The plan as a Markdown report."""
        lines = ["# Training plan", ""]
        lines.append(
            f"{self.world_size} rank(s) ({self.nodes} node(s) x {self.per_node}), strategy `{self.strategy}`, "
            f"device {self.device}{self._memory_share()}."
        )
        lines += ["", "## Verdicts", ""] + [f"- {v}" for v in self.verdicts]
        lines += ["", "## Memory per rank", "", "| component | bytes |", "|---|---:|"]
        for k, v in dataclasses.asdict(self.memory).items():
            lines.append(f"| {k} | {format_memory(v)} |")
        lines.append(f"| **total** | **{format_memory(self.memory.total)}** |")
        if self.capacity_bytes is not None:
            lines.append(f"| capacity | {format_memory(self.capacity_bytes)} |")
        if self.alternatives:
            lines += ["", "## Alternatives", "", "| change | per rank | fits |", "|---|---:|---|"]
            for a in self.alternatives:
                lines.append(f"| {a.change} | {format_memory(a.memory.total)} | {_yes(a.fits)} |")
        if self.scaling:
            unit, (ranks, hour) = f"{self.item_name}/s", _ranks_words(self.device)
            lines += [
                "",
                "## Scaling",
                "",
                f"| nodes | {ranks} | step | compute | exposed comm | {unit} | efficiency | ETA | {hour}s | cost |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for p in self.scaling:
                lines.append(
                    f"| {p.nodes} | {p.gpus} | {_seconds(p.step_seconds)} | {_seconds(p.compute_seconds)} | "
                    f"{_seconds(p.comm_seconds)} | {_num(p.items_per_second, ',.0f')} | {_num(p.efficiency, '.2f')} | "
                    f"{_duration(p.eta_seconds) if p.eta_seconds is not None else '-'} | "
                    f"{_num(p.gpu_hours, '.1f')} | {_num(p.cost, '.2f')} |"
                )
        lines += ["", "## Assumptions", ""] + [f"- {a}" for a in self.assumptions]
        return "\n".join(lines) + "\n"


def _yes(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def _num(value: float | None, fmt: str = ".4g") -> str:
    return "-" if value is None else format(value, fmt)


def _seconds(value: float | None) -> str:
    """A step's time at a readable scale: `12 us`, `3.4 ms`, `1.25 s`."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if value < 1e-3:
        return f"{value * 1e6:.3g} us"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- the model's pieces ------------------------------------------------------------------------


@dataclass
class _Model:
    """What the memory and time models need of one model build."""

    shape: ModelShape
    trace1: ActivationTrace | None  # micro-batch 1
    trace2: ActivationTrace | None  # micro-batch 2: with 1, the linear fit in the micro-batch
    alone: _Model | None = None
    """FSDP's model on one rank, which trains it unwrapped (`distributed.parallelize`), without
    FSDP's bf16 policy: traced as DDP's is. None where the two do not differ."""

    def on(self, world: int) -> _Model:
        """The model as `world` ranks train it."""
        return self.alone if world == 1 and self.alone is not None else self

    def activations(self, micro: float, checkpointing: bool) -> tuple[int, int]:
        """(activation bytes, largest saved tensor) at micro-batch `micro` (linear in it)."""
        if self.trace1 is None or self.trace2 is None:
            return 0, 0
        a1, a2 = self.trace1.bytes(checkpointing), self.trace2.bytes(checkpointing)
        l1, l2 = self.trace1.largest_saved, self.trace2.largest_saved
        return int(a1 + (a2 - a1) * (micro - 1)), int(l1 + (l2 - l1) * (micro - 1))


def _build(cfg: Config, manifest: dict | None, bf16: bool, cuda: bool) -> tuple[_Model, str]:
    from trainer.tasks import task_for

    task = task_for(cfg)
    manifest, note = planning_manifest(cfg, task, manifest)
    shape = model_shape(build_on_meta(cfg, task, manifest), task, cfg)

    def traced(held: Callable[[Any], bool] | None) -> list[ActivationTrace | None]:
        return [
            trace_activations(build_on_meta(cfg, task, manifest), task, cfg, manifest, b, bf16, held) for b in (1, 2)
        ]

    held = _held_in_bf16(cfg, bf16, cuda)
    alone = None
    if cfg.train.strategy == "fsdp" and held is not None:
        unwrapped = _held_in_bf16(
            dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, strategy="ddp")), bf16, cuda
        )
        alone = _Model(shape, *traced(unwrapped))
    return _Model(shape, *traced(held), alone=alone), note


def _held_in_bf16(cfg: Config, bf16: bool, cuda: bool) -> Callable[[Any], bool] | None:
    """Which parameters a GPU run holds in bf16 for compute, so that autocast saves no bf16 copy of
    them (the trace runs on this machine's CPU, in the dtypes the model has here): all of them
    under FSDP (its mixed-precision policy gathers them in bf16), a LoRA run's frozen base (built
    in bf16 on GPUs); None: autocast copies each one, as it does under DDP."""
    if not (cuda and bf16):
        return None
    if cfg.train.strategy == "fsdp":
        return lambda p: True
    if cfg.train.method == "lora":
        return lambda p: not p.requires_grad
    return None


@dataclass(frozen=True)
class _Target:
    gpu: GpuSpec | None
    cuda: bool
    bf16: bool
    link: Interconnect
    per_node: int


def _memory(m: _Model, cfg: Config, world: int, target: _Target) -> MemoryBreakdown:
    tc = cfg.train
    s = m.shape
    frozen_bytes = s.frozen_bytes
    if target.cuda and tc.method == "lora" and target.bf16:
        frozen_bytes = s.frozen * 2  # the trainer builds a LoRA base in bf16 on GPUs
    micro = tc.batch_size / (world * tc.grad_accum_steps)
    act, largest = m.on(world).activations(micro, tc.activation_checkpointing)
    grads = s.trainable * 4
    sharded = tc.strategy == "fsdp" and world > 1
    out = MemoryBreakdown(
        parameters=s.trainable_bytes + frozen_bytes,
        gradients=grads,
        optimizer=2 * s.trainable_bytes,
        activations=act + largest,
        other=GPU_OVERHEAD_BYTES if target.cuda else 0,
    )
    if sharded:
        out.parameters = math.ceil(out.parameters / world)
        out.gradients = math.ceil(grads / world)
        if tc.grad_accum_steps > 1:
            # Accumulation micro-steps skip the reduce-scatter (trainer.distributed.gradient_sync):
            # FSDP2 keeps every trainable parameter's whole gradient, in fp32, until the last one.
            out.gradients += grads
        out.optimizer = math.ceil(out.optimizer / world)
        per_elem = 2 if (target.cuda and target.bf16) else 4
        unit = max(s.unit_params, default=0)
        # The gathered unit (twice: the next one is prefetched) and the full gradients of the
        # largest unit's trainable parameters before the reduce-scatter (LoRA: adapters only).
        out.communication = s.root_params * per_elem + 2 * unit * per_elem + max(s.unit_trainable, default=0) * 4
    return out


def _items_per_rank_step(cfg: Config, world: int) -> float:
    return cfg.train.batch_size / world


def _contention(world_here: int) -> float:
    """CPU ranks on one machine share its cores: more ranks than cores run proportionally slower."""
    cores = os.cpu_count() or 1
    return max(1.0, world_here / cores)


def _time(
    m: _Model, cfg: Config, nodes: int, target: _Target, probe: ProbeResult | None, mfu: float
) -> tuple[float | None, float | None, float]:
    """(compute, exposed communication, data wait) seconds per optimizer step at `nodes`."""
    tc = cfg.train
    world = nodes * target.per_node
    items = _items_per_rank_step(cfg, world)
    compute: float | None = None
    recompute_factor, backward_share = _step_flops(tc.method, tc.activation_checkpointing)
    if target.gpu is not None:
        flops = m.shape.flops_per_item * m.shape.items_per_sample * recompute_factor
        if flops > 0:
            compute = max(flops * items / (target.gpu.tflops(target.bf16) * 1e12 * mfu), launch_floor(m.shape, cfg))
    elif probe is not None:
        shared = probe.device == "cpu"  # CPU ranks share the machine's cores; GPUs are their own
        per_item = probe.compute_seconds / _items_per_rank_step(cfg, probe.world_size)
        if shared:
            per_item /= _contention(probe.world_size)
        compute = per_item * items * (_contention(target.per_node) if shared else 1.0)
    wait = probe.data_wait_seconds if probe is not None else 0.0
    if compute is None:
        return None, None, wait
    link = target.link
    backward = compute * backward_share
    if world <= 1:
        return compute, 0.0, wait
    s = m.shape
    if tc.strategy == "fsdp":
        per_elem = 2 if (target.cuda and target.bf16) else 4
        gathers = [all_gather(p * per_elem, nodes, target.per_node, link) for p in s.unit_params]
        root = all_gather(s.root_params * per_elem, nodes, target.per_node, link)
        # Forward gathers every unit and the root; backward gathers the units again (resharded
        # after forward), per micro-step; the gradients are reduce-scattered once per step.
        gather = tc.grad_accum_steps * (2 * sum(gathers) + root)
        # Only gradients are reduce-scattered: the trainable parameters' (a LoRA run's adapters).
        scatter = sum(reduce_scatter(p * 4, nodes, target.per_node, link) for p in s.unit_trainable if p)
        scatter += reduce_scatter(s.root_trainable * 4, nodes, target.per_node, link) if s.root_trainable else 0.0
        scatters = sum(1 for p in s.unit_trainable if p) + (1 if s.root_trainable else 0)
        calls = tc.grad_accum_steps * (2 * len(gathers) + 1) + scatters
        total = gather + scatter + calls * link.call_overhead_us * 1e-6
        first = root + (gathers[0] if gathers else 0.0)
        exposed = max(total - link.overlap * compute, first if link.overlap > 0 else total)
        return compute, exposed, wait
    sizes = buckets(s.trainable * 4, tc.bucket_cap_mb * 1024 * 1024)
    times = [all_reduce(b, nodes, target.per_node, link) + link.call_overhead_us * 1e-6 for b in sizes]
    total = sum(times)
    last_backward = backward / tc.grad_accum_steps
    exposed = max(total - link.overlap * last_backward, times[-1] if times else 0.0)
    return compute, exposed, wait


def _total_steps(cfg: Config, manifest: dict | None) -> int | None:
    tc = cfg.train
    if tc.max_steps:
        return tc.max_steps
    train = ((manifest or {}).get("splits") or {}).get("train") or {}
    items = train.get("rows")
    if items is None and "tokens" in train:
        items = train["tokens"] // (cfg.model.block_size + 1)
    if not items:
        return None
    return tc.epochs * max(1, items // tc.batch_size)


def _probed_on(device: str, spec: GpuSpec | None) -> bool:
    """Whether a probe on `device` (CUDA's name, or `cpu`) ran on the GPU type `spec` (None: on
    some GPU): the type of the device's name, so an L40S is no L4 and an H100 PCIe no H100 SXM."""
    if device == "cpu":
        return False
    if spec is None:
        return True
    try:
        return gpu_spec(device) == spec
    except HardwareError:  # another type, or one this table does not know
        return False


def make_plan(
    cfg: Config,
    *,
    gpu: str | None = None,
    gpu_memory_gb: float | None = None,
    nodes: Sequence[int] = (),
    price_per_gpu_hour: float | None = None,
    interconnect: Interconnect | None = None,
    probe: ProbeResult | None = None,
    manifest: dict | None = None,
) -> Plan:
    """Predict memory per rank, step time, scaling and cost of training `cfg`.

    `gpu`: a GPU type of :data:`trainer.plan.hardware.GPUS` (its memory, and its FLOP rate for
    the time); `gpu_memory_gb` overrides the memory. `nodes`: the node counts to predict (each
    node runs `job.nproc_per_node` ranks); the config's `job.replicas` is always among them.
    `probe`: a measured probe of this config (:func:`trainer.plan.run_probe`) the time model
    scales from. `manifest`: the prepared dataset's manifest (the model's real vocabulary or
    table width, and the epoch length for the ETA), if data prep has run.
    """
    spec = gpu_spec(gpu) if gpu else None
    cuda = spec is not None or gpu_memory_gb is not None
    tc = cfg.train
    bf16 = tc.precision == "bf16" or (tc.precision == "auto" and cuda)
    per_node = max(1, cfg.job.nproc_per_node)
    link = interconnect or default_interconnect(spec, cfg.plan.network_gbits)
    target = _Target(spec, cuda, bf16, link, per_node)
    here_nodes = max(1, cfg.job.replicas)
    world = here_nodes * per_node
    from trainer.tasks import task_for

    task = task_for(cfg)
    model, note = _build(cfg, manifest, bf16, cuda)
    memory = _memory(model, cfg, world, target)
    capacity = None
    if gpu_memory_gb is not None:
        capacity = int(gpu_memory_gb * GiB)
    elif spec is not None:
        capacity = int(spec.memory_gib * GiB)
    fits = None if capacity is None else memory.total <= capacity

    assumptions = [
        note,
        f"parameters: {model.shape.trainable:,} trainable, {model.shape.frozen:,} frozen "
        f"({len(model.shape.unit_params)} shard units)",
        f"precision: {'bf16 autocast' if bf16 else 'fp32'}; AdamW state 2 x fp32 per trainable parameter; "
        "gradients fp32",
        f"global batch {tc.batch_size} at every N ({tc.grad_accum_steps} accumulation micro-step(s)); "
        "the micro-batch per rank shrinks as ranks grow",
    ]
    if model.trace1 is None:
        assumptions.append(f"task {cfg.task!r} gives no synthetic_batch: activations not predicted (0)")
    else:
        assumptions.append(
            "activations traced from one forward pass and loss on fake tensors (autograd's saved tensors)"
            + ("; activation checkpointing of the shard units" if tc.activation_checkpointing else "")
        )
    if cuda:
        assumptions.append(f"{GPU_OVERHEAD_BYTES / GiB:.1f} GiB per GPU for the CUDA context, NCCL and allocator slack")
    mfu = DEFAULT_MFU
    if probe is not None and cuda and not _probed_on(probe.device, spec):
        # Its compute and its data wait are another device's: neither is used for this one.
        target_name = spec.name if spec is not None else "GPU"
        assumptions.append(f"the probe ran on {probe.device}, not the {target_name}: its times are not used")
        probe_here = None
    else:
        probe_here = probe
    if spec is not None:
        if probe_here is not None and model.shape.flops_per_item:
            flops = model.shape.flops_per_item * model.shape.items_per_sample
            measured = flops * _items_per_rank_step(cfg, probe_here.world_size) / probe_here.compute_seconds
            mfu = measured / (spec.tflops(bf16) * 1e12)
            assumptions.append(f"MFU {mfu:.2f} measured by the probe on {probe_here.device}")
        else:
            assumptions.append(
                f"compute from the task's FLOPs at {mfu:.0%} MFU of the {spec.name}'s "
                f"{spec.tflops(bf16):.0f} TFLOP/s {'bf16' if bf16 else 'fp32 (no TF32)'} peak, and at least "
                f"{launch_floor(model.shape, cfg) * 1e3:.2g} ms a step of kernel launches ({KERNELS_PER_TENSOR} per "
                f"parameter tensor per micro-step at {KERNEL_LAUNCH_S * 1e6:g} us, eager PyTorch)"
            )
    elif probe_here is not None:
        assumptions.append(
            f"compute scaled from the probe's {probe_here.compute_seconds:.4g} s per step on {probe_here.world_size} "
            "rank(s), "
            f"per item; CPU ranks beyond the {os.cpu_count()} cores share them"
        )
    else:
        assumptions.append("no GPU type and no probe: step time, ETA and cost are not predicted")
    assumptions.append(
        f"interconnect: {link.intra_node_gbps:g} GB/s within a node, {link.inter_node_gbps:g} GB/s per node "
        f"between nodes, {link.latency_us:g} us latency, overlap {link.overlap:g}; alpha-beta ring collectives "
        "(Thakur et al. 2005, Patarasuk & Yuan 2009), hierarchical across nodes; ignores congestion, NCCL "
        "protocol and algorithm choice, stragglers, and checkpoint and evaluation time"
    )
    total_steps = _total_steps(cfg, manifest)
    if total_steps is None:
        assumptions.append("ETA unknown: set train.max_steps or plan with the prepared dataset's manifest")

    # The probe measured its exposed communication (and, under FSDP, its compute holds the
    # parameter all-gathers, which cannot be switched off): at its own size the plan is what it
    # measured, elsewhere that plus the modelled difference, not the model's whole again.
    anchor = 0.0
    if probe_here is not None and probe_here.world_size > 1:
        # The probe's ranks all ran on this machine (torchrun --nnodes 1): one node of that many.
        on_one = dataclasses.replace(target, per_node=probe_here.world_size)
        _, modelled, _ = _time(model, cfg, 1, on_one, probe_here, mfu)
        if modelled is not None:
            anchor = probe_here.comm_seconds - modelled
            assumptions.append(
                f"communication calibrated to the probe's {probe_here.comm_seconds:.3g} s exposed a step on "
                f"{probe_here.world_size} ranks (the model said {modelled:.3g} s); other sizes add the modelled "
                "difference"
            )
    counts = sorted({1, here_nodes, *nodes})
    scaling: list[ScalePoint] = []
    for n in counts:
        compute, comm, wait = _time(model, cfg, n, target, probe_here, mfu)
        if comm is not None and n * per_node > 1:
            comm = max(0.0, comm + anchor)
        ranks = n * per_node
        step = None if compute is None else compute + comm + wait
        point = ScalePoint(
            nodes=n,
            gpus=ranks,
            step_seconds=step,
            compute_seconds=compute,
            comm_seconds=comm,
            items_per_second=None if not step else tc.batch_size * model.shape.items_per_sample / step,
            efficiency=None,
            eta_seconds=None if step is None or total_steps is None else step * total_steps,
            gpu_hours=None,
            cost=None,
            memory_total=_memory(model, cfg, ranks, target).total,
        )
        if point.eta_seconds is not None:
            point.gpu_hours = point.eta_seconds * ranks / 3600
            if price_per_gpu_hour is not None:
                point.cost = point.gpu_hours * price_per_gpu_hour
        scaling.append(point)
    if set(nodes):
        scaling = [p for p in scaling if p.nodes in set(nodes) | {here_nodes}]
    base = scaling[0]  # the efficiency is against the first row shown, as the verdicts name it
    for p in scaling:
        if p.items_per_second and base.items_per_second:
            p.efficiency = p.items_per_second / (base.items_per_second * p.nodes / base.nodes)

    plan = Plan(
        memory=memory,
        capacity_bytes=capacity,
        fits=fits,
        scaling=scaling,
        assumptions=assumptions,
        world_size=world,
        nodes=here_nodes,
        per_node=per_node,
        strategy=tc.strategy,
        device=spec.name if spec else ("GPU" if cuda else "cpu"),
        item_name=task.item_name,
        total_steps=total_steps,
        timeout_seconds=cfg.job.timeout_seconds,
        shape=model.shape.as_dict(),
        activation_trace=model.trace1.as_dict() if model.trace1 else {},
        probe=probe.as_dict() if probe else None,
        interconnect=link.as_dict(),
    )
    if fits is False:
        plan.alternatives = _alternatives(cfg, model, world, target, capacity, manifest, bf16)
    plan.verdicts = _verdicts(plan, cfg, price_per_gpu_hour)
    return plan


def _alternatives(
    cfg: Config, model: _Model, world: int, target: _Target, capacity: int | None, manifest: dict | None, bf16: bool
) -> list[Alternative]:
    """The single changes that lower memory per rank, each predicted; when none fits, the fewest of
    them together that do (every such combination of that size), else all of them at micro-batch 1."""
    tc = cfg.train
    # The model as each strategy and method trace it (FSDP and a LoRA base hold weights in bf16,
    # so autocast saves no copy of them), built once each.
    models = {(tc.strategy, tc.method): model}

    def model_for(alt: Config) -> _Model:
        key = (alt.train.strategy, alt.train.method)
        if key not in models:
            models[key] = _build(alt, manifest, bf16, target.cuda)[0]
        return models[key]

    def with_train(**fields: Any) -> Config:
        return dataclasses.replace(cfg, train=dataclasses.replace(tc, **fields))

    singles: list[tuple[str, dict[str, Any]]] = []  # (the change, its train fields)
    if tc.strategy != "fsdp" and world > 1:
        singles.append((f"train.strategy: fsdp (shards over {world} ranks)", {"strategy": "fsdp"}))
    micro = tc.batch_size // (world * tc.grad_accum_steps)
    if micro >= 2 and micro % 2 == 0:  # an odd micro-batch does not halve: the trainer would refuse the split
        accum = tc.grad_accum_steps * 2
        singles.append(
            (
                f"half the micro-batch: train.grad_accum_steps {accum} (micro-batch {micro // 2})",
                {"grad_accum_steps": accum},
            )
        )
    if not tc.activation_checkpointing:
        singles.append(("train.activation_checkpointing: true", {"activation_checkpointing": True}))
    if cfg.model.init_from and tc.method != "lora":
        singles.append((f"train.method: lora (rank {cfg.lora.rank})", {"method": "lora"}))

    def predicted(change: str, alt: Config) -> Alternative | None:
        try:
            alt_model = model_for(alt)
        except PlanError:  # a combination the task cannot build (FSDP over this LoRA model): not offered
            return None
        mem = _memory(alt_model, alt, world, target)
        return Alternative(change, mem, None if capacity is None else mem.total <= capacity)

    out = [a for change, fields in singles if (a := predicted(change, with_train(**fields)))]
    if not out or any(a.fits for a in out) or capacity is None:
        return out
    for size in range(2, len(singles) + 1):
        fitting = []
        for combo in itertools.combinations(singles, size):
            fields = {k: v for _, changes in combo for k, v in changes.items()}
            if (a := predicted(" with ".join(c for c, _ in combo), with_train(**fields))) and a.fits:
                fitting.append(a)
        if fitting:
            return out + fitting
    # Every single change at once, at micro-batch 1 where the batch splits so: named by the settings
    # it applies (was: "fsdp" for one rank, where it changes nothing; "micro-batch 1" where the
    # batch does not split into ones).
    fields = {k: v for _, changes in singles for k, v in changes.items()}
    parts = [change for change, changes in singles if "grad_accum_steps" not in changes]
    if tc.batch_size % world == 0 and tc.batch_size // world > tc.grad_accum_steps:
        fields["grad_accum_steps"] = tc.batch_size // world
        parts.append(f"train.grad_accum_steps {fields['grad_accum_steps']} (micro-batch 1)")
    if any(fields == changes for _, changes in singles):  # one of the single changes, predicted above
        return out
    last = predicted(f"all of them together: {' with '.join(parts)}", with_train(**fields))
    return [*out, last] if last else out


def _verdicts(plan: Plan, cfg: Config, price: float | None) -> list[str]:
    out = []
    split = plan.world_size * cfg.train.grad_accum_steps
    if cfg.train.batch_size % split:
        out.append(
            f"train.batch_size {cfg.train.batch_size} does not divide by {plan.world_size} ranks x "
            f"train.grad_accum_steps {cfg.train.grad_accum_steps}: the trainer refuses it (the plan "
            "takes the fractional micro-batch)"
        )
    accum = cfg.train.grad_accum_steps
    refused = [p for p in plan.scaling if p.nodes != plan.nodes and cfg.train.batch_size % (p.gpus * accum)]
    if refused:
        out.append(
            f"N={', '.join(str(p.nodes) for p in refused)}: train.batch_size {cfg.train.batch_size} does not divide "
            f"by their {', '.join(str(p.gpus) for p in refused)} ranks x train.grad_accum_steps {accum}: the trainer "
            "would refuse those node counts (their rows take the fractional micro-batch)"
        )
    m = plan.memory
    if plan.fits is True:
        share = m.total / (plan.capacity_bytes or 1)
        need, has = format_memories(m.total, plan.capacity_bytes or 0)
        out.append(
            f"fits: {need} per rank of {has} ({share:.0%})"
            + (
                "; little headroom: the allocator's fragmentation or a longer batch can run out of memory"
                if share > TIGHT_FIT
                else ""
            )
        )
    elif plan.fits is False:
        fitting = [a.change for a in plan.alternatives if a.fits]
        need, has = format_memories(m.total, plan.capacity_bytes or 0)
        out.append(
            f"does not fit: {need} per rank, the device has {has}; "
            + (f"would fit with: {'; '.join(fitting)}" if fitting else "no single change considered fits")
        )
    else:
        out.append(f"needs {format_memory(m.total)} per rank (no device memory given: --gpu or --gpu-memory)")
    if plan.capacity_bytes is not None:
        for p in plan.scaling:
            if p.memory_total > plan.capacity_bytes:
                out.append(f"N={p.nodes} does not fit: {format_memory(p.memory_total)} per rank; its row only compares")
    points = [p for p in plan.scaling if p.items_per_second]
    ranks, hour = _ranks_words(plan.device)
    for prev, nxt in itertools.pairwise(points):
        speed = nxt.items_per_second / prev.items_per_second
        resources = nxt.gpus / prev.gpus
        cost = ""
        if prev.cost is not None and nxt.cost is not None and prev.cost > 0:
            cost = f" at {nxt.cost / prev.cost:.2f}x the cost"
        out.append(
            f"N={nxt.nodes} gives {speed:.2f}x of N={prev.nodes} for {resources:g}x the {ranks}{cost} "
            f"(efficiency {nxt.efficiency:.0%} of linear from N={plan.scaling[0].nodes})"
        )
    here = plan.point(plan.nodes)
    if here is not None and here.eta_seconds is not None:
        timeout = cfg.job.timeout_seconds
        eta = f"ETA {_duration(here.eta_seconds)} on {plan.nodes} node(s) ({plan.total_steps} steps)"
        if timeout and here.eta_seconds > timeout:
            out.append(f"{eta}: longer than job.timeout_seconds {timeout}")
        else:
            out.append(eta + (f", within job.timeout_seconds {timeout}" if timeout else ""))
        if here.cost is not None and price is not None:
            out.append(f"cost {here.cost:.2f} ({here.gpu_hours:.1f} {hour}s at {price:g} per {hour})")
    return out


def _ranks_words(device: str) -> tuple[str, str]:
    """What a plan's ranks are, and their hour: GPUs, or processes (a plan of this machine's CPU)."""
    return ("processes", "process-hour") if device == "cpu" else ("GPUs", "GPU-hour")
