"""PeakMemory on the CPU: the live tensors at the window's start plus the highest the window
allocated above them."""

from __future__ import annotations

import os

import pytest
import torch

from trainer.plan.measure import PeakMemory, live_tensor_bytes

MiB = 2**20


def test_live_tensor_bytes_counts_each_storage_once():
    before = live_tensor_bytes()
    a = torch.zeros(4 * MiB // 4)
    view = a[: MiB // 4]  # the same storage: counted once
    assert live_tensor_bytes() - before == 4 * MiB
    del a, view


def test_the_peak_is_the_live_tensors_plus_the_highest_transient():
    kept = torch.zeros(8 * MiB // 4)  # alive when the window opens
    peak = PeakMemory("cpu")
    peak.reset()
    for size in (2, 16, 4):  # MiB, one at a time: the 16 MiB one is the high point
        t = torch.ones(size * MiB // 4)
        t.mul_(2)
        del t
    measured = peak.peak_bytes()
    baseline = peak._baseline
    assert baseline >= 8 * MiB
    assert abs(measured - baseline - 16 * MiB) < 1024  # torch's own scalars aside
    assert peak.peak_bytes() == measured  # the window is closed: the same answer again
    del kept


def test_a_window_measures_only_what_happened_in_it():
    peak = PeakMemory("cpu")
    peak.reset()
    big = torch.ones(32 * MiB // 4)
    del big
    first = peak.peak_bytes() - peak._baseline
    peak.reset()
    small = torch.ones(MiB // 4)
    del small
    assert abs(first - 32 * MiB) < 1024
    assert abs(peak.peak_bytes() - peak._baseline - MiB) < 1024
    assert "profiler" in peak.method and PeakMemory("cpu").peak_bytes() == 0


def test_a_window_prints_nothing_of_the_profiler_but_passes_other_lines_on(capfd):
    from trainer.plan.measure import _quiet_profiler_stderr

    peak = PeakMemory("cpu")
    kept = torch.ones(1000)
    peak.reset()
    del kept  # a block from before the window freed inside it: torch's allocator warns (once per process)
    torch.ones(10_000).sum()
    peak.peak_bytes()
    with _quiet_profiler_stderr():
        os.write(2, b"USDT:2026 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a line of the run's own\n")
    err = capfd.readouterr().err
    assert err == "a line of the run's own\n"


def test_a_window_ends_when_the_code_inside_raises():
    """A profiler still running when the process exits crashes it (SIGSEGV): an error inside the
    measured training step (a non-finite loss) once turned into that signal."""
    peak = PeakMemory("cpu")
    with pytest.raises(RuntimeError, match="diverged"), peak.window():
        torch.ones(1024)
        assert torch.autograd._profiler_enabled()
        raise RuntimeError("diverged")
    assert not torch.autograd._profiler_enabled()
    assert peak.peak_bytes() >= 4096
