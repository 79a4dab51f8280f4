"""Benchmark: how far `kftrain plan`'s predictions are from measurements (issue #20).

On this machine, with gloo over loopback as the interconnect:

1. the interconnect: a sweep of all-reduce, all-gather and reduce-scatter sizes on 2 gloo
   ranks, fitted to the alpha-beta model (latency alpha, bus bandwidth beta, as
   :mod:`trainer.plan.comms` defines them), and the fixed cost per collective call, from FSDP
   on a calibration GPT smaller than the validated ones;
2. per GPT size, strategy (ddp, fsdp) and world size (1, 2, 3): the probe on 1 rank (the
   time model's base: compute per item), then the plan's prediction (memory per rank from the
   shapes alone; step time from that 1-rank probe and the fitted interconnect), then the probe
   measured in that many fresh processes (a second 1-rank run for 1 rank); the medians over
   the repeats (of the largest rank's value) against the predictions;
3. on paper: GPT-2 small and a 1.3B GPT on 1, 2, 4, 8 nodes of 8 H200 with 400 Gb/s
   between nodes (no GPU needed: make_plan only).

    OMP_NUM_THREADS=1 .venv/bin/python bench/plan_accuracy.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import Config  # noqa: E402
from trainer.launch.local import free_port  # noqa: E402
from trainer.local_probe import probe_locally  # noqa: E402
from trainer.plan import Interconnect, make_plan  # noqa: E402
from trainer.plan.probe import ProbeResult  # noqa: E402

MiB = 2**20
SIZES = {
    # name: (layers, width, heads, context)
    "GPT 2x128": (2, 128, 4, 128),
    "GPT 4x256": (4, 256, 4, 256),
}
SWEEP_BYTES = [2**k for k in range(12, 25, 2)]  # 4 KiB .. 16 MiB


def _sweep_rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, list[tuple[int, float]]] = {"all_reduce": [], "all_gather": [], "reduce_scatter": []}
    try:
        for nbytes in SWEEP_BYTES:
            n = nbytes // 4
            full = torch.ones(n - n % world)
            part = torch.ones(full.numel() // world)
            ops = {
                "all_reduce": lambda f=full: dist.all_reduce(f),
                "all_gather": lambda f=full, p=part: dist.all_gather_into_tensor(f, p),
                "reduce_scatter": lambda f=full, p=part: dist.reduce_scatter_tensor(p, f),
            }
            for name, op in ops.items():
                op()
                times = []
                for _ in range(5):
                    dist.barrier()
                    t0 = time.perf_counter()
                    op()
                    times.append(time.perf_counter() - t0)
                results[name].append((full.numel() * 4, statistics.median(times)))
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def fit(samples: list[tuple[int, float]], factor_bytes: float, factor_steps: float) -> tuple[float, float]:
    """Least-squares fit of t = steps * alpha + bytes_moved / beta; (alpha us, beta GB/s)."""
    xs = [n * factor_bytes for n, _ in samples]
    ts = [t for _, t in samples]
    mx, mt = statistics.fmean(xs), statistics.fmean(ts)
    slope = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / sum((x - mx) ** 2 for x in xs)
    intercept = max(mt - slope * mx, 0.0)
    return intercept / factor_steps * 1e6, 1.0 / slope / 1e9


def measure_interconnect(world: int = 2) -> tuple[Interconnect, dict]:
    """The loopback gloo interconnect, fitted from a sweep on `world` ranks."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "sweep.json"))
        mp.start_processes(_sweep_rank, args=(world, free_port(), out), nprocs=world, start_method="spawn")
        sweep = json.loads(Path(out).read_text())
    p = world
    ar_alpha, ar_beta = fit(sweep["all_reduce"], 2 * (p - 1) / p, 2 * (p - 1))
    ag_alpha, ag_beta = fit(sweep["all_gather"], (p - 1) / p, p - 1)
    rs_alpha, rs_beta = fit(sweep["reduce_scatter"], (p - 1) / p, p - 1)
    link = Interconnect(
        intra_node_gbps=ar_beta,
        inter_node_gbps=ar_beta,
        latency_us=ar_alpha,
        overlap=0.0,
        gather_gbps=min(ag_beta, rs_beta),
        gather_latency_us=max(ag_alpha, rs_alpha),
    )
    fitted = {
        "all_reduce": {"alpha_us": ar_alpha, "beta_gbps": ar_beta},
        "all_gather": {"alpha_us": ag_alpha, "beta_gbps": ag_beta},
        "reduce_scatter": {"alpha_us": rs_alpha, "beta_gbps": rs_beta},
        "sweep": sweep,
    }
    return link, fitted


