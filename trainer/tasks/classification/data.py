"""The classification task's data: a table -> stratified splits -> normalised shards + manifest.

Layout under a dataset URI (`trainer/shards.py` describes the format)::

    manifest.json              written last: a dataset without it is incomplete
    train/rows-00000.npz ...   arrays `x` (float32, n x features) and `y` (int64, n)
    val/rows-00000.npz ...
    test/rows-00000.npz ...

Shards are numpy ``.npz`` files read with ``allow_pickle=False``: no code runs when loading.

**Two streamed passes.** A CSV source is read in ranged reads of about a MiB (`CHUNK_BYTES`),
whose lines the `csv` module parses as they come (a quoted field may hold line ends). Its rows
are converted to numbers in batches of a fixed number of rows that depends on the table's width
only, not on the chunk size, so the shards are the same however the source is chunked. Pass 1
finds the classes, counts the rows and accumulates the train rows' per-feature mean and variance
(float64; each batch's moments merged exactly into the running ones, which is steadier than a sum
of squares). Pass 2 normalises every row with them and appends it to its split's shards as they
fill. Memory holds one chunk, one batch, one shard
per split and a few numbers per class and per feature, whatever the size of the source. The
bundled digits set goes through the same two passes from memory.

**The split rule.** A row's split depends only on its class, its position among the rows of its
class and `data.seed`. Each class counts the rows it has sent to train, val and test; its next
row goes to the split furthest below its share (fraction x rows of the class so far; fractions in
millionths, compared exactly as integers). A tie between splits owed equally, frequent for round
fractions such as the defaults, goes to a split picked by a hash of (seed, class, position): that
is where the seed changes the split. The rule keeps every split of every class within one row of
its share after every row (|count - fraction x rows| < 1: the split chosen is owed at least 1/3
of a row, and one owed a whole row is always chosen first), samples each class evenly along the
file rather than in blocks, and needs no label held: the same source and seed give the same
shards in both passes and on every run.
"""

from __future__ import annotations

import codecs
import collections
import csv
import hashlib
import io
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from trainer.config import DataConfig
from trainer.data_rules import bad_feature, canonical_label, missing_label, source_format_problem, text_chunks
from trainer.data_rules import class_order as class_order
from trainer.shards import (
    MANIFEST,
    SPLITS,
    TABULAR_FORMAT,
    DataError,
    ShardWriter,
    read_manifest,
    read_shard,
    split_shards,
)
from trainer.storage import CorruptObject, ObjectStore, join_uri, read_chunks

log = logging.getLogger("kftrain.data")

#: A CSV source is read in ranged reads of this many bytes.
CHUNK_BYTES = 1 << 20
#: Rows are converted and normalised in batches of about this many cells (rows x columns).
BATCH_CELLS = 1 << 16
#: A line longer than this many characters is an error, so a broken file cannot grow the buffer
#: without bound (a quoted field is bounded by the `csv` module's field limit, 128 KiB).
MAX_RECORD_BYTES = 16 << 20
#: Spellings of one class kept for the data-prep log (`1`, `1.0`, ` 1`, ...).
MAX_SPELLINGS = 5
#: Split fractions are counted in millionths, so the split rule compares exact integers.
_SCALE = 1_000_000


@dataclass(slots=True)
class Rows:
    """A labelled table that can be read batch by batch, as often as needed (data prep reads it twice)."""

    name: str
    """The source, as errors and the manifest name it."""
    feature_names: list[str]
    """The feature columns in order."""
    batches: Callable[..., Iterator[tuple[list[str], np.ndarray]]]
    """A fresh pass over the rows in order: batches of (class labels, features as float64 rows x features).
    Its keyword `progress` (what the pass is for) logs how far a pass over a stored source got."""
    spellings: dict[str, set[str]] = field(default_factory=dict)
    """Per class, the label cells read so far that name it (`1`, `1.0`, ` 1`: see
    :func:`trainer.data_rules.canonical_label`); a few per class at most."""


