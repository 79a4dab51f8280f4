"""The sharded dataset format: fixed-size shards, each described in the manifest.

Every shard is one ``.npy`` array (tokens of a language-model split) or one ``.npz`` archive
(features and labels of a table), written as it fills. The manifest, written last, lists per
split the shards in order with their item count, byte size and sha256, so a reader fetches only
the shards it needs, knows their sizes before it reads them, and rejects a shard that was
truncated or changed since data prep, naming it. Token shards hold the smallest unsigned dtype
that holds the vocabulary; nothing widens a whole shard (windows are widened one at a time).

Every task writes its dataset in this format, `manifest.json` last (a dataset without it is
incomplete), under its own `format` name; :func:`read_manifest` reads any of them.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from trainer.errors import KftrainError, first_and_more
from trainer.storage import CorruptObject, ObjectNotFound, ObjectStore, decode_object, has_suffix, join_uri, read_json

if TYPE_CHECKING:
    from trainer.config import Config

#: The dataset's description, written last by data prep.
MANIFEST = "manifest.json"
#: Every dataset's splits, in the order data prep writes them.
SPLITS = ("train", "val", "test")


class DataError(KftrainError, ValueError):
    """The data cannot be read or prepared; the message names the object and what to do."""


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard as the manifest lists it."""

    name: str
    """Path of the shard below the dataset URI, e.g. `train/tokens-00003.npy`."""
    items: int
    """Rows (a table) or tokens (a language-model split) in the shard."""
    bytes: int
    """Size of the shard object in bytes."""
    sha256: str
    """Hex digest of the shard object."""

    def as_dict(self) -> dict:
        """The manifest entry."""
        return asdict(self)

    @classmethod
    def from_dict(cls, entry: dict, where: str) -> ShardInfo:
        """Parse a manifest entry; `where` names it in the error."""
        try:
            return cls(
                name=str(entry["name"]), items=int(entry["items"]), bytes=int(entry["bytes"]), sha256=entry["sha256"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where}: a shard entry lacks {exc} or is malformed; rerun data prep") from None


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds every token id below `vocab_size`."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise DataError(f"a vocabulary of {vocab_size} tokens does not fit in 32 bits")


def encode(arrays: dict[str, np.ndarray]) -> bytes:
    """One array as `.npy`; several (features and labels) as an uncompressed `.npz`."""
    buf = io.BytesIO()
    if len(arrays) == 1:
        np.save(buf, next(iter(arrays.values())), allow_pickle=False)
    else:
        np.savez(buf, **arrays)
    return buf.getvalue()


def decode(raw: bytes, info: ShardInfo, uri: str) -> dict[str, np.ndarray] | np.ndarray:
    """The shard's array(s), after checking its size and digest against the manifest."""
    if len(raw) != info.bytes:
        raise CorruptObject(
            f"{uri}: {len(raw)} bytes, the manifest says {info.bytes}: the shard is truncated or was "
            "replaced after data prep; rerun data prep"
        )
    if hashlib.sha256(raw).hexdigest() != info.sha256:
        raise CorruptObject(
            f"{uri}: its sha256 differs from the manifest's: the shard is corrupt or was changed after "
            "data prep; rerun data prep"
        )
    if has_suffix(info.name, ".npz"):
        return decode_object(uri, raw, _load_npz, "dataset shard (.npz)")
    return decode_object(uri, raw, _load_npy, "token shard (.npy)")


def _load_npz(raw: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:  # no pickle: no code runs on load
        return {k: z[k] for k in z.files}


def _load_npy(raw: bytes) -> np.ndarray:
    return np.load(io.BytesIO(raw), allow_pickle=False)


def read_shard(store: ObjectStore, dataset_uri: str, info: ShardInfo) -> dict[str, np.ndarray] | np.ndarray:
    """Fetch one shard and check it against its manifest entry."""
    uri = join_uri(dataset_uri, info.name)
    return decode(store.get_bytes(uri), info, uri)


class ShardWriter:
    """Writes one split's shards as they fill: at most `items_per_shard` items are held."""

    def __init__(self, store: ObjectStore, dataset_uri: str, split: str, items_per_shard: int, kind: str) -> None:
        if kind not in ("tokens", "rows"):
            raise ValueError(f"kind must be 'tokens' or 'rows', got {kind!r}")
        self.store, self.dataset_uri, self.split = store, dataset_uri, split
        self.items_per_shard, self.kind = items_per_shard, kind
        self.shards: list[ShardInfo] = []
        self._pending: list[dict[str, np.ndarray]] = []
        self._count = 0

    @property
    def items(self) -> int:
        """Items written or pending so far."""
        return sum(s.items for s in self.shards) + self._count

    def add(self, **arrays: np.ndarray) -> None:
        """Append items (equal-length arrays by name); full shards are written at once."""
        n = len(next(iter(arrays.values())))
        start = 0
        while start < n:
            take = min(n - start, self.items_per_shard - self._count)
            self._pending.append({k: v[start : start + take] for k, v in arrays.items()})
            self._count += take
            start += take
            if self._count == self.items_per_shard:
                self._flush()

    def close(self) -> list[ShardInfo]:
        """Write the last, partial shard; return every shard of the split in order."""
        if self._count:
            self._flush()
        return self.shards

    def _flush(self) -> None:
        keys = self._pending[0].keys()
        arrays = {k: np.concatenate([p[k] for p in self._pending]) for k in keys}
        ext = "npy" if len(arrays) == 1 else "npz"
        name = f"{self.split}/{self.kind}-{len(self.shards):05d}.{ext}"
        raw = encode(arrays)
        self.store.put_bytes(join_uri(self.dataset_uri, name), raw)
        self.shards.append(ShardInfo(name, self._count, len(raw), hashlib.sha256(raw).hexdigest()))
        self._pending, self._count = [], 0


def split_shards(manifest: dict, split: str, dataset_uri: str) -> list[ShardInfo]:
    """The shards of one split as the manifest lists them."""
    try:
        entries = manifest["splits"][split]["shards"]
    except (KeyError, TypeError):
        raise DataError(f"{dataset_uri}: the manifest has no {split!r} split; rerun data prep") from None
    return [ShardInfo.from_dict(e, f"{dataset_uri} manifest, split {split}") for e in entries]


def check_shards_present(store: ObjectStore, dataset_uri: str, manifest: dict) -> None:
    """DataError naming the first shard a built-in data prep's manifest lists that the dataset
    does not hold (one listing of the dataset): a dataset whose files were deleted since, which
    KFP's cache would still hand to training (was: found by the replicas, after the job had
    started)."""
    held = set(store.list(dataset_uri.rstrip("/") + "/"))
    listed = [shard.name for split in manifest["splits"] for shard in split_shards(manifest, split, dataset_uri)]
    # Read as training reads it where the listing does not show it (a name spelled another way, a
    # folder reached through a link the listing does not follow).
    missing = [
        name
        for name in listed
        if join_uri(dataset_uri, name) not in held and not store.exists(join_uri(dataset_uri, name))
    ]
    if missing:
        raise DataError(
            f"{dataset_uri}: its manifest lists {first_and_more(missing, f'of its {len(listed)} shards')}, which the "
            "dataset no longer holds (deleted since data prep wrote it); run data prep again (in a KFP pipeline, "
            "with caching off for that step, or with a changed config)"
        )


#: The manifest `format` of each built-in dataset layout: data prep writes it, every reader checks it.
TABULAR_FORMAT = "kftrain.tabular.v2"
TOKENS_FORMAT = "kftrain.tokens.v2"
CHAT_FORMAT = "kftrain.chat.v1"


def dataset_format(cfg: Config) -> str | None:
    """The manifest format data prep writes for `cfg` (None: a custom task's, which only it knows)."""
    if cfg.task == "classification":
        return TABULAR_FORMAT
    if cfg.task == "causal_lm":
        return CHAT_FORMAT if cfg.data.format == "chat" else TOKENS_FORMAT
    return None


def content_digest(manifest: dict) -> str:
    """What identifies a prepared dataset's items: the sha256 of each split's shards, in order
    (equal for the same items in the same shards, whenever and wherever they were prepared)."""
    digest = hashlib.sha256()
    for split in sorted(manifest.get("splits", {})):
        digest.update(split.encode() + b"\0")
        for shard in manifest["splits"][split].get("shards", []):
            digest.update(str(shard.get("sha256", "")).encode() + b"\0")
    return digest.hexdigest()


def read_manifest(store: ObjectStore, dataset_uri: str, expected_format: str | None = None) -> dict:
    """The dataset's manifest; a clear error when the dataset is missing, incomplete or of another task."""
    uri = join_uri(dataset_uri, MANIFEST)
    try:
        manifest = read_json(store, uri)
    except ObjectNotFound:
        # Most often another artifact wired into a step's `dataset` input (in a user's pipeline).
        raise ObjectNotFound(
            f"no file at {uri}: {dataset_uri} is not a dataset kftrain's data prep wrote; give the step the "
            "`dataset` output of data prep (or rerun data prep)"
        ) from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise CorruptObject(f"{uri} is not a kftrain dataset manifest (no 'splits'): rerun data prep")
    found = manifest.get("format")
    if expected_format and found != expected_format:
        what = f"a {found!r} dataset" if isinstance(found, str) and found else "a dataset that names no format"
        raise DataError(
            f"{dataset_uri} holds {what}, not {expected_format!r}: was it prepared for another task, or by "
            "another kftrain version? Rerun data prep"
        )
    return manifest
