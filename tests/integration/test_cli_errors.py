"""Where the user meets kftrain's errors: the command line. Each case runs `kftrain` in its own
process group and asserts the exit code, that the LAST line names the field, flag or object and
says what to do, and that nothing was written (no run folder, no objects in the store).

All but one fail before any step starts; `non-numeric-cell` fails inside data prep, where the
step's own error line must still be the last line (its traceback only in the full log)."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import run_group

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
RUN = ["run", "--local"]


@dataclass
class Case:
    """One bad input: the CLI arguments and config (`{tmp}`, `{bucket}`, `{hang}`, `{web}` filled
    in), files to write first, the exit code, and what the last line must hold."""

    args: list[str]
    last: list[str]
    code: int = 2
    config: str = ""
    files: dict[str, str] = field(default_factory=dict)
    #: Seconds the command may take (the store check's 5 s limit, plus start-up).
    within_s: float = 60.0
    #: The line before the last must hold these (where the full log is).
    before_last: list[str] = field(default_factory=list)
    #: Text that must appear nowhere in the output.
    never: list[str] = field(default_factory=list)
    #: The last line must be exactly the one phrase in `last`.
    exact_last: bool = False


def csv_with(cell: str, row: int = 7) -> str:
    return "a,b,label\n" + "".join(f"{cell if i == row else '1.5'},2.5,{'xy'[i % 2]}\n" for i in range(60))


CASES = {
    # CLI flags: refused at parse time, naming the flag.
    "min-accuracy-nan": Case([*RUN, "--min-accuracy", "nan"], ["--min-accuracy", "[0, 1]"]),
    "max-perplexity-negative": Case([*RUN, "--max-perplexity", "-1"], ["--max-perplexity", "at least 1"]),
    "output-dir-empty": Case([*RUN, "--output-dir", ""], ["--output-dir", "must not be empty"]),
    "output-dir-a-file": Case(
        [*RUN, "--output-dir", "{tmp}/afile"], ["--output-dir", "is a file, not a folder"], files={"afile": "x"}
    ),
    # Config values out of range.
    "negative-seed": Case([*RUN], ["train.seed", "must be from 0 to 4294967295"], config="train:\n  seed: -1\n"),
    "zero-collective-timeout": Case(
        [*RUN], ["job.collective_timeout_seconds", "> 0"], config="job:\n  collective_timeout_seconds: 0\n"
    ),
    # A Kubernetes name the API server would refuse: refused at load, in the preflight's words.
    "namespace-not-a-label": Case(
        [*RUN],
        ["kubernetes.namespace: 'team.a' is not a namespace: a DNS-1123 label"],
        config="kubernetes:\n  namespace: team.a\n",
    ),
    # Checked before any step: the checkpoint prefix, a custom task.
    "checkpoint-uri-a-file": Case(
        [*RUN],
        ["checkpoint.uri: cannot write under {tmp}/ck", "is a file, not a folder"],
        config="checkpoint:\n  uri: {tmp}/ck\n",
        files={"ck": "not a folder"},
    ),
    "checkpoint-uri-missing-bucket": Case(
        [*RUN, "--store", "s3://{bucket}/root"],
        ["checkpoint.uri s3://no-such-bucket-kftrain/ck", "does not exist", "create it"],
        config="checkpoint:\n  uri: s3://no-such-bucket-kftrain/ck\n",
    ),
    "custom-task-missing": Case(
        [*RUN],
        ["task: cannot import 'no_such_pkg.tasks:MyTask'", "importable"],
        config="task: no_such_pkg.tasks:MyTask\n",
    ),
    # A store given with --store is named by the flag in the pre-flight's errors too (was: `store.uri:`
    # alone, a field the user never wrote).
    "store-flag-missing-bucket": Case(
        [*RUN, "--store", "s3://no-such-bucket-kftrain/root"],
        ["--store: store.uri: bucket 'no-such-bucket-kftrain' does not exist", "create it"],
    ),
    # The store check keeps its 5 s against an endpoint that accepts and never answers.
    "store-hangs-long-read-timeout": Case(
        [*RUN, "--store", "s3://{bucket}/root", "--s3-endpoint", "{hang}"],
        ["--store: store.uri: cannot reach the object store", "s3://{bucket}/root", "the store check's limit of 5s"],
        config="store:\n  read_timeout_seconds: 600\n  connect_timeout_seconds: 600\n  retry_budget_seconds: 600\n",
        within_s=30,
    ),
    # The lookup of the checkpoint resume_from names keeps its 15 s against the same endpoint.
    "resume-from-on-a-hung-store": Case(
        [*RUN],
        ["checkpoint.resume_from 's3://{bucket}/runs/old'", "cannot reach the object store", "limit of 15s"],
        config="store:\n  endpoint: {hang}\n  read_timeout_seconds: 600\n  retry_budget_seconds: 600\n"
        "checkpoint:\n  resume_from: s3://{bucket}/runs/old\n",
        within_s=45,
    ),
    # `kftrain runs` asks the store one small question first, within the same 5 s.
    "runs-on-a-hung-store": Case(
        ["runs", "--store", "s3://{bucket}/root", "--s3-endpoint", "{hang}"],
        ["--store: cannot reach the object store", "the store check's limit of 5s"],
        within_s=30,
    ),
    # A password in the endpoint: refused, and printed nowhere (the resume line included).
    "password-in-endpoint": Case(
        [*RUN, "--store", "s3://{bucket}/root", "--s3-endpoint", "http://bob:hunter2@127.0.0.1:9"],
        ["store.endpoint", "--s3-endpoint", "AWS_ACCESS_KEY_ID"],
        never=["hunter2"],
    ),
    # `kftrain submit` to a web server that is no KFP API.
    "submit-not-kfp": Case(["submit", "--host", "{web}"], ["{web} does not answer as a KFP API", "--host"]),
    # Inside a step: data prep's own error is the last line; the resume line names the full log.
    # (Also the quiet half of tests/integration/test_pipeline_local.py's failing-step test: the
    # last line is exactly the step's error, kfp.local's executor input stays in the full log.)
    "non-numeric-cell": Case(
        [*RUN],
        [
            "kftrain: error: step data-prep: {tmp}/in.csv: row 8 (line 9), column 'a': 'x' is not a number; "
            "every feature column must be numeric"
        ],
        code=1,
        config="data:\n  source: {tmp}/in.csv\ntrain:\n  epochs: 1\n",
        files={"in.csv": csv_with("x")},
        before_last=["kftrain: see full log: {tmp}/kftrain-outputs/runs/"],
        never=["Traceback", "[master-0]", "Got executor_input"],
        within_s=150,
        exact_last=True,
    ),
}


@pytest.fixture
def hang() -> Iterator[str]:
    """An endpoint that accepts connections and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()
    for conn in held:
        conn.close()


