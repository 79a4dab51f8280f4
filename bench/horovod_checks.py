"""Benchmark: what the Horovod shim's collective consistency checks cost a training step.

2 ranks on CPU (gloo), an MLP (3 linear layers, 256 inputs, 10 classes) trained with
`hvd.DistributedOptimizer` (one check per step for all its gradients, which in steady state runs
behind the gradient reductions) plus one allreduced loss per step (one check, which waits), and
the first model also without the loss. Steps alternate between checks on (the default) and off (what
`KFTRAIN_HOROVOD_CHECKS=0` sets at init; here toggled between steps, on every rank at the same
step, so that a busy shared machine's drift hits both alike); the median step time of each and
their ratio (target: on / off under 1.03), for each hidden width and batch given. Also the
latency of one tiny allreduce on and off: what one check adds, whatever the model.

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/horovod_checks.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.horovod import api as hvd  # noqa: E402


def mlp(hidden: int) -> torch.nn.Module:
    """The benchmark's model."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def step_times(hidden: int, batch: int, pairs: int, metric: bool) -> dict[bool, list[float]]:
    """Seconds per training step with checks on (True) and off (False), alternating."""
    model = mlp(hidden)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(batch, 256, generator=g), torch.randint(0, 10, (batch,), generator=g)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * pairs + 4):
        checks = (i // 2) % 2 == 0  # on, on, off, off, ...: each mode follows each mode equally often
        hvd._state.checks = checks
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if metric:
            hvd.allreduce(loss.detach(), name="loss")
        if i >= 4:
            times[checks].append(time.perf_counter() - t0)
    hvd._state.checks = True
    return times


def tiny_allreduce(n: int) -> dict[bool, float]:
    """Median seconds of one allreduce of a one-element tensor, checks on and off."""
    t = torch.ones(1)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * n):
        hvd._state.checks = i % 2 == 0
        t0 = time.perf_counter()
        hvd.allreduce(t, op=hvd.Sum)
        times[i % 2 == 0].append(time.perf_counter() - t0)
    hvd._state.checks = True
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=100, help="steps per mode")
    parser.add_argument("--shapes", default="512x64,2048x256", help="HIDDENxBATCH, comma-separated")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    tiny = tiny_allreduce(500)
    lines = [f"tiny allreduce: checks off {tiny[False] * 1e6:.0f} us, on {tiny[True] * 1e6:.0f} us"]
    for i, shape in enumerate(args.shapes.split(",")):
        hidden, batch = (int(v) for v in shape.split("x"))
        for metric in (True, False) if i == 0 else (True,):
            times = step_times(hidden, batch, args.pairs, metric)
            on, off = statistics.median(times[True]), statistics.median(times[False])
            what = "optimizer + allreduced loss" if metric else "optimizer only"
            lines.append(
                f"hidden {hidden}, batch {batch}, {what}: step checks off {off * 1e3:.2f} ms, "
                f"on {on * 1e3:.2f} ms, on / off {on / off:.3f}; one check at the tiny-allreduce difference "
                f"would be {(tiny[True] - tiny[False]) / off * 100:.1f}% of the step"
            )
    hvd.shutdown()
    if int(os.environ.get("RANK", 0)) == 0:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
