"""causal_lm data at scale with real processes and servers: data prep streams text and JSON Lines
from a real S3 server process, and the same source gives the same shards with 1 or 2 processes."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

from tests.unit.test_tasks_causal_lm import all_tokens, prepare
from trainer.shards import split_shards
from trainer.storage import LocalStore, open_store

pytestmark = pytest.mark.timeout(240)


def stdlib_text(n: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = b""
    for path in sorted(root.glob("*.py")):
        out += path.read_bytes()
        if len(out) >= n:
            break
    return out[:n]


def test_a_text_object_in_s3_is_streamed_into_checked_shards(bucket):
    store = open_store(f"s3://{bucket}/x")
    text = stdlib_text(2_999_999) + b"\n"  # three blocks, ending in a line end (else data prep adds one)
    store.put_bytes(f"s3://{bucket}/corpus.txt", text)
    ds = f"s3://{bucket}/ds"
    _, manifest = prepare(store, ds, **{"data.source": f"s3://{bucket}/corpus.txt", "data.max_bytes": 0})
    assert manifest["format"] == "kftrain.tokens.v2" and manifest["dtype"] == "uint8"
    assert sum(manifest["splits"][s]["tokens"] for s in ("train", "val", "test")) == len(text)
    train = split_shards(manifest, "train", ds)
    assert len(train) > 10 and all(info.items <= 8 * 1024 for info in train)
    # Every split samples each piece of each block: test text comes from the start and the end of
    # the corpus (a piece's test share is at least 20% of 8 KiB: 1,000 bytes are one run of text).
    test = all_tokens(store, ds, manifest, "test").tobytes()
    assert 0.15 < len(test) / len(text) < 0.25
    assert test[:1000] in text[: len(text) // 2] and test[-1000:] in text[len(text) // 2 :]


def test_one_and_two_processes_write_the_same_shards(tmp_path, monkeypatch):
    """A BPE tokenizes in worker processes (bytes need none): many small blocks, in order."""
    monkeypatch.setattr("trainer.tasks.causal_lm.BLOCK_BYTES", 64 * 1024)
    store = LocalStore()
    src = tmp_path / "corpus.txt"
    src.write_bytes(stdlib_text(500_000))
    shas = []
    for procs in (1, 2):
        _, manifest = prepare(
            store,
            str(tmp_path / f"ds{procs}"),
            **{
                "data.source": str(src),
                "data.max_bytes": 0,
                "data.num_proc": procs,
                "data.tokenizer": "bpe:300",
                "data.tokenizer_sample_bytes": 100_000,
                "data.shard_rows": 2,
            },
        )
        shas.append([s["sha256"] for split in manifest["splits"].values() for s in split["shards"]])
    assert shas[0] == shas[1] and len(shas[0]) > 6


def test_a_prefix_of_jsonl_and_text_objects(bucket):
    store = open_store(f"s3://{bucket}/x")
    records = [{"text": f"document {i}: " + "lorem ipsum " * 40, "id": i} for i in range(400)]
    store.put_bytes(f"s3://{bucket}/corpus/a.jsonl", "\n".join(json.dumps(r) for r in records).encode())
    store.put_bytes(f"s3://{bucket}/corpus/b.txt", stdlib_text(100_000))
    ds = f"s3://{bucket}/ds"
    _, manifest = prepare(store, ds, **{"data.source": f"s3://{bucket}/corpus/", "data.max_bytes": 0})
    tokens = b"".join(all_tokens(store, ds, manifest, s).tobytes() for s in ("train", "val", "test"))
    assert b"document 17: lorem" in tokens and b'"id"' not in tokens  # the text field only
    assert len(tokens) == sum(len(r["text"]) + 1 for r in records) + 100_000 + 1  # each ends in a line end
