from pathlib import Path

import numpy as np

from trainer.config import DataConfig
from trainer.shards import read_manifest
from trainer.storage import LocalStore, open_store
from trainer.tasks.classification.data import prepare_dataset


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


def test_a_csv_in_s3_is_read_in_ranged_reads_to_the_same_dataset(tmp_path, bucket):
    text = make_csv(400)[0]
    s3 = open_store(f"s3://{bucket}/in.csv")
    s3.put_bytes(f"s3://{bucket}/in.csv", text.encode())
    local = str(tmp_path / "local")
    prepare_dataset(DataConfig(source=put(tmp_path, text)), LocalStore(), local)
    remote = prepare_dataset(DataConfig(source=f"s3://{bucket}/in.csv"), s3, f"s3://{bucket}/ds", chunk_bytes=1000)
    want = read_manifest(LocalStore(), local)
    assert remote["splits"] == want["splits"] and remote["normalization"] == want["normalization"]
