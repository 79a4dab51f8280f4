import numpy as np
import pytest

from trainer.config import DataConfig
from trainer.data import DataError, load_split, parse_csv, prepare_dataset, read_manifest, split_indices
from trainer.storage import LocalStore, ObjectNotFound


def test_split_is_stratified_disjoint_and_deterministic():
    y = np.repeat(np.arange(4), 50)
    a = split_indices(y, 0.1, 0.2, seed=3)
    b = split_indices(y, 0.1, 0.2, seed=3)
    assert all(np.array_equal(a[s], b[s]) for s in a)
    together = np.concatenate([a["train"], a["val"], a["test"]])
    assert sorted(together) == list(range(200))
    for cls in range(4):
        assert (y[a["test"]] == cls).sum() == 10
        assert (y[a["val"]] == cls).sum() == 5
    assert not np.array_equal(split_indices(y, 0.1, 0.2, seed=4)["test"], a["test"])


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


def test_csv_source_from_the_store(tmp_path):
    store = LocalStore()
    rows = ["f1,f2,label"] + [f"{i},{i % 3},{'cat' if i % 2 else 'dog'}" for i in range(40)]
    src = str(tmp_path / "in.csv")
    store.put_bytes(src, "\n".join(rows).encode())
    manifest = prepare_dataset(DataConfig(source=src), store, str(tmp_path / "ds"))
    assert manifest["classes"] == ["cat", "dog"]
    assert manifest["feature_names"] == ["f1", "f2"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b\n1,2\n", "no column 'label'"),
        ("a,label\nx,1\n", "must be numeric"),
        ("a,label\n", "needs a header row and at least one data row"),
    ],
)
def test_bad_csv_says_what_is_wrong(text, message):
    with pytest.raises(DataError, match=message):
        parse_csv(text.encode(), "label", "in.csv")


def test_an_incomplete_dataset_is_not_read(tmp_path):
    store = LocalStore()
    store.put_bytes(str(tmp_path / "ds/train/shard-00000.npz"), b"partial")
    with pytest.raises(ObjectNotFound):
        read_manifest(store, str(tmp_path / "ds"))
