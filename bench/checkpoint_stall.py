"""Benchmark: checkpoint stall per save in a 2-rank training loop, and parallel upload (issue #9).

Run under torchrun (2 ranks, gloo, CPU). Rank 0 starts a real S3 server process (moto on
loopback, as the tests do); every rank writes through the trainer's own
:class:`trainer.checkpoint.CheckpointManager` on the gloo group of
:func:`trainer.distributed.checkpoint_group`, as the trainer does.

(a) Stall per save, for ``ddp`` and ``fsdp``: a training loop saving every ``--interval``
steps against the same loop without saves (alternating, fresh model each). The stall of a save
is the training thread's time in what the trainer does at a save: wait for the previous upload,
``get_state_dict``, ``CheckpointManager.save`` (DCP stages to local disk; the upload then runs
on a background thread). Reported in units of the median step time of the loop without saves
(goal: at most 1 step), with its parts, and the whole loop's slowdown with saves against
without (which also counts steps slowed by the upload competing for the cores).

(b) Upload throughput: the same DDP checkpoint saved by 2 ranks in parallel (each uploads its
own DCP parts: the replicated tensors are spread over the ranks) against one rank saving it
alone (``world_size=1``, every byte from one process), ``blocking=True`` so nothing else runs,
to the same server; MB/s = the checkpoint's bytes / ``last_upload_seconds`` (the slowest rank),
and the S3 server process's CPU seconds per second of upload (1.0 = one core saturated).

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/checkpoint_stall.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.gpt_setup import add_gpt_arguments, parallel_gpt, require_ranks, token_batches  # noqa: E402
from tests.s3server import s3_server  # noqa: E402
from trainer.checkpoint import CheckpointManager  # noqa: E402
from trainer.distributed import (  # noqa: E402
    checkpoint_group,
    clip_grad_norm,
    device_for,
    dist_env,
    process_group,
)
from trainer.rng import rng_state  # noqa: E402
from trainer.storage import S3Store  # noqa: E402


def build(strategy: str, args, env, device):
    model, step_model = parallel_gpt(args, env, device, strategy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    return model, step_model, opt


def train_step(model, step_model, opt, x: torch.Tensor) -> None:
    """The trainer's step: forward, loss, backward, global gradient-norm clip, AdamW."""
    opt.zero_grad(set_to_none=True)
    logits = step_model(x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
    loss.backward()
    clip_grad_norm(list(model.parameters()), 1.0)
    opt.step()


def loop(model, step_model, opt, data, args, env, mgr: CheckpointManager | None, first_step: int) -> dict:
    """`args.steps` steps, saving every `args.interval` (not after the last: its upload would
    outlast the loop). Returns the loop's seconds, per-step seconds and per-save timings."""
    micro = data.shape[1] // env.world_size
    step_s, saves = [], []
    dist.barrier()
    t_loop = time.perf_counter()
    for i in range(1, args.steps + 1):
        t0 = time.perf_counter()
        train_step(model, step_model, opt, data[i, env.rank * micro : (env.rank + 1) * micro])
        step_s.append(time.perf_counter() - t0)
        if mgr is not None and i % args.interval == 0 and i < args.steps:
            t0 = time.perf_counter()
            mgr.wait()  # save() would wait here too: timed on its own
            t1 = time.perf_counter()
            model_state, optim_state = get_state_dict(model, opt)
            t2 = time.perf_counter()
            mgr.save(
                first_step + i,
                {"model": model_state, "optimizer": optim_state},
                record={"position": {"step": first_step + i}} if env.is_main else None,
                local=lambda: {"rng": rng_state()},
            )
            t3 = time.perf_counter()
            saves.append(
                {"stall": t3 - t0, "wait": t1 - t0, "state_dict": t2 - t1, "stage": mgr.last_stage_seconds,
                 "save": t3 - t2, "bytes": mgr.last_bytes}
            )  # fmt: skip
    seconds = time.perf_counter() - t_loop
    t0 = time.perf_counter()
    if mgr is not None:
        mgr.wait()  # the last save's upload, if it outlasted the loop (the trainer's close())
    tail = time.perf_counter() - t0
    dist.barrier()
    return {"seconds": seconds, "tail_wait_s": tail, "step_s": step_s, "saves": saves}


def stall_bench(strategy: str, r: int, args, env, device, store, group, data) -> dict:
    model, step_model, opt = build(strategy, args, env, device)
    train_step(model, step_model, opt, data[0, : data.shape[1] // env.world_size])  # warm-up: AdamW state exists
    mgr = CheckpointManager(
        store, f"s3://bench/{strategy}/checkpoints", keep_last=1, rank=env.rank, world_size=env.world_size, group=group
    )
    out = {}
    first = 1000 * (r + 1)  # step numbers grow over repeats: pruning keeps one checkpoint per strategy
    for with_saves in (False, True) if r % 2 == 0 else (True, False):
        key = "with_saves" if with_saves else "without"
        out[key] = loop(model, step_model, opt, data, args, env, mgr if with_saves else None, first)
    mgr.close()
    return out


def server_cpu_seconds() -> float:
    """CPU seconds the S3 server process (this process's moto_server child) has used so far; 0
    where it is not ours (the other ranks) or /proc is missing."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
        if "moto" in name and int(fields[1]) == os.getpid():  # fields[1]: parent pid
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return 0.0


def upload_bench(r: int, env, device, args, store, group, data) -> dict:
    """One DDP checkpoint, saved by both ranks in parallel and by rank 0 alone (alternating)."""
    model, step_model, opt = build("ddp", args, env, device)
    train_step(model, step_model, opt, data[0, : data.shape[1] // env.world_size])
    model_state, optim_state = get_state_dict(model, opt)
    state = {"model": model_state, "optimizer": optim_state}
    out = {}
    for parallel in (True, False) if r % 2 == 0 else (False, True):
        dist.barrier()
        cpu0 = server_cpu_seconds()
        if parallel:
            mgr = CheckpointManager(
                store, "s3://bench/upload-2/checkpoints", 1, rank=env.rank, world_size=env.world_size, group=group
            )
            mgr.save(r + 1, state, blocking=True)
            sizes = [None] * env.world_size
            dist.all_gather_object(sizes, (mgr.last_bytes, mgr.last_upload_seconds))
            out["parallel"] = {"bytes": sum(b for b, _ in sizes), "seconds": max(s for _, s in sizes)}
            mgr.close()
        elif env.is_main:
            mgr = CheckpointManager(store, "s3://bench/upload-1/checkpoints", 1)
            with warnings.catch_warnings():  # DCP notes that a process-group member saves alone: intended
                warnings.simplefilter("ignore", UserWarning)
                mgr.save(r + 1, state, blocking=True)
            out["one_rank"] = {"bytes": mgr.last_bytes, "seconds": mgr.last_upload_seconds}
            mgr.close()
        dist.barrier()
        if env.is_main:  # the server's CPU time per second of upload (1.0: one core busy)
            key = "parallel" if parallel else "one_rank"
            out[key]["server_cpu_share"] = (server_cpu_seconds() - cpu0) / out[key]["seconds"]
    return out


def summarize(args, per_rank: list[dict], strategies: list[str]) -> dict:
    report: dict = {}
    for s in strategies:
        runs = [rank[s] for rank in per_rank]  # runs[rank][repeat]
        step_s = statistics.median(t for rank in runs for rep in rank for t in rep["without"]["step_s"])
        # A save's stall is the slowest rank's (the collective makes the others wait for it too).
        n_saves = len(runs[0][0]["with_saves"]["saves"])
        saves = [
            {
                k: max(rank[rep]["with_saves"]["saves"][j][k] for rank in runs)
                for k in runs[0][0]["with_saves"]["saves"][0]
            }
            for rep in range(args.repeats)
            for j in range(n_saves)
        ]
        loop_s = {
            key: [max(rank[rep][key]["seconds"] for rank in runs) for rep in range(args.repeats)]
            for key in ("without", "with_saves")
        }
        pairs = list(zip(loop_s["with_saves"], loop_s["without"], strict=True))
        tails = [max(rank[rep]["with_saves"]["tail_wait_s"] for rank in runs) for rep in range(args.repeats)]
        total_bytes = sum(rank[0]["with_saves"]["saves"][0]["bytes"] for rank in runs)
        med = {k: statistics.median(x[k] for x in saves) for k in ("stall", "wait", "state_dict", "stage", "save")}
        report[s] = {
            "checkpoint_mb_all_ranks": round(total_bytes / 1e6, 1),
            "step_s": round(step_s, 4),
            "stall_s_median": round(med["stall"], 4),
            "stall_parts_s": {k: round(v, 4) for k, v in med.items() if k != "stall"},
            "stall_over_step_median": round(med["stall"] / step_s, 3),
            "stall_over_step_max": round(max(x["stall"] for x in saves) / step_s, 3),
            "saves_per_loop": n_saves,
            "upload_left_after_loop_s_median": round(statistics.median(tails), 3),
            "loop_with_saves_over_without_median": round(statistics.median(w / o for w, o in pairs), 3),
            "loop_extra_steps_per_save_median": round(
                statistics.median((w - o) / n_saves / step_s for w, o in pairs), 2
            ),
        }  # fmt: skip
    up = [rank["upload"] for rank in per_rank][0]  # rank 0 holds both figures
    par = [x["parallel"]["bytes"] / x["parallel"]["seconds"] for x in up]
    one = [x["one_rank"]["bytes"] / x["one_rank"]["seconds"] for x in up]
    report["upload"] = {
        "checkpoint_mb_2_ranks": round(up[0]["parallel"]["bytes"] / 1e6, 1),
        "checkpoint_mb_1_rank": round(up[0]["one_rank"]["bytes"] / 1e6, 1),
        "two_ranks_mb_s": round(statistics.median(par) / 1e6, 1),
        "one_rank_mb_s": round(statistics.median(one) / 1e6, 1),
        "two_ranks_mb_s_runs": [round(x / 1e6, 1) for x in par],
        "one_rank_mb_s_runs": [round(x / 1e6, 1) for x in one],
        "two_over_one": round(statistics.median(par) / statistics.median(one), 3),
        "two_over_one_paired_median": round(statistics.median(p / o for p, o in zip(par, one, strict=True)), 3),
        "server_cpu_share_two_ranks": round(statistics.median(x["parallel"]["server_cpu_share"] for x in up), 2),
        "server_cpu_share_one_rank": round(statistics.median(x["one_rank"]["server_cpu_share"] for x in up), 2),
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_gpt_arguments(parser, steps=9, help_steps="timed steps per loop")
    parser.add_argument("--interval", type=int, default=3, help="save every this many steps")
    parser.add_argument("--strategies", default="ddp,fsdp")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    env = dist_env()
    require_ranks(env)
    device = device_for(env)
    data = token_batches(args, args.steps + 1)
    with process_group(env, device), contextlib.ExitStack() as stack:
        box = [None]
        if env.is_main:
            server = stack.enter_context(s3_server())
            server.make_bucket("bench")
            box = [server.env()]
        dist.broadcast_object_list(box)
        os.environ.update(box[0])
        store = S3Store()
        group = checkpoint_group(env)
        results: dict = {s: [] for s in strategies}
        results["upload"] = []
        for r in range(args.repeats):
            for s in strategies if r % 2 == 0 else strategies[::-1]:
                results[s].append(stall_bench(s, r, args, env, device, store, group, data))
            results["upload"].append(upload_bench(r, env, device, args, store, group, data))
        per_rank = [None] * env.world_size
        dist.all_gather_object(per_rank, results)
        if env.is_main:
            report = {
                "world_size": env.world_size,
                "model": f"GPT {args.n_layer} layers x {args.n_embd}, context {args.block}, global batch {args.batch}",
                "steps_per_loop": args.steps,
                "interval": args.interval,
                "repeats": args.repeats,
                "load_average": [round(x, 2) for x in os.getloadavg()],
                **summarize(args, per_rank, strategies),
            }
            print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
