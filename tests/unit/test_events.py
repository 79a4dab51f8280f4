"""TensorBoard event files in one process: the CRC, read back by TensorBoard's own reader, rotated,
one continuous step sequence across a resume, and uploaded off the training thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from trainer.events import EventWriter, crc32c, masked_crc32c
from trainer.storage import LocalStore, StoreError


def scalars(logdir: str, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(logdir)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


class GatedStore(LocalStore):
    """A local store whose uploads wait for a gate and can be made to fail: a slow or down S3."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.failures = 0
        self.puts = 0

    def put_bytes(self, uri: str, data: bytes) -> None:
        self.gate.wait()
        self.puts += 1
        if self.failures:
            self.failures -= 1
            raise StoreError(f"{uri}: connection refused (injected)")
        super().put_bytes(uri, data)


def test_crc32c_matches_the_standard_check_values():
    assert crc32c(b"123456789") == 0xE3069283  # RFC 3720's check value
    assert crc32c(b"") == 0
    assert masked_crc32c(b"") == 0xA282EAD8


def test_tensorboard_reads_scalars_and_steps_as_written(tmp_path):
    logdir = str(tmp_path / "tb")
    writer = EventWriter(LocalStore(), logdir, start_step=0)
    for step in range(1, 11):
        writer.scalars(step, {"train/loss": 1.0 / step, "train/learning_rate": 1e-3 * step}, wall_time=1e9 + step)
        writer.flush()
    writer.scalars(10, {"val/accuracy": 0.875})
    writer.close()
    got = scalars(logdir, "train/loss")
    assert [s for s, _ in got] == list(range(1, 11))
    assert [v for _, v in got] == pytest.approx([1.0 / s for s in range(1, 11)])  # float32 in the file
    assert scalars(logdir, "val/accuracy") == [(10, 0.875)]
    acc = EventAccumulator(logdir)
    acc.Reload()
    assert acc.Scalars("train/loss")[0].wall_time == 1e9 + 1


def test_full_files_rotate_and_read_in_order(tmp_path):
    logdir = str(tmp_path / "tb")
    writer = EventWriter(LocalStore(), logdir, start_step=0, max_file_bytes=300)
    for step in range(1, 41):
        writer.scalars(step, {"train/loss": float(step)})
        writer.flush()
    writer.close()
    names = sorted(p.name for p in Path(logdir).iterdir())
    assert len(names) > 3 and all("tfevents" in n for n in names)
    assert [s for s, _ in scalars(logdir, "train/loss")] == list(range(1, 41))


def test_a_resumed_segment_continues_the_steps_and_drops_the_orphans(tmp_path):
    """Segment 1 logs steps 1..10 but its last checkpoint is at 6; segment 2 resumes from 6. Its
    file sorts after the first even when its clock reads earlier, and TensorBoard shows 1..12 once."""
    logdir, store = str(tmp_path / "tb"), LocalStore()
    first = EventWriter(store, logdir, start_step=0, clock=lambda: 2_000_000_000.0)
    for step in range(1, 11):
        first.scalars(step, {"train/loss": 100.0 + step})
    first.close()
    second = EventWriter(store, logdir, start_step=6, clock=lambda: 1_000_000_000.0)  # a node with a slow clock
    for step in range(7, 13):
        second.scalars(step, {"train/loss": 200.0 + step})
    second.close()
    assert (first.segment, second.segment) == (0, 1)
    files = sorted(Path(logdir).iterdir())
    assert [f.name.rsplit("-", 2)[-2] for f in files] == ["s0000", "s0001"]
    got = scalars(logdir, "train/loss")
    assert [s for s, _ in got] == list(range(1, 13))
    assert [v for _, v in got] == [100.0 + s for s in range(1, 7)] + [200.0 + s for s in range(7, 13)]


def test_flush_never_waits_for_the_store_and_uploads_coalesce(tmp_path):
    store, logdir = GatedStore(), str(tmp_path / "tb")
    writer = EventWriter(store, logdir, start_step=0)
    done = threading.Event()

    def train() -> None:
        for step in range(1, 201):
            writer.scalars(step, {"train/loss": float(step)})
            writer.flush()  # the store is stuck: this must still return
        done.set()

    threading.Thread(target=train, daemon=True).start()
    assert done.wait(60), "flush() blocked on a stuck store"
    store.gate.set()
    writer.close()
    assert store.puts < 200  # one file, re-uploaded whole: the pending copies were coalesced
    assert [s for s, _ in scalars(logdir, "train/loss")] == list(range(1, 201))


def test_failed_uploads_are_healed_by_later_ones_finished_files_included(tmp_path, caplog):
    store, logdir = GatedStore(), str(tmp_path / "tb")
    store.gate.set()
    store.failures = 3
    writer = EventWriter(store, logdir, start_step=0, max_file_bytes=200)
    for step in range(1, 31):
        writer.scalars(step, {"train/loss": float(step)})
        writer.flush()
        time.sleep(0.005)  # let the upload thread see some of the flushes
    writer.close()
    assert "upload of" in caplog.text and "failed" in caplog.text
    assert [s for s, _ in scalars(logdir, "train/loss")] == list(range(1, 31))
