"""The one error path's pure parts: the marked line a failed step ends with, how the console
keeps it, the redaction of URLs, `~` in local paths, and the store check's deadline."""

from __future__ import annotations

import io
import os
import sys
import time

import pytest

from components.runtime import end_with_one_line
from pipelines.console import StepConsole
from trainer.config import ConfigError
from trainer.errors import ERROR_MARKER, KftrainError, error_line, one_line, parse_error_line, redact
from trainer.launch.backend import JobFailed
from trainer.shards import DataError
from trainer.storage import StoreError, _time_left, check_deadline, parse_uri

REDACTED = [
    ("http://bob:hunter2@minio:9000", "http://***@minio:9000"),
    ("https://token@host/path", "https://***@host/path"),
    ("--s3-endpoint http://u:p@h:1 --store s3://b/k", "--s3-endpoint http://***@h:1 --store s3://b/k"),
    ("{'endpoint': 'http://a:b@h'}", "{'endpoint': 'http://***@h'}"),
    ("no url here, user@example.com", "no url here, user@example.com"),
    ("s3://bucket/key@v1 and http://h:9000/x", "s3://bucket/key@v1 and http://h:9000/x"),  # '@' after the host
    # An AWS secret key often holds '/': unencoded, the URL's host seems to end there.
    ("http://AKIAX:wJalr/K7MDENG@minio:9000 x", "http://***@minio:9000 x"),
    ("s3://AKIAX:wJalr/K7/MDENG@bucket/k", "s3://***@bucket/k"),
    ("hf://org/name@v1 hf://hf_tok@org/name", "hf://org/name@v1 hf://***@org/name"),
    ("s3://u:p@ss@bucket/k", "s3://***@bucket/k"),  # an '@' in the password
    ("http://u:ab'cd@host:9000", "http://***@host:9000"),  # a quote in it
    # A space in it, inside a message's repr() quotes (either kind: the other may be in the password).
    ("got 's3://u:hun ter2@bkt/ds' x", "got 's3://***@bkt/ds' x"),
    ('got "s3://u:hun\'ter2 p@bkt/ds" x', 'got "s3://***@bkt/ds" x'),
    ("got 's3://bucket/a key@v1'", "got 's3://bucket/a key@v1'"),  # a key's '@' after the bucket: kept
    # A credential in the query: a presigned URL's signature, a key or token parameter (were: printed).
    ("s3://b/x?X-Amz-Signature=abc123&X-Amz-Date=1", "s3://b/x?X-Amz-Signature=***&X-Amz-Date=1"),
    ("'http://h:9000?sig=abc' x", "'http://h:9000?sig=***' x"),
    ("https://h/p?a=1&token=abc#top", "https://h/p?a=1&token=***#top"),
    (
        "https://storage.googleapis.com/b/o?X-Goog-Signature=f00",
        "https://storage.googleapis.com/b/o?X-Goog-Signature=***",
    ),
    ("http://u:p@h/x?API_KEY=zz", "http://***@h/x?API_KEY=***"),
    ("key=value outside a URL", "key=value outside a URL"),
    # A key or token pasted anywhere (a name, a mapping an error shows): the word alone goes.
    ("got {'accesskey': 'AKIAIOSFODNN7EXAMPLE'}", "got {'accesskey': '***'}"),
    ("key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY: no", "key ***: no"),
    ("got wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY.", "got ***."),  # a full stop after it
    # Paths of a key's length and letters (a review found them masked): from the root, or of 3+ segments.
    ("s3://bucket/Runs2024/Model7Qx/ckpt9Step/Ab3 x", "s3://bucket/Runs2024/Model7Qx/ckpt9Step/Ab3 x"),
    ("HF_HOME=/workspace/Src2/Lib/Python3/Site/Pkgs/xy", "HF_HOME=/workspace/Src2/Lib/Python3/Site/Pkgs/xy"),
    ("MY_VAR=Zx8Qw2Lp9Rt4Vb7Nm1Kj6Hg3Fd5Sa0Yu+Pq7Ws and hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "MY_VAR=*** and ***"),
    # A URL a slash short or long (a refusal of it says so): its userinfo all the same (was: printed).
    ("lacks '//': s3:/u:pw0rdSecret@b/x", "lacks '//': s3:/***@b/x"),
    ("s3:///u:pw0rdSecret@b/x and minio:/AKIAX:wJ/K7@b", "s3:///***@b/x and minio:/***@b"),
    ("file:///home/me/data@v2 file:/data@v2", "file:///home/me/data@v2 file:/data@v2"),  # a path's '@': kept
    # A token the user wrote as a key, inside a field path (was: printed, the dots making one word).
    ("train.Ab3xY9kLm2Qw8ErT5yUi7OpAs4DfGh6JkL: unknown key", "train.***: unknown key"),
    ("kubernetes.labels.wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY.x: no", "kubernetes.labels.***.x: no"),
    ("kubernetes.node_selector.kubernetes.io/arch: no", "kubernetes.node_selector.kubernetes.io/arch: no"),
    # A user and password with no scheme before them: a DSN, a value in a refusal's quotes (were: printed).
    ("connect app:S3cretPassw0rd@db.example.com:5432/x failed", "connect ***@db.example.com:5432/x failed"),
    ("got 'u:S3cretPassw0rd@x' and hf://org/name@u:pw@h", "got '***@x' and hf://org/name@***@h"),
    # Not: a time, a URI whose part after ':' is a user, an image's digest after a registry's port.
    (
        "at 10:30 mailto:ml@example.com reg.io:5000/img@sha256:ab",
        "at 10:30 mailto:ml@example.com reg.io:5000/img@sha256:ab",
    ),
    # A review's cases: a JSON Web Token is one word, dots and all (was: its header masked alone);
    # a DSN's password with '/', ':' or '@' in it; a token as a key's last part, after a '/'.
    (
        "token eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ1MSJ9.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
        "token ***",
    ),
    ("DSN app:S3/cret@db.example.com app:pa:ss@db app:p@ss@db", "DSN ***@db.example.com ***@db ***@db"),
    (
        "kubernetes.annotations.example.com/a8F3kLm92QpZx7Yt4Rv6Wb1Nc5Hd0Jg2: x",
        "kubernetes.annotations.example.com/***: x",
    ),
    # ... and what is none (were: masked): an image's tag and digest, an IAM member, a key's time and tag.
    (
        'image "nvcr.io/nvidia/pytorch:24.01-py3@sha256:0a1b" serviceAccount:sa@proj.iam.gserviceaccount.com',
        'image "nvcr.io/nvidia/pytorch:24.01-py3@sha256:0a1b" serviceAccount:sa@proj.iam.gserviceaccount.com',
    ),
    ("s3://bucket/data/2024-05-01T12:00Z@v2/part-0", "s3://bucket/data/2024-05-01T12:00Z@v2/part-0"),
    # Words that are not: digests, run ids, paths, CamelCase names, dated names.
    (
        "sha 0123456789abcdef0123456789abcdef01234567 run 20261205-220907-ebd598",
        "sha 0123456789abcdef0123456789abcdef01234567 run 20261205-220907-ebd598",
    ),
    (
        "/models/Llama-3.1-8B-Instruct/model-00001-of-00004.safetensors TeamNlpProject2024Q3Experiment7",
        "/models/Llama-3.1-8B-Instruct/model-00001-of-00004.safetensors TeamNlpProject2024Q3Experiment7",
    ),
]

#: A URL's userinfo as users write it: with a password, with a '/' in it, a token alone.
CREDENTIALS = [
    "bob:SECRETPART",
    "AKIAX:wJ/SECRETPART",
    "SECRETPART",
    "bob:x'SECRETPART",
    "bob:x@SECRETPART",
    # A space in the password, with a quote or a '/' beside it (were: printed whole by the refusal).
    "bob:hun SECRETPART",
    "bob:x' SECRETPART",
    'bob:x" SECRETPART',
    "bob:a b/SECRETPART",
]


def _url_takers():
    """Every place kftrain takes a URL a user wrote, as `(name, call)`: each must refuse one with
    credentials (and say so) without printing them."""
    import argparse

    from pipelines.cli import _api_url
    from trainer.config import load_config
    from trainer.storage import endpoint_problem

    def endpoint(url):
        if problem := endpoint_problem(url):
            raise ValueError(problem)

    return [
        ("store.uri", lambda u: parse_uri(f"s3://{u}@bucket/key")),
        ("store.endpoint", lambda u: endpoint(f"http://{u}@minio:9000")),
        ("config store.endpoint", lambda u: load_config(overrides={"store.endpoint": f"http://{u}@minio:9000"})),
        ("config data.source", lambda u: load_config(overrides={"data.source": f"s3://{u}@bucket/k"})),
        ("submit --host", lambda u: _api_url(f"http://{u}@kfp:8080")),
        ("model.init_from", lambda u: load_config(overrides={"task": "causal_lm", "model.init_from": f"hf://{u}@o/m"})),
    ], (ValueError, argparse.ArgumentTypeError)


@pytest.mark.parametrize("userinfo", CREDENTIALS)
def test_every_url_taker_refuses_credentials_without_printing_them(userinfo):
    takers, errors = _url_takers()
    for name, take in takers:
        with pytest.raises(errors) as info:
            take(userinfo)
        message = str(info.value)
        assert "SECRETPART" not in message, (name, message)
        assert "user or password" in message or "token" in message, (name, message)


#: A URL a user wrote a slash short, a slash long, or without its scheme, `{}` its userinfo.
MALFORMED_URLS = ["s3:/{}@bucket/key", "s3:///{}@bucket/key", "{}@bucket/key", "minio:/{}@bucket"]


@pytest.mark.parametrize("form", MALFORMED_URLS)
@pytest.mark.parametrize("userinfo", [c for c in CREDENTIALS if ":" in c])
def test_a_malformed_store_uri_is_refused_without_printing_its_password(form, userinfo):
    """The refusal that says a URL lacks its `//` or its scheme printed the password in it."""
    from trainer.config import load_config

    for field in ("store.uri", "data.source"):
        with pytest.raises(ValueError) as info:
            load_config(overrides={field: form.format(userinfo)})
        assert "SECRETPART" not in str(info.value), (field, str(info.value))
    with pytest.raises(ValueError) as info:
        parse_uri(form.format(userinfo))
    assert "SECRETPART" not in str(info.value)


@pytest.mark.parametrize("path", ["My Drive/ckpt@best", "bob's runs/x@y", "runs@v2/x", "./u:pw@b/x"])
def test_a_local_folder_with_an_at_sign_is_a_folder(path):
    """Only a ':' before the '@' makes a path with no scheme a URL's user and password (a space or
    a quote was taken for one: `My Drive/ckpt@best` was refused)."""
    assert parse_uri(path).scheme == "file"


@pytest.mark.parametrize(
    ("url", "message"),
    [("http://[::1:9000", "IPv6 host is written in brackets"), ("http:///u:SECRETPART@h", "user or password")],
)
def test_a_malformed_endpoint_is_refused_naming_its_field(url, message):
    from trainer.config import load_config

    with pytest.raises(ConfigError) as info:
        load_config(overrides={"store.uri": "s3://bucket/k", "store.endpoint": url})
    assert str(info.value).startswith("store.endpoint: ") and message in str(info.value), str(info.value)
    assert "SECRETPART" not in str(info.value)


@pytest.mark.parametrize(("text", "expected"), REDACTED)
def test_the_userinfo_of_every_url_is_redacted(text, expected):
    assert redact(text) == expected


@pytest.mark.parametrize("cls", [ConfigError, StoreError, DataError, JobFailed])
def test_every_error_the_user_can_fix_shares_the_base_and_keeps_its_old_one(cls):
    assert issubclass(cls, KftrainError)
    assert issubclass(cls, ValueError if cls in (ConfigError, DataError) else RuntimeError)


def test_an_error_line_round_trips_and_is_one_line():
    exc = DataError("s3://b/in.csv: row 8 (line 9), column 'a': 'x' is not a number;\nfix the row")
    line = error_line("data-prep", exc)
    assert line.startswith(ERROR_MARKER) and "\n" not in line
    assert parse_error_line("    " + line) == (
        "data-prep",
        "s3://b/in.csv: row 8 (line 9), column 'a': 'x' is not a number (the lines above it in the log say more)",
    )


def test_a_failed_job_keeps_its_first_line_and_the_trainers_own_failure():
    exc = JobFailed(
        "job kftrain-1 failed: replica master-0 exited with code 1. Its last log lines:\n"
        "  [master-0] [rank 0] 15:00:01 training failed: no object at s3://b/ds/manifest.json\n"
        "  [master-0] torchrun: child failed"
    )
    assert one_line(exc) == (
        "job kftrain-1 failed: replica master-0 exited with code 1: no object at s3://b/ds/manifest.json"
    )


@pytest.mark.parametrize(
    "line",
    [
        "kftrain-error: data-prep",  # no message
        "kftrain-error: : message",  # no step
        "kftrain-error: two words: message",
        "[KFP Executor INFO]: see kftrain-error: x: y",  # not at the start of the line
        "trainer.shards.DataError: bad",
    ],
)
def test_only_a_well_formed_marked_line_parses(line):
    assert parse_error_line(line) is None


def uncaught_in_a_component(step: str, capsys, monkeypatch, *errors: Exception) -> str:
    """What a component's stderr holds after each of `errors` ends it uncaught (its hook installed)."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored after the test
    end_with_one_line(step)
    for exc in errors:
        try:
            raise exc
        except Exception as caught:
            sys.excepthook(type(caught), caught, caught.__traceback__)
    return capsys.readouterr().err


def test_a_component_ends_its_log_with_the_marked_line_after_the_traceback(capsys, monkeypatch):
    store_error = StoreError("bucket 'x' does not exist at http://h: create it")
    err = uncaught_in_a_component("evaluate", capsys, monkeypatch, store_error, KeyError("bug")).splitlines()
    first_end = err.index("kftrain-error: evaluate: bucket 'x' does not exist at http://h: create it")
    assert err[first_end - 1].startswith("trainer.storage.StoreError")  # the traceback, then the line
    assert err[-1] == "KeyError: 'bug'" and sum(ERROR_MARKER in line for line in err) == 1  # a bug: no line


def test_a_components_traceback_is_redacted_as_its_last_line_is(capsys, monkeypatch):
    """A cluster's step log reaches no console that redacts: the traceback printed before the
    marked line printed the message unmasked (was: a password raw in one line, `***` in the next)."""
    secrets = (ConfigError("x: 'http://u:SECRETPART@h' bad"), KeyError("hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"))
    err = uncaught_in_a_component("configure", capsys, monkeypatch, *secrets)
    assert "SECRETPART" not in err and "hf_aBcD" not in err, err
    assert "trainer.config.ConfigError: x: 'http://***@h' bad" in err and "KeyError: '***'" in err, err


STEP_FAILS_WITH_MARKER = """\
15:00:00.002 - INFO - Executing task 'data-prep'
    Traceback (most recent call last):
      File "x.py", line 3, in data_prep
    trainer.shards.DataError: in.csv: row 8, column 'a': 'x' is not a number
    kftrain-error: data-prep: in.csv: row 8, column 'a': 'x' is not a number

15:00:05.000 - ERROR - Task 'data-prep' finished with status FAILURE
"""


def test_the_console_keeps_the_steps_line_for_the_cli_and_shows_no_traceback():
    log, out, err = io.StringIO(), io.StringIO(), io.StringIO()
    console = StepConsole(lambda: log, out, err)
    console.write(STEP_FAILS_WITH_MARKER.replace("'x'", "'x' at http://u:secret@h:1"))
    assert console.failed_step == "data-prep"
    assert console.failure_line == "in.csv: row 8, column 'a': 'x' at http://***@h:1 is not a number"
    assert err.getvalue().splitlines()[-1].endswith("data-prep FAILED after 0.0s")  # no tail: the CLI ends with it
    assert "secret" not in log.getvalue() and "Traceback" in log.getvalue()


def test_a_tilde_in_a_local_path_is_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert parse_uri("~/kftrain/runs").key == os.path.join(str(tmp_path), "kftrain", "runs")
    assert parse_uri("s3://bkt/~x").key == "~x"  # an object key is not a path


def test_the_check_deadline_cuts_and_nests():
    assert _time_left() is None
    with check_deadline(5.0):
        assert 4.9 < _time_left() <= 5.0
        with check_deadline(60.0):  # the earlier deadline wins
            assert _time_left() <= 5.0
        with check_deadline(0.5):
            assert _time_left() <= 0.5
        time.sleep(0.01)
        assert _time_left() < 5.0
    assert _time_left() is None


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("min_accuracy", 0.0, True),
        ("min_accuracy", 1.0, True),
        ("min_accuracy", float("nan"), False),
        ("min_accuracy", 1.01, False),
        ("min_accuracy", -0.1, False),
        ("max_perplexity", 0.0, True),
        ("max_perplexity", 12.5, True),
        ("max_perplexity", -1.0, False),
        ("max_perplexity", 0.99, False),  # a perplexity is at least 1
        ("max_perplexity", 1.0, True),
        ("max_perplexity", float("nan"), False),
        ("max_perplexity", float("inf"), False),
    ],
)
def test_the_quality_gate_bounds_are_one_rule(name, value, ok):
    from trainer.checks import gate_problem

    assert (gate_problem(name, value) == "") == ok


def test_the_local_write_check_creates_nothing_and_names_the_file_in_the_way(tmp_path):
    from trainer.storage import LocalStore

    LocalStore().check(str(tmp_path / "a" / "b"))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match=rf"cannot write under {tmp_path}/f/ck: {tmp_path}/f is a file, not a folder"):
        LocalStore().check(str(tmp_path / "f" / "ck"))


@pytest.mark.parametrize(
    ("name", "value", "masked"),
    [
        ("KFP_TOKEN", "MyPlainToken42", True),  # no shape the patterns know: masked as the variable's value
        ("AWS_SECRET_ACCESS_KEY", "minio-secret-123", True),
        ("AWS_SESSION_TOKEN", "short-lived-session", True),
        ("HF_TOKEN", "abcdefghij", True),
        ("DB_PASSWORD", "correct horse", True),
        ("PGPASSWORD", "PGprobePass777", True),  # libpq's and MySQL's (were: printed)
        ("MYSQL_PWD", "MYSQLprobePwd888", True),
        ("PWD", "/home/user/work", False),  # the shell's working folder
        ("KFP_TOKEN", "password", False),  # shorter than 10: it would take a word out of every message
        ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp/key.json", False),  # a path: a place, named in errors
        ("KUBEFLOW_TRAINER_SERVER_TOKEN", "/var/run/secrets/trainer/token", False),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/eks/token", False),  # a place, named in errors
        ("KF_PIPELINES_SA_TOKEN_PATH", "/var/run/secrets/kubeflow/pipelines/token", False),
        ("TOKENIZERS_PARALLELISM", "false-value", False),  # not a credential's name
        ("KFTRAIN_RUN", "MyPlainToken42", False),
    ],
)
def test_the_value_of_every_credential_variable_is_masked_wherever_it_appears(monkeypatch, name, value, masked):
    """An API's error page may echo the request's token back (was: printed, a plain token having
    no shape that redact knows)."""
    monkeypatch.setenv(name, value)
    text = f"your header: Bearer {value}; at {value}."
    assert (value not in redact(text)) == masked, redact(text)
    monkeypatch.delenv(name)
    assert value in redact(text)  # the environment is read again once it changed


def test_a_token_set_as_another_variable_is_unset_is_masked(monkeypatch):
    """The environment's size unchanged, its names changed (was: the names of its credential
    variables cached by its size, and the token printed)."""
    monkeypatch.setenv("KFTRAIN_SOME_SETTING", "1")
    redact("warm the cache")
    monkeypatch.delenv("KFTRAIN_SOME_SETTING")
    monkeypatch.setenv("KFP_TOKEN", "MyPlainToken42")
    assert "MyPlainToken42" not in redact("your header: Bearer MyPlainToken42")
