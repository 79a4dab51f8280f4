"""`kftrain submit` against a STAND-IN KFP API server (tests/kfp_standin.py): no KFP can run here."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.submit import SubmitError, _validate_config, parse_params, pipeline_parameters

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "compiled" / "training_pipeline.yaml"


def kftrain(*args, env_extra=None):
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )


def test_parameters_are_typed_from_the_compiled_pipeline():
    args = parse_params(["learning_rate=1", "store=s3://bucket/x", "launcher=kubernetes", "min_accuracy=0.5"], PACKAGE)
    assert args == {"learning_rate": 1.0, "store": "s3://bucket/x", "launcher": "kubernetes", "min_accuracy": 0.5}


@pytest.mark.parametrize(
    ("pair", "said"),
    [
        ("epochs=abc", "--param epochs=abc: expected a whole number, e.g. 3"),  # was: "expected int"
        ("epochs=2.5", "--param epochs=2.5: expected a whole number"),
        ("learning_rate=fast", "--param learning_rate=fast: expected a number, e.g. 0.001"),
        ("tolerations=not json", "--param tolerations=not json: expected a JSON list, e.g. '[{"),
        ("node_selector=[1]", "--param node_selector=[1]: expected a JSON object, e.g. '{"),
    ],
)
def test_a_parameter_of_the_wrong_type_says_how_to_write_one(pair, said):
    with pytest.raises(SubmitError) as refused:
        parse_params([pair], PACKAGE)
    assert str(refused.value).startswith(said), refused.value


def test_the_secrets_the_steps_mount_are_checked_against_the_config_before_upload():
    known = pipeline_parameters(PACKAGE)
    config = "kubernetes:\n  hf_token_secret: team-hf\n"
    with pytest.raises(SubmitError, match="kubernetes.hf_token_secret.*set the parameter to 'team-hf'"):
        _validate_config({"config": config}, known)  # the package's default, hf-token, would be mounted
    _validate_config({"config": config, "hf_token_secret": "team-hf"}, known)
    with pytest.raises(SubmitError, match="kubernetes.hf_token_secret: 'Team_HF' is not a Secret's name"):
        _validate_config({"hf_token_secret": "Team_HF"}, known)


@pytest.mark.parametrize(
    ("config", "params", "refused"),
    [
        # Each was uploaded and started, then failed on the cluster (the plan step, or every step pod).
        ("plan:\n  enabled: true\n  gpu: B200\n", {}, "plan.gpu: not a GPU type the plan knows, got 'B200'"),
        (
            "kubernetes:\n  store_secret: my-s3\n  store_secret_keys: {AWS_ACCESS_KEY_ID: AWS_ACCESS_KEY_ID}\n",
            {"store_secret": "my-s3"},
            "kubernetes.store_secret_keys: the pipeline's step pods read the keys accesskey",
        ),
        (
            "",
            {"resume_from": "some-run"},
            "--param resume_from: checkpoint.resume_from 'some-run': a run id is looked up under store.uri, which is "
            "empty; set store.uri (the `store` parameter",
        ),
    ],
)
def test_what_a_step_would_refuse_on_the_cluster_is_refused_before_upload(config, params, refused):
    with pytest.raises(SubmitError, match=re.escape(refused)):
        _validate_config({"config": config, **params}, pipeline_parameters(PACKAGE))


@pytest.mark.parametrize(
    "text",
    ["train:\n  epochs: 1\n", "", "a: [\n", "- a list\n", "root: 3\n", b"\xff\xfe", "just text\n", "7\n"],
    ids=["a-kftrain-config", "empty", "not-yaml", "a-list", "root-not-a-mapping", "not-utf8", "a-string", "a-number"],
)
def test_a_package_that_is_not_a_compiled_pipeline_is_one_line_naming_it(tmp_path, text):
    package = tmp_path / "p.yaml"
    package.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(SubmitError) as err:
        pipeline_parameters(package)
    assert str(err.value).startswith(f"--package {package}: not a compiled KFP pipeline") and "\n" not in str(err.value)
    # What the file holds, not what Python made of it (was: `TypeError: 'NoneType' object is not subscriptable`).
    assert not re.search(r"TypeError|AttributeError|NoneType|subscriptable", str(err.value)), err.value


@pytest.mark.parametrize(
    ("params", "config", "field"),
    [
        (["store=/tmp/x"], "", "store.uri '/tmp/x' is a local path"),
        ([], "store:\n  uri: ./runs\n", "store.uri './runs' is a local path"),
        ([], "checkpoint:\n  uri: /data/ckpt\n", "checkpoint.uri '/data/ckpt' is a local path"),
    ],
    ids=["--param store", "config store.uri", "config checkpoint.uri"],
)
def test_what_pods_share_must_be_in_an_object_store_before_upload(params, config, field):
    """No two pods share a disk: a local store or checkpoint prefix is refused at submit, not in
    the training step on the cluster."""
    where = "--param store" if params else "the run's parameters are invalid"
    with pytest.raises(SubmitError, match=f"{where}: {field}"):
        parse_params([*params, *([f"config={config}"] if config else [])], PACKAGE)
    assert parse_params(["store=s3://bucket/x"], PACKAGE) == {"store": "s3://bucket/x"}
    # Checkpoints off: nothing is written there, so nothing for pods to share.
    off = "checkpoint:\n  enabled: false\n  uri: /data/ckpt\n"
    assert parse_params(["store=s3://bucket/x", f"config={off}"], PACKAGE)["config"] == off


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ("data:\n  source: ./corpus.txt\n", "data.source './corpus.txt'"),
        ("data:\n  source: corpus/\n", "data.source 'corpus/'"),
        ("data:\n  source: ~/corpus.txt\n", "data.source '~/corpus.txt'"),
        ("task: causal_lm\nmodel:\n  init_from: models/llama\n", "model.init_from 'models/llama'"),
        ("task: causal_lm\ndata:\n  tokenizer: ./tok/tokenizer.json\n", "data.tokenizer './tok/tokenizer.json'"),
        ("data:\n  source: /data/corpus.txt\n", ""),  # absolute: a path inside the image
        ("data:\n  source: s3://bucket/corpus.txt\n", ""),
        ("task: causal_lm\nmodel:\n  init_from: hf://org/name\n", ""),
        ("task: causal_lm\nmodel:\n  init_from: /models/llama\n", ""),
        ("task: causal_lm\ndata:\n  tokenizer: bpe:512\n", ""),
        ("data:\n  source: digits\n", ""),
    ],
)
def test_what_pods_read_is_refused_at_submit_as_a_path_relative_to_this_machine(config, refused):
    """A relative path or `~` would be resolved in the pod's own folder and home: refused at
    submit, naming the field (was: uploaded, then data prep or training failed on the cluster)."""
    known = pipeline_parameters(PACKAGE)
    if refused:
        with pytest.raises(SubmitError, match=f"{re.escape(refused)} is a path on this machine"):
            _validate_config({"config": config, "store": "s3://bucket/x"}, known)
    else:
        _validate_config({"config": config, "store": "s3://bucket/x"}, known)


@pytest.mark.parametrize(
    ("params", "refused"),
    [
        (["max_perplexity=5"], "--param max_perplexity=5.0: task 'classification' reports no perplexity"),
        (["config=task: causal_lm", "min_accuracy=0.5"], "--param min_accuracy=0.5: task 'causal_lm' reports no"),
        (["min_accuracy=0.5"], ""),
        (["config=task: causal_lm", "max_perplexity=20"], ""),
        (["max_perplexity=0"], ""),  # 0: no bar, nothing to ignore
        # The default, as the pipeline reads it: no bar set (was: refused here, accepted by the run).
        (["config=task: causal_lm", "min_accuracy=0.9"], ""),
    ],
)
def test_a_gate_the_task_never_reports_is_refused_at_submit(params, refused):
    """The same rule as `kftrain run`'s flags (trainer.checks.gate_ignored)."""
    if not refused:
        parse_params(params, PACKAGE)
        return
    with pytest.raises(SubmitError) as info:
        parse_params(params, PACKAGE)
    assert str(info.value).startswith(refused) and "its gate is " in str(info.value)


