"""Upload a compiled pipeline as a new version of a named pipeline, start a run, follow it.

Authentication: a bearer token from the environment (`KFP_TOKEN`, never a command-line flag, so
it stays out of shell history and process lists); else, in a pod (a Kubeflow notebook), the
projected service-account token KFP's clients read (`KF_PIPELINES_SA_TOKEN_PATH`, by default
/var/run/secrets/kubeflow/pipelines/token), which kfp.Client itself ignores once a host is given;
else none, for an endpoint that needs none (a port-forward).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import os
import re
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import KftrainError, redact, yaml_problem
from trainer.launch.retry import REQUEST_TIMEOUT_S, ApiRetry, ApiUnavailable, http_status

TOKEN_ENV = "KFP_TOKEN"
#: Where a pod's projected service-account token for KFP is (the variable, then kfp's default).
SA_TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
#: Where a CA bundle is named when `--ca-cert` is not given: OpenSSL's variable, then requests'.
CA_BUNDLE_ENVS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
#: HTTP statuses of a KFP API that is there but not answering now (restarting, a gateway's timeout).
UNAVAILABLE = frozenset({502, 503, 504})
#: How much of an error answer's body is shown (an HTML error page may be hundreds of lines).
BODY_EXCERPT_CHARS = 200
_KFP_TYPES = {
    "NUMBER_INTEGER": int,
    "NUMBER_DOUBLE": float,
    "STRING": str,
    "BOOLEAN": bool,
    "STRUCT": dict,
    "LIST": list,
}


#: KFP's final run states (API v2beta1's RuntimeState); CANCELING and PAUSED are not final.
FINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"})
#: How long one poll of a followed run may keep failing transiently (the KFP API restarting, a
#: gateway's 502/503) before `--wait` stops following; the run itself goes on in KFP.
FOLLOW_RETRY_BUDGET_S = 600.0


class SubmitError(KftrainError, ValueError):
    """The submission cannot go ahead; the message says what to fix."""


class RunGone(SubmitError):
    """The followed run was deleted from KFP."""


@dataclass
class Submission:
    """What was submitted and how it ended (`state` is None without --wait)."""

    pipeline_id: str
    version_id: str
    version_name: str
    experiment_id: str
    run_id: str
    run_url: str
    state: str | None = None
    error: str | None = None

    def left_running(self) -> str:
        """What to tell a user who stops following the run: KFP runs it on."""
        return f"the run is not stopped by this; see it at {self.run_url}"


#: What to pass instead of a --package that is not a compiled pipeline.
PACKAGE_HINT = (
    "pass the YAML `kftrain compile` writes (compiled/training_pipeline.yaml), or leave --package out to compile now"
)


def pipeline_parameters(package: Path) -> dict[str, dict[str, Any]]:
    """The compiled pipeline's parameters: name -> {type, default}; SubmitError naming
    --package when it is not a compiled KFP pipeline: no such file, a folder, not a pipeline's
    YAML, or a compiled component's."""
    if package.is_dir():
        inside = package / "training_pipeline.yaml"
        instead = f"pass the file in it: --package {inside}" if inside.is_file() else PACKAGE_HINT
        raise SubmitError(f"--package {package}: is a folder, not a compiled pipeline; {instead}")
    if not package.exists():
        raise SubmitError(f"--package {package}: no such file; {PACKAGE_HINT}")
    if not package.is_file():  # a device (`/dev/zero`) or a pipe would be read without end
        raise SubmitError(f"--package {package}: not a regular file; {PACKAGE_HINT}")
    if (size := package.stat().st_size) > MAX_PACKAGE_BYTES:
        raise SubmitError(
            f"--package {package}: {size:,} bytes, larger than a compiled pipeline may be "
            f"({MAX_PACKAGE_BYTES:,} bytes); is it the right file? {PACKAGE_HINT}"
        )
    try:
        spec = next(yaml.safe_load_all(package.read_text(encoding="utf-8")), None)
        if not isinstance(spec, dict) or not isinstance(spec.get("root"), dict):
            what = (
                "empty"
                if spec is None
                else "a mapping without a `root` component"
                if isinstance(spec, dict)
                else f"a YAML {type(spec).__name__}"
            )
            raise SubmitError(f"--package {package}: not a compiled KFP pipeline ({what}); {PACKAGE_HINT}")
        if component := _component_name(spec):
            raise SubmitError(
                f"--package {package}: a compiled component ({component}), not a pipeline: KFP would run that one "
                f"step alone; {PACKAGE_HINT}"
            )
        params = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        out = {}
        for name, p in params.items():
            default = p.get("defaultValue")
            if p["parameterType"] == "NUMBER_INTEGER" and isinstance(default, float):
                default = int(default)  # the compiled YAML writes integer defaults as 64.0
            out[name] = {"type": p["parameterType"], "default": default}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, LookupError, TypeError, AttributeError) as exc:
        reason = yaml_problem(exc)
        raise SubmitError(
            f"--package {package}: not a compiled KFP pipeline ({type(exc).__name__}: {reason}); {PACKAGE_HINT}"
        ) from None
    return out


