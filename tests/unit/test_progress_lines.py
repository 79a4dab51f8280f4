"""ProgressLine: at most one line per interval while work goes on, then one final line."""

import logging

import pytest

from trainer.progress import ProgressLine, format_bytes, format_memory, format_seconds
from trainer.storage import LocalStore, read_chunks


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kftrain.progress"]


def test_lines_are_throttled_to_one_per_interval_plus_the_final_line(caplog):
    clock = Clock()
    line = ProgressLine("reading s3://b/x.csv", total=10_000_000, interval_s=5.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="kftrain.progress"):
        for _ in range(10):  # 1 MB a second: a line at 5 s and at 10 s, none in between
            clock.now += 1.0
            line.add(1_000_000)
        line.done()
    assert messages(caplog) == [
        "reading s3://b/x.csv: 5.0 MB of 10.0 MB (50%), 1.0 MB/s, eta 5.0s",
        "reading s3://b/x.csv: 10.0 MB of 10.0 MB (100%), 1.0 MB/s, eta 0.0s",
        "reading s3://b/x.csv: 10.0 MB in 10s (1.0 MB/s)",
    ]


def test_a_short_operation_logs_only_its_final_line_with_files_and_note(caplog):
    clock = Clock()
    line = ProgressLine("export to /m", clock=clock)
    with caplog.at_level(logging.INFO, logger="kftrain.progress"):
        line.add(1500, "model.pt")
        clock.now += 0.5
        line.add(500, "model_card.json")
        assert (
            line.done("each format verified")
            == "export to /m: 2 files, 2.0 kB in 0.5s (4.0 kB/s); each format verified"
        )
    assert len(messages(caplog)) == 1


def test_without_a_total_a_line_has_no_percent_or_eta():
    clock = Clock()
    line = ProgressLine("downloading", clock=clock)
    line.add(3_400_000, "__0_0.distcp")
    assert line.line(clock.now + 2.0, "__0_0.distcp") == "downloading: 3.4 MB, 1.7 MB/s (__0_0.distcp)"


@pytest.mark.parametrize(
    ("n", "text"), [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (2_500_000, "2.5 MB"), (3.2e9, "3.2 GB")]
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    ("s", "text"), [(0.04, "0.0s"), (9.94, "9.9s"), (42.4, "42s"), (185, "3m05s"), (3720, "1h02m")]
)
def test_format_seconds(s, text):
    assert format_seconds(s) == text


def test_read_chunks_reports_the_object_it_reads_when_asked(tmp_path, caplog):
    path = tmp_path / "rows.csv"
    path.write_bytes(b"x" * 2500)
    with caplog.at_level(logging.INFO, logger="kftrain.progress"):
        assert b"".join(read_chunks(LocalStore(), str(path), 1000)) == b"x" * 2500
        assert not messages(caplog)  # silent unless asked
        assert b"".join(read_chunks(LocalStore(), str(path), 1000, progress="data prep pass 1/2")) == b"x" * 2500
    [final] = messages(caplog)
    assert final.startswith(f"data prep pass 1/2: reading {path}: 2.5 kB in ")


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (318_700, "311.2 KiB"), (3 * 2**30 + 2**29, "3.5 GiB")],
)
def test_format_memory_in_binary_units(n, text):
    assert format_memory(n) == text
