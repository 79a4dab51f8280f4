"""The API server's name and value formats (trainer/k8s_formats.py), one table a field: every
config field that becomes a Kubernetes name or value takes what a real API server takes and
refuses, at load, what it refuses, naming the field and the value; and the preflight's field
table says the same of the same value in the manifest (both ask trainer.k8s_formats)."""

# ruff: noqa: E501 (the table reads best one row a line)
from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainer.config import ConfigError, parse_config
from trainer.k8s_formats import quantity_problem, quantity_value
from trainer.launch.fieldrules import Item, problem_at

_ENV = ("spec", "trainer", "env")
_SECRET_REF = (*_ENV, Item(0, "X"), "valueFrom", "secretKeyRef")
_LIMITS = ("c", "resources", "limits")


def _scalar(*path: Any) -> Callable[[Any], tuple[tuple[Any, ...], Any]]:
    """A field whose value is one manifest node at `path`."""
    return lambda v: (path, v)


def _first(mapping: dict) -> tuple[Any, Any]:
    return next(iter(mapping.items()))


# (config field, where its value lands in a manifest: value -> (path, node), values the API server takes, values it refuses)
FIELDS = [
    ("kubernetes.namespace", _scalar("metadata", "namespace"),
     ["team-a", "a", "0", "n" * 63],
     ["team.a", "Team", "n" * 64, "-a", "a-", "a_b", "a b"]),
    ("kubernetes.runtime", _scalar("spec", "runtimeRef", "name"),
     ["torch-distributed", "a.b", "r" * 253],
     ["", "Torch", "a..b", "-a", "r" * 254, "a_b"]),
    ("kubernetes.store_secret", _scalar(*_SECRET_REF, "name"),
     ["s3", "minio.keys-v2", "s" * 253],
     ["Store_Keys", "a b", "-a", "s" * 254, "a."]),
    ("kubernetes.hf_token_secret", _scalar(*_SECRET_REF, "name"),
     ["hf-token.v2"],
     ["HF_Token", ".hf"]),
    ("kubernetes.priority_class", _scalar("spec", "priorityClassName"),
     ["high", "system-node-critical"],
     ["High_Prio", "p" * 254]),
    ("kubernetes.service_account", _scalar("spec", "serviceAccountName"),
     ["trainer", "trainer.ml"],
     ["Trainer_SA", "-sa"]),
    ("kubernetes.scheduling_queue", _scalar("spec", "runPolicy", "schedulingPolicy", "queue"),
     ["default", "team-a.gpu"],
     ["Default", "team queue", "q" * 254]),
    # A label value that names a LocalQueue (Kueue's webhook refuses any other: Team_A was accepted).
    ("kubernetes.queue", _scalar("metadata", "labels", "kueue.x-k8s.io/queue-name"),
     ["team-a", "team-a.gpu", "q" * 63],
     ["team queue", "q" * 64, "-q", "q.", "Team_A", "team_a", "Team-A.1"]),
    ("kubernetes.cpu", _scalar(*_LIMITS, "cpu"),
     ["8", "500m", "1.5", "1e3", ".5", "100n", "+1"],  # "0" too, which the config refuses (test_launch_fieldrules)
     ["8 cores", "-1", "1.5.5", "1K", "one", "1m2"]),
    ("kubernetes.memory", _scalar(*_LIMITS, "memory"),
     ["64Gi", "1E", "128974848", "500M", "1.5Gi"],
     ["64GB", "-1Gi", "Gi", "1Qi", "64 Gi", "100m"]),
    ("kubernetes.shm_size", _scalar("volumes", Item(0, "dshm"), "emptyDir", "sizeLimit"),
     ["2Gi", "512Mi", "1e9"],
     ["2 Gi", "2GiB", "-2Gi", "2m"]),
    ("kubernetes.image_pull_secrets", lambda v: (("spec", "imagePullSecrets", Item(0), "name"), v[0]),
     [["regcred.v2"]],
     [["My_Secret"], ["regcred\n"], [""], ["-r"]]),
    ("kubernetes.labels", lambda v: (("metadata", "labels", _first(v)[0]), _first(v)[1]),
     [{"example.com/team": "ml"}, {"empty": ""}, {"k" * 63: "v" * 63}, {"app.kubernetes.io/part-of": "A_b.c"}],
     [{"bad key!": "x"}, {"a/b/c": "x"}, {"Example.com/x": "y"}, {"/x": "y"}, {"example.com/": "y"}, {"k" * 64: "y"},
      {"a": "b c"}, {"a": "v" * 64}, {"a": "-v"}, {"a": "a.b/c"}]),
    ("kubernetes.node_selector", lambda v: (("spec", "nodeSelector", _first(v)[0]), _first(v)[1]),
     [{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}],
     [{"pool name": "gpu"}, {"pool": "a100 x8"}, {"Pool.io/x": "y"}]),
    ("kubernetes.annotations", lambda v: (("metadata", "annotations", _first(v)[0]), _first(v)[1]),
     [{"Example.COM/Note": "any text at all"}, {"k8s.io/a_b.c": ""}],
     [{"bad key!": "x"}, {"a/b/c": "x"}, {"k" * 64: "x"}]),
    ("kubernetes.tolerations", lambda v: (("spec", "tolerations", Item(0)), v[0]),
     [[{"operator": "Exists"}], [{"key": "gpu", "value": "a100", "effect": "NoSchedule"}]],
     [[{"key": "a", "operator": "Maybe"}], [{"key": "a", "value": "b c"}], [{"key": "a b", "operator": "Exists"}],
      [{"key": "a", "effect": "NoScheduel"}]]),
    ("kubernetes.env", lambda v: ((*_ENV, Item(0, _first(v)[0])), {"name": _first(v)[0], "value": _first(v)[1]}),
     [{"my.var-name": "1"}, {"_X": ""}],
     [{"A=B": "1"}, {"1ST": "1"}, {"..X": "1"}, {"A B": "1"}]),
    ("kubernetes.store_secret_keys", lambda v: (("env", Item(0, "X"), "valueFrom", "secretKeyRef", "key"), _first(v)[0]),
     [{"accesskey": "AWS_ACCESS_KEY_ID"}, {"a.b_c-D": "X"}],
     [{"access key": "X"}, {".": "X"}, {"..a": "X"}, {"k" * 254: "X"}]),
    ("kubernetes.store_secret_keys", lambda v: (("env", Item(0, _first(v)[1])), {"name": _first(v)[1], "valueFrom": {"secretKeyRef": {}}}),
     [{"k": "my.var"}],
     [{"k": "AWS=KEY"}, {"k": "1ST"}]),
    ("kubernetes.volumes", lambda v: (("volumes", Item(0, v[0]["name"]), "name"), v[0]["name"]),
     [[{"name": "data", "emptyDir": {}}]],
     [[{"name": "Data", "emptyDir": {}}], [{"name": "a.b", "emptyDir": {}}], [{"name": "v" * 64, "emptyDir": {}}]]),
    ("job.image", _scalar("spec", "trainer", "image"),
     ["ghcr.io/kftrain/kftrain:0.1.0", "registry.local:5000/team/train@sha256:" + "0" * 64, "python", "[::1]:5000/a/b:C_1",
      "My.Registry:443/a__b/c-d:v1.2", "localhost/img"],
     ["", " ghcr.io/kftrain/kftrain:0.1.0", "ghcr.io/kftrain/kftrain:0.1.0\n", "img ", "My Image:latest",
      "ghcr.io/Org/img:1", "img:", "img:-x", "img@sha256:abc"]),
]  # fmt: skip