def _component_name(spec: Any) -> str | None:
    """The component's name when `spec` is a compiled component (compiled/components/*.yaml), else
    None. KFP compiles a component into the same format as a pipeline: `pipelineInfo`, and a root
    DAG with one task, the component itself, named as the pipeline is (`pipelineInfo.name`); a
    pipeline's steps are tasks of another name (the training pipeline: many)."""
    if not isinstance(spec, dict):
        return None
    info, root, components = spec.get("pipelineInfo"), spec.get("root"), spec.get("components")
    dag = root.get("dag") if isinstance(root, dict) else None
    tasks = dag.get("tasks") if isinstance(dag, dict) else None
    name = info.get("name") if isinstance(info, dict) else None
    if isinstance(tasks, dict) and list(tasks) == [name] and isinstance(components, dict) and len(components) == 1:
        return str(name)
    return None


#: What a --param value of each type is written as.
_PARAM_FORMS = {
    int: "expected a whole number, e.g. 3",
    float: "expected a number, e.g. 0.001",
    bool: "expected true or false",
    list: 'expected a JSON list, e.g. \'[{"key": "gpu", "operator": "Exists"}]\'',
    dict: 'expected a JSON object, e.g. \'{"pool": "a100"}\'',
}


def parse_params(pairs: list[str], package: Path) -> dict[str, Any]:
    """`k=v` strings -> typed arguments, checked against the pipeline's own parameters."""
    from trainer.config import load_yaml

    known = pipeline_parameters(package)
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise SubmitError(f"--param {pair!r}: write it as name=value")
        if name not in known:
            raise SubmitError(f"--param {name}: not a parameter of this pipeline; known: {', '.join(sorted(known))}")
        if name in out:
            raise SubmitError(f"--param {name}: given twice; give each parameter once")
        if name == "config":
            _refuse_a_file_name(raw)
        expected = _KFP_TYPES.get(known[name]["type"], str)
        value = raw if expected is str else load_yaml(raw, f"--param {name}")
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise SubmitError(f"--param {name}={redact(raw)}: {_PARAM_FORMS.get(expected, expected.__name__)}")
        out[name] = value
    _validate_config(out, known)
    return out


def _refuse_a_file_name(raw: str) -> None:
    """SubmitError when `--param config=` got a config file's name instead of its text: one line
    that names a file here or ends in .yaml/.yml/.json, and is not a YAML mapping itself. The
    parameter carries the text into the pipeline (the pods cannot read this machine's files), and
    a name would be refused later as a config that "must hold a mapping, got 'str'"."""
    import shlex

    text = raw.strip()
    if not text or "\n" in text:
        return
    named = text.lower().endswith((".yaml", ".yml", ".json")) or os.path.isfile(os.path.expanduser(text))
    if not named:
        return
    try:
        if isinstance(yaml.safe_load(text), dict):  # `model: {init_from: /m/x.json}`: a config after all
            return
    except yaml.YAMLError:
        pass
    raise SubmitError(
        f"--param config={text}: the parameter takes the config's YAML text, not a file's name (the pipeline's "
        f"pods cannot read this machine's files); pass the file with --config {shlex.quote(text)}, which sends its text"
    )


