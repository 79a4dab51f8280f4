"""Shared fixtures: real S3 server processes on loopback, process-group hygiene, and the fixtures
both tiers (or several files) use: datasets, tokenizers, an HTML-answering HTTP server.

Tests that use `s3_server` (directly or through `s3_env` / `bucket`) run against moto. Marked
``@pytest.mark.s3_servers("moto", "rgw")`` they run once per server named; "rgw" is Ceph's RADOS
Gateway (tests/rgwserver.py), which checks what moto does not; "strict" is RGW where it runs and
moto elsewhere (for a run too costly to repeat per server: RGW refuses all that moto refuses).
KFTRAIN_S3_SERVERS=rgw (or moto,rgw) runs the unmarked S3 tests on the servers it lists.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.rgwserver import RGWUnavailable
from tests.rgwserver import rgw_server as start_rgw_server
from tests.s3server import S3Server, free_port
from tests.s3server import s3_server as start_s3_server
from trainer.launch.local import run_captured

S3_SERVERS = ("moto", "rgw", "strict")

# torch in one thread per process, in the xdist workers and in every process the tests start
# (they inherit the environment; the training replicas get job.omp_num_threads anyway): the
# workers already fill the cores, and more threads than cores spin against each other. On the
# 2-core CI machine torch's default (one thread per core) doubled the CPU time of torch work:
# tests/unit/test_train.py took 44 CPU-s with it and 21 with one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks it finds then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on RGW are `serial` too (one RGW for the session, not one per worker). Every `serial`
    test joins one xdist group, so under `-n N --dist loadgroup` they run one after another on one
    worker (mostly waiting: out a time limit, on outages, on a CLI to be killed) beside the other
    workers' tests, whose processes get both cores meanwhile (two workers waiting at once leave the
    machine idle: a third worker costs more in contention than it saves), and they come first, so
    the group starts at once rather than last, alone; then the `slow` tests, so that the last tests
    to be handed out are short ones and no worker waits alone on a long one."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("s3_server") in ("rgw", "strict"):
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("serial"))
    items.sort(key=lambda item: (not item.get_closest_marker("serial"), not item.get_closest_marker("slow")))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `--dist loadgroup` a `serial` test carries its group in its id (xdist's own mark of it);
    without it the group silently does not exist (marks added after xdist read them; pytest 9.2's
    node ids, pytest-xdist#1386), and two workers would wait out their time limits at once, or both
    start an RGW: fail, naming why, rather than run so."""
    if getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("serial") and "@" not in item.nodeid:
        pytest.fail(
            "this serial test is outside its xdist group: see tests/conftest.py and the pytest pin in pyproject.toml"
        )


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_pytests_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every temporary file of the tests and of the processes they start goes under pytest's own
    folder, which pytest prunes: each kfp.local step writes its component's code to a `mktemp -d`
    folder that nothing removes (`kftrain run` gives its steps a TMPDIR of its own; the tests that
    call kfp.local directly do not), and a thousand of them piled up in /tmp."""
    patch = pytest.MonkeyPatch()
    patch.setenv("TMPDIR", str(tmp_path_factory.mktemp("tmpdir")))
    patch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    yield
    patch.undo()


@pytest.fixture(scope="session", autouse=True)
def _stop_signals_as_a_terminal_gives_them() -> Iterator[None]:
    """SIGINT and SIGHUP reach the tests' processes as under a terminal, however the suite was
    started: `nohup`, or `&` in a script (no job control), leaves them ignored, and every process
    the tests start would inherit that (kftrain keeps an ignored stop signal ignored, as `nohup`
    asks). The tests of `nohup` ignore them themselves."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGHUP)}
    if before[signal.SIGINT] == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if before[signal.SIGHUP] == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session")
