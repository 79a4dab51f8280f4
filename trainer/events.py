"""TensorBoard event files, written by rank 0 while training runs, uploaded to the object store.

TensorBoard (and Kubeflow's Tensorboards web app, which runs it against a `logspath`) reads every
`*tfevents*` file under a directory: `tensorboard --logdir s3://bucket/<model>/tensorboard`.

The format is small enough to write by hand, so the trainer needs no TensorBoard or TensorFlow
package at run time: a file is a sequence of TFRecords (little-endian u64 length, masked CRC-32C
of the length, the data, masked CRC-32C of the data), each holding one `tensorflow.Event`
protobuf. Only the fields used here are encoded: `wall_time` (1, double), `step` (2, int64),
`file_version` (3, string), `summary` (5) with `Summary.Value` {`tag` (1), `simple_value`
(2, float)}, and `session_log` (7) with status START.

How a file reaches the store: records accumulate in memory; :meth:`EventWriter.flush` (called at
the log interval) hands a snapshot of the whole file to one background thread, which replaces the
object with it (`put_bytes`: readers see the old or the new file, never a torn record). A flush
while an upload is in flight only replaces the pending snapshot, so the training thread never
waits for the store, and a failed upload is healed by the next one. A file is closed for good at
`max_file_bytes`, and the next one starts: one upload never grows past that size.

Continuation after a resume: each process start (a "segment") writes new files whose names sort
after every file already there, beginning with a SessionLog START event at the first step it will
train. TensorBoard then drops the killed segment's events past its last checkpoint, so a chart
shows one continuous sequence of steps.
"""

from __future__ import annotations

import atexit
import logging
import re
import socket
import struct
import threading
import time
from collections.abc import Callable

from trainer.storage import ObjectStore, StoreError, join_uri

log = logging.getLogger("kftrain.train")

#: The folder under the model URI that rank 0 writes event files to.
EVENTS_FOLDER = "tensorboard"
#: A file is finished at this size and a new one started (bounds the bytes of one upload).
MAX_FILE_BYTES = 1 << 20
_NAME = re.compile(r"events\.out\.tfevents\.(\d+)\..*\.kftrain-s(\d+)-(\d+)$")


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`: the checksum TFRecord framing uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits plus a constant (so a CRC of CRCs differs)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, data, masked CRC of the data."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negative numbers
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def encode_event(
    wall_time: float,
    step: int,
    *,
    scalars: dict[str, float] | None = None,
    file_version: str = "",
    session_start: bool = False,
) -> bytes:
    """A serialized `tensorflow.Event` with scalar summaries, a file version or a START session log."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", float(value)))
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, values)
    if session_start:
        out += _bytes_field(7, _field(1, 0) + _varint(1))  # SessionLog.status = START
    return out


class EventWriter:
    """Rank 0's TensorBoard event files under `prefix` in `store`, uploaded off the training thread.

    `start_step` is the step the run starts from (the resumed checkpoint's, or 0): this segment's
    first event purges, in TensorBoard, what an earlier segment wrote after it.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        start_step: int,
        *,
        max_file_bytes: int = MAX_FILE_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.prefix, self.max_file_bytes, self._clock = store, prefix, max_file_bytes, clock
        newest, self.segment = self._earlier_files()
        self._stamp = newest
        self._part = 0
        self._host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
        self._lock = threading.Condition()
        self._pending: list[tuple[str, bytes]] = []  # (uri, whole file), in upload order
        self._flushes = 0
        self._closed = False
        self._failed_since = 0.0
        self._thread = threading.Thread(target=self._upload_loop, name="kftrain-events", daemon=True)
        self._thread.start()
        self._open_file()
        self._append(encode_event(self._clock(), start_step + 1, session_start=True))
        self.flush()
        atexit.register(self.close)  # a failing run still leaves its last curve points in the store

    def _earlier_files(self) -> tuple[int, int]:
        """(newest timestamp in an earlier file name, this segment's number) from the store."""
        try:
            names = [uri.rsplit("/", 1)[-1] for uri in self.store.list(self.prefix)]
        except StoreError as exc:
            log.warning("TensorBoard: cannot list %s (%s); starting a new event file anyway", self.prefix, exc)
            names = []
        found = [(int(m.group(1)), int(m.group(2))) for n in names if (m := _NAME.match(n))]
        return max((t for t, _ in found), default=0), max((s + 1 for _, s in found), default=0)

    def _open_file(self) -> None:
        # TensorBoard reads a directory's files in name order, and stops re-reading a file once
        # a later one exists: the timestamp leads the name and never repeats or goes back.
        self._stamp = max(int(self._clock()), self._stamp + 1)
        name = f"events.out.tfevents.{self._stamp:010d}.{self._host}.kftrain-s{self.segment:04d}-{self._part:04d}"
        self.uri = join_uri(self.prefix, name)
        self._buffer = bytearray(tfrecord(encode_event(self._clock(), 0, file_version="brain.Event:2")))

    def _append(self, event: bytes) -> None:
        self._buffer += tfrecord(event)

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        """Record scalars at `step` (uploaded at the next :meth:`flush`)."""
        self._append(encode_event(self._clock() if wall_time is None else wall_time, step, scalars=values))

    def flush(self) -> None:
        """Queue the file as it is now for upload; returns at once."""
        with self._lock:
            if self._closed:
                return
            if self._pending and self._pending[-1][0] == self.uri:
                self._pending[-1] = (self.uri, bytes(self._buffer))  # a newer copy of the same file
            else:
                self._pending.append((self.uri, bytes(self._buffer)))
            self._flushes += 1
            self._lock.notify()
        if len(self._buffer) >= self.max_file_bytes:
            self._part += 1
            self._open_file()

    def close(self, timeout_s: float | None = None) -> None:
        """Upload what was recorded and stop the upload thread (waits for the store)."""
        atexit.unregister(self.close)
        self.flush()
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout_s)

    def _upload_loop(self) -> None:
        wait_for = 0  # after a failure: retry once a later flush (or close) has come
        while True:
            with self._lock:
                while not self._closed and (not self._pending or self._flushes < wait_for):
                    self._lock.wait()
                if not self._pending:
                    return
                uri, data = self._pending.pop(0)
                closing = self._closed
            try:
                self.store.put_bytes(uri, data)
            except Exception as exc:  # the curves are for people watching; training goes on
                if not self._failed_since:
                    log.warning("TensorBoard: upload of %s failed (%s); retrying at the next flush", uri, exc)
                    self._failed_since = time.monotonic()
                if closing:
                    log.warning("TensorBoard: %s not uploaded at the end of training (%s)", uri, exc)
                    continue
                with self._lock:
                    if not any(u == uri for u, _ in self._pending):  # a finished file: keep it queued
                        self._pending.insert(0, (uri, data))
                    wait_for = self._flushes + 1
                continue
            if self._failed_since:
                log.info("TensorBoard: uploads to %s work again", self.prefix)
                self._failed_since = 0.0
