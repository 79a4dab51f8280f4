"""Benchmark: what the Horovod shim's collective consistency checks cost a training step.

2 ranks on CPU (gloo), a small MLP trained with `hvd.DistributedOptimizer` (one check per step
for all its gradients) plus one allreduced metric per step (one check each), with the checks on
(the default) and off (`KFTRAIN_HOROVOD_CHECKS=0`), alternating in the same processes
(`hvd.shutdown()` then `hvd.init()` between phases); the median step time of each and their
ratio (target: on / off under 1.03). Also the latency of one tiny allreduce on and off, which
bounds what one check adds.

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


def step_times(model: torch.nn.Module, steps: int, batch: int) -> float:
    """Median seconds per training step over `steps` steps (after 3 untimed ones)."""
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters()
    )
    g = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(batch, 256, generator=g), torch.randint(0, 10, (batch,), generator=g)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        hvd.allreduce(loss.detach(), name="loss")
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tiny_allreduce(n: int) -> float:
    """Median seconds of one allreduce of a one-element tensor."""
    t = torch.ones(1)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        hvd.allreduce(t, op=hvd.Sum)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10),
    )
    results: dict[str, list[float]] = {"on": [], "off": [], "tiny on": [], "tiny off": []}
    for repeat in range(args.repeats):
        # Alternate which goes first, so drift on a shared machine hits both alike.
        for checks in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
            os.environ["KFTRAIN_HOROVOD_CHECKS"] = "1" if checks == "on" else "0"
            hvd.init()
            results[checks].append(step_times(model, args.steps, args.batch))
            results[f"tiny {checks}"].append(tiny_allreduce(200))
            hvd.shutdown()
    if int(os.environ.get("RANK", 0)) == 0:
        med = {k: statistics.median(v) for k, v in results.items()}
        print(f"step time, checks off: {med['off'] * 1e3:.2f} ms")
        print(f"step time, checks on:  {med['on'] * 1e3:.2f} ms")
        print(f"on / off: {med['on'] / med['off']:.3f}")
        print(f"tiny allreduce, checks off: {med['tiny off'] * 1e6:.0f} us, on: {med['tiny on'] * 1e6:.0f} us")
        print("per repeat on/off:", [round(a / b, 3) for a, b in zip(results["on"], results["off"], strict=True)])


if __name__ == "__main__":
    main()
