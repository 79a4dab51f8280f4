import copy
import json
import logging
import re
from importlib import resources

import jsonschema
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.events import EventWriter
from trainer.launch.preflight import _format_checker, _strict
from trainer.progress import (
    MAX_METRIC_CHARS,
    MAX_METRICS,
    PROGRESS_ANNOTATION,
    Progress,
    Snapshot,
    epoch_scalars,
    format_memories,
    format_progress,
    progress_of,
)
from trainer.storage import LocalStore


def test_logs_every_interval_and_at_the_last_step_with_mfu(caplog):
    p = Progress(
        total_steps=5, items_per_step=1000, item_name="tokens", flops_per_step=1e9, peak_flops=1e12,
        interval=2, device=torch.device("cpu"), enabled=True,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        for step, loss in enumerate([4.0, 2.0, 3.0, 1.0, 0.5], start=1):
            p.step(step, 0, torch.tensor(loss), 1e-3)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split()[1] for line in lines] == ["2/5", "4/5", "5/5"]
    assert [(c["step"], c["loss"]) for c in p.curve] == [(2, 3.0), (4, 2.0), (5, 0.5)]
    assert all(c["lr"] == 1e-3 and c["items_per_second"] > 0 and c["time"] > 1.7e9 for c in p.curve)
    assert all("tokens/s" in line and "eta" in line and "mfu" in line for line in lines)


def test_the_profiled_step_is_left_out_of_the_rate_and_the_eta(monkeypatch):
    """The step the memory profiler slows (each start's second) made its interval's rate 20x too
    low and the ETA minutes for seconds (a probe)."""
    clock = iter([0.0, 1.0, 11.0, 12.0, 13.0, 14.0])  # construction, then each step's end
    monkeypatch.setattr("trainer.progress.time.perf_counter", lambda: next(clock))
    scalars = {}

    class Events:  # what TensorBoard would be sent
        def scalars(self, step, values, wall=None):
            scalars.update(values)

        def flush(self):
            pass

    p = Progress(
        total_steps=10, items_per_step=100, item_name="samples", flops_per_step=0, peak_flops=0,
        interval=4, device=torch.device("cpu"), enabled=True, events=Events(),
    )  # fmt: skip
    waits = [0.3, 0.9, 0.9, 0.9]  # the running total: 0.3 s before step 1, 0.6 s in the profiled step 2
    for step in range(1, 5):  # step 2 took 10 s under the profiler
        p.step(step, 0, torch.tensor(1.0), 1e-3, data_wait=waits[step - 1], timed=step != 2)
    assert p.curve[0]["items_per_second"] == pytest.approx(100.0)  # 3 steps in 3 s, not 4 in 13 s
    assert p.last.eta_seconds == 6
    assert scalars["train/data_wait_share"] == pytest.approx(0.3 / 3)  # the timed steps' wait over their time


def test_the_first_point_a_resumed_start_logs_is_marked_as_a_start():
    """The report breaks its time chart there (was: one line across the time the run was stopped)."""

    def logged(curve):
        p = Progress(
            total_steps=4, items_per_step=10, item_name="tokens", flops_per_step=0, peak_flops=0,
            interval=1, device=torch.device("cpu"), enabled=True,
        )  # fmt: skip
        p.curve = curve  # as the trainer hands it the resumed record's curve
        for step in (3, 4):
            p.step(step, 0, torch.tensor(1.0), 1e-3, torch.tensor(1.0))
        return [c.get("start", False) for c in p.curve]

    assert logged([]) == [False, False]
    assert logged([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]) == [False, False, True, False]


def test_an_interval_cut_by_a_checkpoint_and_resumed_averages_the_same_steps():
    """A resumed run's next line is the mean of the interval's steps before the checkpoint too
    (was: of the steps since the resume alone), and its rate is of the steps it timed."""

    def progress():
        return Progress(
            total_steps=6, items_per_step=10, item_name="tokens", flops_per_step=0, peak_flops=0,
            interval=4, device=torch.device("cpu"), enabled=True,
        )  # fmt: skip

    losses = [4.0, 2.0, 3.0, 1.0, 0.5, 0.25]
    whole = progress()
    for step, loss in enumerate(losses, start=1):
        whole.step(step, 0, torch.tensor(loss), 1e-3, torch.tensor(float(step)))
    cut = progress()
    for step, loss in enumerate(losses[:3], start=1):
        cut.step(step, 0, torch.tensor(loss), 1e-3, torch.tensor(float(step)))
    window = json.loads(json.dumps(cut.window()))  # through a checkpoint's JSON record
    resumed = progress()
    resumed.resume_window(window, 3)
    for step, loss in enumerate(losses[3:], start=4):
        resumed.step(step, 0, torch.tensor(loss), 1e-3, torch.tensor(float(step)))
    assert [(c["step"], c["loss"]) for c in resumed.curve] == [(c["step"], c["loss"]) for c in whole.curve]
    assert resumed.last.loss == whole.last.loss and all(c["items_per_second"] > 0 for c in resumed.curve)
    # Not continued: a window of another interval (a changed train.log_interval_steps), one that does
    # not end at the resumed step, and none (a checkpoint from before windows were kept).
    for kept, at in (({**window, "interval": 2}, 3), (window, 2), (None, 3)):
        fresh = progress()
        fresh.resume_window(kept, at)
        fresh.step(4, 0, torch.tensor(1.0), 1e-3)
        assert fresh.last.loss == 1.0, (kept, at)


