"""Benchmark: FSDP2 against DDP on the same GPT, 2 ranks on the CPU (issue #9).

Run under torchrun; every strategy trains a freshly built model (same seed, same data, same
global batch) in the same processes, alternating, and rank 0 reports per strategy:

- state memory per rank: the bytes of parameters + gradients + AdamW state that the rank holds
  after an optimizer step, counted from the tensors themselves (FSDP: the DTensors' local
  shards; DDP: the full replicas and its gradient buckets, which the gradients are views of),
  each distinct storage once, so padding and buckets count as allocated;
- peak RSS growth per rank over the run (``VmHWM`` reset before it, minus ``VmRSS`` at its
  start): a secondary figure, which activations, communication buffers and the allocator's
  caching blur;
- tokens/s (median over repeats) and the ratio against DDP;
- the time of one step's worth of each strategy's collectives on this process group (the
  whole model as one flat tensor): DDP's all-reduce of the gradients against FSDP's two
  all-gathers of the weights and one reduce-scatter of the gradients.

``fsdp`` is :func:`trainer.distributed.parallelize` with ``strategy="fsdp"`` (each GPT block
a shard unit, then the root); ``fsdp+ac`` adds activation checkpointing of the blocks. The step
is the trainer's: forward, loss, backward, global gradient-norm clip, AdamW step. The first
losses of every strategy are compared as a check that they train the same model.

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/fsdp_vs_ddp.py
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gpt_setup import add_gpt_arguments, gpt, parallel_gpt, require_ranks, token_batches  # noqa: E402
from trainer.distributed import clip_grad_norm, device_for, dist_env, process_group  # noqa: E402

STRATEGIES = ("ddp", "fsdp", "fsdp+ac")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of `t`: a DTensor's local shard, else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def held_bytes(tensors, seen: set[int] | None = None) -> int:
    """Bytes of the storages behind `tensors` as this rank holds them, each storage counted once
    (also across calls that share `seen`)."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        storage = local_tensor(t).untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's parameters, gradients and optimizer state, each storage counted once
    (DDP's gradients are views into its all-reduce buckets: the bucket is what is allocated)."""
    seen: set[int] = set()
    params = list(model.parameters())
    out = {
        "params": held_bytes(params, seen),
        "grads": held_bytes((p.grad for p in params if p.grad is not None), seen),
        "optimizer": held_bytes(
            (v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)), seen
        ),
    }
    out["total"] = sum(out.values())
    return out


