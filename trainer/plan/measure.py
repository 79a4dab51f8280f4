"""Peak memory of training tensors, measured the same way by the probe and by real runs.

On CUDA it is the caching allocator's own counter, ``torch.cuda.max_memory_allocated`` (bytes
held by live tensors since ``reset_peak_memory_stats``): what the plan predicts, without the
CUDA context.

The CPU allocator keeps no such counter. Two ways were tried (bench/README.md): the kernel's
resident-set high-water mark (``VmHWM``, resettable through ``/proc/self/clear_refs``) costs
nothing but measured 40-50% above the tensors' peak for a small GPT, because the resident set
also holds what glibc keeps of freed blocks, oneDNN's scratch and per-thread caches, which grow
with the run and cannot be told apart. ``torch.profiler`` with ``profile_memory`` reports every
allocation and free of torch's CPU allocator, so the peak of live tensor bytes is exact (within
an op: its net allocation), at the cost of recording every op while it runs. The CPU measure
is therefore the profiler's, over a window: :meth:`PeakMemory.reset` counts the tensors alive
then (their storages, found through the garbage collector) and starts recording;
:meth:`PeakMemory.peak_bytes` stops and adds the highest running total of allocations minus
frees to that count. Measure a few steps, not a whole run: the recording slows each op.
Memory a library allocates outside torch's allocator (gloo's own buffers) is not seen.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch

#: What torch's C++ side prints to stderr around a memory-profiling window, none of it news to a
#: user: Kineto's start/stop trace lines, and the allocator's one warning per process that a
#: block allocated before the window was freed inside it (which the measure accounts for: the
#: live tensors at the window's start are counted separately).
_PROFILER_NOISE = ("SyncActivityProfilerHandler", "Memory block of unknown size was allocated before the profiling")


@contextlib.contextmanager
def _quiet_profiler_stderr() -> Iterator[None]:
    """Hold file descriptor 2 (where C++ logs go) for a moment; pass on what is not profiler noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [
                line
                for line in held.read().decode(errors="replace").splitlines(keepends=True)
                if not any(noise in line for noise in _PROFILER_NOISE)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def live_tensor_bytes() -> int:
    """Bytes of the CPU tensor storages reachable from Python now, each storage once
    (parameters, gradients, optimizer state, buffers, batches)."""
    from torch._subclasses.fake_tensor import FakeTensor

    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated torch aliases warns
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor) and not isinstance(obj, FakeTensor)]
    for obj in objects:
        try:
            if obj.device.type != "cpu" or obj.is_meta:
                continue
            storage = obj.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        except Exception:  # fake, sparse or otherwise storage-less tensors
            continue
    return sum(n for ptr, n in seen.items() if ptr)


def _peak_of(events: Any) -> int:
    """The highest running total of the profiler's self allocations, in the order ops began."""
    changes = sorted(
        ((e.time_range.start, e.self_cpu_memory_usage) for e in events if e.self_cpu_memory_usage),
        key=lambda item: item[0],
    )
    running = peak = 0
    for _start, delta in changes:
        running += delta
        peak = max(peak, running)
    return peak


class PeakMemory:
    """The peak bytes of tensors on `device` since :meth:`reset` (see the module docstring)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._profiler: Any = None
        self._baseline = 0
        self._peak: int | None = None

    @property
    def method(self) -> str:
        """How the peak is measured, in words (for reports)."""
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated"
        return "torch.profiler memory events over the live tensors at reset"

    def reset(self) -> None:
        """Start a new measurement window (the peak so far is forgotten)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self._stop()
        from torch.profiler import ProfilerActivity, profile

        self._peak = None
        gc.collect()  # garbage from earlier work (a previous probe's model) is not alive
        self._baseline = live_tensor_bytes()
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        before = torch.empty(1)
        with _quiet_profiler_stderr():
            self._profiler.__enter__()
            del before  # the allocator's once-per-process warning about such a free, held here

    @contextlib.contextmanager
    def window(self) -> Iterator[PeakMemory]:
        """:meth:`reset`, then the code inside, and the window ended even when that raises: a
        torch profiler still running when the process exits crashes it (SIGSEGV in the profiler's
        destructor), which turned a run's own error (a non-finite loss) into a signal. Read the
        peak with :meth:`peak_bytes` after."""
        self.reset()
        try:
            yield self
        finally:
            self._stop()  # nothing to stop on a GPU, whose counter needs no window

    def _stop(self) -> None:
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        with _quiet_profiler_stderr():
            profiler.__exit__(None, None, None)
        self._peak = self._baseline + _peak_of(profiler.events())

    def peak_bytes(self) -> int:
        """The peak since the last :meth:`reset` (on the CPU this ends the window); 0 on the
        CPU when no window was started."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        self._stop()
        return self._peak or 0
