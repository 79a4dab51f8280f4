"""Shared fixtures: a real S3 server process on loopback, and process-group hygiene."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A moto S3 server process with authentication on: wrong keys are really rejected."""

    endpoint: str
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def make_bucket(self, name: str) -> None:
        from minio import Minio

        client = Minio(
            self.endpoint.removeprefix("http://"),
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
        )
        if not client.bucket_exists(name):
            client.make_bucket(name)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """Start `moto_server` on a free loopback port; the first 3 calls (IAM set-up) skip auth."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="kftrain")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="kftrain", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="kftrain")["AccessKey"]
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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
