"""Benchmark: causal_lm data at scale (issue #8), against a real S3 server process (moto).

Three measurements, each with its baseline in the same script:

- ``memory``: peak RSS of the largest process of each phase (data prep, each training rank,
  evaluation, export) for a base corpus and one 10x larger; every phase runs in a fresh
  process, so its peak is its own. Target: large / base at most 1.3x per phase.
- ``throughput``: training tokens/s (the trainer's own ``tokens_per_second`` and
  ``data_wait_fraction`` from ``<model>/training.json``) streaming from the S3 server against
  the same shards in a local directory, alternating, same config. Target: S3 / local at least
  0.95x, data wait under 2% of training time.
- ``prep``: data prep throughput (MB of source text per second) with ``data.num_proc`` 1 and 2,
  alternating, for the ``bytes`` tokenizer and a ``bpe:N`` one.
- ``csv``: classification data prep of a CSV table (two streamed passes): peak RSS of the data
  prep process for a base table and one 10x larger, and rows per second.

The corpus is Python's standard-library source concatenated (and repeated) into one text object.

    .venv/bin/python bench/data_scale.py memory [--base-mb 8] [--scale 10] [--cache-mib 512]
    .venv/bin/python bench/data_scale.py throughput [--repeats 3]
    .venv/bin/python bench/data_scale.py prep [--mb 16] [--repeats 3]
    .venv/bin/python bench/data_scale.py csv [--base-mb 4] [--scale 10]

Peak RSS is each process's own ``VmHWM`` (/proc/self/status), written at exit by a
``sitecustomize`` hook this script puts on ``PYTHONPATH``: the phase's process, and in training
the torchrun agents and each rank (fresh interpreters that inherit the environment). Not
``ru_maxrss`` from ``wait4``: Linux carries the forking parent's RSS over ``exec`` into it, so
it would report this driver's size, not the phase's. Forked workers (``data.num_proc`` > 1)
run no exit hook: the memory runs use ``data.num_proc`` 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The tiny GPT of the memory runs (configs/gpt-tiny.yaml's shape), a few steps, no checkpoints.
TINY = {
    "task": "causal_lm",
    "model.n_layer": 2,
    "model.n_head": 4,
    "model.n_embd": 64,
    "model.block_size": 64,
    "train.batch_size": 16,
    "train.max_steps": 20,
    "train.log_interval_steps": 1000,
    "checkpoint.enabled": False,
    "job.replicas": 2,
    "job.nproc_per_node": 1,
    "data.max_bytes": 0,
}
RSS_ENV = "KFTRAIN_BENCH_RSS_DIR"
HOOK = f'''\
import atexit, json, os, sys
_dir = os.environ.get("{RSS_ENV}")
if _dir:
    def _report():
        with open("/proc/self/status") as f:
            hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        rank = os.environ.get("RANK") if "LOCAL_RANK" in os.environ else None  # a torchrun worker
        with open(os.path.join(_dir, f"{{os.getpid()}}.json"), "w") as f:
            json.dump({{"argv": sys.argv, "rank": rank, "hwm_kb": hwm}}, f)
    atexit.register(_report)
'''


def stdlib_corpus(size: int) -> bytes:
    """`size` bytes of the standard library's source, repeated as often as needed."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py")) if not {"site-packages", "test", "tests"} & set(p.parts)]
    out, held = [], 0
    while held < size:
        for p in files:
            data = p.read_bytes() + b"\n"
            out.append(data)
            held += len(data)
            if held >= size:
                break
    return b"".join(out)[:size]


def config(overrides: dict):
    from trainer.config import load_config

    return load_config(overrides={**TINY, **overrides})


# ---------------------------------------------------------------------------------------------
# One phase in this (fresh) process: `data_scale.py phase NAME '{json args}'`.


