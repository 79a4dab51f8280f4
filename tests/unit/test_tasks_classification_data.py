"""Classification data prep (trainer/tasks/classification/data.py) in one process: stratified,
deterministic splits, sharding and normalisation, CSV parsing, bounded memory, and errors named."""

import csv
import hashlib
import io
import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import trainer.tasks.classification.data as data
from trainer.config import DataConfig
from trainer.shards import SPLITS, DataError, read_manifest
from trainer.storage import LocalStore, ObjectNotFound
from trainer.tasks.classification.data import SplitAssigner, csv_records, csv_rows, load_split, prepare_dataset


def make_csv(rows: int, seed: int = 0, classes=("cat", "dog", "emu")) -> tuple[str, np.ndarray, list[str]]:
    """A CSV text of `rows` rows (3 features, label in the middle), its features and labels."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(loc=[5.0, -2.0, 1000.0], scale=[1.0, 0.5, 30.0], size=(rows, 3)), 4)
    labels = [classes[i] for i in rng.integers(0, len(classes), rows)]
    lines = ["f1,f2,label,f3"] + [f"{a},{b},{lab},{c}" for (a, b, c), lab in zip(x, labels, strict=True)]
    return "\n".join(lines) + "\n", x, labels


def put(tmp_path: Path, text: str | bytes, name: str = "in.csv") -> str:
    uri = str(tmp_path / name)
    LocalStore().put_bytes(uri, text.encode() if isinstance(text, str) else text)
    return uri


def shard_digests(uri: str) -> dict[str, str]:
    """The shards of a prepared dataset by relative path, as sha256, and its manifest less the source."""
    root = Path(uri)
    out = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*.npz")}
    manifest = read_manifest(LocalStore(), uri)
    manifest.pop("source")
    return {**out, "manifest": json.dumps(manifest, sort_keys=True)}


# --- the split rule --------------------------------------------------------------------------


def test_split_is_stratified_disjoint_and_deterministic():
    y = [str(c) for c in np.tile(np.arange(4), 50)]

    def splits(seed: int) -> np.ndarray:
        return SplitAssigner(0.1, 0.2, seed).assign_all(y)

    a = splits(3)
    assert np.array_equal(a, splits(3))
    for cls in map(str, range(4)):
        mine = a[np.array(y) == cls]
        assert [(mine == s).sum() for s in range(3)] == [35, 5, 10]
    assert not np.array_equal(splits(4) == 2, a == 2)


@pytest.mark.parametrize(("val", "test"), [(0.1, 0.2), (0.15, 0.15), (0.3, 0.45), (0.013, 0.37), (0.49, 0.49)])
def test_every_split_holds_its_share_of_each_class_within_one_row_after_every_row(val, test):
    fractions = (1 - val - test, val, test)
    labels = [("a", "b", "c")[i] for i in np.random.default_rng(1).integers(0, 3, 3000)]
    for seed in range(3):
        assigner = SplitAssigner(val, test, seed)
        for label in labels:
            assigner.assign(label)
            counts = assigner.counts[label]
            n = sum(counts)
            assert all(abs(c - f * n) < 1 for c, f in zip(counts, fractions, strict=True)), (label, n, counts)


def test_the_seed_changes_which_rows_are_held_out():
    labels = ["x"] * 200
    test_rows = {tuple(np.flatnonzero(SplitAssigner(0.1, 0.2, seed).assign_all(labels) == 2)) for seed in range(8)}
    assert len(test_rows) >= 4


# --- digits ------------------------------------------------------------------------------------


def test_digits_are_sharded_and_normalised_with_train_statistics(tmp_path):
    store = LocalStore()
    uri = str(tmp_path / "ds")
    manifest = prepare_dataset(DataConfig(shard_rows=500), store, uri)
    assert manifest["num_features"] == 64 and manifest["classes"] == [str(i) for i in range(10)]
    assert sum(manifest["splits"][s]["rows"] for s in ("train", "val", "test")) == 1797
    assert len(manifest["splits"]["train"]["shards"]) == 3
    assert read_manifest(store, uri) == manifest
    x_train, y_train = load_split(store, uri, "train")
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    # Train is centred with unit variance (or all-zero for constant pixels); test is not fitted.
    np.testing.assert_allclose(x_train.mean(axis=0), 0, atol=1e-5)
    std = x_train.std(axis=0)
    assert np.all((np.abs(std - 1) < 1e-3) | (std == 0))
    x_test, _ = load_split(store, uri, "test")
    assert np.abs(x_test.mean(axis=0)).max() > 1e-3


# --- CSV sources -------------------------------------------------------------------------------


def test_csv_source_from_the_store(tmp_path):
    rows = ["f1,f2,label"] + [f"{i},{i % 3},{'cat' if i % 2 else 'dog'}" for i in range(40)]
    src = put(tmp_path, "\n".join(rows))
    manifest = prepare_dataset(DataConfig(source=src), LocalStore(), str(tmp_path / "ds"))
    assert manifest["classes"] == ["cat", "dog"]
    assert manifest["feature_names"] == ["f1", "f2"]


def test_classes_are_ordered_shortest_first_as_numbers_read(tmp_path):
    rows = ["f,label"] + [f"{i},{c}" for i in range(10) for c in ("10", "2", "1")]
    manifest = prepare_dataset(DataConfig(source=put(tmp_path, "\n".join(rows))), LocalStore(), str(tmp_path / "ds"))
    assert manifest["classes"] == ["1", "2", "10"]


def test_same_source_and_seed_give_identical_shards(tmp_path):
    src = put(tmp_path, make_csv(900)[0])
    cfg = DataConfig(source=src, shard_rows=64, seed=7)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    prepare_dataset(cfg, LocalStore(), a)
    prepare_dataset(cfg, LocalStore(), b)
    assert shard_digests(a) == shard_digests(b)
    other = str(tmp_path / "other-seed")
    prepare_dataset(DataConfig(source=src, shard_rows=64, seed=8), LocalStore(), other)
    assert shard_digests(other)["test/rows-00000.npz"] != shard_digests(a)["test/rows-00000.npz"]


@pytest.mark.parametrize("chunk_bytes", [7, 100, 4096])
def test_many_chunks_give_the_same_dataset_as_one(tmp_path, chunk_bytes):
    text = make_csv(700)[0]
    src = put(tmp_path, text)
    cfg = DataConfig(source=src, shard_rows=100)
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    prepare_dataset(cfg, LocalStore(), one, chunk_bytes=len(text) + 1)
    prepare_dataset(cfg, LocalStore(), many, chunk_bytes=chunk_bytes)
    assert shard_digests(many) == shard_digests(one)


def test_split_sizes_and_statistics_match_a_numpy_computation(tmp_path):
    text, x, labels = make_csv(1000)
    src = put(tmp_path, text)
    uri = str(tmp_path / "ds")
    manifest = prepare_dataset(DataConfig(source=src, shard_rows=128), LocalStore(), uri, chunk_bytes=512)
    where = SplitAssigner(0.1, 0.2, 0).assign_all(labels)
    train = x[where == 0]
    norm = manifest["normalization"]
    np.testing.assert_allclose(norm["mean"], train.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(norm["std"], train.std(axis=0), rtol=1e-10)
    classes = manifest["classes"]
    labels_arr = np.array(labels)
    for s, (split, fraction) in enumerate(zip(SPLITS, (0.7, 0.1, 0.2), strict=True)):
        xs, ys = load_split(LocalStore(), uri, split)
        # The split's rows, in file order, normalised with the train statistics.
        np.testing.assert_allclose(xs, (x[where == s] - train.mean(axis=0)) / train.std(axis=0), atol=1e-5)
        assert manifest["splits"][split]["rows"] == len(ys)
        for i, cls in enumerate(classes):
            assert abs((ys == i).sum() - fraction * (labels_arr == cls).sum()) < 1, (split, cls)


def test_quoted_fields_and_crlf_line_ends_read_like_plain_csv(tmp_path):
    text, _, labels = make_csv(300)
    plain = put(tmp_path, text, "plain.csv")
    quoted_lines = ['"' + '","'.join(line.split(",")) + '"' for line in text.splitlines()]
    quoted = put(tmp_path, "\r\n".join(quoted_lines) + "\r\n", "quoted.csv")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    prepare_dataset(DataConfig(source=plain), LocalStore(), a)
    prepare_dataset(DataConfig(source=quoted), LocalStore(), b, chunk_bytes=50)
    assert shard_digests(a) == shard_digests(b)


def test_a_quoted_line_end_or_comma_stays_inside_its_field(tmp_path):
    names = ['big, "red"', "two\r\nlines"]
    lines = ["f,label"] + [f'{i},"{names[i % 2].replace(chr(34), chr(34) * 2)}"' for i in range(60)]
    src = put(tmp_path, "\r\n".join(lines) + "\r\n\r\n")
    for chunk_bytes in (5, 64, 10_000):
        manifest = prepare_dataset(
            DataConfig(source=src), LocalStore(), str(tmp_path / f"ds{chunk_bytes}"), chunk_bytes
        )
        assert sorted(manifest["classes"]) == sorted(names)
        assert sum(manifest["splits"][s]["rows"] for s in SPLITS) == 60


@pytest.mark.parametrize(
    "spell",
    [
        pytest.param(lambda text: text.replace("\n", "\r"), id="cr-only"),  # Excel's "CSV (Macintosh)"
        pytest.param(lambda text: text.replace(",cat\n", ',12" cat\n'), id="a-quote-inside-an-unquoted-field"),
        pytest.param(lambda text: text.replace("\n", "\r\n").replace(",dog", ',"dog"'), id="crlf-and-quoted"),
    ],
)
@pytest.mark.parametrize("chunk_bytes", [5, 64, 1 << 20])
def test_csv_that_pythons_csv_reads_is_read_whatever_the_chunks(tmp_path, monkeypatch, spell, chunk_bytes):
    """Record ends were guessed by counting quotes before an LF: a file with a lone CR line end or
    a quote inside an unquoted field (`12" cat`) was one open record, held whole in memory and
    refused past MAX_RECORD_BYTES, 16 MiB ("is a quote left open?")."""
    monkeypatch.setattr(data, "MAX_RECORD_BYTES", 1000)  # a line is shorter; the file is not
    text = make_csv(300)[0]
    expected = [row for row in csv.reader(io.StringIO(spell(text), newline=""))]
    src = put(tmp_path, spell(text), "spelled.csv")
    got = [fields for _, fields in csv_records(LocalStore(), src, chunk_bytes)]
    assert got == expected and len(got) == 301


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'a,label\n1,"x\n' + "2,y\n" * 50,
            r"line 2 is not valid CSV \(a quote \(\"\) that opens a field here is never closed",
        ),
        ('a,label\n1,x\n2,"y"z\n3,x\n', r"line 3 is not valid CSV \(',' expected after '\"'.*double a quote inside it"),
        # Past the csv module's field limit: a quote that ran on over lines, or one long field of one line
        # (was: both blamed on a quote left open).
        (
            'a,label\n1,x\n2,"y\n' + "z" * 1000 + "\n" + ("3,w\n" * 40000),
            r"line 3 is not valid CSV \(field larger than field limit \(131072\): a quoted field that opens here",
        ),
        (
            "a,label\n1,x\n" + "9" * 200000 + ",y\n3,x\n",
            r"line 3 is not valid CSV \(field larger than field limit \(131072\): a field of this line is that long",
        ),
    ],
)
def test_a_quoted_field_that_does_not_end_is_an_error_not_the_rest_of_the_file(tmp_path, text, message):
    """A quote left open made every row after it one field of one row (was: silent, or a 'not a
    number' error about a field of 50 lines)."""
    with pytest.raises(DataError, match=message):
        prepare_dataset(DataConfig(source=put(tmp_path, text)), LocalStore(), str(tmp_path / "ds"), chunk_bytes=16)


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    src = put(tmp_path, b"\xef\xbb\xbf" + make_csv(50)[0].encode())
    assert prepare_dataset(DataConfig(source=src), LocalStore(), str(tmp_path / "ds"))["feature_names"] == [
        "f1",
        "f2",
        "f3",
    ]


def test_peak_memory_does_not_grow_with_the_source(tmp_path):
    """Data prep holds a chunk, a batch and a shard per split: a 10x larger CSV, the same peak."""

    def peak(rows: int) -> int:
        src = put(tmp_path, make_csv(rows, seed=rows)[0], f"in-{rows}.csv")
        cfg = DataConfig(source=src, shard_rows=128)
        tracemalloc.start()
        try:
            prepare_dataset(cfg, LocalStore(), str(tmp_path / f"ds-{rows}"), chunk_bytes=8 << 10, batch_rows=128)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(1_000), peak(10_000)
    # Memory, not time: the ratio is stable; a whole-source read would be ~10x.
    assert large / small < 1.5, (small, large)


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b\n1,2\n", "in.csv: no column 'label' \\(data.label_column\\); columns are 'a', 'b'$"),
        (  # a wide table: the message names the first columns and how many there are, not all of them
            ",".join(f"f{i}" for i in range(5000)) + "\n" + ",".join("1" * 5000) + "\n",
            r"columns are 'f0', 'f1', .*'f11', \.\.\. \(5000 in all\)$",
        ),
        ("label,a,label\n1,2,3\n", "in.csv: the header names 'label' more than once; give every column its own name"),
        ("a,a,label,b,b\n1,2,x,3,4\n", "the header names 'a', 'b' more than once"),
        (
            "a,label\n1,x\n2,y\nnope,x\n",
            r"in.csv: row 3 \(line 4\), column 'a': 'nope' is not a number.*must be numeric",
        ),
        ("a,label,b\n1,x,2\n\n2,y,\n", r"row 2 \(line 4\), column 'b': '' is not a number"),
        ("a,label\n1,x\n2,y,3\n", r"row 2 \(line 3\) has 3 columns.*differing numbers of columns"),
        ("a,label\n", "needs at least one data row below its header \\(the object holds the header alone\\)"),
        ("a,label\n\n\n", "needs at least one data row below its header"),
        ("", "needs a header row and at least one data row"),
        # A column without a name (was: a feature named '', or every row's empty last cell "not a number").
        ("a,label,\n1,x,\n2,y,\n", "column 3 of the 3 in the header has no name \\(a comma at the end of every line"),
        ("a,,label\n1,2,x\n", "in.csv: column 2 of the 3 in the header has no name; name every column, or remove"),
        ("a, ,label,\n1,2,x,\n", "columns 2, 4 of the 4 in the header have no name; name every column"),
        ("label\nx\n", "needs at least one feature column"),
        ("a,label\n1,x\n2,x\n3,x\n", "needs at least two classes, found \\['x'\\]"),
        ("a,label\n1,x\n2,y\n", "2 rows are too few for a train/val/test split"),
        (
            "label,b\n" + "".join(f"{i}.25,{i % 2}\n" for i in range(300)),  # a continuous column as the label
            r"300 of the 300 classes in column 'label' \(data.label_column\) have one row each.*holds the classes",
        ),
        (b"a,label\n1,x\n2,\xff\n", r"in.csv is not UTF-8 text \(line 3: byte 0xff"),
    ],
)
def test_bad_csv_says_what_is_wrong(tmp_path, text, message):
    src = put(tmp_path, text)
    with pytest.raises(DataError, match=message):
        prepare_dataset(DataConfig(source=src), LocalStore(), str(tmp_path / "ds"), chunk_bytes=8)


