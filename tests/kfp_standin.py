"""A STAND-IN for the Kubeflow Pipelines API server (REST v2beta1), for the submit tests.

No KFP deployment can run on the test machines. This small HTTP server answers the calls that
`kfp.Client` makes for upload, versioning, experiments and runs, checks what it receives (the
uploaded YAML must be a compiled pipeline; a run must name an uploaded version), and records
every request so tests can assert on them. Each poll of a run answers the next entry of
`run_states` (the last one repeats): a state, an HTTP status to fail that poll with, or
:data:`HANG_UP`.
`socketless(api)` hands kfp.Client's requests to it without a connection (unit tests); `tls`
serves it over HTTPS with a given certificate.
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import json
import ssl
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import urllib3
import yaml

PREFIX = "/apis/v2beta1"
#: A run state that answers the poll by closing the connection (a proxy or the server restarting).
HANG_UP = "hang up"


class StandInKFP:
    def __init__(self, run_states: list[str | int] | None = None, tls: tuple[str, str] | None = None) -> None:
        self.run_states = run_states or ["RUNNING", "SUCCEEDED"]
        self.broken: Callable[[str, str], dict | None] = lambda method, path: None
        self.pipelines: dict[str, dict] = {}
        self.experiments: dict[str, dict] = {}
        self.runs: dict[str, dict] = {}
        self.requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        if tls is not None:  # (certificate, key) PEM files: HTTPS on `localhost`, as a TLS ingress serves it
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.url = f"https://localhost:{self._server.server_address[1]}"
        # A short poll interval: `shutdown()` waits up to one (0.5 s by default) in every test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> StandInKFP:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the API ----------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, body: bytes, headers) -> tuple[int, dict]:
        self.requests.append({"method": method, "path": path, "query": query, "auth": headers.get("Authorization")})
        if path == f"{PREFIX}/healthz":
            return 200, {"multi_user": False}
        # Pipelines live in a namespace (multi-user KFP; "" is the shared ones), as a list sees them.
        namespace = query.get("namespace", [""])[0]
        if path == f"{PREFIX}/pipelines" and method == "GET":
            name = _filter_name(query)
            found = [
                p["info"]
                for p in self.pipelines.values()
                if name in (None, p["info"]["display_name"]) and p["namespace"] == namespace
            ]
            return 200, {"pipelines": found, "total_size": len(found)} if found else {}
        if path == f"{PREFIX}/pipelines/upload" and method == "POST":
            spec = _uploaded_pipeline(body, headers)
            name = query["name"][0]
            if any(p["info"]["display_name"] == name and p["namespace"] == namespace for p in self.pipelines.values()):
                return 409, {"error": f"pipeline {name} already exists in namespace {namespace!r}"}
            pid = str(uuid.uuid4())
            info = {"pipeline_id": pid, "display_name": name}
            self.pipelines[pid] = {"info": info, "versions": {}, "namespace": namespace}
            self._add_version(pid, query["name"][0], spec)
            return 200, info
        if path == f"{PREFIX}/pipelines/upload_version" and method == "POST":
            spec = _uploaded_pipeline(body, headers)
            pid = query["pipelineid"][0]
            if pid not in self.pipelines:
                return 404, {"error": f"pipeline {pid} not found"}
            return 200, self._add_version(pid, query["name"][0], spec)
        if path.startswith(f"{PREFIX}/pipelines/") and path.endswith("/versions") and method == "GET":
            pid = path.split("/")[-2]
            name = _filter_name(query)
            found = [
                v["info"] for v in self.pipelines[pid]["versions"].values() if name in (None, v["info"]["display_name"])
            ]
            return 200, {"pipeline_versions": found, "total_size": len(found)} if found else {}
        if path == f"{PREFIX}/experiments" and method == "GET":
            name = _filter_name(query)
            found = [e for e in self.experiments.values() if name in (None, e["display_name"])]
            return 200, {"experiments": found, "total_size": len(found)} if found else {}
        if path == f"{PREFIX}/experiments" and method == "POST":
            exp = json.loads(body)
            exp["experiment_id"] = str(uuid.uuid4())
            self.experiments[exp["experiment_id"]] = exp
            return 200, exp
        if path == f"{PREFIX}/runs" and method == "POST":
            run = json.loads(body)
            ref = run.get("pipeline_version_reference") or {}
            versions = self.pipelines.get(ref.get("pipeline_id"), {}).get("versions", {})
            if ref.get("pipeline_version_id") not in versions or run.get("experiment_id") not in self.experiments:
                return 400, {"error": "unknown pipeline version or experiment"}
            run.update(run_id=str(uuid.uuid4()), state="PENDING", polls=0)
            self.runs[run["run_id"]] = run
            return 200, {k: v for k, v in run.items() if k != "polls"}
        if path.startswith(f"{PREFIX}/runs/") and method == "GET":
            run = self.runs.get(path.rsplit("/", 1)[1])
            if run is None:
                return 404, {"error": "run not found"}
            answer = self.run_states[min(run["polls"], len(self.run_states) - 1)]
            run["polls"] += 1
            if answer == HANG_UP:
                return 0, {}
            if isinstance(answer, int):
                return answer, {"error": f"HTTP {answer} from the stand-in"}
            run["state"] = answer
            if run["state"] == "FAILED":
                run["error"] = {"message": "train: PyTorchJob failed: JobFailed"}
            return 200, {k: v for k, v in run.items() if k != "polls"}
        return 404, {"error": f"no route {method} {path}"}

    def _add_version(self, pid: str, name: str, spec: dict) -> dict:
        vid = str(uuid.uuid4())
        info = {"pipeline_id": pid, "pipeline_version_id": vid, "display_name": name}
        self.pipelines[pid]["versions"][vid] = {"info": info, "spec": spec}
        return info

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                parts = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, payload = api.handle(self.command, parts.path, parse_qs(parts.query), body, self.headers)
                if status == 0:  # HANG_UP: the connection closes without an answer
                    self.close_connection = True
                    return
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _serve

            def log_message(self, *args) -> None:
                pass

        return Handler


def _filter_name(query: dict) -> str | None:
    if "filter" not in query:
        return None
    predicates = json.loads(query["filter"][0]).get("predicates", [])
    return next((p["stringValue"] for p in predicates if p.get("key") == "display_name"), None)


def _uploaded_pipeline(body: bytes, headers) -> dict:
    """The YAML in the multipart `uploadfile` field; it must be a compiled KFP pipeline."""
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {headers['Content-Type']}\r\n\r\n".encode() + body
    )
    (part,) = [p for p in msg.iter_parts() if p.get_param("name", header="content-disposition") == "uploadfile"]
    spec = next(yaml.safe_load_all(part.get_payload(decode=True)))
    assert "pipelineInfo" in spec and "root" in spec, "not a compiled pipeline"
    return spec


def socketless(api: StandInKFP):
    """A `urllib3.PoolManager.urlopen` that hands each request to `api.handle` instead of a
    socket (patch it in with monkeypatch): everything of kfp.Client above the transport is real.
    Where `api.broken(method, path)` gives an object, the request is answered 200 with it: a
    server that answers JSON but not as KFP does."""

    def urlopen(self, method, url, body=None, headers=None, preload_content=True, **kwargs):
        parts = urlsplit(url)
        bad = api.broken(method, parts.path)
        if bad is not None:
            return _response(200, bad, preload_content)
        if isinstance(body, str):
            body = body.encode()
        status, payload = api.handle(method, parts.path, parse_qs(parts.query), body or b"", headers or {})
        api.requests[-1]["timeout"] = kwargs.get("timeout")  # what the client would wait at most
        return _response(status, payload, preload_content)

    return urlopen


def _response(status: int, payload: dict, preload_content: bool) -> urllib3.HTTPResponse:
    raw = json.dumps(payload).encode()
    return urllib3.HTTPResponse(
        body=io.BytesIO(raw),
        headers={"Content-Type": "application/json", "Content-Length": str(len(raw))},
        status=status,
        reason="OK" if status == 200 else "Error",
        preload_content=preload_content,
    )