def _texts(value: Any) -> list[str]:
    """The text in a value: itself, or a mapping's keys and values, a list's items, at any depth."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_texts(k), *_texts(v))]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return [value] if isinstance(value, str) else []


ACCEPTED = [(f, probe, v) for f, probe, good, _ in FIELDS for v in good]
REFUSED = [(f, probe, v) for f, probe, _, bad in FIELDS for v in bad]


@pytest.mark.parametrize(("field", "probe", "value"), ACCEPTED, ids=[f"{f}={v!r}"[:70] for f, _, v in ACCEPTED])
def test_what_the_api_server_takes_loads_and_passes_the_manifest_rules(field, probe, value):
    parse_config("", {field: value})
    assert problem_at(*probe(value)) is None


@pytest.mark.parametrize(("field", "probe", "value"), REFUSED, ids=[f"{f}={v!r}"[:70] for f, _, v in REFUSED])
def test_what_it_refuses_fails_at_load_naming_the_field_in_the_manifest_rules_words(field, probe, value):
    with pytest.raises(ConfigError) as err:
        parse_config("", {field: value})
    message = str(err.value)
    assert message.startswith(field) and "\n" not in message, message
    where, problem = message.split(": ", 1)
    assert any(repr(text)[:20] in problem for text in _texts(value)), message  # the bad value, quoted
    manifest_problem = problem_at(*probe(value))
    assert manifest_problem is not None and problem in manifest_problem, (problem, manifest_problem)


def test_empty_is_unset_where_the_job_leaves_the_field_out():
    cfg = parse_config("", {f"kubernetes.{name}": "" for name in ("namespace", "cpu", "memory", "shm_size")}).kubernetes
    assert (cfg.namespace, cfg.cpu, cfg.shm_size) == ("", "", "")
    # The Secret's keys are not read without the Secret (workload identity).
    parse_config("", {"kubernetes.store_secret": "", "kubernetes.store_secret_keys": {"a key": "X"}})


@pytest.mark.parametrize(
    ("quantity", "value"),
    [
        ("64Gi", 64 * 2**30),
        ("500M", 5e8),
        ("8", 8),
        ("500m", 0.5),
        ("1e3", 1000),
        ("1E", 1e18),
        ("1.5Ki", 1536),
        (".5", 0.5),
        ("100n", 1e-7),
        ("1.5Ti", 1.5 * 2**40),
        ("2k", 2000),
        ("512Ki", 2**19),
    ],
)
def test_quantity_value(quantity, value):
    assert quantity_problem(quantity) is None
    assert quantity_value(quantity) == pytest.approx(value)


def test_a_gpu_count_is_whole():
    assert quantity_problem("8", "nvidia.com/gpu") is None
    assert "not a whole number" in quantity_problem("0.5", "nvidia.com/gpu")


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("k8s_formats", {"trainer.credentials", "trainer.yaml_scalars"}),
        ("credentials", set()),
        ("yaml_scalars", set()),
    ],
)
def test_the_module_is_a_leaf(module, allowed):
    """The config imports it and fieldrules imports the config: it may import nothing of kftrain
    but another leaf (its messages mask credentials as trainer.credentials tells them, and name
    YAML's reading of a value as trainer.yaml_scalars does)."""
    tree = ast.parse((Path(__file__).resolve().parents[2] / "trainer" / f"{module}.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.split(".")[0] in ("trainer", "components", "pipelines")} <= allowed


def _isvc(name: str) -> None:
    from trainer.launch.inferenceservice import validate_inferenceservice

    validate_inferenceservice(
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}, "storageUri": "s3://b/m"}}},
        }
    )


