"""Every bad input gives a clear error naming the field or object and what to do: exit code 2
for user errors on the command line, a named error type at the function level, no traceback."""

from __future__ import annotations

import io
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.cli import main
from tests.s3server import free_port
from trainer.checkpoint import COMMIT, METADATA, CheckpointManager, step_dir
from trainer.config import load_config
from trainer.shards import MANIFEST, read_manifest
from trainer.storage import CorruptObject, LocalStore, join_uri
from trainer.tasks.classification.data import load_split, prepare_dataset

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
PACKAGE = str(REPO / "compiled" / "training_pipeline.yaml")


class _Answer(BaseHTTPRequestHandler):
    """Answers every request with `status` and an HTML page (a web console, a login page)."""

    status = 200

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = b"<!doctype html><html><body>MinIO Console</body></html>"
        self.send_response(type(self).status)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _reply

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def html_server():
    """URL -> an HTTP server answering HTML with a given status."""
    servers = {}

    def url(status: int) -> str:
        if status not in servers:
            handler = type(f"Answer{status}", (_Answer,), {"status": status})
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers[status] = server
        return f"http://127.0.0.1:{servers[status].server_address[1]}"

    yield url
    for server in servers.values():
        server.shutdown()


# (config text or None, extra CLI args, phrase the message must contain)
CLI_ROWS = [
    # non-finite floats, each named at load, for any float field
    ("train:\n  learning_rate: .inf\n", [], "train.learning_rate: must be a finite number"),
    ("train:\n  learning_rate: .nan\n", [], "train.learning_rate: must be a finite number"),
    ("train:\n  learning_rate: nan\n", [], "train.learning_rate: must be a finite number"),
    ("train:\n  weight_decay: .nan\n", [], "train.weight_decay: must be a finite number"),
    ("train:\n  grad_clip_norm: .inf\n", [], "train.grad_clip_norm: must be a finite number"),
    ("train:\n  peak_tflops: -.inf\n", [], "train.peak_tflops: must be a finite number"),
    ("data:\n  val_fraction: .nan\n", [], "data.val_fraction: must be a finite number"),
    ("model:\n  dropout: .nan\n", [], "model.dropout: must be a finite number"),
    ("kubernetes:\n  poll_seconds: .nan\n", [], "kubernetes.poll_seconds: must be a finite number"),
    ("store:\n  retry_budget_seconds: .inf\n", [], "store.retry_budget_seconds: must be a finite number"),
    # the new fields' ranges
    ("store:\n  retry_budget_seconds: -1\n", [], "store.retry_budget_seconds: must be >= 0"),
    ("store:\n  read_timeout_seconds: 0\n", [], "store.read_timeout_seconds: must be > 0"),
    ("store:\n  connect_timeout_seconds: -2\n", [], "store.connect_timeout_seconds: must be > 0"),
    ("train:\n  max_consecutive_skips: 0\n", [], "train.max_consecutive_skips: must be >= 1"),
    # '.' and '..' in keys named by the field
    ("checkpoint:\n  uri: s3://bucket/a/../b\n", [], "checkpoint.uri: storage URI 's3://bucket/a/../b' has a"),
    ("store:\n  uri: s3://bucket/./x\n", [], "store.uri: storage URI 's3://bucket/./x' has a '.' or '..'"),
    ("data:\n  source: s3://bucket/../x.csv\n", [], "data.source: storage URI"),
    (None, ["--store", "s3://bucket/x/../y"], "store.uri: storage URI 's3://bucket/x/../y' has a"),
    (None, ["--store", "s3://bucket/x/.."], "'.' or '..' path segment"),
    # command-line arguments
    (None, ["--config", "missing.yaml"], "--config missing.yaml: cannot read the config file (No such file"),
    (None, ["--config", "."], "--config .: cannot read the config file (Is a directory)"),
    ("- a\n- list\n", [], "c.yaml: must hold a mapping"),
    ("train: [unclosed\n", [], "c.yaml: not valid YAML"),
    ("train:\n  epochs: 2\n  learning_rat: 0.1\n", [], "train.learning_rat: unknown key"),
    (None, ["--s3-endpoint", "ftp://host:9000"], "store.endpoint: must be a URL starting with http://"),
    (None, ["--run-id", "../escape"], "--run-id: must be 1-63 letters"),
    (None, ["--run-id", "a/b"], "--run-id: must be 1-63 letters"),
    (None, ["--run-id", "x" * 64], "--run-id: must be 1-63 letters"),
]


