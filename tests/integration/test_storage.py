"""The object store (trainer/storage.py) against real S3 server processes: round trips, errors, preflight."""

from __future__ import annotations

import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.unit.test_pipelines_cli import call_cli
from tests.unit.test_storage import assert_lists_folders
from trainer.launch.local import free_port
from trainer.storage import (
    LocalStore,
    ObjectNotFound,
    S3Store,
    StoreError,
    open_store,
)

pytestmark = pytest.mark.timeout(120)

#: A store that never answers: the check waits out its 5 s limit (`serial`: tests/conftest.py).
WAITS = pytest.mark.serial


@pytest.mark.parametrize(
    ("endpoint", "env", "phrase"),
    [
        ("html200", {}, "is not an S3 API (it answered"),
        ("html200", {}, "console's port instead of the API port"),
        pytest.param(*("html502", {}, "cannot reach the object store"), marks=WAITS),
        pytest.param(*("unreachable", {}, "cannot reach the object store"), marks=WAITS),
        ("html200", {"AWS_ACCESS_KEY_ID": None, "MINIO_ACCESS_KEY": None}, "see README 'Credentials'"),
    ],
)
def test_a_store_that_is_not_s3_or_not_there_fails_preflight(
    tmp_path, monkeypatch, capsys, html_server, endpoint, env, phrase
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
    url = {
        "html200": lambda: html_server(200),
        "html502": lambda: html_server(502),
        "unreachable": lambda: f"http://127.0.0.1:{free_port()}",
    }[endpoint]()
    argv = ["run", "--local", "--store", "s3://some-bucket/x", "--s3-endpoint", url, "--run-id", "r"]
    rc, out = call_cli(argv, capsys)
    assert rc == 2, out
    assert phrase in out, out
    assert "Traceback" not in out and "configure started" not in out
    # The first request that fails reports: no probe before it waits out the check's limit as well
    # (each retry shown is of the request the error names), and retries show as warnings.
    failed = re.search(r"for ((GET|PUT|LIST|HEAD|DELETE) \S+):", out)
    retries = [line for line in out.splitlines() if "retry" in line and "of the retry budget left" in line]
    if "cannot reach" in phrase:  # a store that does not answer is retried, each retry shown
        assert failed and retries, out
    assert all("warning: " in line and failed[1] in line for line in retries), out


# Every S3 test here runs on moto and on Ceph's RADOS Gateway (tests/conftest.py).
pytestmark = pytest.mark.s3_servers("moto", "rgw")


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
    # An object's version (data.source_version's part) changes with its content, not with its reads.
    version = store.version(f"s3://{bucket}/runs/a/one.json")
    assert store.version(f"s3://{bucket}/runs/a/one.json") == version
    store.put_bytes(f"s3://{bucket}/runs/a/one.json", b"[]")
    assert store.version(f"s3://{bucket}/runs/a/one.json") != version
    store.delete(f"s3://{bucket}/runs/a/one.json")
    assert not store.exists(f"s3://{bucket}/runs/a/one.json")
    with pytest.raises(ObjectNotFound):
        store.version(f"s3://{bucket}/runs/a/one.json")


def test_s3_store_lists_folders_not_name_prefixes(bucket):
    assert_lists_folders(open_store(f"s3://{bucket}"), f"s3://{bucket}")


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


@WAITS
def test_unreachable_endpoint_is_a_store_error(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    from tests.conftest import free_port

    store = S3Store(endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StoreError, match="cannot reach the object store"):
        store.check("s3://some-bucket/x")


def test_an_s3_source_lists_as_a_local_one_does(bucket):
    """tests/unit/test_data_rules.py's source tree, plus the empty `data/` key the S3 console's
    "Create folder" makes: a source ending in '/' is a folder, never that marker (was: read as
    the one, empty, object); a bucket's root is a folder (was: refused as naming no object)."""
    from tests.unit.test_data_rules import assert_source_objects

    store = open_store(f"s3://{bucket}")
    store.put_bytes(f"s3://{bucket}/data/", b"")
    assert_source_objects(store, f"s3://{bucket}")


@pytest.mark.parametrize("key", ["dir/", "x/../b.txt", "./c.txt", "deep/./d.txt"])
def test_data_a_key_no_file_path_can_hold_is_refused_naming_it_not_left_out(bucket, s3_env, key):
    """A non-empty object whose key ends in '/', or has a '.' or '..' segment, was left out of the
    source in silence, as if a folder marker or a hidden file (a probe on RGW); an empty marker
    and hidden files still are."""
    import boto3  # minio's client refuses to write such keys; other tools do (boto3 here, as in the probe)

    from trainer.data_rules import source_listing
    from trainer.shards import DataError

    client = boto3.client(
        "s3",
        endpoint_url=s3_env.endpoint,
        region_name="us-east-1",
        aws_access_key_id=s3_env.access_key,
        aws_secret_access_key=s3_env.secret_key,
    )
    hidden = ("w/.hidden.txt", "w/.ipynb_checkpoints/x/")  # left out, as any hidden object, whatever its name
    for name, data in (("w/a.txt", b"A\n"), ("w/empty/", b""), *((name, b"H\n") for name in hidden)):
        client.put_object(Bucket=bucket, Key=name, Body=data)
    store = open_store(f"s3://{bucket}")
    assert list(source_listing(store, f"s3://{bucket}/w")) == [f"s3://{bucket}/w/a.txt"]
    client.put_object(Bucket=bucket, Key=f"w/{key}", Body=b"B\n" * 25)
    assert f"w/{key}" in [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    with pytest.raises(DataError, match=f"the object {re.escape(repr(key))} below it holds 50 bytes, but its name"):
        source_listing(store, f"s3://{bucket}/w")


def test_keys_with_a_question_mark_or_a_hash_are_listed_and_read_as_written(bucket):
    """S3 keys may hold `?` and `#` (was: refused, or a file:// path cut there, as a URL's query
    and fragment would be)."""
    from trainer.data_rules import source_objects

    store = open_store(f"s3://{bucket}")
    keys = {"corpus/a?b=1.txt": b"first", "corpus/c#1.txt": b"second", "corpus/plain.txt": b"third"}
    for key, data in keys.items():
        store.put_bytes(f"s3://{bucket}/{key}", data)
    found = source_objects(store, f"s3://{bucket}/corpus/")
    assert sorted(found) == sorted(f"s3://{bucket}/{key}" for key in keys)
    assert {uri: store.get_bytes(uri) for uri in found} == {f"s3://{bucket}/{k}": v for k, v in keys.items()}


def test_a_prefix_s_version_is_read_from_its_listing_not_one_request_per_object(bucket, monkeypatch):
    """data.source_version of a prefix of many objects: one LIST, no HEAD per object (was: a HEAD
    each, serially, under the pre-flight's 5 s: about 700 objects failed it, "cannot reach the
    object store", though the store answered)."""
    from trainer.config import load_config
    from trainer.data_rules import source_version

    store = open_store(f"s3://{bucket}")
    for i in range(30):
        store.put_bytes(f"s3://{bucket}/many/{i:03d}.txt", b"line\n")
    heads = []
    monkeypatch.setattr(S3Store, "version", lambda self, uri: heads.append(uri) or "")
    cfg = load_config(overrides={"task": "causal_lm", "data.source": f"s3://{bucket}/many/"})
    first = source_version(cfg)
    assert heads == [] and len(first) == 16
    store.put_bytes(f"s3://{bucket}/many/007.txt", b"LINE\n")  # the same size: the ETag tells
    assert source_version(cfg) != first


@pytest.mark.parametrize("size", [3000, 1000, 5000], ids=["same-size", "shorter", "longer"])
def test_an_object_replaced_while_read_in_parts_is_refused_not_mixed(bucket, size):
    """An object replaced between two ranged reads of one (data prep reads a source in 1 MiB
    parts) was read on in its new version, a dataset of two; a shorter one failed as S3's bare
    InvalidRange (a probe on RGW). Every part is read of the version the first one was."""
    from trainer.storage import ObjectChanged, read_chunks

    store, uri = open_store(f"s3://{bucket}/x"), f"s3://{bucket}/corpus.txt"
    store.put_bytes(uri, b"A" * 3000)
    assert b"".join(read_chunks(store, uri, 1024)) == b"A" * 3000  # unchanged: read whole
    chunks = read_chunks(store, uri, 1024)
    assert next(chunks) == b"A" * 1024
    store.put_bytes(uri, b"B" * size)
    with pytest.raises(ObjectChanged, match=f"{re.escape(uri)} changed while it was read"):
        list(chunks)


class _NoLocation(BaseHTTPRequestHandler):
    """An S3 endpoint whose policy grants reading one object and not `s3:GetBucketLocation`, as
    a policy for the data alone does (measured on RGW: a bucket policy of ListBucket and
    GetObject; minio asked for the location first, and every request failed as bad keys)."""

    BODY = b"the data"

    def log_message(self, *args) -> None:
        pass

    def _answer(self, body: bool) -> None:
        if "location" in self.path.split("?", 1)[-1] or "/secret" in self.path:
            error = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
            self.send_response(403)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            if body:
                self.wfile.write(error)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.BODY)))
        self.send_header("ETag", '"e1"')
        self.send_header("Last-Modified", "Mon, 07 Dec 2026 00:00:00 GMT")
        self.end_headers()
        if body:
            self.wfile.write(self.BODY)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(False)


