"""Benchmark: the demo pipeline's wall time and time to first training step.

Reported, not asserted. The baseline, run in the same script on the same machine, is the bare
training job (the same replicas through the local backend, no KFP, no other steps): the ratio
says what the pipeline around training costs.

    .venv/bin/python bench/demo_timing.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace

from pipelines.local_run import run_local
from trainer.config import load_config
from trainer.launch.backend import run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.storage import LocalStore, join_uri
from trainer.tasks.classification.data import prepare_dataset
from trainer.train import TRAINING_RECORD


def demo_once(cfg) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        summary = run_local(cfg, local_root=tmp)
        wall = time.time() - t0
        record = json.loads(LocalStore().get_bytes(join_uri(summary["artifacts"]["model"], TRAINING_RECORD)))
    return {"wall_s": wall, "first_step_s": record["metrics"]["first_step_unix_time"] - t0}


def bare_training_once(cfg) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        prepare_dataset(cfg.data, LocalStore(), f"{tmp}/ds")
        t0 = time.time()
        run_job(
            LocalBackend(sink=lambda line: None),
            replace(training_job(cfg, "bench", f"{tmp}/ds", f"{tmp}/m"), timeout_s=3600),
        )
        wall = time.time() - t0
        record = json.loads(LocalStore().get_bytes(f"{tmp}/m/{TRAINING_RECORD}"))
    return {"wall_s": wall, "first_step_s": record["metrics"]["first_step_unix_time"] - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--config", default="configs/demo.yaml")
    args = parser.parse_args()
    cfg = load_config(args.config)
    demo = [demo_once(cfg) for _ in range(args.repeats)]
    bare = [bare_training_once(cfg) for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in demo) for k in demo[0]}
    base = {k: statistics.median(r[k] for r in bare) for k in bare[0]}
    print(
        json.dumps(
            {
                "demo_wall_s": round(med["wall_s"], 2),
                "demo_first_step_s": round(med["first_step_s"], 2),
                "bare_training_wall_s": round(base["wall_s"], 2),
                "bare_training_first_step_s": round(base["first_step_s"], 2),
                "demo_over_bare_training_wall": round(med["wall_s"] / base["wall_s"], 2),
                "repeats": args.repeats,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