def test_a_line_without_an_end_is_an_error_not_an_unbounded_buffer(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_RECORD_BYTES", 1000)
    src = put(tmp_path, "a,label\n1,x\n" + "2," * 1000 + "y\n")
    with pytest.raises(DataError, match=r"in.csv: line 3 runs over \d+ characters without a line end"):
        prepare_dataset(DataConfig(source=src), LocalStore(), str(tmp_path / "ds"), chunk_bytes=64)


@pytest.mark.timeout(60)  # quadratic, 200,000 columns take hours
def test_a_header_of_many_columns_is_checked_in_linear_time(tmp_path):
    """A repeated column name was found with list.count per name: 40,000 columns took 15 s."""
    n = 200_000
    src = put(tmp_path, ",".join(f"c{i}" for i in range(n)) + ",label,c7\n" + "1," * (n + 1) + "1\n")
    with pytest.raises(DataError, match="the header names 'c7' more than once"):
        csv_rows(LocalStore(), src, "label")


def test_a_missing_source_is_named(tmp_path):
    with pytest.raises(ObjectNotFound, match="nothing.csv"):
        prepare_dataset(DataConfig(source=str(tmp_path / "nothing.csv")), LocalStore(), str(tmp_path / "ds"))


def test_an_incomplete_dataset_is_not_read(tmp_path):
    store = LocalStore()
    store.put_bytes(str(tmp_path / "ds/train/shard-00000.npz"), b"partial")
    with pytest.raises(ObjectNotFound):
        read_manifest(store, str(tmp_path / "ds"))


def test_a_csv_replaced_between_the_two_passes_is_refused_not_read_as_two_files(tmp_path):
    """Data prep reads a CSV twice (statistics and classes, then rows): a file replaced between
    the passes had the first's statistics applied to the second's rows (a probe)."""
    import os

    from trainer.storage import ObjectChanged

    path = tmp_path / "t.csv"
    path.write_text("x,label\n1,a\n2,b\n")
    rows = csv_rows(LocalStore(), f"file://{path}", "label")
    assert [labels for labels, _ in rows.batches()] == [["a", "b"]]
    path.write_text("x,label\n7,c\n8,d\n")
    os.utime(path, ns=(1, 1))  # a new modification time, however coarse the file system's clock
    with pytest.raises(ObjectChanged, match="changed while it was read"):
        list(rows.batches())


@pytest.mark.parametrize(
    ("fractions", "said"),
    [
        ((0.001, 0.1), "the val split would be empty; give more rows, or raise data.val_fraction"),
        ((0.1, 0.001), "the test split would be empty; give more rows, or raise data.test_fraction"),
        # Under three rows a class no fractions fill every split: more rows only (review: advice in a loop).
        ((0.3, 0.3), "would be empty; give more rows (at least three a class)"),
    ],
)
def test_too_few_rows_name_the_split_left_empty_and_its_setting(tmp_path, fractions, said):
    """Was: "60 rows are too few" and the fractions, not which split or which setting."""
    rows = 4 if fractions == (0.3, 0.3) else 60
    src = put(tmp_path, make_csv(rows)[0])
    cfg = DataConfig(source=src, val_fraction=fractions[0], test_fraction=fractions[1])
    with pytest.raises(DataError, match=f"{rows} rows are too few .*{re.escape(said)}$"):
        prepare_dataset(cfg, LocalStore(), str(tmp_path / "ds"))


def test_a_class_the_split_leaves_out_of_training_is_said(tmp_path, caplog):
    """Large val and test fractions can leave a rare class no training row: it trained silently,
    its test rows errors the model could never avoid."""
    text = "a,label\n" + "".join(f"{i},{'x' if i % 2 else 'y'}\n" for i in range(200)) + "1,rare\n2,rare\n"
    src = put(tmp_path, text)
    with caplog.at_level("WARNING"):
        prepare_dataset(
            DataConfig(source=src, val_fraction=0.45, test_fraction=0.45), LocalStore(), str(tmp_path / "d")
        )
    assert "class(es) 'rare' have no row in the training split ('rare': 1 val, 1 test)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare_dataset(DataConfig(source=src), LocalStore(), str(tmp_path / "d2"))
    assert "no row in the training split" not in caplog.text


def test_a_line_of_spaces_is_a_blank_line_not_a_row(tmp_path):
    """Blank lines were skipped, and a line of spaces or a tab stopped data prep ("has 1 columns")."""
    src = put(tmp_path, "a,label\n1,x\n  \n2,y\n\t\n\n3,x\n")
    assert [(line, fields) for line, fields in csv_records(LocalStore(), src)] == [
        (1, ["a", "label"]),
        (2, ["1", "x"]),
        (4, ["2", "y"]),
        (7, ["3", "x"]),
    ]