@pytest.mark.parametrize(
    ("param", "refused"),
    [
        ("epochs=-2", "--param epochs: train.epochs: must be positive, got -2 (-1 keeps the config's value)"),
        ("learning_rate=-0.5", "--param learning_rate: train.learning_rate: must be positive"),
        ("job_kind=foo", "--param job_kind: job.kind: must be one of"),
        ("node_selector={a: [1]}", "--param node_selector: kubernetes.node_selector.a: must be a string"),
        ("tolerations=[1]", "--param tolerations: kubernetes.tolerations[0]: must be a mapping"),
        ("launcher=Kubernetes", "--param launcher=Kubernetes: must be one of auto, local, kubernetes"),
        ("store_secret=Bad_Secret", "--param store_secret: kubernetes.store_secret: 'Bad_Secret' is not a Secret"),
        # Empty: every step pod mounts the Secret by its name (was: uploaded and started, then refused).
        ("store_secret=", "--param store_secret: kubernetes.store_secret: must name a Secret, got ''"),
        ("hf_token_secret=", "--param hf_token_secret: kubernetes.hf_token_secret: must name a Secret, got ''"),
        ("hf_token_secret= ", "--param hf_token_secret: kubernetes.hf_token_secret: must name a Secret, got ' '"),
    ],
)
def test_a_bad_parameter_value_names_the_flag_and_the_value_that_keeps_the_config_s(param, refused):
    """The config's message names the field; the user typed a --param, and its unset value is not obvious."""
    with pytest.raises(SubmitError) as info:
        parse_params([param], PACKAGE)
    assert str(info.value).startswith(refused)
    numeric = param.split("=")[0] in ("epochs", "learning_rate")  # -1: the config's value, which nobody guesses
    assert str(info.value).endswith("(-1 keeps the config's value)") is numeric


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("{tmp}/d.yaml", True),  # an existing config file
        ("{tmp}/settings", True),  # an existing file, no suffix
        ("configs/missing.yml", True),
        ("/nowhere/run.json", True),
        ("  {tmp}/d.yaml  ", True),
        ("train: {epochs: 1}", False),  # the text itself, on one line
        ("data: {source: s3://bucket/rows.json}", False),  # a mapping that ends in .json is text
        ("train:\n  epochs: 1\n", False),
    ],
    ids=["existing-yaml", "existing-no-suffix", "yml", "json", "spaces", "inline", "inline-json-suffix", "multiline"],
)
def test_a_config_file_name_as_the_config_parameter_says_to_pass_its_text(tmp_path, value, refused):
    """`--param config=FILE` (what `kftrain run --config` takes) is refused naming the fix, not as a
    config that "must hold a mapping, got 'str'"."""
    (tmp_path / "d.yaml").write_text("train:\n  epochs: 1\n")
    (tmp_path / "settings").write_text("train:\n  epochs: 1\n")
    value = value.replace("{tmp}", str(tmp_path))
    if not refused:
        assert parse_params([f"config={value}"], PACKAGE) == {"config": value}
        return
    with pytest.raises(SubmitError) as err:
        parse_params([f"config={value}"], PACKAGE)
    name = value.strip()
    assert str(err.value) == (
        f"--param config={name}: the parameter takes the config's YAML text, not a file's name (the pipeline's pods "
        f"cannot read this machine's files); pass the file with --config {name}, which sends its text"
    )


