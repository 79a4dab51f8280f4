"""`kftrain submit` (pipelines/submit.py) against a stand-in KFP API server process on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.submit import Submission, SubmitError, follow, make_client, parse_params, submit, version_name
from tests.kfp_standin import HANG_UP, StandInKFP
from tests.unit.test_pipelines_cli import call_cli
from trainer.launch.local import free_port

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("status", "phrase"),
    [
        (None, "cannot reach the KFP API at"),
        (401, "rejected the request (HTTP 401"),
        (403, "rejected the request (HTTP 403"),
        (503, "is unavailable (HTTP 503"),  # the API restarting: not "not a KFP API, check --host"
        (502, "is unavailable (HTTP 502"),
    ],
)
def test_submit_to_an_unreachable_or_rejecting_host_is_one_line(capsys, html_server, status, phrase):
    host = f"http://127.0.0.1:{free_port()}" if status is None else html_server(status)
    rc, out = call_cli(["submit", "--host", host, "--package", str(PACKAGE)], capsys)
    assert rc == 2, out
    assert phrase in out, out
    assert "Traceback" not in out and out.strip().count("\n") == 0


PACKAGE = REPO / "compiled" / "training_pipeline.yaml"


def kftrain(*args, env_extra=None):
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )


def test_first_submit_uploads_the_pipeline_then_later_ones_add_versions(tmp_path):
    with StandInKFP() as kfp_api:
        out = kftrain(
            "submit", "--host", kfp_api.url, "--package", str(PACKAGE), "--param", "epochs=3", "--run-name", "first"
        )
        assert out.returncode == 0, out.stderr
        (pipeline,) = kfp_api.pipelines.values()
        assert pipeline["info"]["display_name"] == "kftrain-training"
        names = {v["info"]["display_name"] for v in pipeline["versions"].values()}
        assert version_name("kftrain-training", PACKAGE) in names
        (run,) = kfp_api.runs.values()
        assert run["display_name"] == "first"
        assert run["runtime_config"]["parameters"] == {"epochs": 3}
        assert f"{kfp_api.url}/#/runs/details/{run['run_id']}" in out.stdout
        # The same YAML again: no new version (content-addressed), a second run.
        out = kftrain("submit", "--host", kfp_api.url, "--package", str(PACKAGE))
        assert out.returncode == 0, out.stderr
        assert len(pipeline["versions"]) == len(names) and len(kfp_api.runs) == 2
        # Changed YAML: a new version of the same pipeline.
        changed = tmp_path / "changed.yaml"
        changed.write_text(PACKAGE.read_text().replace("Data prep, distributed", "Data prep and distributed"))
        out = kftrain("submit", "--host", kfp_api.url, "--package", str(changed))
        assert out.returncode == 0, out.stderr
        assert len(kfp_api.pipelines) == 1 and len(pipeline["versions"]) == len(names) + 1


@pytest.mark.parametrize(
    ("final", "code", "word"), [("SUCCEEDED", 0, "SUCCEEDED"), ("FAILED", 1, "FAILED"), ("CANCELED", 1, "CANCELED")]
)
def test_wait_follows_the_run_and_the_exit_code_says_how_it_ended(final, code, word):
    with StandInKFP(run_states=["RUNNING", final]) as kfp_api:
        out = kftrain(
            "submit", "--host", kfp_api.url, "--package", str(PACKAGE), "--wait", "--poll-seconds", "0.05",
            env_extra={"KFP_TOKEN": "token-value-123"},
        )  # fmt: skip
        assert out.returncode == code, out.stdout + out.stderr
        assert f"run finished: {word}" in out.stdout
        if final == "FAILED":
            assert "PyTorchJob failed" in out.stdout
        assert all(
            r["auth"] == "Bearer token-value-123" for r in kfp_api.requests if r["path"] != "/apis/v2beta1/healthz"
        )
        assert "token-value-123" not in out.stdout + out.stderr


def test_ctrl_c_while_waiting_stops_following_and_says_the_run_goes_on():
    import os
    import signal

    with StandInKFP(run_states=["RUNNING"]) as kfp_api:
        cmd = [sys.executable, "-m", "pipelines.cli", "submit", "--host", kfp_api.url, "--package", str(PACKAGE)]
        proc = subprocess.Popen(
            [*cmd, "--wait", "--poll-seconds", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        lines = iter(proc.stdout.readline, "")
        assert any(line.startswith("run RUNNING") for line in lines)  # following
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    (run_id,) = kfp_api.runs
    assert proc.returncode == 130, out + err
    assert (
        f"kftrain: stopped following; the run is not stopped by this; see it at {kfp_api.url}/#/runs/details/{run_id}"
        in err
    )
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("epoch=3", "--param epoch: not a parameter of this pipeline"),
        ("epochs=three", "--param epochs=three: expected a whole number, e.g. 3"),
        ("replicas", "write it as name=value"),
        ("batch_size=63", "train.batch_size: must divide by the world size 2"),
    ],
)
def test_bad_parameters_fail_before_anything_is_uploaded(param, message):
    with pytest.raises(SubmitError, match=None) as info:
        parse_params([param], PACKAGE)
    assert message in str(info.value)
    with StandInKFP() as kfp_api:
        out = kftrain("submit", "--host", kfp_api.url, "--package", str(PACKAGE), "--param", param)
        assert out.returncode == 2 and message in out.stderr
        assert not kfp_api.pipelines and not kfp_api.runs


@pytest.mark.parametrize("namespace", [None, "team-a"])
def test_submit_function_finds_its_pipeline_again_in_its_namespace(namespace):
    """Multi-user KFP lists a namespace's pipelines apart from the shared ones (the stand-in too):
    a second submit to the namespace adds to its pipeline (was: looked among the shared ones, did
    not find it, and its upload was refused as a duplicate), and a shared pipeline of the same
    name is not the namespace's."""
    import kfp

    with StandInKFP() as kfp_api:
        client = kfp.Client(host=kfp_api.url)
        if namespace:
            shared = submit(client, kfp_api.url, PACKAGE, "p", "exp", "r0", {})
        first = submit(client, kfp_api.url, PACKAGE, "p", "exp", "r1", {}, namespace=namespace)
        second = submit(client, kfp_api.url, PACKAGE, "p", "exp", "r2", {}, namespace=namespace)
        assert first.pipeline_id == second.pipeline_id and first.version_id == second.version_id
        assert kfp_api.pipelines[first.pipeline_id]["namespace"] == (namespace or "")
        assert len(kfp_api.pipelines) == (2 if namespace else 1)
        if namespace:
            assert shared.pipeline_id != first.pipeline_id
        finds = [r for r in kfp_api.requests if r["method"] == "GET" and r["path"].endswith("/pipelines")]
        assert all(r["query"].get("namespace", [""])[0] == (namespace or "") for r in finds[-2:])


