"""The TrainJob progress report over real HTTPS: rank 0's reporter, configured only by the three
variables Kubeflow Trainer v2.3 injects, POSTs to a local stand-in of the controller's status
server (a FAKE: same path, Bearer token and response contract, a certificate signed by a CA the
test makes), which checks the body against the vendored TrainJob schema. No controller can run
here; what this adds to tests/unit/test_job_status.py is the real transport: TLS verified
against the injected CA file, the token header, the JSON body, and a server the pod cannot
trust (or that refuses) leaving training untouched.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.unit.test_progress import check_trainer_status
from trainer.job_status import SERVER_CA_ENV, SERVER_TOKEN_ENV, SERVER_URL_ENV, reporter_from_env
from trainer.progress import Progress, Snapshot

pytestmark = pytest.mark.timeout(60)
PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/kftrain-job/status"


def _cert(subject: str, issuer_key, issuer_name, key, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name or x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(tmp_path):
    """A CA (the webhook CA the controller copies into `<job>-tls-config`) and a server cert it signed."""
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("kubeflow-trainer-ca", ca_key, None, ca_key, ca=True)
    server = _cert("127.0.0.1", ca_key, ca.subject, server_key, ca=False)
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(pem))
    (tmp_path / "tls.crt").write_bytes(server.public_bytes(pem))
    (tmp_path / "tls.key").write_bytes(
        server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


class StatusServer:
    """A FAKE status server on loopback: the v2.3.0 contract (POST on the TrainJob's status path,
    `Authorization: Bearer <projected token>`, 200 echoing the body, 403 / 422 as metav1.Status)."""

    def __init__(self, tmp_path, token: str, refuse: bool = False) -> None:
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != PATH or refuse:
                    return self._answer(404 if self.path != PATH else 500, {"kind": "Status", "code": 500})
                if self.headers["Authorization"] != f"Bearer {token}":
                    return self._answer(403, {"kind": "Status", "reason": "Forbidden", "code": 403})
                doc = json.loads(body)
                check_trainer_status(doc["trainerStatus"])
                outer.received.append(doc)
                self._answer(200, doc)

            def _answer(self, code, doc):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}{PATH}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def train_reporting(env: dict[str, str], steps: int = 12) -> Progress:
    progress = Progress(
        total_steps=steps, items_per_step=64, item_name="tokens", flops_per_step=0, peak_flops=0,
        interval=3, device=torch.device("cpu"), enabled=True, reporter=reporter_from_env(env, interval_s=0),
    )  # fmt: skip
    for step in range(1, steps + 1):
        progress.step(step, 0, torch.tensor(3.0 / step), 1e-3)
    progress.close()
    return progress


@pytest.fixture
def pki(tmp_path):
    write_pki(tmp_path)
    (tmp_path / "token").write_text("projected-jwt\n")
    return tmp_path


def test_rank_0_reports_to_the_status_server_over_tls_with_its_projected_token(pki):
    server = StatusServer(pki, "projected-jwt")
    try:
        env = {SERVER_URL_ENV: server.url, SERVER_CA_ENV: str(pki / "ca.crt"), SERVER_TOKEN_ENV: str(pki / "token")}
        progress = train_reporting(env)
    finally:
        server.close()
    assert server.received, "no report arrived"
    last = Snapshot.from_trainer_status(server.received[-1]["trainerStatus"])
    assert last == progress.last and last.percent == 100 and last.eta_seconds == 0


@pytest.mark.parametrize(
    ("case", "warning"),
    [
        ("untrusted", "CERTIFICATE_VERIFY_FAILED"),  # the pod has another CA: TLS is verified
        ("bad-token", "HTTPError 403"),
        ("server-error", "HTTPError 500"),
    ],
)
def test_a_status_server_that_fails_leaves_training_untouched(pki, tmp_path_factory, caplog, case, warning):
    server = StatusServer(pki, "someone-elses-jwt" if case == "bad-token" else "projected-jwt", case == "server-error")
    ca = pki / "ca.crt"
    if case == "untrusted":
        other = tmp_path_factory.mktemp("other-ca")
        write_pki(other)
        ca = other / "ca.crt"
    try:
        env = {SERVER_URL_ENV: server.url, SERVER_CA_ENV: str(ca), SERVER_TOKEN_ENV: str(pki / "token")}
        with caplog.at_level(logging.INFO, logger="kftrain.train"):
            progress = train_reporting(env)
    finally:
        server.close()
    assert progress.last.step == 12 and not server.received
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warning in warnings[0] and "training goes on" in warnings[0], warnings


def test_a_training_run_reports_from_its_first_interval_to_its_end(pki, digits, tmp_path, monkeypatch):
    """The trainer itself (trainer/train.py) in a pod with Trainer's three variables: its reports
    reach the stand-in server, the last one at 100% with the epoch's validation metrics."""
    from trainer.config import load_config
    from trainer.distributed import DistEnv
    from trainer.train import run_training

    server = StatusServer(pki, "projected-jwt")
    monkeypatch.setenv(SERVER_URL_ENV, server.url)
    monkeypatch.setenv(SERVER_CA_ENV, str(pki / "ca.crt"))
    monkeypatch.setenv(SERVER_TOKEN_ENV, str(pki / "token"))
    cfg = load_config(overrides={"job.replicas": 1, "train.epochs": 2, "checkpoint.enabled": False})
    try:
        metrics = run_training(cfg, digits, str(tmp_path / "model"), DistEnv())
    finally:
        server.close()
    last = Snapshot.from_trainer_status(server.received[-1]["trainerStatus"])
    assert (last.step, last.total_steps, last.percent, last.epoch) == (metrics["steps"], metrics["steps"], 100, 1)
    assert last.item_name == "samples" and last.rate > 0 and last.loss > 0
    assert last.metrics["val_accuracy"] == pytest.approx(metrics["val_accuracy"])