COMPONENTS = sorted((REPO / "compiled" / "components").glob("*.yaml"))


@pytest.mark.parametrize("component", COMPONENTS, ids=[c.stem for c in COMPONENTS])
def test_a_compiled_component_is_refused_as_the_package_naming_it(component):
    """A component's YAML has the pipeline format too (KFP would run that one step alone)."""
    import yaml

    name = next(yaml.safe_load_all(component.read_text()))["pipelineInfo"]["name"]
    with pytest.raises(SubmitError) as err:
        pipeline_parameters(component)
    assert str(err.value).startswith(f"--package {component}: a compiled component ({name}), not a pipeline")
    assert "compiled/training_pipeline.yaml" in str(err.value)
    assert pipeline_parameters(PACKAGE)  # the pipeline itself is one


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("folder", "is a folder, not a compiled pipeline; pass the YAML `kftrain compile` writes"),
        (
            "compiled folder",
            "is a folder, not a compiled pipeline; pass the file in it: --package {p}/training_pipeline.yaml",
        ),
        ("missing", "no such file; pass the YAML `kftrain compile` writes"),
    ],
)
def test_a_package_that_is_a_folder_or_missing_is_named_so(tmp_path, where, message):
    package = tmp_path / "p"
    if where != "missing":
        package.mkdir()
    if where == "compiled folder":
        (package / "training_pipeline.yaml").write_bytes(PACKAGE.read_bytes())
    with pytest.raises(SubmitError) as err:
        pipeline_parameters(package)
    assert str(err.value).startswith(f"--package {package}: {message.format(p=package)}")


