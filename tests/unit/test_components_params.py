"""The KFP edge: the config text is the base, a typed parameter wins only when set, and the
pipeline, the configure component and docs/pipeline.md all follow the one parameter table."""

from __future__ import annotations

import dataclasses
import inspect
import sys
from pathlib import Path

import pytest
import yaml

from components.configure import configure
from components.params import (
    BY_NAME,
    PARAMS,
    SECRET_PARAMS,
    UNSET,
    config_from_params,
    effective_default,
    parameter_named_by,
)
from pipelines.training import training_pipeline
from trainer.checks import CHECKED_CONFIG_ENV, checked_digest
from trainer.config import Config, ConfigError, config_from_json, load_config
from trainer.errors import KftrainError

REPO = Path(__file__).resolve().parents[2]
#: For each knob, a config value that differs from the default and from the override below.
FROM_CONFIG = {
    "data_source": "python-stdlib",
    "replicas": 1,
    "nproc_per_node": 2,
    "epochs": 3,
    "batch_size": 32,
    "learning_rate": 0.01,
    "image": "reg.example.com/kftrain:cfg",
    "timeout_seconds": 120,
    "job_kind": "trainjob",
    "gpus_per_node": 2,
    "queue": "team-cfg",
    "node_selector": {"pool": "cfg"},
    "tolerations": [{"key": "cfg", "operator": "Exists"}],
    "base_model": "s3://cfg-bucket/models/base",
    "train_method": "lora",
    "store": "s3://cfg-bucket/runs",
    "s3_endpoint": "http://cfg:9000",
    "resume_from": "20261201-101500-abc123",
}
OVERRIDE = {
    "data_source": "s3://data/corpus.txt",
    "replicas": 2,
    "nproc_per_node": 2,
    "epochs": 5,
    "batch_size": 64,
    "learning_rate": 0.02,
    "image": "reg.example.com/kftrain:param",
    "timeout_seconds": 240,
    "job_kind": "auto",
    "gpus_per_node": 2,
    "queue": "team-param",
    "node_selector": {"pool": "param"},
    "tolerations": [
        {"key": "param", "operator": "Equal", "value": "x", "effect": "NoExecute", "tolerationSeconds": 300.0}
    ],
    "base_model": "hf://org/param-model@main",
    "train_method": "full",
    "store": "s3://param-bucket/runs",
    "s3_endpoint": "http://param:9000",
    "resume_from": "s3://param-bucket/runs/r1/train-7/model/checkpoints",
}


def _config_text(values: dict) -> str:
    tree: dict = {"task": "causal_lm"}  # base_model needs it
    for name, value in values.items():
        *parents, leaf = BY_NAME[name].field.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return yaml.safe_dump(tree)


def _field(cfg: Config, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _knob_specs(signature: inspect.Signature) -> dict:
    return {n: (p.annotation, p.default) for n, p in signature.parameters.items() if n in BY_NAME}


def test_the_table_covers_the_fixtures():
    assert set(FROM_CONFIG) == set(OVERRIDE) == set(BY_NAME)


@pytest.mark.parametrize("param", PARAMS, ids=lambda p: p.name)
def test_an_unset_parameter_keeps_the_configs_value(param):
    """A run whose only parameter is `config` trains exactly that config."""
    cfg = config_from_params(_config_text(FROM_CONFIG), **{p.name: p.unset for p in PARAMS})
    assert _field(cfg, param.field) == FROM_CONFIG[param.name]
    assert FROM_CONFIG[param.name] != effective_default(param)


@pytest.mark.parametrize("param", PARAMS, ids=lambda p: p.name)
def test_a_set_parameter_overrides_the_config(param):
    cfg = config_from_params(_config_text(FROM_CONFIG), **{param.name: OVERRIDE[param.name]})
    expected = OVERRIDE[param.name]
    if param.name == "tolerations":  # KFP passes numbers in structs as floats; Kubernetes wants ints
        expected = [{**expected[0], "tolerationSeconds": 300}]
        assert isinstance(_field(cfg, param.field)[0]["tolerationSeconds"], int)
    assert _field(cfg, param.field) == expected


def test_unset_everywhere_gives_the_config_defaults():
    assert config_from_params("", **{p.name: p.unset for p in PARAMS}) == load_config()


def test_the_shipped_multinode_config_pasted_alone_runs_as_written():
    text = (REPO / "configs" / "multinode-gpu.yaml").read_text()
    cfg = config_from_params(text, **{p.name: p.unset for p in PARAMS})
    assert cfg == load_config(REPO / "configs" / "multinode-gpu.yaml")


def test_store_secret_parameter_reaches_the_replicas():
    cfg = config_from_params("", store_secret="team-s3")
    assert cfg.kubernetes.store_secret == "team-s3"
    same = config_from_params("kubernetes:\n  store_secret: team-s3\n", store_secret="team-s3")
    assert same.kubernetes.store_secret == "team-s3"


def test_a_config_naming_another_store_secret_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="kubernetes.store_secret.*set the parameter to 'team-s3'"):
        config_from_params("kubernetes:\n  store_secret: team-s3\n", store_secret="mlpipeline-minio-artifact")


