"""Data preparation and loading: a table -> stratified splits -> normalised shards + manifest.

Layout under a dataset URI (`trainer/shards.py` describes the format)::

    manifest.json              written last: a dataset without it is incomplete
    train/rows-00000.npz ...   arrays `x` (float32, n x features) and `y` (int64, n)
    val/rows-00000.npz ...
    test/rows-00000.npz ...

Shards are numpy ``.npz`` files read with ``allow_pickle=False``: no code runs when loading.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

import numpy as np

from trainer.config import DataConfig
from trainer.shards import DataError, ShardWriter, read_shard, split_shards
from trainer.storage import CorruptObject, ObjectStore, join_uri, read_json

MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
FORMAT = "kftrain.tabular.v2"


@dataclass(slots=True)
class Table:
    """A labelled table: features `x`, class indices `y`, and the class names."""

    x: np.ndarray
    y: np.ndarray
    feature_names: list[str]
    classes: list[str]


def load_source(cfg: DataConfig, store: ObjectStore | None) -> Table:
    """Read the configured source: the bundled digits set, or a CSV file from the store."""
    if cfg.source in ("", "digits"):
        from sklearn.datasets import load_digits

        digits = load_digits()
        return Table(
            x=digits.data.astype(np.float32),
            y=digits.target.astype(np.int64),
            feature_names=[f"pixel_{i}" for i in range(digits.data.shape[1])],
            classes=[str(c) for c in digits.target_names],
        )
    if store is None:
        raise DataError(f"data.source {cfg.source!r} needs an object store to read from")
    return parse_csv(store.get_bytes(cfg.source), cfg.label_column, cfg.source)


def parse_csv(raw: bytes, label_column: str, name: str) -> Table:
    """Parse a CSV with a header row; `label_column` holds the class, all other columns are numbers."""
    rows = list(csv.reader(io.StringIO(raw.decode("utf-8"))))
    if len(rows) < 2:
        raise DataError(f"{name}: needs a header row and at least one data row")
    header, body = rows[0], [r for r in rows[1:] if r]
    if label_column not in header:
        raise DataError(f"{name}: no column {label_column!r} (data.label_column); columns are {header}")
    li = header.index(label_column)
    labels_raw = [r[li] for r in body]
    classes = sorted(set(labels_raw), key=lambda s: (len(s), s))
    index = {c: i for i, c in enumerate(classes)}
    try:
        x = np.array([[float(v) for j, v in enumerate(r) if j != li] for r in body], np.float32)
    except ValueError as exc:
        raise DataError(f"{name}: every feature column must be numeric ({exc})") from None
    if x.ndim != 2 or x.shape[1] != len(header) - 1:
        raise DataError(f"{name}: rows have differing numbers of columns")
    y = np.array([index[v] for v in labels_raw], np.int64)
    return Table(x=x, y=y, feature_names=[h for h in header if h != label_column], classes=classes)


def split_indices(y: np.ndarray, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Stratified train/val/test row indices, the same for the same labels and seed."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        n_test = int(round(len(idx) * test_fraction))
        n_val = int(round(len(idx) * val_fraction))
        out["test"].append(idx[:n_test])
        out["val"].append(idx[n_test : n_test + n_val])
        out["train"].append(idx[n_test + n_val :])
    return {s: np.sort(np.concatenate(parts)) for s, parts in out.items()}


def prepare_dataset(cfg: DataConfig, store: ObjectStore, dataset_uri: str) -> dict:
    """Split, normalise (statistics from train only) and shard the source; return the manifest."""
    table = load_source(cfg, store)
    if len(table.classes) < 2:
        raise DataError(f"{cfg.source}: needs at least two classes, found {table.classes}")
    parts = split_indices(table.y, cfg.val_fraction, cfg.test_fraction, cfg.seed)
    if any(len(parts[s]) == 0 for s in SPLITS):
        raise DataError(
            f"{cfg.source}: {len(table.y)} rows are too few for a train/val/test split "
            f"with val_fraction={cfg.val_fraction} and test_fraction={cfg.test_fraction}"
        )
    train_x = table.x[parts["train"]]
    mean = train_x.mean(axis=0)
    std = train_x.std(axis=0)
    std[std == 0] = 1.0  # constant features (blank pixel columns) stay zero, not NaN

    manifest: dict = {
        "format": FORMAT,
        "source": cfg.source or "digits",
        "seed": cfg.seed,
        "num_features": int(table.x.shape[1]),
        "feature_names": table.feature_names,
        "classes": table.classes,
        "normalization": {"mean": mean.tolist(), "std": std.tolist()},
        "splits": {},
    }
    for split in SPLITS:
        idx = parts[split]
        writer = ShardWriter(store, dataset_uri, split, cfg.shard_rows, kind="rows")
        writer.add(x=((table.x[idx] - mean) / std).astype(np.float32), y=table.y[idx])
        shards = writer.close()
        manifest["splits"][split] = {"rows": int(len(idx)), "shards": [sh.as_dict() for sh in shards]}
    # The manifest goes last: readers treat a dataset without it as incomplete.
    store.put_bytes(join_uri(dataset_uri, MANIFEST), json.dumps(manifest, indent=2).encode())
    return manifest


def read_manifest(store: ObjectStore, dataset_uri: str, expected_format: str | None = None) -> dict:
    """The dataset's manifest; a clear error when the dataset is missing, incomplete or of another task."""
    uri = join_uri(dataset_uri, MANIFEST)
    manifest = read_json(store, uri)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise CorruptObject(f"{uri} is not a kftrain dataset manifest (no 'splits'): rerun data prep")
    if expected_format and manifest.get("format") != expected_format:
        raise DataError(
            f"{dataset_uri} holds a {manifest.get('format')!r} dataset, not {expected_format!r}: "
            "was it prepared for another task?"
        )
    return manifest


def load_split(
    store: ObjectStore, dataset_uri: str, split: str, manifest: dict | None = None, max_rows: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The first `max_rows` rows of one split in shard order (0: all) as (x float32, y int64);
    only the shards that hold them are read."""
    manifest = manifest or read_manifest(store, dataset_uri, FORMAT)
    xs, ys, count = [], [], 0
    for info in split_shards(manifest, split, dataset_uri):
        if max_rows and count >= max_rows:
            break
        arrays = read_shard(store, dataset_uri, info)
        if not isinstance(arrays, dict) or not {"x", "y"} <= set(arrays):
            raise CorruptObject(f"{join_uri(dataset_uri, info.name)} lacks the arrays x and y: rerun data prep")
        take = info.items if not max_rows else min(info.items, max_rows - count)
        xs.append(arrays["x"][:take])
        ys.append(arrays["y"][:take])
        count += take
    return np.concatenate(xs), np.concatenate(ys)
