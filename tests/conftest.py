"""Shared fixtures: a real S3 server process on loopback, and process-group hygiene."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.s3server import S3Server, free_port
from tests.s3server import s3_server as start_s3_server


@pytest.fixture(scope="session")
def digits(tmp_path_factory) -> str:
    """The demo's prepared digits dataset in a local directory, shared by the session."""
    from trainer.config import load_config
    from trainer.storage import LocalStore
    from trainer.tasks.classification.data import prepare_dataset

    uri = str(tmp_path_factory.mktemp("digits") / "dataset")
    prepare_dataset(load_config().data, LocalStore(), uri)
    return uri


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto S3 server process for the whole session (tests/s3server.py)."""
    with start_s3_server() as server:
        yield server


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server's credentials and endpoint in this test's environment."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def bucket(s3_env: S3Server, request: pytest.FixtureRequest) -> str:
    """A fresh bucket per test."""
    name = "t-" + request.node.name.lower().replace("_", "-")[:40].strip("-") + f"-{free_port()}"
    s3_env.make_bucket(name)
    return name


def run_group(cmd: list[str], timeout: float, env: dict[str, str] | None = None, cwd: str | None = None):
    """Run a command in its own process group; on timeout kill the whole group and fail."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{cmd[:3]} timed out after {timeout}s; output:\n{out[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftovers such as torchrun's workers
        except ProcessLookupError:
            pass
    return proc.returncode, out