def run_phase(name: str, args: dict) -> dict:
    from trainer import pipeline_steps

    cfg = config(args["overrides"])
    if name == "prep":
        import trainer.tasks  # noqa: F401  (torch: its import is not data prep's work)

        t0 = time.perf_counter()
        manifest = pipeline_steps.prepare_data(cfg, args["dataset"])
        return {"seconds": time.perf_counter() - t0, "train_tokens": manifest["splits"]["train"]["tokens"]}
    if name == "csv_prep":
        import trainer.tasks  # noqa: F401  (torch: its import is not data prep's work)

        t0 = time.perf_counter()
        manifest = pipeline_steps.prepare_data(cfg, args["dataset"])
        rows = sum(manifest["splits"][s]["rows"] for s in ("train", "val", "test"))
        return {"seconds": time.perf_counter() - t0, "rows": rows}
    if name == "bpe_train":  # what prep spends training its BPE before it tokenizes anything
        from trainer.tasks.causal_lm import source_pieces
        from trainer.tokenizer import load_tokenizer

        store = pipeline_steps.store_for(cfg, args["dataset"])
        t0 = time.perf_counter()
        load_tokenizer(
            cfg.data.tokenizer,
            store,
            sample=source_pieces(cfg),
            max_sample_bytes=cfg.data.tokenizer_sample_bytes,
        )
        return {"seconds": time.perf_counter() - t0}
    if name == "train":
        from trainer.launch.local import LocalBackend

        record = pipeline_steps.train_model(cfg, args["dataset"], args["model"], LocalBackend(sink=lambda line: None))
        return record["metrics"]
    if name == "eval":
        report, _, _ = pipeline_steps.evaluate(
            cfg, args["model"], args["dataset"], args["out"] + "/evaluation", args["out"] + "/report.html"
        )
        return {"perplexity": report["perplexity"], "test_tokens": report["test_tokens"]}
    if name == "export":
        pipeline_steps.export(cfg, args["model"], args["out"] + "/exported", {})
        return {}
    raise SystemExit(f"unknown phase {name!r}")


