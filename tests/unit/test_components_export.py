"""components/export.py in this process (the whole step through kfp.local: tests/integration/)."""

from __future__ import annotations

import pytest
from kfp.dsl import Metrics, Model

from components.export import export
from trainer.config import ConfigError


def test_metrics_that_are_not_the_evaluate_steps_are_named_with_the_output_to_pass(tmp_path):
    """A user's pipeline wiring the training step's `metrics` into export (was: "no file at
    .../metrics.json", naming neither the parameter nor the output it wants)."""
    (tmp_path / "train-metrics").mkdir()
    with pytest.raises(ConfigError) as caught:
        export.python_func(
            model=Model(uri=str(tmp_path / "model")),
            metrics=Metrics(uri=str(tmp_path / "train-metrics")),
            exported=Model(uri=str(tmp_path / "exported")),
        )
    message = str(caught.value)
    assert message.startswith("metrics: no metrics.json at ") and "the evaluate step's `metrics` output" in message
    assert not (tmp_path / "exported").exists()  # nothing written