def _validate_config(args: dict[str, Any], known: dict[str, dict[str, Any]]) -> None:
    """Run the trainer's config validation on the run's effective parameters before uploading,
    and the quality gate's bounds (the same as `kftrain run`'s flags)."""
    from components.params import BY_NAME, SECRET_PARAMS, config_from_params, parameter_named_by
    from trainer.checks import GATE_DEFAULTS, check_plan_gpu, gate_ignored, gate_problem
    from trainer.launch.job import check_cluster_locations, check_job_manifests
    from trainer.pipeline_steps import LAUNCHERS
    from trainer.runs import check_run_id_has_a_store

    for name in ("min_accuracy", "max_perplexity"):
        if name in args and (problem := gate_problem(name, args[name])):
            raise SubmitError(f"--param {name}={args[name]}: {problem}")
    if args.get("launcher", "auto") not in LAUNCHERS:  # else the training step fails, after data prep
        raise SubmitError(f"--param launcher={args['launcher']}: must be one of {', '.join(LAUNCHERS)}")

    effective = {k: args.get(k, known[k]["default"]) for k in known if k in BY_NAME}
    config = args.get("config", known.get("config", {}).get("default") or "")
    # A pipeline without a Secret parameter (an own one) mounts none: not given.
    secrets = {name: args.get(name, known[name].get("default")) for name in SECRET_PARAMS if name in known}
    try:
        cfg = config_from_params(config, **secrets, **effective)
        check_job_manifests(cfg)
        check_cluster_locations(cfg)
        check_plan_gpu(cfg)  # else the plan step fails on it, after the run started
        check_run_id_has_a_store(cfg)  # else the configure step fails on it
    except ValueError as exc:
        if named := parameter_named_by(str(exc), args):  # a bad value a --param gave: name the flag
            raise SubmitError(f"--param {named[0]}: {exc}{named[1]}") from None
        raise SubmitError(f"the run's parameters are invalid: {exc}") from None
    for name in ("min_accuracy", "max_perplexity"):
        # The default is no bar set (the pipeline's configure step cannot tell it from one given), as there.
        value = args.get(name, GATE_DEFAULTS[name])
        if value != GATE_DEFAULTS[name] and (problem := gate_ignored(name, value, cfg.task)):
            raise SubmitError(f"--param {name}={args[name]}: {problem}")


#: The largest --package read: KFP's compiled pipelines are kilobytes to a few megabytes.
MAX_PACKAGE_BYTES = 64 * 1024 * 1024


def version_name(pipeline_name: str, package: Path) -> str:
    """Content-addressed: the same compiled YAML (from Git) is always the same version."""
    return f"{pipeline_name}-{hashlib.sha256(package.read_bytes()).hexdigest()[:12]}"


@contextlib.contextmanager
def kfp_errors(host: str, ca: str | None = None) -> Iterator[None]:
    """Turn the KFP API being unreachable or refusing us into one :class:`SubmitError` line (`ca`:
    the CA bundle the connections trust, :func:`ca_bundle`)."""
    import urllib3.exceptions
    from kfp_server_api.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        status = exc.status or 0
        if status in (401, 403):
            raise _rejected(host, status, exc.reason) from None
        if status in UNAVAILABLE:
            raise _unavailable(host, status, exc.reason) from None
        said = answer_excerpt(exc.body)
        raise SubmitError(
            redact(f"the KFP API at {host} answered HTTP {status} {exc.reason}{f': {said}' if said else ''}")
        ) from None
    except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as exc:
        raise _unreachable(host, exc, ca) from None


