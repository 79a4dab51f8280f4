"""A second real S3 server for tests: Ceph's RADOS Gateway, started by scripts/rgw.

moto accepts what a real store refuses; RGW checks credentials and bucket names and answers a
completed multipart upload with an empty ETag. The one-node cluster (monitor, OSD, radosgw) runs
in a temporary directory on loopback and is removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.s3server import S3Server, free_port

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "rgw"
#: What scripts/rgw needs on PATH.
BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "ceph-authtool", "monmaptool")


class RGWUnavailable(RuntimeError):
    """RGW cannot run here; the message says why and how to get it."""


def missing() -> list[str]:
    """The Ceph programs scripts/rgw needs that are not on PATH."""
    return [b for b in BINARIES if shutil.which(b) is None]


@contextlib.contextmanager
def rgw_server(start_timeout_s: float = 120) -> Iterator[S3Server]:
    """Start a one-node Ceph with radosgw on a free loopback port; stop it and delete its data after.

    Raises :class:`RGWUnavailable` naming the missing programs or the start failure (with the
    tail of the daemons' logs)."""
    absent = missing()
    if absent:
        raise RGWUnavailable(
            f"Ceph's RADOS Gateway is not installed ({', '.join(absent)} missing): "
            "`scripts/rgw install` (as root, Debian/Ubuntu) installs it"
        )
    root = Path(tempfile.mkdtemp(prefix="kftrain-rgw-"))
    started: list[Path] = []
    # The daemons detach from us: should this process die without its teardown (SIGKILL, a
    # timeout), a watchdog stops them and deletes their data.
    watchdog = subprocess.Popen(
        [
            "bash",
            "-c",
            'while kill -0 "$0" 2>/dev/null; do sleep 2; done; for c in "$1"/c*; do bash "$2" stop "$c"; done; '
            'rm -rf "$1"',
            str(os.getpid()),
            str(root),
            str(SCRIPT),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for attempt in range(2):  # a second try where another program took the free port first
            cluster = root / f"c{attempt}"
            started.append(cluster)
            env = {**os.environ, "KFTRAIN_RGW_MON_PORT": str(free_port())}
            try:
                proc = subprocess.run(
                    ["bash", str(SCRIPT), "start", str(cluster), str(free_port())],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=start_timeout_s,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired:
                raise RGWUnavailable(f"scripts/rgw start took over {start_timeout_s:.0f}s{_logs(cluster)}") from None
            if proc.returncode == 0:
                break
            if "could not listen" not in proc.stderr or attempt:
                raise RGWUnavailable(f"scripts/rgw start failed: {proc.stderr.strip()[-2000:]}{_logs(cluster)}")
        values = dict(line.split("=", 1) for line in proc.stdout.split() if "=" in line)
        yield S3Server(values["endpoint"], values["access_key"], values["secret_key"], kind="rgw")
    finally:
        watchdog.kill()
        watchdog.wait()
        for cluster in started:
            subprocess.run(["bash", str(SCRIPT), "stop", str(cluster)], capture_output=True, timeout=60, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _logs(cluster: Path, lines: int = 15) -> str:
    """The last lines of each daemon's log, for a failure's message."""
    out = []
    for log in sorted((cluster / "log").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        if tail:
            out.append(f"\n--- {log.name}\n" + "\n".join(tail))
    return "".join(out)
