"""trainer/torchrun.py: torchrun's exit-barrier race told in one line, and the agent's quieter C++
log (asked for by the local backend) kept from the workers it starts (tests/integration/test_stopping.py
runs it for real)."""

from __future__ import annotations

import io
import logging
import sys
import types

import pytest

from trainer import torchrun


def logged(*failures: tuple[str, BaseException]) -> list[str]:
    """What torchrun's agent logger writes for each (message, exception), through the filter."""
    logger = logging.getLogger(torchrun.AGENT_LOGGER)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    note = torchrun.ExitBarrierNote()
    logger.addHandler(handler)
    logger.addFilter(note)
    try:
        for message, exc in failures:
            try:
                raise exc
            except type(exc):
                logger.exception(message, 0.01)
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(note)
    return out.getvalue().split("\n")


def test_the_exit_barrier_race_is_one_warning_line_and_other_failures_pass_as_logged():
    closed = RuntimeError("Failed to recv, got 0 bytes. Connection was likely closed.\nframe #0: c10::Error")
    lines = logged(
        ("Error waiting on exit barrier. Elapsed: %s seconds", closed),
        ("Error waiting on exit barrier. Elapsed: %s seconds", TimeoutError("barrier timed out after 300 s")),
    )
    assert lines[0] == (
        "WARNING exit barrier: another agent left first (RuntimeError: Failed to recv, got 0 bytes. Connection was "
        "likely closed.); this node's workers had finished"
    )
    # A barrier that timed out (a node still running) is no race: torchrun's error and traceback.
    assert (
        lines[1] == "ERROR Error waiting on exit barrier. Elapsed: 0.01 seconds"
        and lines[2] == "Traceback (most recent call last):"
    )


class _Recording(types.ModuleType):
    """A stand-in for a torch module: records TORCH_CPP_LOG_LEVEL when its names are imported."""

    def __init__(self, name: str, seen: list) -> None:
        super().__init__(name)
        self._seen = seen

    def __getattr__(self, attr: str):
        if attr not in ("main", "SignalException"):  # the import machinery's own lookups
            raise AttributeError(attr)
        self._seen.append(("import", torchrun.os.environ.get("TORCH_CPP_LOG_LEVEL")))
        if attr == "main":
            return lambda argv: self._seen.append(("workers", torchrun.os.environ.get("TORCH_CPP_LOG_LEVEL")))
        return type(attr, (Exception,), {})


@pytest.mark.parametrize(
    ("asked", "preset", "at_import", "for_workers"),
    [
        ("ERROR", None, "ERROR", None),  # the local backend: quiet while torch loads, then as it was
        ("ERROR", "INFO", "INFO", "INFO"),  # the user's own setting wins
        ("", None, None, None),  # on a cluster nothing asks: the agent's connection warnings stay
    ],
    ids=["local", "user-set", "cluster"],
)
def test_the_agent_alone_is_quiet_and_only_when_asked(monkeypatch, asked, preset, at_import, for_workers):
    seen: list = []
    for name in ("torch.distributed.run", "torch.distributed.elastic.multiprocessing.api"):
        monkeypatch.setitem(sys.modules, name, _Recording(name, seen))
    monkeypatch.setattr("trainer.stacks.print_stacks_on_signals", lambda: None)
    monkeypatch.setattr(torchrun, "stop_once", lambda: None)  # torch's own module, which is stood in for here
    for var, value in ((torchrun.QUIET_AGENT_ENV, asked), ("TORCH_CPP_LOG_LEVEL", preset)):
        if value:
            monkeypatch.setenv(var, value)
        else:
            monkeypatch.delenv(var, raising=False)
    assert torchrun.main(["-m", "x"]) == 0
    assert [level for when, level in seen if when == "import"] == [at_import, at_import]
    assert [level for when, level in seen if when == "workers"] == [for_workers]
    assert torchrun.QUIET_AGENT_ENV not in torchrun.os.environ  # not passed on to the workers


def test_torchruns_stop_handler_acts_on_the_first_signal_and_ignores_the_next(monkeypatch):
    """A second SIGTERM while torchrun stops its workers raised inside its logging (was: thirty
    lines of `--- Logging error ---`); the first one still ends torchrun with its signal."""
    import signal

    import torch.distributed.elastic.multiprocessing.api as elastic
    from torch.distributed.elastic.multiprocessing.api import SignalException

    monkeypatch.setattr(elastic, "_terminate_process_handler", elastic._terminate_process_handler)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    try:
        torchrun.stop_once()
        with pytest.raises(SignalException) as info:
            elastic._terminate_process_handler(signal.SIGTERM, None)
        assert info.value.sigval == signal.SIGTERM
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in before)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