def gpt_config(size: str, strategy: str, world: int) -> Config:
    """The benchmark's GPT: a byte-level BPE vocabulary of 8192, global batch 12 (divides by 1, 2, 3)."""
    layers, width, heads, context = SIZES[size]
    cfg = Config(task="causal_lm")
    cfg.data.tokenizer = "bpe:8192"
    m = cfg.model
    m.n_layer, m.n_embd, m.n_head, m.block_size = layers, width, heads, context
    cfg.train.batch_size = 12
    cfg.train.max_steps = 100
    cfg.train.strategy = strategy
    cfg.job.replicas, cfg.job.nproc_per_node = 1, world  # one machine: `world` processes on its cores
    return cfg


def median_probe(worst: list[ProbeResult]) -> ProbeResult:
    """The medians over the repeats of each repeat's combined result (the slowest rank's times,
    the largest rank's peak: :func:`trainer.local_probe.combine`)."""

    def med(name: str) -> float:
        return statistics.median(getattr(r, name) for r in worst)

    return dataclasses.replace(
        worst[0],
        step_seconds=med("step_seconds"),
        compute_seconds=med("compute_seconds"),
        comm_seconds=med("comm_seconds"),
        data_wait_seconds=med("data_wait_seconds"),
        peak_memory_bytes=int(med("peak_memory_bytes")),
    )


def calibrate_call_overhead(link: Interconnect, repeats: int, steps: int) -> float:
    """The fixed cost per collective call (us), from FSDP on 2 ranks of a calibration GPT that
    is not one of the validated sizes (2 layers x 64, context 64): what its measured step time
    exceeds the alpha-beta prediction by, per call."""
    small = {"layers": 2, "width": 64, "heads": 4, "context": 64}
    SIZES["calibration"] = tuple(small.values())
    try:
        base = median_probe(probe_locally(gpt_config("calibration", "ddp", 1), steps=steps, repeats=repeats))
        cfg = gpt_config("calibration", "fsdp", 2)
        measured = median_probe(probe_locally(cfg, steps=steps, repeats=repeats)).step_seconds
    finally:
        del SIZES["calibration"]
    at = {
        us: make_plan(cfg, interconnect=dataclasses.replace(link, call_overhead_us=us), probe=base, nodes=(1,))
        .point(1)
        .step_seconds
        for us in (0.0, 1000.0)
    }
    per_us = (at[1000.0] - at[0.0]) / 1000.0  # seconds of step per us of overhead: the calls
    return max(0.0, (measured - at[0.0]) / per_us)


def accuracy(link: Interconnect, repeats: int, steps: int) -> list[dict]:
    rows = []
    for size in SIZES:
        for strategy in ("ddp", "fsdp"):
            for world in (1, 2, 3):
                if strategy == "fsdp" and world == 1:
                    continue  # one process: the same run as ddp's
                # The base right before the run it predicts: the machine's load from other work
                # changes by the minute.
                base = median_probe(probe_locally(gpt_config(size, "ddp", 1), steps=steps, repeats=repeats))
                cfg = gpt_config(size, strategy, world)
                plan = make_plan(cfg, interconnect=link, probe=base, nodes=(1,))
                point = plan.point(1)
                measured = median_probe(probe_locally(cfg, steps=steps, repeats=repeats))
                row = {
                    "model": size,
                    "strategy": strategy,
                    "ranks": world,
                    "memory_predicted_mib": plan.memory.tensors / MiB,
                    "memory_measured_mib": measured.peak_memory_bytes / MiB,
                    "step_predicted_s": point.step_seconds,
                    "step_measured_s": measured.step_seconds,
                    "compute_predicted_s": point.compute_seconds,
                    "compute_measured_s": measured.compute_seconds,
                    "comm_predicted_s": point.comm_seconds,
                    "comm_measured_s": measured.comm_seconds,
                    "load_average": os.getloadavg()[0],
                }
                row["memory_error"] = row["memory_predicted_mib"] / row["memory_measured_mib"] - 1
                row["step_error"] = row["step_predicted_s"] / row["step_measured_s"] - 1
                rows.append(row)
                print(
                    f"{size} {strategy} {world}: memory {row['memory_predicted_mib']:.1f} vs "
                    f"{row['memory_measured_mib']:.1f} MiB ({row['memory_error']:+.1%}), step "
                    f"{row['step_predicted_s']:.3f} vs {row['step_measured_s']:.3f} s ({row['step_error']:+.1%}), "
                    f"load {row['load_average']:.1f}",
                    flush=True,
                )
    return rows


