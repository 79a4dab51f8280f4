"""`kftrain plan`: predict a run's memory per rank, step time, scaling and cost before spending
GPUs on it, and measure the same with a short probe (issue #20).

- :mod:`trainer.plan.shapes`: the task's model on the meta device, its parameters and traced
  activations;
- :mod:`trainer.plan.plan`: the memory and time models, the verdicts (:func:`make_plan`);
- :mod:`trainer.plan.comms`: the alpha-beta cost of the collectives;
- :mod:`trainer.plan.hardware`: GPU types and the interconnect;
- :mod:`trainer.plan.probe`: a few real steps, measured (:func:`run_probe`);
- :mod:`trainer.plan.measure`: peak memory as the probe and every real run measure it.
"""

from trainer.plan.hardware import GPUS, GpuSpec, Interconnect, gpu_spec
from trainer.plan.measure import PeakMemory
from trainer.plan.plan import Alternative, MemoryBreakdown, Plan, ScalePoint, make_plan
from trainer.plan.probe import ProbeResult, run_probe
from trainer.plan.shapes import PlanError

__all__ = [
    "GPUS",
    "Alternative",
    "GpuSpec",
    "Interconnect",
    "MemoryBreakdown",
    "PeakMemory",
    "Plan",
    "PlanError",
    "ProbeResult",
    "ScalePoint",
    "gpu_spec",
    "make_plan",
    "run_probe",
]