def test_only_rank_0_logs(caplog):
    p = Progress(
        total_steps=2, items_per_step=1, item_name="samples", flops_per_step=0, peak_flops=0,
        interval=1, device=torch.device("cpu"), enabled=False,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        p.step(1, 0, torch.tensor(1.0), 0.1)
    assert not caplog.records and not p.curve


def test_scalars_reach_tensorboard_at_every_interval(tmp_path):
    logdir = str(tmp_path / "tb")
    p = Progress(
        total_steps=4, items_per_step=64, item_name="samples", flops_per_step=1e9, peak_flops=1e12,
        interval=2, device=torch.device("cpu"), enabled=True, events=EventWriter(LocalStore(), logdir, 0),
    )  # fmt: skip
    waited = 0.0
    for step, (loss, norm) in enumerate([(4.0, 1.0), (2.0, 3.0), (1.0, 5.0), (1.0, 7.0)], start=1):
        waited += 0.0 if step < 3 else 1e6  # an absurd wait: the share is capped at 100%
        p.step(step, 0, torch.tensor(loss), 0.01 * step, grad_norm=torch.tensor(norm), data_wait=waited)
    p.epoch_end(4, {"epoch": 0, "train_loss": 2.0, "val_accuracy": 0.75, "val_loss": 0.5})
    p.checkpoint(4, 0.25, 3_000_000)
    p.close()
    acc = EventAccumulator(logdir)
    acc.Reload()

    def series(tag):
        return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]

    assert series("train/loss") == [(2, 3.0), (4, 1.0)]
    assert series("train/learning_rate") == [(2, 0.02), (4, 0.04)]
    assert series("train/grad_norm") == [(2, 2.0), (4, 6.0)]  # the mean over the interval
    assert series("train/data_wait_share") == [(2, 0.0), (4, 1.0)]
    assert [s for s, _ in series("train/samples_per_second")] == [2, 4]
    assert [s for s, _ in series("train/mfu")] == [2, 4]
    assert series("val/accuracy") == [(4, 0.75)] and series("val/loss") == [(4, 0.5)]
    assert series("train/epoch_loss") == [(4, 2.0)]
    assert series("checkpoint/stage_seconds") == [(4, 0.25)] and series("checkpoint/megabytes") == [(4, 3.0)]
    summary = p.summary()
    assert summary["validation"] == [{"step": 4, "epoch": 0, "train_loss": 2.0, "val_accuracy": 0.75, "val_loss": 0.5}]
    assert summary["checkpoints"][0]["step"] == 4 and summary["tensorboard_uri"] == logdir


def test_epoch_records_map_onto_readable_tags():
    record = {"epoch": 3, "train_loss": 1.5, "val_perplexity": 9.0, "note": "x", "ok": True}
    assert epoch_scalars(record) == {"train/epoch_loss": 1.5, "val/perplexity": 9.0}


# -- the snapshot: one source for the log line, the job's status and the launcher ------------

RFC3339_SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def trainer_status_validator():
    """`status.trainerStatus` of the vendored Kubeflow Trainer v2.3.0 TrainJob CRD, strict (unknown
    keys refused) and with the int32 ranges checked, as the API server decodes them."""
    doc = json.loads(resources.files("trainer.launch").joinpath("schemas/trainjob.v1alpha1.json").read_text())
    schema = doc["openAPIV3Schema"]["properties"]["status"]["properties"]["trainerStatus"]
    return jsonschema.Draft7Validator(_strict(copy.deepcopy(schema)), format_checker=_format_checker())


def check_trainer_status(status: dict) -> None:
    """The schema, plus its CEL rule (`has(self.lastUpdatedTime)`) and the `date-time` format,
    which jsonschema leaves to the API server."""
    errors = [e.message for e in trainer_status_validator().iter_errors(status)]
    assert not errors, errors
    assert RFC3339_SECONDS.match(status["lastUpdatedTime"]), status["lastUpdatedTime"]


SNAP = Snapshot(
    step=40, total_steps=100, epoch=1, eta_seconds=125, loss=2.345678, learning_rate=1e-3, rate=12345.6,
    item_name="tokens", mfu=0.351, metrics={"val_loss": 2.1, "val_perplexity": 8.166}, time=1_767_225_600,
)  # fmt: skip