def on_paper() -> list[dict]:
    """GPT-2 small and a 1.3B GPT on 1, 2, 4, 8 nodes of 8 H200, 400 Gb/s per node between nodes:
    global batch 512 sequences of 1024 tokens, micro-batch 8 per GPU (accumulation fills the rest)."""
    models = {
        "GPT-2 small (124M)": {"n_layer": 12, "n_embd": 768, "n_head": 12},
        "GPT 1.3B (24 x 2048)": {"n_layer": 24, "n_embd": 2048, "n_head": 16},
    }
    link = Interconnect(intra_node_gbps=450.0, inter_node_gbps=400 / 8 * 0.9, latency_us=10.0, overlap=1.0)
    rows = []
    for name, shape in models.items():
        for strategy in ("ddp", "fsdp"):
            base_rate = None
            for nodes in (1, 2, 4, 8):
                gpus = nodes * 8
                cfg = Config(task="causal_lm")
                cfg.data.tokenizer = "bpe:50257"
                for k, v in shape.items():
                    setattr(cfg.model, k, v)
                cfg.model.block_size = 1024
                cfg.train.batch_size = 512
                cfg.train.grad_accum_steps = 512 // (8 * gpus)
                cfg.train.max_steps = 10_000
                cfg.train.strategy = strategy
                cfg.job.replicas, cfg.job.nproc_per_node = nodes, 8
                plan = make_plan(cfg, gpu="H200", nodes=(nodes,), interconnect=link, price_per_gpu_hour=4.0)
                p = plan.point(nodes)
                base_rate = base_rate or p.items_per_second
                rows.append(
                    {
                        "model": name,
                        "strategy": strategy,
                        "nodes": nodes,
                        "gpus": gpus,
                        "memory_gib": plan.memory.total / 2**30,
                        "step_s": p.step_seconds,
                        "compute_s": p.compute_seconds,
                        "comm_s": p.comm_seconds,
                        "tokens_per_s": p.items_per_second,
                        "efficiency": p.items_per_second / (base_rate * nodes),
                        "eta_h": p.eta_seconds / 3600,
                        "gpu_hours": p.gpu_hours,
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default="")
    parser.add_argument("--paper-only", action="store_true")
    args = parser.parse_args()
    t0 = time.time()
    out: dict = {"load_average_start": os.getloadavg()}
    out["paper"] = on_paper()
    for r in out["paper"]:
        print(
            f"{r['model']} {r['strategy']} {r['nodes']} nodes: {r['memory_gib']:.1f} GiB/GPU, step {r['step_s']:.3f} s "
            f"(compute {r['compute_s']:.3f}, comm {r['comm_s']:.3f}), {r['tokens_per_s']:,.0f} tokens/s, "
            f"efficiency {r['efficiency']:.2f}, ETA {r['eta_h']:.1f} h, {r['gpu_hours']:.0f} GPU-h"
        )
    if not args.paper_only:
        link, fitted = measure_interconnect()
        overhead = calibrate_call_overhead(link, args.repeats, args.steps)
        link = dataclasses.replace(link, call_overhead_us=overhead)
        fitted["call_overhead_us"] = overhead
        out["interconnect"] = fitted
        print("interconnect:", {k: v for k, v in fitted.items() if k != "sweep"}, flush=True)
        out["accuracy"] = accuracy(link, args.repeats, args.steps)
    out["load_average_end"] = os.getloadavg()
    out["seconds"] = time.time() - t0
    print(f"{out['seconds']:.0f} s; load average {out['load_average_start']} -> {out['load_average_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
