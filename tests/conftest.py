"""Shared fixtures: real S3 server processes on loopback, and process-group hygiene.

Tests that use `s3_server` (directly or through `s3_env` / `bucket`) run against moto. Marked
``@pytest.mark.s3_servers("moto", "rgw")`` they run once per server named; "rgw" is Ceph's RADOS
Gateway (tests/rgwserver.py), which checks what moto does not. KFTRAIN_S3_SERVERS=rgw (or moto,rgw)
runs the unmarked S3 tests on the servers it lists.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.rgwserver import RGWUnavailable
from tests.rgwserver import rgw_server as start_rgw_server
from tests.s3server import S3Server, free_port
from tests.s3server import s3_server as start_s3_server

S3_SERVERS = ("moto", "rgw")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One run per S3 server named by the test's `s3_servers` mark, or for unmarked tests by
    KFTRAIN_S3_SERVERS (default: moto alone, unparametrized)."""
    if "s3_server" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("s3_servers")
    if marker:
        names = list(marker.args)
    else:
        names = [n.strip() for n in os.environ.get("KFTRAIN_S3_SERVERS", "").split(",") if n.strip()]
    for name in names:
        if name not in S3_SERVERS:
            raise pytest.UsageError(f"unknown S3 server {name!r}: one of {', '.join(S3_SERVERS)}")
    if names:
        metafunc.parametrize("s3_server", names, indirect=True)


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
def moto_server() -> Iterator[S3Server]:
    """A moto S3 server process for the whole session (tests/s3server.py)."""
    with start_s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def rgw_server() -> Iterator[S3Server]:
    """Ceph's RADOS Gateway for the whole session (tests/rgwserver.py); skips, saying why, where it
    cannot run, unless KFTRAIN_REQUIRE_RGW=1 (CI, once it installed the packages) makes that a failure."""
    try:
        with start_rgw_server() as server:
            yield server
    except RGWUnavailable as exc:
        if os.environ.get("KFTRAIN_REQUIRE_RGW") == "1":
            pytest.fail(f"KFTRAIN_REQUIRE_RGW=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture
def s3_server(request: pytest.FixtureRequest) -> S3Server:
    """The S3 server this test runs against: moto unless parametrized (see the module docstring)."""
    name = getattr(request, "param", "moto")
    return request.getfixturevalue(f"{name}_server")


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server's credentials and endpoint in this test's environment."""
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def bucket(s3_env: S3Server, request: pytest.FixtureRequest) -> str:
    """A fresh bucket per test."""
    # Bucket names are 3-63 lower-case letters, digits and '-' (RGW enforces it; moto does not).
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"t-{stem}-{free_port()}"
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
