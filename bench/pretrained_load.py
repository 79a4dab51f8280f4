"""Benchmark: peak memory of loading a pretrained model, kftrain's sharded path against plain
transformers (issue #18).

A Llama-shaped model of S bytes (fp32, random weights, built from a config and saved with
``save_pretrained``; nothing is downloaded) is loaded, each way in fresh processes so each peak
is its own:

- ``plain``: one process, ``AutoModelForCausalLM.from_pretrained(folder)``, then every weight
  read once (transformers maps the safetensors file, so the weights enter RSS as they are first
  used; the growth after ``from_pretrained`` alone is reported too);
- ``plain_fsdp``: what a hand-written FSDP2 script does on each of 2 ranks (gloo):
  ``from_pretrained``, then ``fully_shard`` per decoder layer and the root;
- ``kftrain``: 2 ranks (gloo) through the trainer's path for ``model.init_from``:
  ``PretrainedLMTask.build_model`` (parameters on the meta device), ``parallelize`` with FSDP
  (``fully_shard`` per decoder layer, then the root), ``materialize`` (``give_storage``, then
  ``load_base_weights``: ranged reads of exactly this rank's rows), from a local folder and
  from a real S3 server process (moto on loopback, started here as the tests start it).

Per process: the growth of peak RSS over the process's own RSS after its imports (and, for a
rank, after joining the process group), the peak reset just before the load
(``/proc/self/clear_refs``; ``VmHWM`` after it); the bytes of the parameters it holds at the end
(a rank's local shards); and the rest, growth minus held, the load's overhead. Each loaded model
then scores the same tokens and the driver checks the logits are equal to plain transformers'
(exactly), so the sharded load is proven to be the same model. For kftrain's load the report
also says what dominates its peak: the shape of the tensor being filled when the peak was
reached, the growth before it and what was in flight (a wrapper around
``trainer.pretrained.fill_tensor`` in the worker reads ``/proc/self/status`` around each tensor).

The fixed overhead is measured, not assumed: a probe model with the same layers at a negligible
size (hidden 64, vocabulary 1,000: under 1 MB) is loaded the same two ways, and its growth minus
what it holds is what a load costs whatever the weights' size (code running for the first time,
FSDP's and the process group's bookkeeping, the allocator's arenas). The goal of issue #18 is a
rank's growth at most 0.6 x S plus that overhead; the report gives (growth - fixed) / S.

    OMP_NUM_THREADS=1 .venv/bin/python bench/pretrained_load.py [--layers 6 --hidden 768 --vocab 32000] [--no-s3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Tokens every loaded model scores (the driver compares the logits).
SCORED = (2, 24)


def probe_tokens(vocab: int):
    import torch

    return (torch.arange(SCORED[0] * SCORED[1]).reshape(SCORED) * 7919) % vocab


# ---------------------------------------------------------------------------------------------
# Workers: `pretrained_load.py worker {plain|kftrain} URI OUT_DIR LABEL` (2 ranks: under torchrun).


def worker_plain(folder: str, out: Path, label: str) -> None:
    """`plain`: from_pretrained in one process, then every weight read once (what the first
    forward does). `plain_fsdp` (under torchrun): from_pretrained on every rank, then
    fully_shard per decoder layer and the root, as a hand-written FSDP2 script does."""
    import torch
    import transformers.models.llama.modeling_llama  # noqa: F401  (code, not the load)
    from transformers import AutoModelForCausalLM

    from bench.fsdp_vs_ddp import held_bytes, reset_peak_rss
    from bench.llama_setup import proc_status_kb
    from trainer.distributed import dist_env, process_group

    env = dist_env()
    with process_group(env, torch.device("cpu")):
        if env.distributed:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (env.world_size,))
            torch.distributed.barrier()
        base_kb = reset_peak_rss()
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        mapped_kb = proc_status_kb("VmHWM")["VmHWM"]
        if env.distributed:
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            # transformers maps the safetensors file: the weights are paged in when first used.
            with torch.no_grad():
                for p in model.parameters():
                    p.sum()
        seconds = time.perf_counter() - t0
        status = proc_status_kb("VmHWM", "RssAnon", "RssFile")
        record = {
            "rank": env.rank,
            "seconds": seconds,
            "baseline_rss_mib": base_kb / 1024,
            "peak_growth_mib": (status["VmHWM"] - base_kb) / 1024,
            "growth_after_from_pretrained_alone_mib": (mapped_kb - base_kb) / 1024,
            "held_mib": held_bytes(model.parameters()) / 2**20,
            "rss_anon_after_mib": status["RssAnon"] / 1024,
            "rss_file_after_mib": status["RssFile"] / 1024,
        }
        (out / f"{label}-{env.rank}.json").write_text(json.dumps(record))
        with torch.no_grad():
            logits = model(input_ids=probe_tokens(model.config.vocab_size)).logits
        if env.is_main:
            torch.save(logits, out / f"{label}-logits.pt")


def worker_kftrain(uri: str, out: Path, label: str) -> None:
    import torch
    import transformers.models.llama.modeling_llama  # noqa: F401  (code, not the load)

    from bench.fsdp_vs_ddp import held_bytes, reset_peak_rss
    from bench.llama_setup import proc_status_kb
    from trainer import pretrained
    from trainer.config import load_config
    from trainer.distributed import dist_env, parallelize, process_group
    from trainer.tasks import task_for

    env = dist_env()
    device = torch.device("cpu")
    cfg = load_config(
        overrides={
            "task": "causal_lm",
            "model.init_from": uri,
            "model.block_size": 128,
            "job.replicas": env.world_size,
            "train.strategy": "fsdp",
        }
    )
    with process_group(env, device):
        # What is not the load: the store's client and the folder's config.json.
        pretrained.read_config(pretrained.resolve(uri))
        task = task_for(cfg)
        # Where the peak is reached: RSS before each tensor is filled, the peak after it.
        marks: list[tuple[tuple[int, ...], int, int]] = []
        fill = pretrained.fill_tensor

        def traced_fill(target, rows, row_bytes=0):
            before = proc_status_kb("VmRSS")["VmRSS"]
            read = fill(target, rows, row_bytes)
            marks.append((tuple(target.shape), before, proc_status_kb("VmHWM")["VmHWM"]))
            return read

        pretrained.fill_tensor = traced_fill
        torch.distributed.barrier()
        base_kb = reset_peak_rss()
        t0 = time.perf_counter()
        model, meta = task.build_model(cfg, {"vocab_size": 1, "tokenizer": {}})
        parallelize(model, env, device, strategy="fsdp", units=task.shard_units(model))
        task.materialize(model, device)
        seconds = time.perf_counter() - t0
        status = proc_status_kb("VmHWM", "RssAnon", "RssFile")
        peak_shape, rss_before, _ = next(
            (m for m in marks if m[2] == status["VmHWM"]), ((), status["VmHWM"], status["VmHWM"])
        )
        record = {
            "rank": env.rank,
            "peak_while_filling": list(peak_shape),
            "growth_before_that_tensor_mib": (rss_before - base_kb) / 1024,
            "in_flight_at_peak_mib": (status["VmHWM"] - rss_before) / 1024,
            "seconds": seconds,
            "baseline_rss_mib": base_kb / 1024,
            "peak_growth_mib": (status["VmHWM"] - base_kb) / 1024,
            "held_mib": held_bytes(model.parameters()) / 2**20,
            "rss_anon_after_mib": status["RssAnon"] / 1024,
            "rss_file_after_mib": status["RssFile"] / 1024,
        }
        (out / f"{label}-{env.rank}.json").write_text(json.dumps(record))
        with torch.no_grad():
            logits = model(input_ids=probe_tokens(meta["vocab_size"])).logits
        if env.is_main:
            torch.save(logits, out / f"{label}-logits.pt")


# ---------------------------------------------------------------------------------------------


def run(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, env=env, cwd=ROOT, check=False)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed with exit code {proc.returncode}")


def load_sharded(kind: str, uri: str, label: str, out: Path, env: dict[str, str]) -> None:
    """A load of `uri` on 2 ranks (gloo), in fresh processes."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    run([*torchrun, __file__, "worker", kind, uri, str(out), label], env)


