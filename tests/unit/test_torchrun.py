"""trainer/torchrun.py: torchrun's exit-barrier race told in one line, and the agent's quieter C++
log kept from the workers it starts (tests/integration/test_stopping.py runs it for real)."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from trainer import torchrun


def test_the_exit_barrier_race_is_one_warning_line_and_other_records_pass_unchanged():
    logger = logging.getLogger(torchrun.AGENT_LOGGER)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    note = torchrun.ExitBarrierNote()
    logger.addHandler(handler)
    logger.addFilter(note)
    try:
        try:
            raise RuntimeError("Failed to recv, got 0 bytes. Connection was likely closed.\nframe #0: c10::Error")
        except RuntimeError:
            logger.exception("Error waiting on exit barrier. Elapsed: %s seconds", 0.01)
        try:
            raise ValueError("not the race")
        except ValueError:
            logger.exception("Another failure")
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(note)
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "WARNING exit barrier: another agent left first (RuntimeError: Failed to recv, got 0 bytes. Connection was "
        "likely closed.); this node's workers had finished"
    )
    assert lines[1] == "ERROR Another failure" and "Traceback" in out.getvalue().split(lines[1])[1]


@pytest.mark.parametrize("preset", [None, "INFO"])
def test_the_workers_get_the_environment_as_it_was(monkeypatch, preset):
    """The agent's TORCH_CPP_LOG_LEVEL=ERROR is gone before torchrun starts a worker; a user's own stays."""
    import torch.distributed.run

    if preset is None:
        monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", preset)
    seen = []
    monkeypatch.setattr(torch.distributed.run, "main", lambda argv: seen.append(dict(torchrun.os.environ)))
    monkeypatch.setattr("trainer.stacks.print_stacks_on_signals", lambda: None)
    assert torchrun.main(["-m", "x"]) == 0
    assert seen[0].get("TORCH_CPP_LOG_LEVEL") == preset
    assert "torch" in sys.modules
