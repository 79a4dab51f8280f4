"""A real S3 server process (moto) on loopback with authentication on, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainer.launch.local import free_port


@dataclass
class S3Server:
    """Where the server listens and the access key of its one user; `kind` is "moto" or "rgw"."""

    endpoint: str
    access_key: str
    secret_key: str
    kind: str = "moto"

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def client(self):
        from minio import Minio

        return Minio(
            self.endpoint.removeprefix("http://"), access_key=self.access_key, secret_key=self.secret_key, secure=False
        )

    def make_bucket(self, name: str) -> None:
        client = self.client()
        if not client.bucket_exists(name):
            client.make_bucket(name)


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """Run `moto_server` on a free port; its first 3 calls (creating the IAM user) skip auth."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"},
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