def summarize(out: Path, labels: list[str], size_mib: float) -> dict:
    import torch

    plain_logits = torch.load(out / "plain-logits.pt")
    report: dict = {}
    for label in ["plain", *labels]:
        ranks = sorted(out.glob(f"{label}-[0-9].json"))
        recs = [json.loads(p.read_text()) for p in ranks]
        growth = [r["peak_growth_mib"] for r in recs]
        entry = {
            "processes": len(recs),
            "seconds": [round(r["seconds"], 2) for r in recs],
            "baseline_rss_mib": [round(r["baseline_rss_mib"], 1) for r in recs],
            "peak_growth_mib": [round(g, 1) for g in growth],
            "peak_growth_over_S": [round(g / size_mib, 3) for g in growth],
            "held_mib": [round(r["held_mib"], 1) for r in recs],
            "overhead_mib": [round(r["peak_growth_mib"] - r["held_mib"], 1) for r in recs],
            "rss_anon_after_mib": [round(r["rss_anon_after_mib"], 1) for r in recs],
            "rss_file_after_mib": [round(r["rss_file_after_mib"], 1) for r in recs],
        }
        if "growth_after_from_pretrained_alone_mib" in recs[0]:
            entry["growth_after_from_pretrained_alone_mib"] = [
                round(r["growth_after_from_pretrained_alone_mib"], 1) for r in recs
            ]
        if label != "plain":
            entry["logits_equal_plain"] = bool(torch.equal(torch.load(out / f"{label}-logits.pt"), plain_logits))
        if "peak_while_filling" in recs[0]:
            entry["peak_while_filling_tensor_of_shape"] = [r["peak_while_filling"] for r in recs]
            entry["growth_before_that_tensor_mib"] = [round(r["growth_before_that_tensor_mib"], 1) for r in recs]
            entry["in_flight_at_peak_mib"] = [round(r["in_flight_at_peak_mib"], 1) for r in recs]
        report[label] = entry
    for label in labels:
        for base in ("plain", "plain_fsdp"):
            if base != label:
                ratio = max(report[label]["peak_growth_mib"]) / max(report[base]["peak_growth_mib"])
                report[label][f"peak_growth_over_{base}"] = round(ratio, 3)
    return report


