"""The S3 store rides out outages: a real moto server behind a TCP proxy we switch to refuse or hang."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tests.faultproxy import FaultProxy
from tests.integration.test_checkpoint import reference_run, resume_config
from trainer.checkpoint import CheckpointManager
from trainer.config import load_config
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.storage import LocalStore, ObjectNotFound, RetryPolicy, S3Store, StoreError, join_uri, open_store
from trainer.tasks.classification.data import prepare_dataset

pytestmark = [pytest.mark.serial, pytest.mark.timeout(240)]

SHORT = RetryPolicy(budget_s=3.0, connect_timeout_s=1.0, read_timeout_s=1.0, first_backoff_s=0.2, max_backoff_s=1.0)


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env.endpoint.removeprefix("http://")) as p:
        yield p


def outage(proxy: FaultProxy, mode: str, seconds: float) -> threading.Thread:
    """Put the proxy in `mode` now and back to `pass` after `seconds` (in the background)."""
    proxy.set_mode(mode)
    t = threading.Timer(seconds, proxy.set_mode, args=("pass",))
    t.start()
    return t


class _Flaky(BaseHTTPRequestHandler):
    """Answers the first `failures` requests with an S3 error status, then serves b'hello'."""

    failures: list[tuple[int, str]] = []
    seen = 0

    def _answer(self, body: bool) -> None:
        cls = type(self)
        cls.seen += 1
        if cls.failures:
            status, code = cls.failures.pop(0)
            xml = f"<Error><Code>{code}</Code><Message>try later</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(xml)))
            self.end_headers()
            self.wfile.write(xml)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", "5")
        self.end_headers()
        if body:
            self.wfile.write(b"hello")

    def do_GET(self):
        self._answer(True)

    def log_message(self, *args):
        pass


# -- a 15 s outage during real 2-process training with checkpoints -----------------------------


def outage_config(endpoint: str, prefix: str):
    return load_config(
        overrides={
            "model.dropout": 0.1,
            "train.epochs": 3,  # test_checkpoint.resume_config's training, whose reference run this reads
            "train.log_interval_steps": 1000,
            "train.deterministic": True,
            "store.endpoint": endpoint,
            "store.read_timeout_seconds": 3.0,  # hung connections are cut quickly, then retried
            "store.connect_timeout_seconds": 2.0,
            "checkpoint.uri": prefix,
            "checkpoint.interval_steps": 5,
            "checkpoint.keep_last": 2,
        }
    )


@pytest.fixture
def reference_weights(shared):
    """The uninterrupted run of the same training config on a local directory: test_checkpoint.py's
    DDP reference, built once per session (outage_config differs from it only in its store and
    checkpoint settings, which do not change the weights)."""
    from safetensors.torch import load

    from trainer.config import to_dict

    ours, theirs = to_dict(outage_config("http://unused:9000", "p")), to_dict(resume_config("p"))
    assert {k: v for k, v in ours.items() if k not in ("checkpoint", "store")} == {
        k: v for k, v in theirs.items() if k not in ("checkpoint", "store")
    }
    _, model_uri = reference_run(shared, {})
    return load(LocalStore().get_bytes(join_uri(model_uri, "model.safetensors")))


@pytest.mark.parametrize(
    ("mode", "cause"),
    [("refuse", "Connection refused"), ("hang", "timed out")],
)
def test_an_exhausted_budget_names_the_object_and_the_cause(proxy, bucket, mode, cause):
    store = S3Store(endpoint=proxy.url, policy=SHORT)
    uri = f"s3://{bucket}/ckpt/step-00000007/state.pt"
    store.put_bytes(uri, b"x")
    proxy.set_mode(mode)
    t0 = time.monotonic()
    with pytest.raises(StoreError) as err:
        store.get_bytes(uri)
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    assert uri in msg and cause in msg and "store.retry_budget_seconds" in msg, msg
    # The budget is spent, then one more attempt at most: a hung connection is cut by the read
    # timeout (1 s here), not after minio's default 300 s.
    assert SHORT.budget_s <= elapsed < SHORT.budget_s + SHORT.read_timeout_s + 2.5, elapsed


@pytest.mark.parametrize("mode", ["refuse", "hang"])
@pytest.mark.parametrize("op", ["put", "get", "list", "exists"])
def test_a_short_outage_is_ridden_out_by_every_operation(proxy, bucket, mode, op):
    policy = RetryPolicy(budget_s=20, connect_timeout_s=1, read_timeout_s=1, first_backoff_s=0.2, max_backoff_s=1)
    store = S3Store(endpoint=proxy.url, policy=policy)
    uri = f"s3://{bucket}/data/shard-00000.npz"
    store.put_bytes(uri, b"payload")
    timer = outage(proxy, mode, 2.5)
    t0 = time.monotonic()
    result = {
        "put": lambda: store.put_bytes(uri, b"payload"),
        "get": lambda: store.get_bytes(uri),
        "list": lambda: store.list(f"s3://{bucket}/data"),
        "exists": lambda: store.exists(uri),
    }[op]()
    timer.join()
    assert time.monotonic() - t0 >= 2.0  # it did wait the outage out
    assert result in (None, b"payload", [uri], True)
    assert store.get_bytes(uri) == b"payload"


def test_definite_answers_fail_at_once(proxy, bucket, monkeypatch):
    store = S3Store(endpoint=proxy.url, policy=RetryPolicy(budget_s=60))
    rows = [
        (lambda: store.get_bytes(f"s3://{bucket}/missing"), ObjectNotFound, "no object at"),
        (lambda: store.get_bytes("s3://no-such-bucket-kft/x"), StoreError, "does not exist"),
        (lambda: fresh().put_bytes(f"s3://{bucket}/x", b"x"), StoreError, "rejected the credentials"),
    ]

    def fresh() -> S3Store:  # a client caches its keys: a new one reads the wrong key just set
        return S3Store(endpoint=proxy.url, policy=RetryPolicy(budget_s=60))

    for call, error, phrase in rows:
        if phrase == "rejected the credentials":
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        t0 = time.monotonic()
        with pytest.raises(error, match=phrase):
            call()
        assert time.monotonic() - t0 < 15  # no retrying a final answer (retries would go on for the 60 s budget)


@pytest.mark.parametrize(
    "failures",
    [[(503, "SlowDown")] * 3, [(500, "InternalError"), (503, "ServiceUnavailable")], [(502, "BadGateway")]],
)
def test_5xx_and_slowdown_are_retried(monkeypatch, failures):
    _Flaky.failures, _Flaky.seen = list(failures), 0
    with misbehaving_s3(
        monkeypatch, _Flaky, RetryPolicy(budget_s=20, first_backoff_s=0.05, max_backoff_s=0.2)
    ) as store:
        assert store.get_bytes("s3://flaky-bucket/obj") == b"hello"
        assert _Flaky.seen == len(failures) + 1


@contextlib.contextmanager
def misbehaving_s3(monkeypatch, handler: type[BaseHTTPRequestHandler], policy: RetryPolicy) -> Iterator[S3Store]:
    """An S3Store on a local HTTP server whose `handler` answers as a misbehaving S3 would (a
    stand-in for the answers no real server gives on demand), shut down after."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield S3Store(endpoint=f"http://127.0.0.1:{server.server_address[1]}", region="us-east-1", policy=policy)
    finally:
        server.shutdown()