def test_a_package_that_is_a_device_or_huge_is_refused_before_it_is_read(tmp_path):
    """`--package /dev/zero` read 14 GB before it was killed; a 115 MB file took 39 s (a probe)."""
    with pytest.raises(SubmitError, match="--package /dev/zero: not a regular file"):
        pipeline_parameters(Path("/dev/zero"))
    huge = tmp_path / "model.safetensors"
    with huge.open("wb") as f:
        f.truncate(65 * 1024 * 1024)  # sparse: no disk used
    with pytest.raises(SubmitError, match="larger than a compiled pipeline may be"):
        pipeline_parameters(huge)


PAGE = "<!doctype html><html><head><style>body {color: red}</style></head><body>" + "<p>line</p>\n" * 400


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (500, PAGE + "<p>your header: Bearer MyPlainToken42</p></body></html>", "HTTP 500 Error: line line line"),
        (500, "<html><body>your header: Bearer MyPlainToken42</body></html>", "your header: Bearer ***"),
        (500, "x" * 185 + " Bearer MyPlainToken42 " + "y" * 50, "Bearer ***"),  # across the cut: masked first
        (400, '{"error": "bad filter", "code": 3, "message": "invalid filter: key display_name"}', "invalid filter"),
        (404, "", "answered HTTP 404 Error"),
        (500, b"plain \xff bytes", "plain \ufffd bytes"),
        (503, PAGE, "is unavailable (HTTP 503 Error): it may be restarting"),
        (504, "", "try again in a minute"),
    ],
)
def test_an_api_error_is_one_short_line_without_the_token(monkeypatch, status, body, said):
    """(was: an HTML error page printed whole, 400 lines, with the token it echoed back)"""
    from kfp_server_api.exceptions import ApiException

    from pipelines.submit import kfp_errors

    monkeypatch.setenv("KFP_TOKEN", "MyPlainToken42")
    exc = ApiException(status=status, reason="Error")
    exc.body = body
    with pytest.raises(SubmitError) as caught, kfp_errors("http://kfp.example.test"):
        raise exc
    message = str(caught.value)
    assert said in message and "\n" not in message and len(message) < 400, message
    assert "MyPlain" not in message and "<" not in message


@pytest.mark.parametrize(
    ("host", "named", "sent"),
    [
        ("http://ml-pipeline.kubeflow:8888", False, True),  # a Kubeflow notebook's in-cluster host
        ("http://ml-pipeline-ui.kubeflow.svc.cluster.local", False, True),
        ("https://kfp.example.com", False, False),  # outside the cluster: not unasked
        ("http://localhost:8080", False, False),
        ("https://kfp.example.com", True, True),  # KF_PIPELINES_SA_TOKEN_PATH names the file: asked
    ],
)
def test_a_pods_service_account_token_goes_only_where_it_belongs(tmp_path, monkeypatch, host, named, sent):
    from pipelines import submit

    token = tmp_path / "token"
    token.write_text("sa-token\n")
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    monkeypatch.setattr(submit, "SA_TOKEN_PATH", str(token))
    if named:
        monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))
    else:
        monkeypatch.delenv("KF_PIPELINES_SA_TOKEN_PATH", raising=False)
    assert submit.bearer_token(host) == ("sa-token" if sent else None)