def main() -> None:
    from bench.llama_setup import add_llama_arguments

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_llama_arguments(parser)
    parser.add_argument("--no-s3", action="store_true", help="skip the load from the S3 server")
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        kind, uri, out = sys.argv[2], sys.argv[3], Path(sys.argv[4])
        (worker_plain if kind == "plain" else worker_kftrain)(uri, out, sys.argv[5])
        return
    args = parser.parse_args()

    from bench.llama_setup import llama_config, save_llama_folder

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    tmp = Path(tempfile.mkdtemp(prefix="kftrain-load-"))
    try:
        from trainer import pretrained

        # The probe: the same layers at a negligible size, so its growth is the fixed overhead
        # (code run for the first time, FSDP's and the process group's bookkeeping, the allocator).
        probe_args = argparse.Namespace(**{**vars(args), "hidden": 64, "intermediate": 128, "heads": 4,
                                           "kv_heads": 2, "vocab": 1000})  # fmt: skip
        report: dict = {"load_average_start": [round(x, 2) for x in os.getloadavg()]}
        for name, shape in (("model", args), ("probe", probe_args)):
            folder = save_llama_folder(tmp / name, llama_config(shape))
            index = pretrained.tensor_index(pretrained.resolve(folder))
            size_mib = pretrained.parameter_bytes(index) / 2**20
            out = tmp / f"out-{name}"
            out.mkdir()
            run([sys.executable, __file__, "worker", "plain", folder, str(out), "plain"], env)
            load_sharded("plain", folder, "plain_fsdp", out, env)
            load_sharded("kftrain", folder, "kftrain_local", out, env)
            labels = ["plain_fsdp", "kftrain_local"]
            if name == "model" and not args.no_s3:
                from tests.s3server import s3_server
                from trainer.storage import S3Store

                with s3_server() as server:
                    server.make_bucket("bench")
                    os.environ.update(server.env())
                    for path in sorted(Path(folder).iterdir()):
                        S3Store().put_file(f"s3://bench/model/{path.name}", path)
                    load_sharded("kftrain", "s3://bench/model", "kftrain_s3", out, {**env, **server.env()})
                labels.append("kftrain_s3")
            report[name] = {
                "shape": {
                    k: getattr(shape, k) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")
                },
                "params_m": round(pretrained.parameter_bytes(index) / 4 / 1e6, 1),  # fp32
                "S_mib": round(size_mib, 1),
                "largest_tensor_mib": round(max(e.row_bytes * e.shape[0] for e in index.values()) / 2**20, 1),
                **summarize(out, labels, size_mib),
            }
        size_mib = report["model"]["S_mib"]
        for label, fixed_from in (
            ("plain", "plain"),
            ("plain_fsdp", "plain_fsdp"),
            ("kftrain_local", "kftrain_local"),
            ("kftrain_s3", "kftrain_local"),
        ):
            if label not in report["model"]:
                continue
            fixed = max(report["probe"][fixed_from]["overhead_mib"])
            growth = max(report["model"][label]["peak_growth_mib"])
            report["model"][label]["fixed_overhead_mib"] = fixed
            report["model"][label]["peak_growth_minus_fixed_over_S"] = round((growth - fixed) / size_mib, 3)
        report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(report, indent=2), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