@pytest.mark.parametrize(
    "keys",
    [
        "{AWS_ACCESS_KEY_ID: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: AWS_SECRET_ACCESS_KEY}",
        "{accesskey: AWS_ACCESS_KEY_ID, secret: AWS_SECRET_ACCESS_KEY}",
    ],
)
def test_store_secret_keys_other_than_the_step_pods_read_are_refused(keys):
    """The step pods' secretKeyRefs are compiled with KFP's keys: a Secret with other keys would keep
    them from starting while the replicas read it (was: accepted by submit and configure)."""
    text = f"kubernetes:\n  store_secret: team-s3\n  store_secret_keys: {keys}\n"
    with pytest.raises(
        ConfigError, match="kubernetes.store_secret_keys: the pipeline's step pods read the keys accesskey"
    ):
        config_from_params(text, store_secret="team-s3")
    # Outside a pipeline (`kftrain job manifest`, the pytorchjob component) the keys are the user's,
    # and so in `kftrain run --local`, whose steps are no pods (a review found it refused there).
    assert config_from_params(text).kubernetes.store_secret == "team-s3"
    assert config_from_params(text, store_secret="team-s3", step_pods=False).kubernetes.store_secret == "team-s3"


def test_configure_under_kftrain_run_local_takes_the_config_s_own_store_secret_keys(monkeypatch, capsys):
    """kfp.local's configure step (the local run marks every process it starts) mounts no Secret."""
    from trainer.launch.local import RUN_MARKER_ENV

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # configure installs its one-line hook
    keys = "{id: AWS_ACCESS_KEY_ID, key: AWS_SECRET_ACCESS_KEY}"
    text = f"kubernetes:\n  store_secret: team-s3\n  store_secret_keys: {keys}\n"
    with pytest.raises(ConfigError, match="kubernetes.store_secret_keys: the pipeline's step pods read"):
        configure.python_func(config=text, store_secret="team-s3")
    monkeypatch.setenv(RUN_MARKER_ENV, "r-local")
    assert '"store_secret":"team-s3"' in configure.python_func(config=text, store_secret="team-s3")


def test_hf_token_secret_parameter_reaches_the_replicas():
    assert config_from_params("", hf_token_secret="team-hf").kubernetes.hf_token_secret == "team-hf"
    # Empty in the config is "none": the steps mount theirs (optionally), and the replicas get the same.
    none = config_from_params("kubernetes:\n  hf_token_secret: ''\n", hf_token_secret="hf-token")
    assert none.kubernetes.hf_token_secret == "hf-token"
    assert config_from_params("kubernetes:\n  hf_token_secret: team-hf\n").kubernetes.hf_token_secret == "team-hf"


def test_a_config_naming_another_hf_token_secret_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="kubernetes.hf_token_secret.*set the parameter to 'team-hf'"):
        config_from_params("kubernetes:\n  hf_token_secret: team-hf\n", hf_token_secret="hf-token")


@pytest.mark.parametrize(
    ("config", "params", "said"),
    [
        ("", {"epochs": 0}, "parameter epochs: train.epochs: must be positive, got 0 (-1 keeps the config's value)"),
        ("", {"node_selector": {"n": 3.0}}, "parameter node_selector: kubernetes.node_selector.n: must be a string"),
        ("", {"store_secret": "Bad_Secret"}, "parameter store_secret: kubernetes.store_secret: 'Bad_Secret' is not"),
        # The config text's own field: no parameter was set, none is named.
        ("train:\n  epochs: 0\n", {}, "train.epochs: must be positive, got 0"),
        ("train:\n  epochs: 0\n", {"learning_rate": 0.1}, "train.epochs: must be positive, got 0"),
        # The job's own rules: a ConfigError, so the step ends on one line (was: a traceback).
        (
            "kubernetes:\n  priority_class: high\n",
            {"job_kind": "trainjob"},
            "parameter job_kind: kubernetes.priority_class: 'high'",  # the job.kind it names is the parameter's
        ),
        # A parameter's field named later in the line: its doing (was: only the config field named).
        (
            "task: causal_lm\nmodel:\n  n_layer: 2\n",
            {"base_model": "hf://org/name"},
            "parameter base_model: model.n_layer: is defined by the pretrained model (model.init_from",
        ),
        # The pre-flight's refusals too (were: outside the naming, so `model.init_from`, never base_model).
        (
            "task: causal_lm\n",
            {"base_model": "/nonexistent/model"},
            "parameter base_model: model.init_from '/nonexistent/model'",
        ),
        ("", {"resume_from": "some-run"}, "parameter resume_from: checkpoint.resume_from 'some-run'"),
    ],
)
def test_configure_names_the_parameter_a_ui_user_set(monkeypatch, config, params, said):
    """The UI user set `epochs`, not `train.epochs` (`kftrain submit` said so; the step did not)."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # configure installs its one-line hook
    with pytest.raises(ConfigError) as err:
        configure.python_func(config=config, **params)
    assert str(err.value).startswith(said)


@pytest.mark.parametrize("secret", ["store_secret", "hf_token_secret"])
@pytest.mark.parametrize("given", ["", "  "])
def test_configure_refuses_an_empty_secret_parameter(monkeypatch, secret, given):
    """The later steps mount each Secret by its name: an empty one would be a pod the API server
    refuses (an empty store_secret was taken as "not given": the config's Secret for the replicas,
    none for the steps)."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # configure installs its one-line hook
    with pytest.raises(
        ConfigError, match=f"^parameter {secret}: kubernetes.{secret}: must name a Secret, got '{given}'"
    ):
        configure.python_func(config="", **{secret: given})