def batch_rows_for(num_columns: int) -> int:
    """Rows per batch for a table this wide (about `BATCH_CELLS` cells)."""
    return max(1, BATCH_CELLS // max(num_columns, 1))


def digits_rows(batch_rows: int = 0) -> Rows:
    """scikit-learn's bundled handwritten digits (1,797 rows of 64 pixels), read from memory."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float64)
    labels = [str(digits.target_names[t]) for t in digits.target]
    step = batch_rows or batch_rows_for(x.shape[1])

    def batches(progress: str = "") -> Iterator[tuple[list[str], np.ndarray]]:
        for start in range(0, len(labels), step):  # in memory: nothing to report
            yield labels[start : start + step], x[start : start + step]

    return Rows("digits", [f"pixel_{i}" for i in range(x.shape[1])], batches)


def _csv_lines(chunks: Iterable[bytes], uri: str) -> Iterator[str]:
    """The lines of a CSV object's UTF-8 `chunks` (:func:`~trainer.data_rules.text_chunks` checked
    them), each with its line end as the `csv` module reads them (`\\r\\n`, `\\n` or a lone `\\r`,
    a Macintosh export's), a byte-order mark dropped; a line longer than :data:`MAX_RECORD_BYTES`
    is an error, so a broken file cannot grow the buffer without bound."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    carry, line = "", 1
    for chunk in chunks:
        lines = io.StringIO(carry + decoder.decode(chunk), newline="").readlines()
        # The last line may go on in the next chunk (one ending in a CR too: its LF may come next).
        carry = lines.pop() if lines and not lines[-1].endswith("\n") else ""
        if len(carry) > MAX_RECORD_BYTES:
            raise DataError(f"{uri}: line {line + len(lines)} runs over {len(carry)} characters without a line end")
        line += len(lines)
        yield from lines
    carry += decoder.decode(b"", final=True)
    if carry:
        yield carry


def csv_records(
    store: ObjectStore, uri: str, chunk_bytes: int = CHUNK_BYTES, progress: str = "", version: str = ""
) -> Iterator[tuple[int, list[str]]]:
    """The records of the CSV object at `uri` as (line number, fields), read in ranged reads of
    `chunk_bytes`; blank lines (of spaces and tabs too) are skipped, a UTF-8 byte-order mark is
    dropped. Read as Python's `csv` module reads a file, strictly: a quote inside an unquoted
    field (`12" pizza`) is a character, and a quoted field must end (a quote left open was the
    rest of the file, one field).
    `progress` and `version`: as for :func:`~trainer.storage.read_chunks`."""
    reader = csv.reader(
        _csv_lines(text_chunks(read_chunks(store, uri, chunk_bytes, progress, version), uri, "CSV"), uri), strict=True
    )
    line = 1  # the first line of the next record
    try:
        for fields in reader:
            if fields and (len(fields) > 1 or fields[0].strip()):  # a line of spaces is blank too (was: a row)
                yield line, fields
            line = reader.line_num + 1
    except csv.Error as exc:
        problem = str(exc)
        if problem == "unexpected end of data":
            problem = 'a quote (") that opens a field here is never closed: close it, or double a quote inside a field'
        elif "field larger than field limit" in problem and reader.line_num > line:
            problem += ": a quoted field that opens here runs on over the lines after it: is its closing quote missing?"
        elif "field larger than field limit" in problem:  # on its own line: no quote ran on (was: blamed on one)
            problem += ": a field of this line is that long, which no number or label is: is the line this table's?"
        elif "expected after" in problem:
            problem += ': a quoted field ends at its closing quote; double a quote inside it ("")'
        raise DataError(f"{uri}: line {line} is not valid CSV ({problem})") from None


def _numbers(rows: list[list[str]], columns: list[str], uri: str, first_row: int, lines: list[int]) -> np.ndarray:
    """The feature cells of a batch as float64; a cell that is not a number, or not one float32
    holds (NaN, infinite, beyond ~3.4e38), is named by row, line and column."""
    try:
        out = np.array(rows, dtype=np.float64)
    except ValueError:
        out = None
    # `1_000` is a number to Python's float() (and so numpy's), and no CSV writer's: found below.
    if out is None or any("_" in "".join(row) for row in rows):
        out = _numbers_one_by_one(rows, columns, uri, first_row, lines)
    bad = bad_feature(out)
    if bad is not None:
        i, j, problem = bad
        raise DataError(
            f"{uri}: row {first_row + i} (line {lines[i]}), column {columns[j]!r}: {rows[i][j]!r} {problem}; "
            "every feature must be a finite number within float32's range: fix or drop the row"
        )
    return out


def _numbers_one_by_one(
    rows: list[list[str]], columns: list[str], uri: str, first_row: int, lines: list[int]
) -> np.ndarray:
    # Find the culprit; numpy may also refuse a spelling Python's float() reads (then use those).
    out = np.empty((len(rows), len(columns)))
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            try:
                if "_" in value:  # `1_000`: a typo or another tool's notation, not a CSV number
                    raise ValueError(value)
                out[i, j] = float(value)
            except ValueError:
                raise DataError(
                    f"{uri}: row {first_row + i} (line {lines[i]}), column {columns[j]!r}: {value!r} is not a "
                    "number; every feature column must be numeric"
                ) from None
    return out


def _names(header: list[str], most: int = 12) -> str:
    """The first `most` column names for a message, and how many there are when that is not all
    (a wide table's header would be a message of megabytes)."""
    shown = ", ".join(map(repr, header[:most]))
    return shown if len(header) <= most else f"{shown}, ... ({len(header)} in all)"


def csv_rows(
    store: ObjectStore, uri: str, label_column: str, chunk_bytes: int = CHUNK_BYTES, batch_rows: int = 0
) -> Rows:
    """The CSV object at `uri` as :class:`Rows`: a header row, `label_column` holds the class, every
    other column is a number. Reads only the header now; each pass streams the object again, the
    same version (:class:`~trainer.storage.ObjectChanged` if another writer replaced it: was, the
    first pass's statistics and classes applied to another file's rows)."""
    version = store.version(uri)
    records = csv_records(store, uri, chunk_bytes, version=version)
    first, row = next(records, None), next(records, None)
    records.close()
    if first is None:
        raise DataError(f"{uri}: needs a header row and at least one data row (the object holds no rows)")
    if row is None:  # was: found only in data prep, after the pre-flight passed it
        raise DataError(f"{uri}: needs at least one data row below its header (the object holds the header alone)")
    header = first[1]
    unnamed = [i + 1 for i, name in enumerate(header) if not name.strip()]
    if unnamed:  # was: a feature named '' (or each row's empty last cell "is not a number")
        trailing = " (a comma at the end of every line?)" if unnamed == [len(header)] else ""
        columns, has, ones = ("columns", "have", "ones") if len(unnamed) > 1 else ("column", "has", "one")
        raise DataError(
            f"{uri}: {columns} {', '.join(map(str, unnamed))} of the {len(header)} in the header {has} no "
            f"name{trailing}; name every column, or remove the empty {ones}"
        )
    twice = sorted(name for name, n in collections.Counter(header).items() if n > 1)
    if twice:  # the second label column would be read as a feature, a repeated feature as two
        raise DataError(
            f"{uri}: the header names {', '.join(map(repr, twice))} more than once; give every column its own name"
        )
    if label_column not in header:
        raise DataError(f"{uri}: no column {label_column!r} (data.label_column); columns are {_names(header)}")
    li = header.index(label_column)
    features = header[:li] + header[li + 1 :]
    if not features:
        raise DataError(f"{uri}: needs at least one feature column besides {label_column!r}")
    step = batch_rows or batch_rows_for(len(header))
    spellings: dict[str, set[str]] = {}

    def batches(progress: str = "") -> Iterator[tuple[list[str], np.ndarray]]:
        records = csv_records(store, uri, chunk_bytes, progress, version)
        next(records)  # the header
        canonical: dict[str, str] = {}  # label cell -> class (few distinct cells: one look-up per row)
        labels: list[str] = []
        cells: list[list[str]] = []
        lines: list[int] = []
        row = 0  # data rows before this batch
        for line, fields in records:
            if len(fields) != len(header):
                raise DataError(
                    f"{uri}: row {row + len(labels) + 1} (line {line}) has {len(fields)} columns, the header "
                    f"{len(header)}: rows have differing numbers of columns"
                )
            raw = fields[li]
            label = canonical.get(raw)
            if label is None:
                label = canonical[raw] = canonical_label(raw)
                if missing_label(label):
                    what = f"{label!r} marks a missing value (as pandas reads a table)" if label else "is empty"
                    raise DataError(
                        f"{uri}: row {row + len(labels) + 1} (line {line}), column {label_column!r} "
                        f"(data.label_column): the label {what}; give every row a class (a class spelled so: "
                        "another name), or leave out the rows that have none"
                    )
                seen = spellings.setdefault(label, set())
                if len(seen) < MAX_SPELLINGS:
                    seen.add(raw)
            labels.append(label)
            cells.append(fields[:li] + fields[li + 1 :])
            lines.append(line)
            if len(labels) == step:
                yield labels, _numbers(cells, features, uri, row + 1, lines)
                row += len(labels)
                labels, cells, lines = [], [], []
        if labels:
            yield labels, _numbers(cells, features, uri, row + 1, lines)

    return Rows(uri, features, batches, spellings)


def open_source(
    cfg: DataConfig, store: ObjectStore | None, chunk_bytes: int = CHUNK_BYTES, batch_rows: int = 0
) -> Rows:
    """The configured source: the bundled digits set, or a CSV object from the store."""
    if cfg.source in ("", "digits"):
        return digits_rows(batch_rows)
    if store is None:
        raise DataError(f"data.source {cfg.source!r} needs an object store to read from")
    problem = source_format_problem("classification", cfg.source)
    if problem:
        raise DataError(f"data.source {cfg.source} {problem}")
    return csv_rows(store, cfg.source, cfg.label_column, chunk_bytes, batch_rows)


class SplitAssigner:
    """The split rule of the module docstring: call :meth:`assign` once per row, in row order."""

    def __init__(self, val_fraction: float, test_fraction: float, seed: int) -> None:
        val, test = round(val_fraction * _SCALE), round(test_fraction * _SCALE)
        self.weights = (_SCALE - val - test, val, test)
        self.seed = seed
        self.counts: dict[str, list[int]] = {}
        """Per class, the rows sent to train, val and test so far."""
        self._keys: dict[str, bytes] = {}

    def assign(self, label: str) -> int:
        """The split (an index into `SPLITS`) of the next row of class `label`."""
        counts = self.counts.get(label)
        if counts is None:
            counts = self.counts[label] = [0, 0, 0]
        c0, c1, c2 = counts
        n = c0 + c1 + c2 + 1
        w0, w1, w2 = self.weights
        # What each split is owed, in millionths of a row: its share of n rows minus what it holds.
        o0, o1, o2 = w0 * n - _SCALE * c0, w1 * n - _SCALE * c1, w2 * n - _SCALE * c2
        if o0 > o1 and o0 > o2:
            split = 0
        elif o1 > o0 and o1 > o2:
            split = 1
        elif o2 > o0 and o2 > o1:
            split = 2
        else:
            top = max(o0, o1, o2)
            tied = [s for s, o in enumerate((o0, o1, o2)) if o == top]
            split = tied[self._tie_break(label, n) % len(tied)]
        counts[split] += 1
        return split

    def assign_all(self, labels: list[str]) -> np.ndarray:
        """:meth:`assign` for each label in order, as an array of split indices."""
        assign = self.assign
        return np.array([assign(label) for label in labels], dtype=np.int8)

    def _tie_break(self, label: str, position: int) -> int:
        key = self._keys.get(label)
        if key is None:
            key = self._keys[label] = hashlib.blake2b(f"{self.seed}\0{label}".encode(), digest_size=32).digest()
        digest = hashlib.blake2b(position.to_bytes(8, "little"), key=key, digest_size=8).digest()
        return int.from_bytes(digest, "little")


class _Moments:
    """Per-feature count, mean and sum of squared deviations, merged batch by batch (the pairwise
    update of Chan, Golub and LeVeque: no cancellation, unlike a sum of squares)."""

    def __init__(self, width: int) -> None:
        self.n = 0
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def add(self, x: np.ndarray) -> None:
        if not len(x):
            return
        nb, mb = len(x), x.mean(axis=0)
        m2b = np.square(x - mb).sum(axis=0)
        n = self.n + nb
        delta = mb - self.mean
        self.mean = self.mean + delta * (nb / n)
        self.m2 = self.m2 + m2b + np.square(delta) * (self.n * nb / n)
        self.n = n

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        std = np.sqrt(self.m2 / max(self.n, 1))
        # Constant features (blank pixel columns) stay zero, not NaN; "constant" allows for the
        # rounding of a mean of equal values.
        std[std <= 1e-12 * np.abs(self.mean)] = 1.0
        std[std == 0] = 1.0
        return self.mean, std


def prepare_dataset(
    cfg: DataConfig,
    store: ObjectStore,
    dataset_uri: str,
    chunk_bytes: int = CHUNK_BYTES,
    batch_rows: int = 0,
    source: ObjectStore | None = None,
) -> dict:
    """Split, normalise (statistics from train only) and shard the source (read through `source`,
    its own store; `store` when None) into `store` in two streamed passes; return the manifest.
    `chunk_bytes` and `batch_rows` (0: from the width) only bound memory."""
    rows = open_source(cfg, source or store, chunk_bytes, batch_rows)
    name = cfg.source or "digits"

    # Pass 1: classes, split sizes, and the train rows' statistics.
    assigner = SplitAssigner(cfg.val_fraction, cfg.test_fraction, cfg.seed)
    moments = _Moments(len(rows.feature_names))
    for labels, x in rows.batches(progress="data prep pass 1/2"):
        moments.add(x[assigner.assign_all(labels) == 0])
    counts = assigner.counts
    total = sum(sum(c) for c in counts.values())
    if total == 0:
        raise DataError(f"{name}: needs a header row and at least one data row")
    classes = class_order(counts)
    if len(classes) < 2:
        raise DataError(f"{name}: needs at least two classes, found {classes}")
    sizes = [sum(c[s] for c in counts.values()) for s in range(len(SPLITS))]
    if not all(sizes):
        singles = sum(1 for c in counts.values() if sum(c) == 1)
        if singles >= 10 and singles * 2 > total:  # each class splits on its own: one row each cannot
            raise DataError(
                f"{name}: {singles} of the {len(classes)} classes in column {cfg.label_column!r} "
                "(data.label_column) have one row each, too few to split: is it a measurement rather than a "
                "class? Name the column that holds the classes"
            )
        empty = [split for split, n in zip(SPLITS, sizes, strict=True) if not n]
        # Each class splits on its own: with under three rows a class, no fractions fill three splits.
        fixes = [f"raise data.{split}_fraction" for split in empty if split != "train"]
        fixes += ["lower data.val_fraction / data.test_fraction"] if "train" in empty else []
        fixes = [] if total < 3 * len(classes) else fixes
        raise DataError(
            f"{name}: {total} rows are too few for a train/val/test split with val_fraction={cfg.val_fraction} "
            f"and test_fraction={cfg.test_fraction}: the {' and '.join(empty)} split{'s' * (len(empty) > 1)} would "
            f"be empty; give more rows{', or ' + ', or '.join(fixes) if fixes else ' (at least three a class)'}"
        )
    untrained = {c: counts[c] for c in classes if not counts[c][0]}
    if untrained:  # possible with large val/test fractions and a rare class
        log.warning(
            "%s: class(es) %s have no row in the training split (%s): the model never learns them and their test "
            "rows count as errors; give them more rows, or lower data.val_fraction / data.test_fraction",
            name,
            ", ".join(repr(c) for c in untrained),
            "; ".join(f"{c!r}: {n[1]} val, {n[2]} test" for c, n in untrained.items()),
        )
    mean, std = moments.mean_std()
    for label, seen in sorted(rows.spellings.items()):
        if len(seen) > 1:
            spelled = ", ".join(repr(s) for s in sorted(seen))
            # A warning: the step's warnings reach the terminal (a print stayed in the full log).
            log.warning("%s: labels %s are one class %r (data.label_column)", name, spelled, label)

    # Pass 2: normalise and shard, in row order within each split.
    index = {c: i for i, c in enumerate(classes)}
    writers = [ShardWriter(store, dataset_uri, split, cfg.shard_rows, kind="rows") for split in SPLITS]
    assigner = SplitAssigner(cfg.val_fraction, cfg.test_fraction, cfg.seed)
    row = 0  # data rows before this batch
    for labels, x in rows.batches(progress="data prep pass 2/2"):
        where = assigner.assign_all(labels)
        if assigner.counts.keys() - index.keys():
            raise DataError(f"{name} changed while data prep read it (a new class appeared); rerun data prep")
        y = np.array([index[label] for label in labels], dtype=np.int64)
        with np.errstate(over="ignore"):
            z = ((x - mean) / std).astype(np.float32)
        bad = bad_feature(z)
        if bad is not None:  # a far outlier in val or test over a near-constant train column
            i, j, _ = bad
            raise DataError(
                f"{name}: row {row + i + 1}, column {rows.feature_names[j]!r}: {x[i, j]!r} normalised with the train "
                f"rows' mean {mean[j]:.6g} and std {std[j]:.6g} overflows float32; fix or drop the row"
            )
        row += len(labels)
        for s, writer in enumerate(writers):
            mask = where == s
            if mask.any():
                writer.add(x=z[mask], y=y[mask])
    if assigner.counts != counts:
        raise DataError(f"{name} changed while data prep read it (its rows differ between passes); rerun data prep")

    manifest: dict = {
        "format": TABULAR_FORMAT,
        "source": name,
        "seed": cfg.seed,
        "num_features": len(rows.feature_names),
        "feature_names": rows.feature_names,
        "classes": classes,
        "normalization": {"mean": mean.tolist(), "std": std.tolist()},
        "splits": {},
    }
    for split, writer, size in zip(SPLITS, writers, sizes, strict=True):
        shards = writer.close()
        manifest["splits"][split] = {"rows": size, "shards": [sh.as_dict() for sh in shards]}
    # The manifest goes last: readers treat a dataset without it as incomplete.
    store.put_bytes(join_uri(dataset_uri, MANIFEST), json.dumps(manifest, indent=2).encode())
    return manifest


def load_split(
    store: ObjectStore, dataset_uri: str, split: str, manifest: dict | None = None, max_rows: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The first `max_rows` rows of one split in shard order (0: all) as (x float32, y int64);
    only the shards that hold them are read."""
    manifest = manifest or read_manifest(store, dataset_uri, TABULAR_FORMAT)
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