class _HangsMidUpload(BaseHTTPRequestHandler):
    """Starts a multipart upload, then never answers a part: a store that hangs mid-upload."""

    released = threading.Event()
    parts = 0

    def do_POST(self):  # CreateMultipartUpload (?uploads)
        xml = b"<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>u1</UploadId>"
        xml += b"</InitiateMultipartUploadResult>"
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        self.wfile.write(xml)

    def do_PUT(self):  # UploadPart: hangs
        type(self).parts += 1
        type(self).released.wait(60)

    def do_DELETE(self):  # AbortMultipartUpload
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_file_put_under_a_deadline_ends_by_it_when_the_store_hangs_mid_upload(monkeypatch, tmp_path):
    """A stopped run's last log upload (a file over PART_SIZE: a multipart upload) gives up at the
    stop's deadline (was: minio sent the parts from threads of its own, which the deadline did not
    reach, and each waited out the read timeout)."""
    from trainer.storage import PART_SIZE, check_deadline

    path = tmp_path / "log.txt"
    path.write_bytes(b"x" * (2 * PART_SIZE + 1))
    _HangsMidUpload.released.clear()
    policy = RetryPolicy(budget_s=60, connect_timeout_s=5, read_timeout_s=20)
    try:
        with misbehaving_s3(monkeypatch, _HangsMidUpload, policy) as store:
            t0 = time.monotonic()
            with pytest.raises(StoreError) as err, check_deadline(2.0):
                store.put_file("s3://bucket/runs/r/log.txt", path)
            elapsed = time.monotonic() - t0
    finally:
        _HangsMidUpload.released.set()  # the handler threads the server leaves hanging
    assert _HangsMidUpload.parts >= 1  # it did hang mid-upload, not at its start
    assert elapsed < 6, elapsed
    assert "limit of 2s" in str(err.value), err.value


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["refuse", "hang"])
def test_training_survives_a_15s_store_outage_and_ends_equal(proxy, bucket, reference_weights, mode):
    from safetensors.torch import load

    root = f"s3://{bucket}/run"
    direct = open_store(root)
    prepare_dataset(load_config().data, direct, join_uri(root, "dataset"))
    prefix = join_uri(root, "ckpt")
    cfg = outage_config(proxy.url, prefix)
    lines: list[str] = []
    spec = replace(
        training_job(cfg, f"outage-{mode}", join_uri(root, "dataset"), join_uri(root, "model")), timeout_s=300
    )
    backend = LocalBackend(sink=lines.append)
    backend.submit(spec)
    mgr = CheckpointManager(direct, prefix)  # watches the store directly, not through the proxy
    deadline = time.monotonic() + 120
    while not mgr.committed_steps():
        assert time.monotonic() < deadline, "no checkpoint appeared:\n" + "\n".join(lines[-30:])
        time.sleep(0.05)
    timer = outage(proxy, mode, 15.0)
    try:
        backend.wait(spec)
    finally:
        timer.cancel()
        proxy.set_mode("pass")
        backend.cancel(spec)
    retried = [line for line in lines if "retry" in line and "retry budget left" in line]
    assert retried, "the outage never hit a store call:\n" + "\n".join(lines[-40:])
    got = load(direct.get_bytes(join_uri(root, "model", "model.safetensors")))
    assert got.keys() == reference_weights.keys()
    for name in got:
        assert torch.equal(got[name], reference_weights[name]), name