@pytest.fixture
def web(tmp_path_factory) -> Iterator[str]:
    """A plain web server: 404 for every KFP path."""
    root = tmp_path_factory.mktemp("www")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kw):
            super().__init__(*args, directory=str(root), **kw)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def waits(case: Case) -> bool:
    """A case against the endpoint that never answers waits out a time limit: `serial` (tests/conftest.py)."""
    return "{hang}" in case.config or any("{hang}" in arg for arg in case.args)


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.serial] if waits(case) else []) for name, case in CASES.items()]
)
def test_the_last_line_names_what_to_fix_and_nothing_is_written(name, tmp_path, s3_env, bucket, hang, web):
    case = CASES[name]
    fill = {"tmp": tmp_path, "bucket": bucket, "hang": hang, "web": web}
    for rel, text in case.files.items():
        (tmp_path / rel).write_text(text.format(**fill))
    args = [a.format(**fill) for a in case.args]
    if case.config:
        (tmp_path / "c.yaml").write_text(case.config.format(**fill))
        args += ["--config", "c.yaml"]
    env = {**os.environ, **s3_env.env(), "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    rc, out = run_group(
        [sys.executable, "-m", "pipelines.cli", *args], timeout=case.within_s + 30, env=env, cwd=tmp_path
    )
    took = time.monotonic() - start
    lines = out.strip().splitlines()
    assert rc == case.code, out[-3000:]
    for phrase in case.last:
        assert phrase.format(**fill) in lines[-1], out[-3000:]
    if case.exact_last:
        assert lines[-1] == case.last[0].format(**fill), out[-3000:]
    for phrase in case.before_last:
        assert phrase.format(**fill) in lines[-2], out[-3000:]
    for phrase in case.never:
        assert phrase not in out, out[-3000:]
    assert took < case.within_s, f"took {took:.1f}s"
    if case.code == 2:  # refused before any step: no run folder, no log, nothing in the store
        assert "Executing task" not in out and "started" not in out and "Traceback" not in out, out[-3000:]
        assert not (tmp_path / "kftrain-outputs").exists()
        assert list(s3_env.client().list_objects(bucket, recursive=True)) == []
    else:  # failed in a step: the run's folder holds its log, and no checkpoint was written
        [run] = (tmp_path / "kftrain-outputs" / "runs").iterdir()
        [log_file] = run.glob("log-*")
        assert not list(run.glob("checkpoints/step-*"))  # the claimed prefix holds no step
        log = log_file.read_text()
        assert (
            "Traceback (most recent call last)" in log and "kftrain-error: data-prep: " in log
        )  # the traceback is kept, in the log


@pytest.mark.parametrize(
    ("argv", "how"),
    [
        (["job", "manifest", "--kind", "pytorchjob"], "stdout-closed"),  # `>&-` (was: a traceback: sys.stdout None)
        (["runs", "--store", "{tmp}/st-\u00e9"], "stdout-closed"),
        (["runs", "--store", "{tmp}/st-\u00e9"], "ascii"),  # PYTHONIOENCODING=ascii (was: exit 2, 'ascii' codec)
    ],
)
def test_a_closed_or_narrow_standard_output_is_no_traceback(tmp_path, argv, how):
    """A command whose output is its product refuses a standard output closed as it starts (was:
    a traceback; for a moment, success with the output thrown away); one that cannot encode a
    character gets it escaped."""
    import subprocess

    (tmp_path / "st-\u00e9" / "runs").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), **({"PYTHONIOENCODING": "ascii"} if how == "ascii" else {})}
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *(a.format(tmp=tmp_path) for a in argv)],
        stdout=subprocess.PIPE if how == "ascii" else None,
        stderr=subprocess.PIPE,
        env=env,
        timeout=120,
        preexec_fn=(lambda: os.close(1)) if how == "stdout-closed" else None,
    )
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    if how == "ascii":
        assert done.returncode == 0 and b"st-\\xe9" in done.stdout, done.stdout
    else:
        assert done.returncode == 1, done.stderr.decode()
        assert (
            done.stderr.decode()
            .strip()
            .endswith("standard output is closed (`>&-`): give the command a file or a pipe")
        )
