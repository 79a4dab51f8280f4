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
from trainer.storage import LocalStore, StoreError
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


def test_a_later_copy_of_the_signal_after_the_loop_stopped_leaves_the_teardown_alone():
    """torchrun passes the pod's SIGTERM on to each rank, which got its own: the copy that comes
    after the loop stopped must not raise in the group's teardown."""
    from trainer.stopping import stop_while_starting

    for stopped in (True, False):  # the loop stopped on the signal, or ended (finished, failed) without one
        with stop_while_starting() as received:
            with StopSignal().installed():
                if stopped:
                    os.kill(os.getpid(), signal.SIGTERM)  # the loop's stop
            os.kill(os.getpid(), signal.SIGTERM)  # in the teardown: nothing (was: its outcome replaced by 143)
        assert received == []
    with pytest.raises(Terminated), stop_while_starting() as received:
        os.kill(os.getpid(), signal.SIGTERM)  # outside any loop: ends the rank
    assert received == [signal.SIGTERM]


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


@pytest.mark.parametrize("where", ["setup", "collective", "wrapped"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_outside_the_training_loop_ends_the_rank_in_one_line_with_143(monkeypatch, caplog, where, signum):
    """A stop while the rank starts (the process group forming, a checkpoint downloading) or after
    the loop: exit 143 and one line, nothing to fix (was: SIGTERM's default death, its peers left a
    gloo traceback); a collective broken by the peers stopping too is that same stop."""
    import time

    import trainer.train as train

    def run_training(cfg, dataset_uri, model_uri, env):
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # interrupted at once
        except Terminated:
            if where == "collective":  # what surfaces is the collective's error, its peers gone
                raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection reset by peer") from None
            raise
        except Exception as exc:  # a store request's retry, a download: it must not wrap the stop (was: exit 1)
            raise StoreError(f"cannot reach the object store: {exc}") from None
        raise AssertionError("the signal did not stop the rank")

    monkeypatch.setattr(train, "run_training", run_training)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with caplog.at_level(logging.INFO, logger="kftrain"):
        code = train.main(["--config-json", "{}", "--dataset-uri", "/nowhere", "--model-uri", "/nowhere"])
    assert code == TERMINATED_CHECKPOINTED
    said = [r.getMessage() for r in caplog.records if "before the training loop" in r.getMessage()]
    assert said == [
        f"stopped by {signal.Signals(signum).name} before the training loop: nothing of this start to commit; a "
        "rerun resumes from the newest committed checkpoint"
    ]
    assert {sig: signal.getsignal(sig) for sig in previous} == previous  # the handlers given back
