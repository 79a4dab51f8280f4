"""The stop-signal flag, its handlers, the grace-period warning, and the trainer stopping on it."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from trainer.checkpoint import CheckpointManager
from trainer.config import ConfigError, load_config
from trainer.distributed import DistEnv
from trainer.exit_codes import TERMINATED_CHECKPOINTED
from trainer.stopping import StopSignal, Terminated, grace_warning
from trainer.storage import LocalStore
from trainer.tasks import get_task
from trainer.train import run_training

pytestmark = pytest.mark.timeout(120)


def test_the_first_signal_is_kept():
    stop = StopSignal()
    assert not stop.requested and not stop.agreed() and stop.seconds_since() == 0.0
    stop.handle(signal.SIGINT)
    stop.handle(signal.SIGTERM)
    assert stop.requested and stop.agreed() and stop.signum == signal.SIGINT and stop.name() == "SIGINT"
    assert stop.seconds_since() >= 0.0


def test_handlers_are_installed_for_the_block_only():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    stop = StopSignal()
    with stop.installed():
        assert signal.getsignal(signal.SIGTERM) == stop.handle
        os.kill(os.getpid(), signal.SIGTERM)  # recorded, the process goes on
    assert stop.signum == signal.SIGTERM
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_another_rank_signalled_is_named_so():
    assert StopSignal().name() == "a signal to another rank"


@pytest.mark.parametrize(
    ("grace", "stage", "commit", "warns"),
    [
        (120, 10.0, 30.0, False),
        (120, 100.0, 30.0, True),
        (30, 0.5, 40.0, True),
        (0, 100.0, 100.0, False),  # no grace period known (not launched by kftrain)
    ],
)
def test_grace_warning(grace, stage, commit, warns):
    msg = grace_warning(grace, stage, commit)
    assert bool(msg) == warns
    if warns:
        assert "kubernetes.termination_grace_seconds" in msg and f"{stage + commit:.1f}s" in msg


@pytest.mark.parametrize("value", [0, -5])
def test_termination_grace_seconds_is_bounded(value):
    with pytest.raises(ConfigError, match="kubernetes.termination_grace_seconds"):
        load_config(overrides={"kubernetes.termination_grace_seconds": value})


def signalled_at(step: int):
    """The digits task, sending this process SIGTERM during optimizer step `step` (1-based)."""

    class Signalled(type(get_task("classification"))):
        calls = 0

        def loss(self, model, batch):
            Signalled.calls += 1
            if Signalled.calls == step:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().loss(model, batch)

    return Signalled()


def test_sigterm_commits_a_checkpoint_of_the_step_and_stops(digits, tmp_path, caplog):
    prefix = str(tmp_path / "ckpt")
    cfg = load_config(overrides={"train.epochs": 2, "checkpoint.uri": prefix, "checkpoint.interval_steps": 100})
    handler = signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.INFO, logger="kftrain.train"), pytest.raises(Terminated) as stopped:
        run_training(cfg, digits, str(tmp_path / "model"), DistEnv(), task=signalled_at(5))
    assert stopped.value.exit_code == TERMINATED_CHECKPOINTED
    # One process agrees with itself at once: it stops after the step the signal came in.
    assert CheckpointManager(LocalStore(), prefix).committed_steps() == [5]
    assert "stopped by SIGTERM at step 5: checkpoint committed" in caplog.text
    assert not (tmp_path / "model" / "model.safetensors").exists()  # not finished: no model
    assert signal.getsignal(signal.SIGTERM) == handler  # the trainer's handler is gone


def test_sigterm_without_checkpoints_stops_at_once_and_says_nothing_was_saved(digits, tmp_path, caplog):
    cfg = load_config(overrides={"train.epochs": 2, "checkpoint.enabled": False})
    with caplog.at_level(logging.WARNING, logger="kftrain.train"), pytest.raises(Terminated) as stopped:
        run_training(cfg, digits, str(tmp_path / "model"), DistEnv(), task=signalled_at(3))
    assert stopped.value.exit_code == TERMINATED_CHECKPOINTED
    assert "stopped by SIGTERM at step 3: nothing was saved" in caplog.text
