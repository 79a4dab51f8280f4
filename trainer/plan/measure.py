"""Peak memory of a training process, measured the same way by the probe and by every real run.

On CUDA it is the caching allocator's own counter, ``torch.cuda.max_memory_allocated`` (bytes
held by live tensors, reset with ``reset_peak_memory_stats``): what the plan predicts.

The CPU allocator keeps no such counter. Two ways were weighed: ``torch.profiler`` memory
events are exact per tensor, but profiling slows every op and holds every event, so a real
run could not afford it; the kernel's resident-set high-water mark costs nothing, and Linux
resets it on request (writing ``5`` to ``/proc/self/clear_refs`` sets ``VmHWM`` back to the
current ``VmRSS``, proc(5)). The CPU measure is therefore ``VmHWM`` since the last reset minus
the resident set of the process before the model was built (the interpreter, torch's
libraries, the process group): the tensors' peak plus what the allocator keeps mapped around
them (glibc returns large blocks to the kernel on free; a small remainder of freed memory stays
resident, which the measure counts as the process really used it). Where ``clear_refs`` cannot
be written (not Linux) the high-water mark cannot be reset and the measure falls back to
``ru_maxrss``, which only grows: the first measurement of a process is still right.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def resident_bytes() -> int:
    """This process's resident set now (0 where /proc is missing)."""
    kb = _status_kb("VmRSS")
    return (kb or 0) * 1024


def _high_water_bytes() -> int:
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux kilobytes
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


class PeakMemory:
    """The peak memory of training tensors on `device` since :meth:`reset`.

    Create it before the model is built: on the CPU its baseline is the process's resident set
    at that moment, so the peak counts what training added (weights, gradients, optimizer
    state, activations, buffers), as the CUDA counter does.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.baseline = 0 if self.device.type == "cuda" else resident_bytes()
        self.resettable = self.device.type == "cuda" or _CLEAR_REFS.exists()

    @property
    def method(self) -> str:
        """How the peak is measured, in words (for reports)."""
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated"
        return "resident-set high-water mark (VmHWM) above the pre-model baseline"

    def reset(self) -> None:
        """Start a new measurement window (the peak so far is forgotten)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            self.resettable = False

    def peak_bytes(self) -> int:
        """The peak since the last :meth:`reset` (or since creation)."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return max(0, _high_water_bytes() - self.baseline)