def _rejected(host: str, status: int, reason: str) -> SubmitError:
    return SubmitError(
        f"the KFP API at {redact(host)} rejected the request (HTTP {status} {reason}): set {TOKEN_ENV} to a "
        "valid bearer token, or check the namespace and your access to it"
    )


def _unavailable(host: str, status: int, reason: str) -> SubmitError:
    return SubmitError(
        f"the KFP API at {redact(host)} is unavailable (HTTP {status} {reason}): it may be restarting, or the "
        "gateway in front of it timed out; try again in a minute (kubectl -n kubeflow get pods -l app=ml-pipeline)"
    )


def answer_excerpt(body: Any) -> str:
    """What an error answer says, in one short line, redacted: a KFP error's `message` (or
    `error`), else the body's text with HTML's tags and runs of white space taken out, at most
    :data:`BODY_EXCERPT_CHARS` characters."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    text = str(body or "")
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("message") or answer.get("error"), str):
        text = answer.get("message") or answer["error"]
    text = redact(text)  # before the cut: half a token no longer matches the token it is of
    text = re.sub(r"(?is)<(script|style)\b.*?</\1>|<[^>]*>", " ", text)
    text = " ".join(text.split())
    return text if len(text) <= BODY_EXCERPT_CHARS else text[: BODY_EXCERPT_CHARS - 3].rstrip() + "..."


def ca_bundle(flag: str | None, host: str) -> str | None:
    """The PEM file of the CAs the KFP API's TLS certificate is checked against, beside the usual
    roots: `--ca-cert`, else $SSL_CERT_FILE or $REQUESTS_CA_BUNDLE (so that kfp.Client, which
    trusts only certifi's list, trusts what this machine's other tools do), else None. None for an
    `http://` host, which uses no TLS (`--ca-cert` with one is refused). Raises
    :class:`SubmitError` naming where it came from when it holds no certificate."""
    if not host.lower().startswith("https://"):
        if flag:
            raise SubmitError(
                f"--ca-cert: --host {redact(host)} uses no TLS, so no certificate is checked: give the https:// "
                "address, or leave out --ca-cert"
            )
        return None
    where, path = (
        ("--ca-cert", flag)
        if flag
        else next(((name, os.environ[name]) for name in CA_BUNDLE_ENVS if os.environ.get(name)), ("", None))
    )
    if path is None:
        return None
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        # SSLError is an OSError too: its text is OpenSSL's code.
        why = "it holds no PEM certificate" if isinstance(exc, ssl.SSLError) or not exc.strerror else exc.strerror
        raise SubmitError(
            f"{where} {path}: cannot be read as the CA bundle ({why}): give the PEM file of the CA that signed "
            "the KFP API's certificate"
        ) from None
    return path


#: OpenSSL's verify results that mean no trusted CA signed the certificate (X509_V_ERR_*: unable to
#: get the issuer, self-signed, self-signed in the chain, unable to get the local issuer, unable to
#: verify the first certificate, untrusted).
_UNTRUSTED = frozenset({2, 18, 19, 20, 21, 27})
#: ... that the certificate is for another name or address (hostname, IP address mismatch).
_OTHER_NAME = frozenset({62, 64})
#: ... that it is out of its dates (not yet valid, expired).
_OUT_OF_DATE = frozenset({9, 10})


def _verify_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check's failure in `exc`, however urllib or urllib3 wrapped it."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            return e
        todo += [
            x for x in (getattr(e, "reason", None), e.__cause__, e.__context__, *e.args) if isinstance(x, BaseException)
        ]
    return None


def _untrusted(host: str, failure: ssl.SSLCertVerificationError, ca: str | None) -> SubmitError:
    code, detail = failure.verify_code, failure.verify_message or "certificate verify failed"
    if code in _OTHER_NAME:
        fix = "it was issued for another name: give --host the name the certificate names"
    elif code in _OUT_OF_DATE:
        fix = "it is out of its dates: renew it on the server, or check this machine's clock"
    elif ca:
        fix = f"{ca} is not the CA that signed it: give that CA's PEM file"
    elif code in _UNTRUSTED:
        fix = f"give the PEM file of the CA that signed it with --ca-cert (or {CA_BUNDLE_ENVS[0]})"
    else:
        fix = "check the server's certificate"
    return SubmitError(
        f"the KFP API at {redact(host)} presents a TLS certificate this machine does not trust ({detail}): {fix}"
    )


def _unreachable(host: str, exc: BaseException, ca: str | None = None) -> SubmitError:
    if (failure := _verify_failure(exc)) is not None:
        return _untrusted(host, failure, ca)
    reason = getattr(exc, "reason", None) or exc
    return SubmitError(
        f"cannot reach the KFP API at {redact(host)} ({type(reason).__name__}: {reason}): check --host "
        "(e.g. a running `kubectl port-forward svc/ml-pipeline-ui 8080:80`)"
    )


def probe_host(host: str, timeout_s: float = 10.0, ca: str | None = None) -> None:
    """One request to the KFP API's health endpoint, so that an unreachable or rejecting host, or
    one that is not a KFP API at all (a web page, another service, a login page in front of it),
    is one clear line at once: kfp.Client retries its health check and reports a timeout, and
    against another service fails later with a confusing message ("Missing the required
    parameter `pipeline_id`")."""
    import http.client
    import urllib.error
    import urllib.request

    url = f"{host.rstrip('/')}/apis/v2beta1/healthz"
    context = None
    if ca:  # beside the usual roots, as kfp.Client's bundle (make_client)
        context = ssl.create_default_context()
        context.load_verify_locations(cafile=ca)
    req = urllib.request.Request(url)
    token = bearer_token(host)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            kind, body = resp.headers.get("Content-Type", "?"), resp.read(65536)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise _rejected(host, exc.code, exc.reason) from None
        if exc.code in UNAVAILABLE:
            raise _unavailable(host, exc.code, exc.reason) from None
        raise _not_kfp(host, f"HTTP {exc.code} {exc.reason} for {url}") from None
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        raise _unreachable(host, exc, ca) from None
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise _not_kfp(host, f"HTTP 200 with {kind.split(';')[0]} that is not KFP's JSON for {url}")


def _not_kfp(host: str, seen: str) -> SubmitError:
    # A login page in front of the API answers a request whose token it did not take, too.
    login = (
        "if that is a login page in front of it, the token sent did not get past it (expired, or for another "
        f"audience or host): set {TOKEN_ENV} to a fresh one"
        if os.environ.get(TOKEN_ENV) or _sa_token_path(host)
        else f"if a login page stands in front of it, set {TOKEN_ENV}"
    )
    return SubmitError(
        f"{redact(host)} does not answer as a KFP API ({seen}): check --host; it is the KFP API or UI "
        f"address, e.g. http://localhost:8080 with `kubectl port-forward svc/ml-pipeline-ui 8080:80`, and {login}"
    )


def _sa_token_path(host: str) -> str | None:
    """The pod's projected service-account token for KFP, where there is one and `host` may have
    it: a host inside the cluster (`ml-pipeline.kubeflow:8888`, `*.svc`, `*.svc.cluster.local`),
    or any host once $KF_PIPELINES_SA_TOKEN_PATH names the file (a pod's token is not sent to a
    host outside the cluster unasked)."""
    from urllib.parse import urlsplit

    named = os.environ.get(SA_TOKEN_PATH_ENV)
    name = (urlsplit(host).hostname or "").lower()
    in_cluster = name.endswith((".svc", ".svc.cluster.local")) or name.startswith("ml-pipeline")
    path = named or (SA_TOKEN_PATH if in_cluster else "")
    return path if path and os.path.isfile(path) else None


def bearer_token(host: str) -> str | None:
    """The token every request to `host` carries: $KFP_TOKEN, else the service-account token's
    file (:func:`_sa_token_path`)."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    path = _sa_token_path(host)
    if path is None:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as exc:
        raise SubmitError(f"cannot read the service-account token {path} ({exc.strerror}); set {TOKEN_ENV}") from None


def make_client(host: str, namespace: str | None, ca: str | None = None):
    """A kfp.Client for `host`, with the bearer token of :func:`bearer_token` (the service
    account's as a credential that reads its file again, since the kubelet rotates it), trusting
    the CA bundle `ca` (:func:`ca_bundle`; None: the usual roots)."""
    import warnings

    import kfp

    probe_host(host, ca=ca)
    with warnings.catch_warnings():
        # kfp's notice that its client will change, on every submit: not the user's to act on.
        warnings.simplefilter("ignore", FutureWarning)
        token = os.environ.get(TOKEN_ENV) or None
        path = None if token else _sa_token_path(host)
        trusted = _with_public_roots(ca) if ca else None
        if path is None:
            return kfp.Client(host=host, namespace=namespace, existing_token=token, ssl_ca_cert=trusted)
        from kfp.client import ServiceAccountTokenVolumeCredentials

        credentials = ServiceAccountTokenVolumeCredentials(path)
        return kfp.Client(host=host, namespace=namespace, credentials=credentials, ssl_ca_cert=trusted)


def _with_public_roots(ca: str) -> str:
    """A file of `ca`'s certificates and certifi's roots, removed at exit: kfp.Client's bundle
    replaces certifi's list, and one from $SSL_CERT_FILE holding only a company's CA must not stop
    it trusting a KFP API a public CA signed (the health probe adds it to the usual roots too)."""
    import atexit
    import tempfile

    import certifi

    fd, combined = tempfile.mkstemp(prefix="kftrain-ca-", suffix=".pem")
    with os.fdopen(fd, "w") as out:
        out.write(f"{Path(certifi.where()).read_text()}\n{Path(ca).read_text()}")
    atexit.register(lambda: Path(combined).unlink(missing_ok=True))
    return combined


def _without_urllib3_retries(client) -> None:
    """From now on ApiRetry owns the client's retries, as it does for the Kubernetes API: urllib3's
    default three more, under it, hid each dropped poll and made a poll that timed out wait four
    times its timeout, past `--timeout`. (Submitting keeps them: kftrain retries no upload, and
    urllib3 resends a POST only when it never reached the server.) kfp.Client takes no retry setting:
    its connection pools do."""
    api_client = getattr(getattr(client, "_run_api", None), "api_client", None)  # one for every kfp API
    pools = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    if pools is not None:
        pools.connection_pool_kw["retries"] = 0
        pools.clear()  # the pool of kfp.Client's health check was made with the default


def _kfp_call(host: str, what: str, need: str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Every kfp.Client call of :func:`submit`: `fn(*args, **kwargs)`, whose answer must carry the
    field `need` (the id the next call or the printed link uses; returned instead of the answer),
    else one :class:`SubmitError` saying `host` does not answer as the KFP API.

    Why here: a server that answers 200 with JSON but is not the KFP API (`{}` to everything)
    gets through kfp.Client's deserialization with every field None; the client then prints its
    UI link (`Pipeline details: .../details/None`) and a later call fails with a message about a
    parameter the user never gave. The client's own lines are held back until the answer is
    checked, then printed as they came."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            answer = fn(*args, **kwargs)
        if need is not None and not _has(answer, need):
            printed = io.StringIO()  # its link names the missing id: not worth showing
            raise _not_kfp(host, f"its answer to {what} has no {need}")
    finally:
        sys.stdout.write(printed.getvalue())
    return answer if need is None else getattr(answer, need)


def _has(answer: Any, field: str) -> bool:
    """Whether the KFP API model `answer` holds a non-empty `field` (an id is a non-empty string)."""
    value = getattr(answer, field, None)
    return isinstance(value, str) and bool(value.strip())


def _named(name: str) -> str:
    """A KFP list filter: the objects whose display name is `name`."""
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})


def _pipeline_id(client, host: str, name: str, namespace: str | None) -> str | None:
    """The id of the pipeline `name` in `namespace` (multi-user KFP keeps a namespace's own
    pipelines apart from the shared ones: kfp.Client's `get_pipeline_id` looks at the shared
    ones only, so a namespace's pipeline was never found again and its upload refused as a
    duplicate), or None."""
    listed = _kfp_call(
        host, "find the pipeline", None, client.list_pipelines, filter=_named(name), namespace=namespace, page_size=2
    )
    pipelines = getattr(listed, "pipelines", None) or []
    if len(pipelines) > 1:
        where = f" in namespace {namespace}" if namespace else ""
        raise SubmitError(
            f"the KFP API at {redact(host)} holds more than one pipeline named {name!r}{where}: pass --pipeline-name "
            "with a name of its own, or delete the extra pipelines in the KFP UI"
        )
    if pipelines and not _has(pipelines[0], "pipeline_id"):
        raise _not_kfp(host, "its answer to find the pipeline has a pipeline without a pipeline_id")
    return pipelines[0].pipeline_id if pipelines else None


def _version_id(client, host: str, pipeline_id: str, name: str) -> str | None:
    flt = _named(name)
    listed = _kfp_call(
        host, "list pipeline versions", None, client.list_pipeline_versions, pipeline_id=pipeline_id, filter=flt
    )
    versions = getattr(listed, "pipeline_versions", None) or []
    if versions and not _has(versions[0], "pipeline_version_id"):
        raise _not_kfp(host, "its answer to list pipeline versions has a version without a pipeline_version_id")
    return versions[0].pipeline_version_id if versions else None


def submit(
    client,
    host: str,
    package: Path,
    pipeline_name: str,
    experiment: str,
    run_name: str,
    params: dict[str, Any],
    namespace: str | None = None,
) -> Submission:
    """Upload (as a new version when the pipeline exists) and create the run; :func:`follow` waits for it."""
    vname = version_name(pipeline_name, package)
    pipeline_id = _pipeline_id(client, host, pipeline_name, namespace)
    if pipeline_id is None:
        pipeline_id = _kfp_call(
            host,
            "upload the pipeline",
            "pipeline_id",
            client.upload_pipeline,
            str(package),
            pipeline_name=pipeline_name,
            namespace=namespace,
        )
    version_id = _version_id(client, host, pipeline_id, vname)
    if version_id is None:
        version_id = _kfp_call(
            host,
            "upload the pipeline version",
            "pipeline_version_id",
            client.upload_pipeline_version,
            str(package),
            pipeline_version_name=vname,
            pipeline_id=pipeline_id,
        )
    experiment_id = _kfp_call(
        host, "create the experiment", "experiment_id", client.create_experiment, experiment, namespace=namespace
    )
    run_id = _kfp_call(
        host,
        "create the run",
        "run_id",
        client.run_pipeline,
        experiment_id,
        job_name=run_name,
        params=params,
        pipeline_id=pipeline_id,
        version_id=version_id,
    )
    result = Submission(
        pipeline_id=pipeline_id,
        version_id=version_id,
        version_name=vname,
        experiment_id=experiment_id,
        run_id=run_id,
        run_url=redact(f"{host.rstrip('/')}/#/runs/details/{run_id}"),
    )
    return result


def follow(
    client,
    host: str,
    result: Submission,
    timeout_s: float,
    poll_seconds: float,
    *,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] = print,
) -> Submission:
    """Poll the submitted run until it is in one of :data:`FINAL_STATES` or `timeout_s` has
    passed, logging each state it enters with the time since following began; sets
    `result.state` (`TIMEOUT` when it did not end) and `result.error`.

    Not `kfp.Client.wait_for_run_completion`: it does not stop on CANCELED (a run cancelled in
    the UI was followed until the timeout, a day by default), and one failed poll (the API
    server restarting, a gateway's 503) ended the wait with a traceback. Here a poll failing
    transiently is retried under the launcher's retry policy for up to
    :data:`FOLLOW_RETRY_BUDGET_S`; any other failure is one :class:`SubmitError` saying the run
    goes on in KFP, except a run deleted meanwhile (:class:`RunGone`)."""
    _without_urllib3_retries(client)
    start = now()
    deadline = start + dt.timedelta(seconds=timeout_s)
    retry = ApiRetry(
        FOLLOW_RETRY_BUDGET_S,
        now=now,
        sleep=sleep,
        log=log,
        api="KFP API",
        limit=f"(--wait retries a poll for {FOLLOW_RETRY_BUDGET_S:g}s)",
    )
    goes_on = result.left_running()
    seen = None
    while True:
        try:
            run = _poll(client, host, result.run_id, retry, deadline)
        except ApiUnavailable as exc:
            if not exc.at_deadline:
                raise SubmitError(f"stopped following: {exc}; {goes_on}") from None
            result.state = "TIMEOUT"
            result.error = f"not finished within {timeout_s:.0f}s (the KFP API was unavailable at the end); {goes_on}"
            return result
        except RunGone:
            raise
        except SubmitError as exc:
            raise SubmitError(f"stopped following: {exc}; {goes_on}") from None
        state = str(getattr(run, "state", None) or "RUNTIME_STATE_UNSPECIFIED").upper()
        waited = (now() - start).total_seconds()
        if state != seen:
            log(f"run {state} ({waited:.0f}s)")
            seen = state
        if state in FINAL_STATES:
            result.state = state
            error = getattr(run, "error", None)
            if error is not None:
                result.error = getattr(error, "message", None) or str(error)
            return result
        left = (deadline - now()).total_seconds()
        if left <= 0:
            result.state = "TIMEOUT"
            result.error = f"not finished within {timeout_s:.0f}s (last state: {state}); {goes_on}"
            return result
        sleep(min(poll_seconds, left))


def _poll(client, host: str, run_id: str, retry: ApiRetry, deadline: dt.datetime) -> Any:
    """One poll of the run, retried while it fails transiently: the run, else :class:`RunGone`
    (404), another :class:`SubmitError` (a refusal, an answer that is not a KFP run), or
    :class:`ApiUnavailable` (the retries ran out)."""
    with kfp_errors(host):
        try:
            run = retry.call(f"get run {run_id}", _get_run, client, run_id, stop_at=deadline)
        except Exception as exc:
            if http_status(exc) == 404:  # deleted in the UI: nothing goes on
                raise RunGone(
                    f"stopped following: run {run_id} is no longer in the KFP API at {redact(host)} (HTTP 404): "
                    "it was deleted"
                ) from None
            raise
    # A login page or `{}` from a gateway whose session expired: kfp.Client makes a run of None
    # fields from it, which looked RUNTIME_STATE_UNSPECIFIED until the timeout.
    if not _has(run, "run_id"):
        raise _not_kfp(host, "its answer to get run has no run_id")
    return run


def _get_run(client, run_id: str) -> Any:
    """The run, asked with a request timeout: `kfp.Client.get_run` takes none, and a connection
    the KFP API left half-open would hold `--wait` past `--timeout`. A timed-out poll is transient."""
    api = getattr(client, "_run_api", None)  # what kfp.Client.get_run calls
    if api is None:
        return client.get_run(run_id)
    return api.run_service_get_run(run_id=run_id, _request_timeout=REQUEST_TIMEOUT_S)


def succeeded(result: Submission) -> bool:
    """Whether a waited-for run ended well."""
    return result.state == "SUCCEEDED"
