"""Probes on this machine: `world_size` CPU processes joined by gloo over loopback, each running
:func:`trainer.plan.run_probe`, as torchrun would start them (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/PORT in each one's environment)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

from trainer.config import Config, config_from_json, to_dict
from trainer.plan.probe import ProbeResult


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(
    rank: int, world: int, port: int, config_json: str, steps: int, repeats: int, out: str, threads: int
) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        CUDA_VISIBLE_DEVICES="",
    )
    import torch
    import torch.distributed as dist

    from trainer.plan.probe import run_probe

    torch.set_num_threads(threads)
    cfg = config_from_json(config_json)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = [run_probe(cfg, steps=steps).as_dict() for _ in range(repeats)]
    finally:
        if world > 1:
            dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


def probe_locally(
    cfg: Config, world_size: int, *, steps: int = 5, repeats: int = 1, threads: int = 1, timeout_s: float = 600
) -> list[list[ProbeResult]]:
    """Run the probe of `cfg` `repeats` times in `world_size` fresh CPU processes joined by gloo
    (`threads` torch threads each); the results by repeat, then by rank. Processes still running
    after `timeout_s` are killed and a TimeoutError raised."""
    import time

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="kftrain-probe-") as out:
        ctx = mp.start_processes(
            _rank_main,
            args=(world_size, _free_port(), json.dumps(to_dict(cfg)), steps, repeats, out, threads),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):  # raises when a rank failed (and ends the others)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the {world_size}-rank probe did not finish within {timeout_s:.0f} s")
        finally:
            for process in ctx.processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        by_rank = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
    return [[ProbeResult(**by_rank[r][k]) for r in range(world_size)] for k in range(repeats)]
