import os

import pytest

from trainer.storage import (
    LocalStore,
    Location,
    ObjectNotFound,
    S3Store,
    StoreError,
    join_uri,
    open_store,
    parse_uri,
)

# Every S3 test here runs on moto and on Ceph's RADOS Gateway (tests/conftest.py).
pytestmark = pytest.mark.s3_servers("moto", "rgw")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://my-bucket/a/b.txt", Location("s3", "my-bucket", "a/b.txt")),
        ("minio://mlpipeline/v2/artifacts", Location("minio", "mlpipeline", "v2/artifacts")),
        ("s3://my-bucket", Location("s3", "my-bucket", "")),
        ("file:///tmp/x/y", Location("file", "", "/tmp/x/y")),
        ("/tmp/x", Location("file", "", "/tmp/x")),
    ],
)
def test_parse_uri(uri, expected):
    assert parse_uri(uri) == expected


def test_relative_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_uri("out/x").key == os.path.join(str(tmp_path), "out/x")


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "empty storage URI"),
        ("gs://bucket/x", "unsupported storage URI scheme 'gs'"),
        ("s3://ab/x", "invalid bucket name 'ab'"),
        ("s3://Bucket/x", "invalid bucket name 'Bucket'"),
        ("s3:///x", "invalid bucket name ''"),
        ("s3://a.-b/x", "invalid bucket name 'a.-b'"),
        ("s3://ab-.cd/x", "invalid bucket name 'ab-.cd'"),
        ("s3://10.0.0.1/x", "invalid bucket name '10.0.0.1'"),
        ("s3://bucket/a//b", "empty path segment"),
        ("s3://bucket/a?x=1", "query or fragment"),
        ("file://host/x", "names a host"),
    ],
)
def test_malformed_uris_are_rejected_with_the_accepted_forms(uri, message):
    with pytest.raises(ValueError, match=None) as info:
        parse_uri(uri)
    assert message in str(info.value)


def test_join_uri():
    assert join_uri("s3://b/prefix/", "run", "/model/") == "s3://b/prefix/run/model"


def test_local_store_round_trip(tmp_path):
    store = LocalStore()
    root = str(tmp_path / "root")
    store.check(root)
    store.put_bytes(join_uri(root, "a/b.bin"), b"hello")
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    store.put_file(join_uri(root, "c.bin"), src)
    assert store.get_bytes(join_uri(root, "a/b.bin")) == b"hello"
    assert store.list(root) == [join_uri(root, "a/b.bin"), join_uri(root, "c.bin")]
    store.get_file(join_uri(root, "c.bin"), tmp_path / "dl.bin")
    assert (tmp_path / "dl.bin").read_bytes() == b"x" * 1000
    store.delete(join_uri(root, "c.bin"))
    assert not store.exists(join_uri(root, "c.bin"))
    with pytest.raises(ObjectNotFound):
        store.get_bytes(join_uri(root, "missing"))


def test_s3_store_round_trip_with_multipart_upload(bucket, tmp_path):
    store = open_store(f"s3://{bucket}/x")
    assert isinstance(store, S3Store)
    store.check(f"s3://{bucket}/runs")
    big = tmp_path / "big.bin"
    payload = os.urandom(11 * 1024 * 1024)  # > 10 MB: above the 8 MiB part size
    big.write_bytes(payload)
    store.put_file(f"s3://{bucket}/runs/big.bin", big)
    # S3 marks an object assembled from parts with a '-<parts>' ETag suffix.
    assert store._client.stat_object(bucket, "runs/big.bin").etag.endswith("-2")
    store.get_file(f"s3://{bucket}/runs/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == payload
    store.put_bytes(f"s3://{bucket}/runs/a/one.json", b"{}")
    assert store.list(f"s3://{bucket}/runs") == [
        f"s3://{bucket}/runs/a/one.json",
        f"s3://{bucket}/runs/big.bin",
    ]
    assert store.list(f"s3://{bucket}/elsewhere") == []
    assert store.exists(f"s3://{bucket}/runs/a/one.json")
    store.delete(f"s3://{bucket}/runs/a/one.json")
    assert not store.exists(f"s3://{bucket}/runs/a/one.json")


def test_s3_missing_key(bucket):
    store = open_store(f"s3://{bucket}/x")
    with pytest.raises(ObjectNotFound, match=f"no object at s3://{bucket}/nothing/here"):
        store.get_bytes(f"s3://{bucket}/nothing/here")
    assert not store.exists(f"s3://{bucket}/nothing/here")


def test_s3_missing_bucket_says_what_to_fix(s3_env):
    store = open_store("s3://no-such-bucket/x")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist at http://127.0.0.1"):
        store.check("s3://no-such-bucket/x")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist"):
        store.get_bytes("s3://no-such-bucket/x")


def test_s3_object_operations_on_a_bucket_uri_say_the_key_is_missing(bucket):
    store = open_store(f"s3://{bucket}")
    for op in (store.get_bytes, store.size, store.exists, store.delete, lambda uri: store.put_bytes(uri, b"x")):
        with pytest.raises(StoreError, match=f"'s3://{bucket}' names a bucket, not an object"):
            op(f"s3://{bucket}")


@pytest.mark.parametrize("which", ["AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"])
def test_s3_wrong_credentials_are_named_and_not_echoed(bucket, monkeypatch, which):
    monkeypatch.setenv(which, "AKIAWRONGWRONGWRONG1")
    store = open_store(f"s3://{bucket}/x")
    with pytest.raises(StoreError) as info:
        store.check(f"s3://{bucket}/x")
    message = str(info.value)
    assert "rejected the credentials" in message
    assert "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in message
    assert "AKIAWRONGWRONGWRONG1" not in message


def test_s3_without_credentials_says_which_variables(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "MINIO_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StoreError, match="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        S3Store(endpoint="http://127.0.0.1:1")


def test_unreachable_endpoint_is_a_store_error(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    from tests.conftest import free_port

    store = S3Store(endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StoreError, match="cannot reach the object store"):
        store.check("s3://some-bucket/x")


@pytest.mark.parametrize("name", ["events.out.tfevents.1.host", "rows-00000.npz", "COMMIT.json"])
def test_a_local_write_in_progress_never_looks_like_its_object(tmp_path, name):
    """A writer SIGKILLed mid-write leaves its temporary file behind: it must not be mistaken for
    the object by readers that glob the folder (TensorBoard reads every `*tfevents*` file)."""
    dest = tmp_path / name
    seen = []

    def write(tmp):
        seen.append(tmp.name)
        tmp.write_bytes(b"partial")
        raise KeyboardInterrupt  # interrupted mid-write

    with pytest.raises(KeyboardInterrupt):
        LocalStore._replace_atomically(dest, write)
    assert name not in seen[0] and seen[0].startswith(".kftrain-") and seen[0].endswith(".tmp")
    assert list(tmp_path.iterdir()) == []  # cleaned up when it could be
    LocalStore().put_bytes(str(dest), b"whole")
    assert LocalStore().list(str(tmp_path)) == [str(dest)]
