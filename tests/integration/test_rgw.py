"""What a real S3 server checks and moto does not, on Ceph's RADOS Gateway (tests/rgwserver.py):
credentials, bucket names, and the empty ETag that answers a completed multipart upload."""

from __future__ import annotations

import os

import pytest

from trainer.checkpoint import CheckpointManager
from trainer.storage import PART_SIZE, S3Store, StoreError, open_store, parse_uri

pytestmark = pytest.mark.s3_servers("rgw")


@pytest.mark.parametrize(
    ("variable", "code"),
    [("AWS_SECRET_ACCESS_KEY", "SignatureDoesNotMatch"), ("AWS_ACCESS_KEY_ID", "InvalidAccessKeyId")],
)
def test_a_wrong_key_is_named_with_the_servers_code_and_no_secret(
    bucket, s3_env, monkeypatch, tmp_path, variable, code
):
    wrong = "WRONGwrongWRONGwrong0123456789wrongWRONG"
    monkeypatch.setenv(variable, wrong)
    store = open_store(f"s3://{bucket}/x")
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (PART_SIZE + 1))
    for attempt, named in (
        # A HEAD's answer has no body: the SDK can only call a 403 AccessDenied.
        (lambda: store.check(f"s3://{bucket}/runs"), "AccessDenied"),
        (lambda: store.get_bytes(f"s3://{bucket}/runs/a"), code),
        (lambda: store.put_file(f"s3://{bucket}/runs/big.bin", big), code),  # multipart: refused at its start
    ):
        with pytest.raises(StoreError) as info:
            attempt()
        message = str(info.value)
        assert f"rejected the credentials for s3://{bucket}/runs" in message and f"({named})" in message, message
        assert "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in message
        assert wrong not in message and s3_env.secret_key not in message


# Names RGW answered InvalidBucketName to (measured, Ceph 16.2): the store refuses every one
# itself, before any request, saying what a bucket name may be.
@pytest.mark.parametrize("name", ["a.-b", "ab-.cd", "abc..d", "192.168.1.1", "ab_c", "Abc"])
def test_a_bucket_name_the_server_refuses_is_refused_first_by_the_store(s3_server, name):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    raw = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError) as refused:
        raw.create_bucket(Bucket=name)
    assert refused.value.response["Error"]["Code"] == "InvalidBucketName"
    with pytest.raises(ValueError, match=f"invalid bucket name {name!r}.*not an IP address"):
        parse_uri(f"s3://{name}/x")


def test_multipart_uploads_work_although_completion_returns_an_empty_etag(bucket, s3_env, tmp_path):
    store = open_store(f"s3://{bucket}/x")
    assert isinstance(store, S3Store)
    payload = os.urandom(2 * PART_SIZE + 12345)  # three parts
    src = tmp_path / "big.bin"
    src.write_bytes(payload)
    # The server's behaviour this test is about: CompleteMultipartUpload answers without an ETag.
    done = s3_env.client().fput_object(bucket, "probe.bin", str(src), part_size=PART_SIZE)
    assert not done.etag
    assert s3_env.client().stat_object(bucket, "probe.bin").etag.endswith("-3")  # HEAD has it
    uri = f"s3://{bucket}/runs/big.bin"
    store.put_file(uri, src)
    assert store.size(uri) == len(payload)
    assert store.get_bytes(uri, PART_SIZE - 5, 10) == payload[PART_SIZE - 5 : PART_SIZE + 5]
    store.get_file(uri, tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == payload


def test_a_checkpoint_with_a_multipart_shard_commits_and_loads(bucket):
    """Checkpoint commit records hold sizes and SHA-256s, never ETags: a shard uploaded in parts
    (whose completion had no ETag) is verified and loaded."""
    import torch

    prefix = f"s3://{bucket}/run/checkpoints"
    weights = torch.arange(3 * PART_SIZE // 4 + 7, dtype=torch.float32)  # a shard over 2 parts
    mgr = CheckpointManager(open_store(prefix), prefix)
    mgr.save(3, {"weights": weights}, blocking=True)
    mgr.close()
    reader = CheckpointManager(open_store(prefix), prefix)
    record = reader.latest()
    assert record["step"] == 3
    assert max(part["bytes"] for part in record["parts"].values()) > PART_SIZE
    target = {"weights": torch.zeros_like(weights)}
    reader.load(record, target)
    assert torch.equal(target["weights"], weights)