def _job(name: str) -> None:
    from trainer.launch.spec import JobSpec

    JobSpec(name=name, image="img:1", command=("c",))


def _run_id(value: str) -> None:
    from pipelines.local_run import check_run_id

    check_run_id(value)


def _hub(repo: str) -> None:
    from trainer.pretrained import parse_hf_uri

    parse_hf_uri(f"hf://{repo}")


def _resume_from(value: str) -> None:
    parse_config("", {"checkpoint.resume_from": value})


def _namespace(value: str) -> None:
    parse_config("", {"kubernetes.namespace": value})


@pytest.mark.parametrize(
    ("check", "good"),
    [
        (_isvc, "model"),
        (_job, "kftrain-job"),
        (_run_id, "run-1"),
        (_hub, "org/name"),
        (_resume_from, "run-1"),
        (_namespace, "team"),
    ],
    ids=["inferenceservice-name", "job-name", "run-id", "hub-repo", "resume-from-run-id", "namespace"],
)
def test_no_name_check_takes_a_trailing_newline(check, good):
    """`^...$` with `re.match` lets a final newline through (`$` matches before it): every
    name check matches the whole value, so `name\\n` is refused where `name` is taken."""
    check(good)
    with pytest.raises(Exception) as err:
        check(good + "\n")
    assert not isinstance(err.value, AssertionError | AttributeError | TypeError | KeyError), err.value


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # A token pasted where a name goes (was: printed whole in the error line).
        ("kubernetes:\n  hf_token_secret: hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567\n", False),
        ("kubernetes:\n  store_secret: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n", False),
        ("kubernetes:\n  store_secret: AKIAIOSFODNN7EXAMPLE\n", False),
        ("kubernetes:\n  service_account: ghp_abcdefghijklmnopqrstuvwxyz0123456789\n", False),
        # A mistyped name is shown, to be fixed.
        ("kubernetes:\n  store_secret: My_Secret\n", True),
        ("kubernetes:\n  store_secret: Team-Store-Credentials-2024\n", True),
        ("kubernetes:\n  namespace: Research_Team\n", True),
        # Names in CamelCase with numbers, image paths: shown, for the user to see what to fix.
        ("kubernetes:\n  store_secret: MinioCredentials2024\n", True),
        ("kubernetes:\n  namespace: TeamNlpProject2024Q3x\n", True),
        ("kubernetes:\n  store_secret: MyVeryLongCamelCaseName1234567890\n", True),
        ("job:\n  image: MyOrg/KftrainTrainer2024\n", True),
        # A random-looking token of no known format.
        ("kubernetes:\n  store_secret: Zx8Qw2Lp9Rt4Vb7Nm1Kj6Hg3Fd5Sa0Yu\n", False),
    ],
)
def test_a_credential_given_as_a_name_is_never_shown_in_its_error(text, shown):
    value = text.split(": ")[-1].strip()
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    message = str(refused.value)
    assert (value in message) is shown, message
    assert ("'***' (it looks like a credential)" in message) is not shown, message


def test_a_credential_inside_a_list_or_mapping_is_never_shown():
    from trainer.k8s_formats import show

    assert show(["a", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567"]) == "'***' (it looks like a credential)"
    assert show({"k": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}) == "'***' (it looks like a credential)"
    assert show(["plain", "names"]) == "['plain', 'names']"
