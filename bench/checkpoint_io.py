"""Benchmark: what a checkpoint costs training, and upload throughput against the raw client.

Against a real S3 server process (moto on loopback) in the same script:

- stall: wall time of N training steps with one checkpoint taken mid-way, minus the same N
  steps without, in units of one step's time (target: at most 1 step). Training uses one
  thread and the S3 server the other core: on a cluster the store is another machine;
- upload throughput of CheckpointManager (DCP parts + commit record, nothing else running)
  against the raw minio client's put_object of the same bytes to the same server (target: at
  least 0.9x).

    .venv/bin/python bench/checkpoint_io.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3server import s3_server  # noqa: E402
from trainer.checkpoint import CheckpointManager  # noqa: E402
from trainer.gpt import GPT, GPTConfig  # noqa: E402
from trainer.storage import S3Store  # noqa: E402


def steps(model, opt, n: int, on_step=None) -> float:
    x = torch.randint(0, 256, (8, 128))
    t0 = time.perf_counter()
    for i in range(n):
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), x.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step:
            on_step(i)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(n_layer=args.n_layer, n_head=8, n_embd=args.n_embd, block_size=128))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps(model, opt, 3)  # warm-up, and creates the optimizer state a checkpoint carries
    with s3_server() as server:
        server.make_bucket("bench")
        os.environ.update(server.env())
        store = S3Store(endpoint=server.endpoint)
        base, with_ckpt, stalls_staging, ours, raw = [], [], [], [], []
        for r in range(args.repeats):
            prefix = f"s3://bench/run-{r}/checkpoints"
            mgr = CheckpointManager(store, prefix, keep_last=1)
            model_state, optim_state = get_state_dict(model, opt)  # what the trainer checkpoints
            state = {"model": model_state, "optimizer": optim_state}

            def maybe_save(i: int, mgr=mgr, state=state) -> None:
                if i == 2:
                    mgr.save(100 + i, state)

            base.append(steps(model, opt, args.steps))
            with_ckpt.append(steps(model, opt, args.steps, maybe_save))
            mgr.wait()
            stalls_staging.append(mgr.last_stage_seconds)
            buf = io.BytesIO()
            torch.save(state, buf)
            payload = buf.getvalue()
            t0 = time.perf_counter()
            server.client().put_object("bench", f"raw-{r}/state.pt", io.BytesIO(payload), len(payload))
            raw.append(len(payload) / (time.perf_counter() - t0))
            mgr.save(200 + r, state, blocking=True)  # alone, like the raw upload just before
            ours.append(mgr.last_bytes / mgr.last_upload_seconds)
    step_s = statistics.median(base) / args.steps
    stall_s = statistics.median(w - b for w, b in zip(with_ckpt, base, strict=True))
    print(
        json.dumps(
            {
                "checkpoint_mb": round(mgr.last_bytes / 1e6, 1),
                "step_s": round(step_s, 4),
                "staging_s": round(statistics.median(stalls_staging), 4),
                "stall_steps": round(stall_s / step_s, 2),
                "upload_mb_s": round(statistics.median(ours) / 1e6, 1),
                "raw_minio_put_mb_s": round(statistics.median(raw) / 1e6, 1),
                "upload_over_raw": round(statistics.median(ours) / statistics.median(raw), 3),
                "repeats": args.repeats,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