def test_configure_checks_every_config_but_the_one_kftrain_run_has_just_checked(monkeypatch, tmp_path):
    """`kftrain run` checks the config before its first step and marks that very config in the
    steps' environment: its configure step does not read the source (or a base model) again. Any
    other config is checked: a knob set on top of it, or no mark (a cluster's pipeline run)."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # configure installs its one-line hook
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")  # no label column: refused by the check
    config = f"data:\n  source: {tmp_path / 't.csv'}\n"
    unread = r"data.source .*t\.csv.*label"
    with pytest.raises(KftrainError, match=unread):
        configure.python_func(config=config)
    checked = config_from_params(config, store_secret="mlpipeline-minio-artifact", hf_token_secret="hf-token")
    monkeypatch.setenv(CHECKED_CONFIG_ENV, checked_digest(checked))
    effective = config_from_json(configure.python_func(config=config))
    # The source's version is set either way: data prep's cache key (tests/unit/test_data_rules.py).
    assert effective.data.source_version and effective == dataclasses.replace(
        checked, data=dataclasses.replace(checked.data, source_version=effective.data.source_version)
    )
    with pytest.raises(KftrainError, match=unread):
        configure.python_func(config=config, epochs=3)
    monkeypatch.setenv(CHECKED_CONFIG_ENV, "0" * 64)
    with pytest.raises(KftrainError, match=unread):
        configure.python_func(config=config)


def test_unknown_parameter_is_a_type_error():
    with pytest.raises(TypeError, match="unknown parameter"):
        config_from_params("", replica=3)


@pytest.mark.parametrize(
    "func", [configure.python_func, training_pipeline.pipeline_func], ids=["configure", "pipeline"]
)
def test_signatures_follow_the_table(func):
    """configure's signature is written out (KFP embeds its source); the pipeline's is generated."""
    expected = {p.name: (p.type, UNSET[p.type]) for p in PARAMS}
    assert _knob_specs(inspect.signature(func)) == expected


@pytest.mark.parametrize("component", [configure, training_pipeline], ids=["configure", "pipeline"])
def test_ui_descriptions_come_from_the_table(component):
    inputs = component.component_spec.inputs
    for param in PARAMS:
        assert inputs[param.name].description.startswith(param.help), param.name
        assert "the config's value" in inputs[param.name].description
    assert inputs["store_secret"].default == "mlpipeline-minio-artifact"
    assert inputs["hf_token_secret"].default == "hf-token"


def test_the_docs_document_every_parameter_with_its_unset_value_and_default():
    page = (REPO / "docs" / "pipeline.md").read_text()
    section = page[page.index("# Pipeline parameters") : page.index("## Job names")]
    for param in PARAMS:
        default = effective_default(param)
        shown = "empty" if default in ("", {}, []) else f"`{default}`"
        unset = "''" if param.unset == "" else param.unset  # an empty code span shows its backticks
        row = f"| `{param.name}` | `{unset}` | `{param.field}` | {shown} | {param.help} |"
        assert row in section, row
    for name in training_pipeline.component_spec.inputs:
        assert f"| `{name}` |" in section, name


@pytest.mark.parametrize(
    ("message", "given", "named"),
    [
        ("train.epochs: must be positive", ["epochs"], "epochs"),  # the field it starts with
        ("model.n_layer: is defined by the pretrained model (model.init_from 'x')", ["base_model"], "base_model"),
        # Of several named later, the first in the line (was: the parameter table's order)
        (
            "train.grad_accum_steps 3: use a smaller train.batch_size or more job.replicas",
            ["replicas", "batch_size"],
            "batch_size",
        ),
        # The always-given Secret parameters only where the line starts with theirs (was: blamed for a hint)
        ("model.init_from 'hf://org/x': cannot fetch it (a gated model needs kubernetes.hf_token_secret)", [], None),
        ("kubernetes.hf_token_secret: 'Bad_Name' is not a Secret's name", [], "hf_token_secret"),
        ("train.epochs_x: a field that starts like another's", ["epochs"], None),
        ("nothing a parameter sets", ["epochs", "base_model"], None),
    ],
)
def test_a_refusal_is_put_on_the_parameter_whose_field_it_names(message, given, named):
    found = parameter_named_by(message, [*given, *SECRET_PARAMS])
    assert (found[0] if found else None) == named