def phase(name: str, args: dict, env: dict[str, str]) -> dict:
    """Run one phase in a fresh process; its result, peak RSS (MB) and its ranks' peaks."""
    rss_dir = tempfile.mkdtemp(prefix="kftrain-rss-")
    hook_dir = Path(rss_dir) / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    out_file = Path(rss_dir) / "result.json"
    child_env = {
        **env,
        RSS_ENV: rss_dir,
        "PYTHONPATH": os.pathsep.join([str(hook_dir), str(ROOT), env.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, __file__, "phase", name, json.dumps(args), str(out_file)],
        env=child_env,
        start_new_session=True,
    )
    proc.wait()
    if proc.returncode:
        raise SystemExit(f"phase {name} failed with exit code {proc.returncode}")
    result = json.loads(out_file.read_text())
    peaks, ranks = [], {}
    for f in Path(rss_dir).glob("*.json"):
        if f == out_file:
            continue
        rec = json.loads(f.read_text())
        peaks.append(rec["hwm_kb"] / 1024)
        if rec.get("rank") is not None:
            ranks[int(rec["rank"])] = rec["hwm_kb"] / 1024
    shutil.rmtree(rss_dir, ignore_errors=True)
    return {"result": result, "peak_mb": max(peaks), "ranks_mb": [ranks[r] for r in sorted(ranks)]}


# ---------------------------------------------------------------------------------------------


def memory(ns: argparse.Namespace) -> None:
    from tests.s3server import s3_server

    sizes = {"base": int(ns.base_mb * 1e6), "large": int(ns.base_mb * ns.scale * 1e6)}
    overrides = {"data.cache_bytes": ns.cache_mib * 2**20, "data.num_proc": ns.num_proc}
    table: dict[str, dict[str, float]] = {}
    extra: dict[str, dict] = {}
    with s3_server() as server:
        server.make_bucket("bench")
        env = {**os.environ, **server.env()}
        os.environ.update(server.env())
        client = server.client()
        for label, size in sizes.items():
            text = stdlib_corpus(size)
            client.put_object("bench", f"{label}/corpus.txt", __import__("io").BytesIO(text), len(text))
            del text
            base = f"s3://bench/{label}"
            args = {
                "overrides": {**overrides, "data.source": f"{base}/corpus.txt"},
                "dataset": f"{base}/dataset",
                "model": f"{base}/model",
                "out": base,
            }
            prep = phase("prep", args, env)
            train = phase("train", args, env)
            ev = phase("eval", args, env)
            ex = phase("export", args, env)
            table[label] = {
                "data prep": prep["peak_mb"],
                **{f"training rank {r}": mb for r, mb in enumerate(train["ranks_mb"])},
                "evaluation": ev["peak_mb"],
                "export": ex["peak_mb"],
            }
            extra[label] = {
                "corpus_mb": size / 1e6,
                "prep_seconds": round(prep["result"]["seconds"], 2),
                "train_tokens": prep["result"]["train_tokens"],
                "train_phase_largest_process_mb": round(train["peak_mb"], 1),
                "tokens_per_second": round(train["result"]["tokens_per_second"]),
                "test_tokens_evaluated": ev["result"]["test_tokens"],
            }
            print(f"{label}: {json.dumps(table[label])}", file=sys.stderr, flush=True)
    rows = {
        p: {
            "base_mb": round(table["base"][p], 1),
            "large_mb": round(table["large"][p], 1),
            "growth_mb": round(table["large"][p] - table["base"][p], 1),
            "large_over_base": round(table["large"][p] / table["base"][p], 3),
        }
        for p in table["base"]
    }
    print(json.dumps({"peak_rss": rows, "runs": extra, "config": {**TINY, **overrides}}, indent=2))


def throughput(ns: argparse.Namespace) -> None:
    from tests.s3server import s3_server
    from trainer.config import load_config
    from trainer.storage import open_store

    overrides = {
        "train.max_steps": ns.steps,
        "data.shard_rows": ns.shard_rows,
        "model.n_layer": ns.n_layer,
        "model.n_embd": ns.n_embd,
        "model.block_size": ns.block_size,
        "train.batch_size": ns.batch_size,
    }
    work = Path(tempfile.mkdtemp(prefix="kftrain-bench-"))
    runs: dict[str, list[dict]] = {"s3": [], "local": []}
    try:
        with s3_server() as server:
            server.make_bucket("bench")
            env = {**os.environ, **server.env()}
            os.environ.update(server.env())
            text = stdlib_corpus(int(ns.mb * 1e6))
            server.client().put_object("bench", "corpus.txt", __import__("io").BytesIO(text), len(text))
            args = {"overrides": {**overrides, "data.source": "s3://bench/corpus.txt"}, "dataset": "s3://bench/dataset"}
            phase("prep", args, env)
            # The very same shards in a local directory.
            store = open_store("s3://bench/dataset")
            local_ds = work / "dataset"
            for uri in store.list("s3://bench/dataset/"):
                dest = local_ds / uri.removeprefix("s3://bench/dataset/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(store.get_bytes(uri))
            cfg = load_config(overrides={**TINY, **args["overrides"]})
            shards = len(json.loads((local_ds / "manifest.json").read_text())["splits"]["train"]["shards"])
            for r in range(ns.repeats):
                for where in ("s3", "local") if r % 2 == 0 else ("local", "s3"):
                    ds = "s3://bench/dataset" if where == "s3" else str(local_ds)
                    model = f"s3://bench/model-{r}" if where == "s3" else str(work / f"model-{r}")
                    m = phase("train", {**args, "dataset": ds, "model": model}, env)["result"]
                    runs[where].append(m)
                    print(
                        f"{where}: {m['tokens_per_second']:.0f} tokens/s, data wait {m['data_wait_fraction']:.4f}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(where: str, key: str) -> float:
        return statistics.median(m[key] for m in runs[where])

    print(
        json.dumps(
            {
                "s3_tokens_per_second": round(med("s3", "tokens_per_second")),
                "local_tokens_per_second": round(med("local", "tokens_per_second")),
                "s3_over_local": round(med("s3", "tokens_per_second") / med("local", "tokens_per_second"), 3),
                "s3_data_wait_fraction": round(med("s3", "data_wait_fraction"), 4),
                "local_data_wait_fraction": round(med("local", "data_wait_fraction"), 4),
                "train_shards": shards,
                "tokens_per_shard": cfg.data.shard_rows * 1024,
                "repeats": ns.repeats,
                "config": {**TINY, **overrides},
            },
            indent=2,
        )
    )


def prep(ns: argparse.Namespace) -> None:
    tokenizers = ns.tokenizers.split(",")
    work = Path(tempfile.mkdtemp(prefix="kftrain-bench-"))
    out: dict = {"repeats": ns.repeats, "bpe_sample_mb": ns.bpe_sample_mb}
    try:
        env = dict(os.environ)
        seconds: dict[tuple[str, int], list[float]] = {}
        for tok in tokenizers:
            src = work / "corpus.txt"
            src.write_bytes(stdlib_corpus(int((ns.bpe_mb if tok.startswith("bpe") else ns.mb) * 1e6)))
            mb = src.stat().st_size / 1e6
            out[tok] = {"corpus_mb": mb}
            for r in range(ns.repeats):
                for n in (1, 2) if r % 2 == 0 else (2, 1):
                    ds = work / f"ds-{len(seconds)}-{r}"
                    args = {
                        "overrides": {
                            "data.source": str(src),
                            "data.num_proc": n,
                            "data.tokenizer": tok,
                            "data.tokenizer_sample_bytes": ns.bpe_sample_mb * 10**6,
                        },
                        "dataset": str(ds),
                    }
                    s = phase("prep", args, env)["result"]["seconds"]
                    seconds.setdefault((tok, n), []).append(s)
                    print(f"{tok} num_proc {n}: {mb / s:.2f} MB/s", file=sys.stderr, flush=True)
                    shutil.rmtree(ds, ignore_errors=True)
            one, two = (statistics.median(seconds[(tok, n)]) for n in (1, 2))
            out[tok].update(
                num_proc_1_mb_s=round(mb / one, 2),
                num_proc_2_mb_s=round(mb / two, 2),
                two_over_one=round(one / two, 3),
            )
            if tok.startswith("bpe"):
                args["overrides"]["data.num_proc"] = 1
                out[tok]["bpe_training_seconds"] = round(phase("bpe_train", args, env)["result"]["seconds"], 2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2))


def csv_table(path: Path, size: int, features: int = 16, classes: int = 10) -> None:
    """Write a CSV of about `size` bytes: `features` numeric columns and a `label` column."""
    import numpy as np

    rng = np.random.default_rng(0)
    with path.open("w") as f:
        f.write(",".join([f"f{i}" for i in range(features)] + ["label"]) + "\n")
        while f.tell() < size:
            y = rng.integers(0, classes, 4096)
            x = rng.normal(size=(4096, features)) + y[:, None] * 0.1
            f.writelines(",".join(f"{v:.4f}" for v in row) + f",c{label}\n" for row, label in zip(x, y, strict=True))


def csv_memory(ns: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="kftrain-bench-"))
    out: dict = {}
    try:
        for label, mb in (("base", ns.base_mb), ("large", ns.base_mb * ns.scale)):
            src = work / f"{label}.csv"
            csv_table(src, int(mb * 1e6))
            args = {
                "overrides": {"task": "classification", "data.source": str(src), "data.shard_rows": ns.shard_rows},
                "dataset": str(work / f"{label}-dataset"),
            }
            run = phase("csv_prep", args, dict(os.environ))
            res = run["result"]
            out[label] = {
                "csv_mb": round(src.stat().st_size / 1e6, 1),
                "rows": res["rows"],
                "peak_rss_mb": round(run["peak_mb"], 1),
                "seconds": round(res["seconds"], 2),
                "rows_per_second": round(res["rows"] / res["seconds"]),
            }
            print(f"{label}: {json.dumps(out[label])}", file=sys.stderr, flush=True)
            shutil.rmtree(work / f"{label}-dataset", ignore_errors=True)
            src.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base, large = out["base"], out["large"]
    out["peak_rss_large_over_base"] = round(large["peak_rss_mb"] / base["peak_rss_mb"], 3)
    out["peak_rss_growth_mb"] = round(large["peak_rss_mb"] - base["peak_rss_mb"], 1)
    print(json.dumps(out, indent=2))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "phase":
        _, _, name, args, out_file = sys.argv
        Path(out_file).write_text(json.dumps(run_phase(name, json.loads(args))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("memory", help="peak RSS per phase, base corpus vs one `--scale` times larger")
    m.add_argument("--base-mb", type=float, default=8.0)
    m.add_argument("--scale", type=float, default=10.0)
    m.add_argument("--cache-mib", type=int, default=512, help="data.cache_bytes in MiB (default: the config's)")
    m.add_argument("--num-proc", type=int, default=1, help="data.num_proc of data prep")
    t = sub.add_parser("throughput", help="training tokens/s streaming from S3 vs a local directory")
    t.add_argument("--mb", type=float, default=8.0)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--shard-rows", type=int, default=16, help="data.shard_rows (16: 16 Ki-token shards)")
    t.add_argument("--n-layer", type=int, default=4)
    t.add_argument("--n-embd", type=int, default=128)
    t.add_argument("--block-size", type=int, default=128)
    t.add_argument("--batch-size", type=int, default=16)
    p = sub.add_parser("prep", help="data prep MB/s with data.num_proc 1 and 2")
    p.add_argument("--mb", type=float, default=32.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bpe-mb", type=float, default=8.0, help="corpus size for the bpe tokenizers")
    p.add_argument("--tokenizers", default="bytes,bpe:4096")
    p.add_argument("--bpe-sample-mb", type=int, default=4)
    c = sub.add_parser("csv", help="classification CSV data prep: peak memory, base table vs `--scale` times larger")
    c.add_argument("--base-mb", type=float, default=4.0)
    c.add_argument("--scale", type=float, default=10.0)
    c.add_argument("--shard-rows", type=int, default=512, help="data.shard_rows")
    ns = parser.parse_args()
    {"memory": memory, "throughput": throughput, "prep": prep, "csv": csv_memory}[ns.command](ns)


if __name__ == "__main__":
    main()