def test_two_pipelines_of_one_name_are_one_line_naming_the_flag():
    import kfp

    with StandInKFP() as kfp_api:
        client = kfp.Client(host=kfp_api.url)
        first = submit(client, kfp_api.url, PACKAGE, "p", "exp", "r1", {})
        twin = dict(kfp_api.pipelines[first.pipeline_id], info={"pipeline_id": "twin", "display_name": "p"})
        kfp_api.pipelines["twin"] = twin  # as another user's upload of the same name, racing ours
        with pytest.raises(SubmitError, match="holds more than one pipeline named 'p': pass --pipeline-name"):
            submit(client, kfp_api.url, PACKAGE, "p", "exp", "r2", {})


def test_a_pods_service_account_token_is_sent_when_kfp_token_is_not_set(tmp_path, monkeypatch, capsys):
    """In a Kubeflow notebook the projected token at KF_PIPELINES_SA_TOKEN_PATH authenticates
    (kfp.Client ignores it once a host is given: was a 401 saying to set KFP_TOKEN); kfp's own
    FutureWarning is not printed on every submit."""
    token = tmp_path / "token"
    token.write_text("sa-token-of-the-notebook-pod\n")
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))
    with StandInKFP() as kfp_api:
        rc, out = call_cli(["submit", "--host", kfp_api.url, "--package", str(PACKAGE)], capsys)
        assert rc == 0, out
        assert {r["auth"] for r in kfp_api.requests} == {"Bearer sa-token-of-the-notebook-pod"}
    assert "FutureWarning" not in out and "sa-token" not in out


def test_submit_function_reuses_an_existing_experiment():
    import kfp

    with StandInKFP() as kfp_api:
        client = kfp.Client(host=kfp_api.url)
        first = submit(client, kfp_api.url, PACKAGE, "p", "exp", "r1", {})
        second = submit(client, kfp_api.url, PACKAGE, "p", "exp", "r2", {})
        assert first.experiment_id == second.experiment_id and len(kfp_api.experiments) == 1
        assert first.version_id == second.version_id