def test_the_vendored_trainjob_schema_has_trainer_status():
    props = trainer_status_validator().schema["properties"]
    assert set(props) == {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}
    assert props["metrics"]["maxItems"] == MAX_METRICS
    assert props["metrics"]["items"]["properties"]["name"]["maxLength"] == MAX_METRIC_CHARS


def test_a_snapshot_is_a_valid_trainer_status():
    status = SNAP.trainer_status()
    check_trainer_status(status)
    assert status["progressPercentage"] == 40 and status["estimatedRemainingSeconds"] == 125
    assert status["lastUpdatedTime"] == "2026-01-01T00:00:00Z"
    assert {m["name"]: m["value"] for m in status["metrics"]} == {
        "step": "40", "total_steps": "100", "epoch": "1", "loss": "2.345678", "learning_rate": "0.001",
        "mfu": "0.351", "tokens_per_second": "12345.6", "val_loss": "2.1", "val_perplexity": "8.166",
    }  # fmt: skip


def test_the_trainer_status_is_refused_by_the_schema_when_it_breaks_a_limit():
    """The validator used above does catch what the API server would refuse."""
    good = SNAP.trainer_status()
    for bad in (
        {**good, "progressPercentage": 101},
        {**good, "estimatedRemainingSeconds": 2**31},
        {**good, "metrics": [{"name": "x" * 65, "value": "1"}]},
        {**good, "metrics": [{"name": "x", "value": ""}]},
        {**good, "metrics": [{"name": f"m{i}", "value": "1"} for i in range(257)]},
        {**good, "extra": 1},
    ):
        assert list(trainer_status_validator().iter_errors(bad)), bad


@pytest.mark.parametrize(
    ("snapshot", "check"),
    [
        # a long metric name is cut to 64 characters, in every rendering
        (Snapshot(step=1, total_steps=2, metrics={"val_" + "x" * 100: 1.0}), lambda s: len(s.metrics) == 1),
        # more validation metrics than the 256 the CRD takes: the core metrics stay, the rest fill up
        (Snapshot(step=1, total_steps=2, loss=1.0, metrics={f"val_{i}": float(i) for i in range(400)}), None),
        # an ETA beyond int32 (a stalled start) is capped, a negative one is 0
        (Snapshot(step=1, total_steps=2, eta_seconds=10**12), lambda s: s.eta_seconds == 2**31 - 1),
        (Snapshot(step=1, total_steps=2, eta_seconds=-5), lambda s: s.eta_seconds == 0),
        # a percentage never passes 100, nor goes below 0
        (Snapshot(step=120, total_steps=100), lambda s: s.percent == 100),
        (Snapshot(step=0, total_steps=100), lambda s: s.percent == 0),
        # non-finite numbers (a diverged loss) are still valid strings
        (Snapshot(step=3, total_steps=9, loss=float("nan"), learning_rate=float("inf")), None),
        # a long throughput unit name
        (Snapshot(step=1, total_steps=2, rate=5.0, item_name="y" * 80), None),
        # nothing known but the time
        (Snapshot(), lambda s: s.trainer_status() == {"lastUpdatedTime": "1970-01-01T00:00:00Z"}),
    ],
)
def test_metric_limits_hold_for_any_snapshot(snapshot, check):
    status = snapshot.trainer_status()
    check_trainer_status(status)
    names = [m["name"] for m in status.get("metrics", [])]
    assert len(names) == len(set(names)) <= MAX_METRICS
    assert all(1 <= len(m["value"]) <= MAX_METRIC_CHARS for m in status.get("metrics", []))
    if snapshot.loss is not None:
        assert names[: names.index("loss") + 1] == [n for n in ("step", "total_steps", "epoch", "loss") if n in names]
    assert check is None or check(snapshot)


def test_the_annotation_is_json_that_reads_back_as_the_same_snapshot():
    doc = json.loads(SNAP.annotation())
    assert doc == {
        "step": 40, "total_steps": 100, "epoch": 1, "percent": 40, "eta_seconds": 125, "loss": 2.345678,
        "learning_rate": 0.001, "rate": 12345.6, "mfu": 0.351, "item_name": "tokens",
        "metrics": {"val_loss": 2.1, "val_perplexity": 8.166}, "time": "2026-01-01T00:00:00Z",
    }  # fmt: skip
    assert Snapshot.from_annotation(SNAP.annotation()) == SNAP
    diverged = Snapshot(step=3, total_steps=9, loss=float("nan"))
    assert json.loads(diverged.annotation())["loss"] == "nan"  # strict JSON: no bare NaN
    assert Snapshot.from_annotation(diverged.annotation()).line() == diverged.line()


