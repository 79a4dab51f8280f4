"""The unit tier's rule, enforced: a unit test starts no process and talks to no server.

Every test here runs with process creation (fork, exec, spawn) and network connections
refused, so a test that needs either fails at once, naming what it tried, instead of slowing the
tier down. Such a test belongs in tests/integration/.

The objects alive when each test module starts (the imports, the collected tests, what earlier
modules left) are frozen out of the garbage collector's sight: every CPU peak-memory window
(trainer/plan/measure.py) starts with a full `gc.collect()` and a walk of `gc.get_objects()`, which
took half a second over them each time.
"""

from __future__ import annotations

import _posixsubprocess
import gc
import os
import socket
import subprocess
from collections.abc import Iterator

import pytest


class NotAUnitTest(RuntimeError):
    """Raised when a unit test tries to start a process or open a network connection."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise NotAUnitTest(f"a unit test may not {what}: move this test to tests/integration/")

    return refuse


@pytest.fixture(scope="package", autouse=True)
def frozen_objects_thawed_after_the_tier() -> Iterator[None]:
    """Hands what `earlier_objects_frozen` froze back to the collector once the tier is done."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="module", autouse=True)
def earlier_objects_frozen() -> None:
    """Freezes what is alive as a module starts, after collecting the garbage (so none is frozen);
    each collection then covers only what the previous module made. An autouse fixture is set up
    before the module's own module-scoped fixtures: theirs and the tests' objects stay in sight.
    Tensors alive then are no test's (measured: none, or up to about 1 MB that an earlier module
    left); a peak-memory window's baseline leaves them out."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="package", autouse=True)
def no_processes_or_servers() -> Iterator[None]:
    """Package scope: it is in place before any module-scoped fixture of the tier starts, and gone
    before the integration tier runs in the same session."""
    real_connect = socket.socket.connect

    def connect(sock: socket.socket, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise NotAUnitTest(f"a unit test may not connect to {address!r}: move this test to tests/integration/")
        return real_connect(sock, address)

    with pytest.MonkeyPatch.context() as patch:
        # subprocess keeps its own reference to fork_exec; multiprocessing looks it up on the module.
        for module, name in (
            (_posixsubprocess, "fork_exec"),
            (subprocess, "_fork_exec"),
            (os, "fork"),
            (os, "posix_spawn"),
            (os, "posix_spawnp"),
        ):
            patch.setattr(module, name, _refuse("start a process"))
        patch.setattr(socket.socket, "connect", connect)
        yield