def _self_signed(folder: Path, name: str) -> tuple[str, str]:
    """A self-signed certificate for `localhost` (its own CA) and its key, made by openssl."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(cert), str(key)


# A KFP API behind a private CA: (--ca-cert, $SSL_CERT_FILE, how --host reaches the stand-in, the exit
# code, what the output says). `ca` is the CA that signed the server's certificate (for `localhost`),
# `other` one that did not; `https://127.0.0.1` is an address the certificate does not name; `http`
# is the stand-in without TLS.
PRIVATE_CA_ROWS = {
    "no bundle: named as a certificate to trust": (None, None, "https://localhost", 2, "presents a TLS certificate "
        "this machine does not trust (self-signed certificate): give the PEM file of the CA that signed it with "
        "--ca-cert (or SSL_CERT_FILE)"),
    "--ca-cert": ("ca", None, "https://localhost", 0, "run "),
    "$SSL_CERT_FILE, for kfp.Client too": (None, "ca", "https://localhost", 0, "run "),
    "--ca-cert wins over $SSL_CERT_FILE": ("ca", "other", "https://localhost", 0, "run "),
    "the wrong CA": ("other", None, "https://localhost", 2, "other.pem is not the CA that signed it: give that CA's "
        "PEM file"),
    "another name than the certificate's": ("ca", None, "https://127.0.0.1", 2, "(IP address mismatch, certificate "
        "is not valid for '127.0.0.1'.): it was issued for another name: give --host the name the certificate names"),
    "not a PEM file": ("junk", None, "https://localhost", 2, "junk.txt: cannot be read as the CA bundle (it holds no "
        "PEM certificate)"),
    "no such file": ("missing", None, "https://localhost", 2, "missing.pem: cannot be read as the CA bundle (No such "
        "file or directory)"),
    "--ca-cert for an http:// host": ("ca", None, "http", 2, "--ca-cert: --host http://127.0.0.1:"),
    "$SSL_CERT_FILE unused by an http:// host": (None, "missing", "http", 0, "run "),
}  # fmt: skip


@pytest.mark.parametrize("case", PRIVATE_CA_ROWS, ids=list(PRIVATE_CA_ROWS))
def test_a_kfp_api_behind_a_private_ca_is_trusted_through_ca_cert(tmp_path, monkeypatch, capsys, case):
    """Was: no way to trust it (kfp.Client trusts certifi's list alone, so $SSL_CERT_FILE passed the
    health check and failed the upload), and the error said to check --host."""
    flag, env, reach, code, said = PRIVATE_CA_ROWS[case]
    files = {"ca": _self_signed(tmp_path, "ca")[0], "other": _self_signed(tmp_path, "other")[0]}
    files["junk"] = str(tmp_path / "junk.txt")
    files["missing"] = str(tmp_path / "missing.pem")
    Path(files["junk"]).write_text("not a certificate\n")
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    if env:
        monkeypatch.setenv("SSL_CERT_FILE", files[env])
    with StandInKFP(tls=None if reach == "http" else (files["ca"], str(tmp_path / "ca.key"))) as api:
        host = api.url if reach == "http" else api.url.replace("https://localhost", reach)
        argv = ["submit", "--host", host, "--package", str(PACKAGE), *(["--ca-cert", files[flag]] if flag else [])]
        rc, out = call_cli(argv, capsys)
        assert rc == code and said in out, out
        assert len(api.runs) == (1 if code == 0 else 0)
        if flag in ("junk", "missing") or reach == "http" and flag:  # refused before any request
            assert not api.requests


def test_kfp_client_trusts_the_bundle_beside_certifi_s_roots(tmp_path):
    """kfp.Client's `ssl_ca_cert` replaces certifi's list: a $SSL_CERT_FILE holding only a company's CA
    must not stop it trusting a KFP API a public CA signed."""
    import certifi

    from pipelines.submit import _with_public_roots

    ca = _self_signed(tmp_path, "ca")[0]
    combined = Path(_with_public_roots(ca)).read_text()
    assert Path(certifi.where()).read_text() in combined and Path(ca).read_text() in combined


def test_each_dropped_poll_is_retried_by_kftrain_s_one_retry_policy():
    """kfp.Client's connections retry nothing themselves: urllib3's default three retries under
    kftrain's hid each dropped poll, and made a poll that timed out wait four times its request
    timeout, past `--timeout`. Real sockets: urllib3 retries below the stand-in's socketless hook."""
    lines: list[str] = []
    with StandInKFP(run_states=["RUNNING", HANG_UP, HANG_UP, HANG_UP, "SUCCEEDED"]) as api:
        client = make_client(api.url, None)
        api.runs["r-1"] = {"run_id": "r-1", "state": "PENDING", "polls": 0}  # as a submitted run is
        result = Submission("p", "v", "kftrain-v", "e", "r-1", f"{api.url}/#/runs/details/r-1")
        result = follow(client, api.url, result, 120, 0.01, sleep=lambda s: None, log=lines.append)
    assert result.state == "SUCCEEDED", lines
    assert len([line for line in lines if "retry" in line]) == 3, lines
    assert len([r for r in api.requests if r["path"].endswith("/runs/r-1")]) == 5
