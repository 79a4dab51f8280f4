"""Resume safety for train.strategy fsdp, in one process: an incompatible resume is refused naming
the field, and a world-size change is resumable when the task streams."""

from __future__ import annotations

import pytest

from trainer.checkpoint import CheckpointError
from trainer.config import load_config, to_dict
from trainer.distributed import DistEnv
from trainer.train import check_resumable, run_training

pytestmark = pytest.mark.timeout(300)


def test_an_incompatible_resume_is_refused_naming_the_field(digits, tmp_path):
    base = {"job.replicas": 1, "train.epochs": 1, "checkpoint.uri": str(tmp_path / "ckpt")}
    run_training(load_config(overrides=base), digits, str(tmp_path / "m1"), DistEnv())
    changed = load_config(overrides={**base, "train.epochs": 2, "model.hidden_sizes": [32]})
    with pytest.raises(CheckpointError, match=r"model\.hidden_sizes \(\[128, 64\], now \[32\]\)") as err:
        run_training(changed, digits, str(tmp_path / "m2"), DistEnv())
    assert "train.epochs" not in str(err.value)  # a compatible change is not a reason
    assert not (tmp_path / "m2").exists()


def test_a_world_size_change_is_resumable_when_the_task_streams():
    cfg = load_config(overrides={"job.replicas": 3, "train.batch_size": 60})
    check_resumable(to_dict(cfg), cfg, 2, 3, streams=True)  # the position carries over by items left
    other = load_config(overrides={"job.replicas": 3, "train.batch_size": 60, "data.partitions": 6})
    check_resumable(to_dict(cfg), other, 3, 3, streams=True)
    with pytest.raises(CheckpointError, match=r"world size \(2, now 3\).*does not stream"):
        check_resumable(to_dict(cfg), cfg, 2, 3, streams=False)
    with pytest.raises(CheckpointError, match=r"train\.strategy \('ddp', now 'fsdp'\)"):
        fsdp = load_config(overrides={"train.strategy": "fsdp"})
        check_resumable(to_dict(load_config()), fsdp, 2, 2, streams=True)


@pytest.mark.parametrize(
    ("task", "field", "value"),
    [
        ("classification", "data.source", "s3://bucket/other.csv"),
        ("classification", "data.val_fraction", 0.45),
        ("classification", "data.test_fraction", 0.3),
        ("classification", "data.seed", 1),  # another split: the new test rows were trained on
        ("classification", "data.label_column", "target"),
        ("causal_lm", "data.max_bytes", 30_000),  # fewer items: the position ends past them
        ("causal_lm", "data.text_field", "body"),
        ("causal_lm", "data.messages_field", "turns"),
        ("causal_lm", "data.tokenizer_sample_bytes", 1_000_000),
    ],
)
def test_a_resume_on_other_prepared_data_is_refused_naming_the_field(task, field, value):
    """The data position counts items of the prepared data: another split, source or size of it
    would put test rows into training or index past its end (was: logged and resumed)."""
    cfg = load_config(overrides={"task": task})
    changed = load_config(overrides={"task": task, field: value})
    with pytest.raises(CheckpointError, match=rf"cannot resume: .*{field.replace('.', '[.]')} \("):
        check_resumable(to_dict(cfg), changed, 2, 2, streams=True)
    other = "classification" if task == "causal_lm" else "causal_lm"
    if field != "data.source" and "fraction" not in field and field != "data.seed":  # one task's own field
        check_resumable(
            to_dict(load_config(overrides={"task": other})),
            load_config(overrides={"task": other, field: value}),
            2,
            2,
            streams=True,
        )
    saved = to_dict(cfg)
    del saved[field.split(".")[0]][field.split(".")[1]]  # a record from before the field existed
    check_resumable(saved, changed, 2, 2, streams=True)