def call_cli(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize(("config", "args", "phrase"), CLI_ROWS)
def test_bad_cli_input_is_one_clear_line(tmp_path, monkeypatch, capsys, config, args, phrase):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--local"]
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        argv += ["--config", "c.yaml"]
    rc, out = call_cli(argv + args, capsys)
    assert rc == 2, out
    assert phrase in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "kftrain-outputs").exists()  # stopped before anything was written


def test_run_without_local_is_exit_2(capsys):
    rc, out = call_cli(["run"], capsys)
    assert rc == 2 and "only --local is supported" in out


@pytest.mark.parametrize(
    ("endpoint", "env", "phrase"),
    [
        ("html200", {}, "is not an S3 API (it answered"),
        ("html200", {}, "console's port instead of the API port"),
        ("html502", {}, "cannot reach the object store"),
        ("unreachable", {}, "cannot reach the object store"),
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


def test_the_readme_has_the_credentials_section_errors_point_to():
    readme = (REPO / "README.md").read_text()
    assert "\n### Credentials\n" in readme or "\n## Credentials\n" in readme


@pytest.mark.parametrize(
    ("status", "phrase"),
    [
        (None, "cannot reach the KFP API at"),
        (401, "rejected the request (HTTP 401"),
        (403, "rejected the request (HTTP 403"),
    ],
)
def test_submit_to_an_unreachable_or_rejecting_host_is_one_line(capsys, html_server, status, phrase):
    host = f"http://127.0.0.1:{free_port()}" if status is None else html_server(status)
    rc, out = call_cli(["submit", "--host", host, "--package", PACKAGE], capsys)
    assert rc == 2, out
    assert phrase in out, out
    assert "Traceback" not in out and out.strip().count("\n") == 0


# -- corrupt data and checkpoints: named by their URI, never chosen ----------------------------


@pytest.fixture
def dataset(tmp_path) -> str:
    uri = str(tmp_path / "dataset")
    prepare_dataset(load_config().data, LocalStore(), uri)
    return uri


def _truncate(uri: str, keep: int) -> None:
    path = Path(uri)
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize(
    ("damage", "read", "object_name", "phrase"),
    [
        (lambda d: _truncate(join_uri(d, MANIFEST), 100), "manifest", MANIFEST, "not a valid JSON document"),
        (lambda d: Path(join_uri(d, MANIFEST)).write_text("[1, 2]"), "manifest", MANIFEST, "not a kftrain dataset"),
        (lambda d: Path(join_uri(d, MANIFEST)).write_text("{}"), "manifest", MANIFEST, "no 'splits'"),
        (lambda d: _truncate(join_uri(d, "train/rows-00000.npz"), 200), "train", "train/rows-00000.npz", "200 bytes"),
        (lambda d: Path(join_uri(d, "val/rows-00000.npz")).write_bytes(b""), "val", "val/rows-00000.npz", "0 bytes"),
        (
            lambda d: Path(join_uri(d, "test/rows-00000.npz")).write_bytes(_npz(z=np.zeros(2))),
            "test",
            "test/rows-00000.npz",
            "the manifest says",
        ),
    ],
)
def test_corrupt_dataset_objects_are_named_by_uri(dataset, damage, read, object_name, phrase):
    store = LocalStore()
    manifest = read_manifest(store, dataset) if read != "manifest" else None
    damage(dataset)
    with pytest.raises(CorruptObject) as err:
        if read == "manifest":
            read_manifest(store, dataset)
        else:
            load_split(store, dataset, read, manifest)
    msg = str(err.value)
    assert join_uri(dataset, object_name) in msg and phrase in msg, msg
    assert "rerun" in msg  # and what to do


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_a_corrupt_token_shard_is_named_by_uri(tmp_path):
    """A shard that matches its manifest entry yet does not parse (written corrupt)."""
    import hashlib

    from trainer.shards import ShardInfo, read_shard

    store = LocalStore()
    uri = str(tmp_path / "ds")
    raw = b"\x93NUMPY garbage"
    store.put_bytes(join_uri(uri, "train/tokens-00000.npy"), raw)
    info = ShardInfo("train/tokens-00000.npy", 10, len(raw), hashlib.sha256(raw).hexdigest())
    with pytest.raises(CorruptObject, match=r"tokens-00000.npy is not a valid token shard"):
        read_shard(store, uri, info)


@pytest.mark.parametrize(
    "commit",
    [
        b'{"step": 9}',  # no parts
        b'{"step": 9, "parts": {}}',  # no entry for DCP's index
        b'{"step": 9, "parts": {".metadata": {"bytes": "12"}}}',  # no hash, size not a number
        b'{"step": 9, "par',  # truncated
        b"[]",
    ],
)
def test_a_commit_record_without_parts_is_an_incomplete_checkpoint(tmp_path, caplog, commit):
    store, prefix = LocalStore(), str(tmp_path / "ckpt")
    mgr = CheckpointManager(store, prefix)
    mgr.save(5, {"w": torch.ones(2)}, blocking=True)
    store.put_bytes(join_uri(step_dir(prefix, 9), METADATA), b"whatever")
    store.put_bytes(join_uri(step_dir(prefix, 9), COMMIT), commit)
    with caplog.at_level(logging.WARNING, logger="kftrain.checkpoint"):
        assert mgr.latest()["step"] == 5  # never chosen
    assert step_dir(prefix, 9) in caplog.text and "incomplete" in caplog.text


def test_skip_gives_up_after_max_consecutive_skips(digits, tmp_path):
    from trainer.distributed import DistEnv
    from trainer.tasks import get_task
    from trainer.train import NonFiniteLoss, run_training

    class Diverged(type(get_task("classification"))):
        def loss(self, model, batch):
            return super().loss(model, batch) * float("nan")

    cfg = load_config(
        overrides={
            "train.on_nonfinite": "skip",
            "train.max_consecutive_skips": 4,
            "train.epochs": 1,
            "checkpoint.enabled": False,
        }
    )
    with pytest.raises(NonFiniteLoss) as err:
        run_training(cfg, digits, str(tmp_path / "model"), DistEnv(), task=Diverged())
    msg = str(err.value)
    assert "4 updates in a row skipped" in msg and "optimizer step 4" in msg and "rank" in msg, msg
    assert "train.max_consecutive_skips 4" in msg
    # Nothing written as if it had succeeded (the live TensorBoard curves may be there: they show the divergence).
    assert not any(
        (tmp_path / "model" / name).exists() for name in ("model.json", "model.safetensors", "training.json")
    )


def test_the_trainer_process_exits_with_a_message_not_a_traceback(dataset, tmp_path):
    import subprocess
    import sys

    from trainer.config import config_to_json

    _truncate(join_uri(dataset, "train/rows-00000.npz"), 300)
    cfg = load_config(overrides={"checkpoint.enabled": False, "train.epochs": 1})
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--config-json", config_to_json(cfg)]
        + ["--dataset-uri", dataset, "--model-uri", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "training failed: " in out and join_uri(dataset, "train/rows-00000.npz") in out
    assert "Traceback" not in out
