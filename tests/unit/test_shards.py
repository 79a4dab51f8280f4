"""Dataset shards and their manifest (trainer/shards.py): a corrupt object is named by its URI."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import truncate
from trainer.shards import MANIFEST, read_manifest
from trainer.storage import CorruptObject, LocalStore, join_uri
from trainer.tasks.classification.data import load_split

pytestmark = pytest.mark.timeout(120)


# -- corrupt data and checkpoints: named by their URI, never chosen ----------------------------


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("damage", "read", "object_name", "phrase"),
    [
        (lambda d: truncate(join_uri(d, MANIFEST), 100), "manifest", MANIFEST, "not a valid JSON document"),
        (lambda d: Path(join_uri(d, MANIFEST)).write_text("[1, 2]"), "manifest", MANIFEST, "not a kftrain dataset"),
        (lambda d: Path(join_uri(d, MANIFEST)).write_text("{}"), "manifest", MANIFEST, "no 'splits'"),
        (lambda d: truncate(join_uri(d, "train/rows-00000.npz"), 200), "train", "train/rows-00000.npz", "200 bytes"),
        (lambda d: Path(join_uri(d, "val/rows-00000.npz")).write_bytes(b""), "val", "val/rows-00000.npz", "0 bytes"),
        (
            lambda d: Path(join_uri(d, "test/rows-00000.npz")).write_bytes(_npz(z=np.zeros(2))),
            "test",
            "test/rows-00000.npz",
            "the manifest says",
        ),
    ],
)
def test_corrupt_dataset_objects_are_named_by_uri(dataset, damage, read, object_name, phrase):
    store = LocalStore()
    manifest = read_manifest(store, dataset) if read != "manifest" else None
    damage(dataset)
    with pytest.raises(CorruptObject) as err:
        if read == "manifest":
            read_manifest(store, dataset)
        else:
            load_split(store, dataset, read, manifest)
    msg = str(err.value)
    assert join_uri(dataset, object_name) in msg and phrase in msg, msg
    assert "rerun" in msg  # and what to do


@pytest.mark.parametrize(
    ("fmt", "phrase"),
    [(None, "a dataset that names no format"), ("", "a dataset that names no format"), ("x.v1", "a 'x.v1' dataset")],
)
def test_a_dataset_of_another_format_says_what_it_holds(tmp_path, fmt, phrase):
    """A manifest without a format read `holds a None dataset`."""
    from trainer.shards import DataError

    (tmp_path / MANIFEST).write_text(json.dumps({"splits": {}} | ({} if fmt is None else {"format": fmt})))
    with pytest.raises(DataError, match=f"{re.escape(phrase)}, not 'kftrain.tokens.v2'.*Rerun data prep"):
        read_manifest(LocalStore(), str(tmp_path), "kftrain.tokens.v2")


def test_a_corrupt_token_shard_is_named_by_uri(tmp_path):
    """A shard that matches its manifest entry yet does not parse (written corrupt)."""
    import hashlib

    from trainer.shards import ShardInfo, read_shard

    store = LocalStore()
    uri = str(tmp_path / "ds")
    raw = b"\x93NUMPY garbage"
    store.put_bytes(join_uri(uri, "train/tokens-00000.npy"), raw)
    info = ShardInfo("train/tokens-00000.npy", 10, len(raw), hashlib.sha256(raw).hexdigest())
    with pytest.raises(CorruptObject, match=r"tokens-00000.npy is not a valid token shard"):
        read_shard(store, uri, info)


def _manifest(**shas) -> dict:
    return {"splits": {split: {"shards": [{"sha256": s} for s in v]} for split, v in shas.items()}}


@pytest.mark.parametrize(
    ("other", "same"),
    [
        (_manifest(train=["a", "b"], test=["c"]), True),
        ({**_manifest(train=["a", "b"], test=["c"]), "source": "elsewhere", "seed": 3}, True),  # the items decide
        (_manifest(train=["b", "a"], test=["c"]), False),  # another order of the same shards
        (_manifest(train=["a"], test=["b", "c"]), False),  # a shard moved to another split
        (_manifest(train=["a", "b"], test=["d"]), False),
        (_manifest(train=["a", "b", "c"]), False),
    ],
)
def test_a_datasets_content_digest_is_its_splits_shards_in_order(other, same):
    from trainer.shards import content_digest

    assert (content_digest(_manifest(train=["a", "b"], test=["c"])) == content_digest(other)) is same