def test_the_three_renderings_agree():
    """Rank 0's log line, the TrainJob status read back and the PyTorchJob annotation read back
    give one line, through one formatting function."""
    from_status = progress_of({"status": {"trainerStatus": SNAP.trainer_status()}})
    from_annotation = progress_of({"metadata": {"annotations": {PROGRESS_ANNOTATION: SNAP.annotation()}}})
    assert from_status == from_annotation == SNAP
    assert format_progress(from_status) == format_progress(from_annotation) == SNAP.line()
    assert SNAP.line() == (
        "step 40/100 (40%) epoch 1 loss 2.3457 lr 1.00e-03 12,346 tokens/s eta 2m05s mfu 35.1% "
        "val_loss 2.1000 val_perplexity 8.1660"
    )


def test_another_reporters_trainer_status_reads_as_far_as_it_goes():
    """A TrainJob whose status another client wrote (the Kubeflow SDK, a transformers callback)."""
    status = {
        "progressPercentage": 45, "estimatedRemainingSeconds": 3600, "lastUpdatedTime": "2026-06-12T03:00:00Z",
        "metrics": [{"name": "loss", "value": "0.2347"}, {"name": "accuracy", "value": "0.9876"},
                    {"name": "phase", "value": "warmup"}],
    }  # fmt: skip
    assert progress_of({"status": {"trainerStatus": status}}).line() == "45% loss 0.2347 eta 1h00m accuracy 0.9876"


@pytest.mark.parametrize(
    "job",
    [
        {},
        {"status": {"trainerStatus": {"progressPercentage": 3}}},  # no lastUpdatedTime
        {"status": {"trainerStatus": {"lastUpdatedTime": "yesterday"}}},
        {"status": {"trainerStatus": {"lastUpdatedTime": "2026-01-01T00:00:00Z", "metrics": [{"name": "step"}]}}},
        {"metadata": {"annotations": {PROGRESS_ANNOTATION: "{not json"}}},
        {"metadata": {"annotations": {PROGRESS_ANNOTATION: '{"step": "x", "time": "2026-01-01T00:00:00Z"}'}}},
        {"metadata": {"annotations": {PROGRESS_ANNOTATION: "[1, 2]"}}},
    ],
)
def test_unreadable_progress_is_no_progress(job):
    assert progress_of(job) is None


def test_each_logged_interval_is_the_snapshot_the_reporter_gets(caplog):
    class Collect:
        def __init__(self):
            self.got, self.closed = [], False

        def submit(self, snapshot):
            self.got.append(snapshot)

        def close(self):
            self.closed = True

    sink = Collect()
    p = Progress(
        total_steps=4, items_per_step=10, item_name="samples", flops_per_step=0, peak_flops=0,
        interval=2, device=torch.device("cpu"), enabled=True, reporter=sink,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        for step in (1, 2, 3):
            p.step(step, 0, torch.tensor(1.0), 0.1)
        p.epoch_end(3, {"epoch": 0, "train_loss": 1.0, "val_accuracy": 0.5, "note": "x"})
        p.step(4, 1, torch.tensor(0.5), 0.1)
    p.close()
    assert [r.getMessage() for r in caplog.records] == [s.line() for s in (sink.got[0], sink.got[2])]
    assert [(s.step, s.percent, dict(s.metrics)) for s in sink.got] == [
        (2, 50, {}),
        (2, 50, {"val_accuracy": 0.5}),  # the epoch's validation, reported at once
        (4, 100, {"val_accuracy": 0.5}),
    ]
    assert sink.got[-1].eta_seconds == 0 and sink.closed
    disabled = Progress(
        total_steps=1, items_per_step=1, item_name="samples", flops_per_step=0, peak_flops=0,
        interval=1, device=torch.device("cpu"), enabled=False, reporter=sink,
    )  # fmt: skip
    disabled.step(1, 0, torch.tensor(1.0), 0.1)
    assert len(sink.got) == 3  # only rank 0 reports


@pytest.mark.parametrize(
    ("a", "b", "shown"),
    [
        (1.507 * 2**30, 1.505 * 2**30, ("1.51 GiB", "1.50 GiB")),  # was: "1.5 GiB" against "1.5 GiB"
        (1.5072 * 2**30, 1.5068 * 2**30, ("1.507 GiB", "1.507 GiB")),  # as far as three decimals go
        (1.5074 * 2**30, 1.5056 * 2**30, ("1.507 GiB", "1.506 GiB")),
        (3.2 * 2**30, 79.6 * 2**30, ("3.2 GiB", "79.6 GiB")),
        (2**30, 2**30, ("1.0 GiB", "1.0 GiB")),
        (512 * 2**20, 2**30, ("512.0 MiB", "1.0 GiB")),
    ],
)
def test_two_amounts_of_memory_are_shown_with_the_decimals_that_tell_them_apart(a, b, shown):
    assert format_memories(a, b) == shown