def digits(shared) -> str:
    """The demo's prepared digits dataset, built once per test session (across xdist workers):
    read-only (`dataset` gives a test its own copy to damage)."""
    from tests.jobs import shared_digits

    return shared_digits(shared)


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[Path], None]], Path]:
    """`shared(key, build)` -> a folder that `build(folder)` filled, once per test session: under
    pytest-xdist the workers share it (the first to ask builds it, holding a file lock; the others
    wait for it), so an expensive result (a reference training run) is computed once, not once per
    test or per worker. Treat it as read-only: copy it first to change it. A build that fails leaves
    nothing behind, and the next test to ask tries again."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above the workers' own
    root = base / "shared"
    root.mkdir(exist_ok=True)

    def get(key: str, build: Callable[[Path], None]) -> Path:
        folder, done = root / key, root / f"{key}.done"
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                done.touch()
        return folder

    return get


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
    if name == "strict":
        try:
            return request.getfixturevalue("rgw_server")
        except pytest.skip.Exception:  # RGW cannot run here (under KFTRAIN_REQUIRE_RGW=1 that fails instead)
            return request.getfixturevalue("moto_server")
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
    """Run a command in its own process group (killed after it, taking leftovers such as torchrun's
    workers); on timeout fail with its output."""
    try:
        return run_captured(cmd, timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{cmd[:3]} timed out after {timeout}s; output:\n{(exc.output or '')[-4000:]}")


def run_ranks(code: str, world: int, timeout: float) -> list[tuple[int, str]]:
    """Python `code` as `world` plain rank processes with the environment torchrun gives its ranks
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each in its own session, killed
    after; each one's (exit code, output)."""
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={
                **os.environ,
                "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                **dict(
                    RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
                ),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for r in range(world)
    ]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return [(p.returncode, out) for p, out in zip(procs, outs, strict=True)]


class Mounts:
    """Real mounts a test makes where this machine allows them (root, or a container with
    CAP_SYS_ADMIN), each undone after the test. Each call returns whether it mounted; `need=True`
    skips the test when it could not."""

    def __init__(self) -> None:
        self.made: list[Path] = []

    def _mount(self, args: list[str], where: Path, need: bool) -> bool:
        where.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mount", *args, str(where)], capture_output=True).returncode:
            if need:
                pytest.skip(f"mount {' '.join(args)} is not allowed here")
            return False
        self.made.append(where)
        return True

    def bind(self, source: Path, where: Path, need: bool = True) -> bool:
        """`source` (a folder that exists) seen at `where` too, as `mount --bind` or a container's volume."""
        return self._mount(["--bind", str(source)], where, need)

    def tmpfs(self, where: Path, size: str, need: bool = True) -> bool:
        """A small disk of `size` (`64k`) at `where`, to fill."""
        return self._mount(["-t", "tmpfs", "-o", f"size={size}", "tmpfs"], where, need)


@pytest.fixture
def mounts() -> Iterator[Mounts]:
    made = Mounts()
    yield made
    for where in reversed(made.made):
        subprocess.run(["umount", str(where)], check=True)


# -- fixtures and helpers that both tiers, or several files, use --------------------------------


@pytest.fixture
def dataset(tmp_path) -> str:
    """The demo's prepared digits dataset, fresh for this test to damage (`digits` is shared)."""
    from trainer.config import load_config
    from trainer.storage import LocalStore
    from trainer.tasks.classification.data import prepare_dataset

    uri = str(tmp_path / "dataset")
    prepare_dataset(load_config().data, LocalStore(), uri)
    return uri


def truncate(uri: str, keep: int) -> None:
    """Cut a local file down to its first `keep` bytes."""
    path = Path(uri)
    path.write_bytes(path.read_bytes()[:keep])


@pytest.fixture
def uneven_shards(tmp_path):
    """(uri, shard infos) of tests/streams.py's dataset: shards of uneven sizes, item i holding i."""
    from tests.streams import write_uneven_shards

    return write_uneven_shards(str(tmp_path / "ds"))


def stdlib_chunks(limit: int = 400_000) -> list[bytes]:
    """A few hundred KB of Python's own library source, one chunk per file, in a fixed order."""
    chunks, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            return chunks
    raise AssertionError("the Python standard library has too little source to sample")


@pytest.fixture(scope="module")
def sample() -> list[bytes]:
    """Text to train tokenizers on: stdlib_chunks()."""
    return stdlib_chunks()


@pytest.fixture(scope="module")
def bpe(sample):
    """A byte-level BPE tokenizer (1,000 tokens) trained on `sample`."""
    from trainer.storage import LocalStore
    from trainer.tokenizer import load_tokenizer

    return load_tokenizer("bpe:1000", LocalStore(), iter(sample))


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
    """URL -> an HTTP server answering HTML with a given status (something that is not the API)."""
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
