"""Classification data prep against a real S3 server process: a CSV in S3 is read in ranged reads
to the same dataset as a local copy."""

from tests.unit.test_tasks_classification_data import make_csv, put
from trainer.config import DataConfig
from trainer.shards import read_manifest
from trainer.storage import LocalStore, open_store
from trainer.tasks.classification.data import prepare_dataset


def test_a_csv_in_s3_is_read_in_ranged_reads_to_the_same_dataset(tmp_path, bucket):
    text = make_csv(400)[0]
    s3 = open_store(f"s3://{bucket}/in.csv")
    s3.put_bytes(f"s3://{bucket}/in.csv", text.encode())
    local = str(tmp_path / "local")
    prepare_dataset(DataConfig(source=put(tmp_path, text)), LocalStore(), local)
    remote = prepare_dataset(DataConfig(source=f"s3://{bucket}/in.csv"), s3, f"s3://{bucket}/ds", chunk_bytes=1000)
    want = read_manifest(LocalStore(), local)
    assert remote["splits"] == want["splits"] and remote["normalization"] == want["normalization"]