def test_credentials_without_get_bucket_location_read_the_data(monkeypatch, tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoLocation)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "reader")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "reader-secret")
        store = S3Store(endpoint=f"http://127.0.0.1:{server.server_address[1]}")
        assert store.get_bytes("s3://corpus/data/train.txt") == b"the data"
        assert store.size("s3://corpus/data/train.txt") == 8
        # An object the policy does not grant: the permission named, not the keys blamed (they
        # are valid: wrong ones get InvalidAccessKeyId or SignatureDoesNotMatch).
        with pytest.raises(StoreError) as info:
            store.get_bytes("s3://corpus/secret/x")
        assert str(info.value).endswith(
            "refused GET s3://corpus/secret/x (AccessDenied): the credentials are valid but not allowed "
            "s3:GetObject on it; grant it in the user's or the bucket's policy"
        ), info.value
        # A download asks for the size first, a HEAD, whose refusal cannot tell wrong keys from it.
        with pytest.raises(StoreError, match=r"rejected the credentials for s3://corpus/secret/x \(AccessDenied\)"):
            store.get_file("s3://corpus/secret/x", tmp_path / "x")
    finally:
        server.shutdown()


FILL_THE_LIMIT = """
import resource, signal, sys
from trainer.storage import LocalStore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
LocalStore().put_bytes(sys.argv[1], b"x" * 100_000)
"""


def test_a_local_write_cut_short_by_the_file_system_names_the_file_and_leaves_nothing(tmp_path):
    """A write the file system stops part way (here a file size limit, `ulimit -f`; a full disk
    alike): one line naming the file, and no partial file or temporary file left."""
    import subprocess
    import sys

    dest = tmp_path / "run" / "record.json"
    done = subprocess.run([sys.executable, "-c", FILL_THE_LIMIT, str(dest)], capture_output=True, text=True, timeout=60)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last == f"trainer.storage.StoreError: cannot write {dest}: File too large", last
    assert list((tmp_path / "run").iterdir()) == []


def test_a_full_disk_under_a_local_store_names_the_file_and_says_what_to_do(tmp_path, mounts):
    """On a small tmpfs, where this machine allows one to be mounted."""
    disk = tmp_path / "disk"
    mounts.tmpfs(disk, "64k")
    dest = disk / "record.json"
    with pytest.raises(StoreError, match=rf"cannot write {re.escape(str(dest))}: No space left on device: free sp"):
        LocalStore().put_bytes(str(dest), b"x" * 1_000_000)
    assert list(disk.iterdir()) == []