def _proc_status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> int:
    """Give freed heap back to the OS, reset the peak RSS (Linux clear_refs 5); return RSS in kB."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _proc_status_kb("VmRSS")


def run(strategy: str, args, env, device, data: torch.Tensor) -> dict:
    """Train a fresh model for `args.steps` steps (after `args.warmup`); time, memory, losses."""
    rss0 = reset_peak_rss()
    # Identical initial weights on every rank, for every strategy.
    model, step_model = parallel_gpt(
        args, env, device, strategy.removesuffix("+ac"), activation_checkpointing=strategy.endswith("+ac")
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    micro = args.batch // env.world_size
    losses = []
    t0 = 0.0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        batch = data[i, env.rank * micro : (env.rank + 1) * micro]
        x, y = batch[:, :-1].to(device), batch[:, 1:].to(device)
        opt.zero_grad(set_to_none=True)
        logits = step_model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        clip_grad_norm(list(model.parameters()), 1.0)
        opt.step()
        losses.append(loss.item())
    dist.barrier()
    seconds = time.perf_counter() - t0
    memory = state_bytes(model, opt)  # after a step: gradients and AdamW state all present
    peak_growth_kb = _proc_status_kb("VmHWM") - rss0
    # The mean loss over the ranks' micro-batches is the global batch's loss, same for any strategy.
    mean = torch.tensor(losses[: args.warmup + 1], dtype=torch.float64)
    dist.all_reduce(mean)
    return {
        "seconds": seconds,
        "memory": memory,
        "peak_rss_growth_mb": peak_growth_kb / 1024,
        "losses": (mean / env.world_size).tolist(),
    }


def collective_seconds(numel: int, env, repeats: int = 5) -> dict[str, float]:
    """Median seconds of one step's worth of gradient and weight traffic on this process group,
    as single flat tensors of `numel` fp32 values: DDP all-reduces the gradients once; FSDP
    all-gathers the weights in forward and again in backward (the blocks reshard after forward)
    and reduce-scatters the gradients."""
    full, shard = torch.randn(numel), torch.randn(numel // env.world_size)
    ops = {
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather": lambda: dist.all_gather_single(full, shard),
        "reduce_scatter": lambda: dist.reduce_scatter_single(shard, full),
    }
    out = {}
    for name, op in ops.items():
        op()  # warm-up: gloo sets up its buffers
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    out["ddp_step"] = out["all_reduce"]
    out["fsdp_step"] = 2 * out["all_gather"] + out["reduce_scatter"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_gpt_arguments(parser, steps=8, help_steps="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    env = dist_env()
    require_ranks(env)
    device = device_for(env)
    data = token_batches(args, args.warmup + args.steps)
    results: dict[str, list[dict]] = {s: [] for s in strategies}
    with process_group(env, device):
        for r in range(args.repeats):
            # Rotate the order so no strategy always runs first (or right after another).
            for strategy in strategies[r % len(strategies) :] + strategies[: r % len(strategies)]:
                results[strategy].append(run(strategy, args, env, device, data))
        numel = gpt(args).num_params()
        comm = collective_seconds(numel, env)
        per_rank = [None] * env.world_size
        dist.all_gather_object(per_rank, results)
        if not env.is_main:
            return
        tokens = args.steps * args.batch * args.block
        base = strategies[0]
        report: dict = {
            "world_size": env.world_size,
            "model": f"GPT {args.n_layer} layers x {args.n_embd}, context {args.block}, vocab 256",
            "params_m": round(numel / 1e6, 2),
            "global_batch": args.batch,
            "steps": args.steps,
            "repeats": args.repeats,
            "load_average": [round(x, 2) for x in os.getloadavg()],
        }  # fmt: skip
        base_mem = max(runs[base][-1]["memory"]["total"] for runs in per_rank)
        base_tps = tokens / statistics.median(x["seconds"] for x in results[base])
        first_losses = results[base][0]["losses"]
        for s in strategies:
            tps = tokens / statistics.median(x["seconds"] for x in results[s])
            mem = [runs[s][-1]["memory"] for runs in per_rank]
            peak = [statistics.median(x["peak_rss_growth_mb"] for x in runs[s]) for runs in per_rank]
            loss_diff = max(abs(a - b) for a, b in zip(results[s][0]["losses"], first_losses, strict=True))
            report[s] = {
                "state_mb_per_rank": [round(m["total"] / 1e6, 1) for m in mem],
                "params_grads_optimizer_mb_rank0": [
                    round(mem[0][k] / 1e6, 1) for k in ("params", "grads", "optimizer")
                ],
                "state_memory_over_" + base: round(max(m["total"] for m in mem) / base_mem, 3),
                "peak_rss_growth_mb_per_rank": [round(p, 1) for p in peak],
                "tokens_per_s": round(tps),
                "tokens_per_s_runs": [round(tokens / x["seconds"]) for x in results[s]],
                "throughput_over_" + base: round(tps / base_tps, 3),
                # Per repeat (the two ran back to back, under the same load), then the median.
                "throughput_over_" + base + "_paired_median": round(
                    statistics.median(
                        b["seconds"] / x["seconds"] for x, b in zip(results[s], results[base], strict=True)
                    ),
                    3,
                ),
                "first_losses_max_abs_diff_vs_" + base: float(f"{loss_diff:.2e}"),
            }
        report["collectives_s_per_step"] = {k: round(v, 4) for k, v in comm.items()}
        report["step_s"] = {s: round(args.batch * args.block / report[s]["tokens_per_s"], 4) for s in strategies}
        print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
