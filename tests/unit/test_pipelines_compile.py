"""compiled/*.yaml is what a fresh compile produces (GitOps: CI fails when it is stale), compiled in
one process: byte-identical twice, no credentials, the training step never cached."""

import re
from pathlib import Path

import pytest
import yaml

from components.params import BY_NAME
from pipelines.compile import CompileRefused, compile_all
from pipelines.registry import COMPONENTS, PIPELINES

REPO = Path(__file__).resolve().parents[2]


def test_committed_yaml_matches_a_fresh_compile(tmp_path):
    paths = compile_all(tmp_path)
    relative = {p.relative_to(tmp_path).as_posix() for p in paths}
    assert relative == {f"{name}.yaml" for name in PIPELINES} | {f"components/{name}.yaml" for name in COMPONENTS}
    committed_files = {p.relative_to(REPO / "compiled").as_posix() for p in (REPO / "compiled").rglob("*.yaml")}
    assert committed_files == relative, "compiled/ holds files no compile writes: delete them"
    for path in paths:
        committed = REPO / "compiled" / path.relative_to(tmp_path)
        assert committed.is_file(), f"{committed} is missing: run `kftrain compile`"
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `kftrain compile`"


def test_compiling_twice_is_byte_identical(tmp_path):
    a = compile_all(tmp_path / "a")
    b = compile_all(tmp_path / "b")
    for pa, pb in zip(a, b, strict=True):
        assert pa.read_text() == pb.read_text()


def test_compiled_yaml_holds_no_credentials_and_uses_the_secret():
    text = (REPO / "compiled" / "training_pipeline.yaml").read_text()
    docs = list(yaml.safe_load_all(text))
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    # Every step that touches the store mounts the Secret the run's `store_secret` names; every
    # step that may ask the Hugging Face Hub (all but configure) the optional `hf_token_secret`.
    assert set(platform) == {
        "exec-configure",
        "exec-plan",
        "exec-data-prep",
        "exec-train",
        "exec-evaluate",
        "exec-export",
    }
    for name, executor in platform.items():
        store, *hub = executor["secretAsEnv"]
        assert store["secretNameParameter"]["componentInputParameter"].endswith("store_secret")
        assert {m["envVar"] for m in store["keyToEnv"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        assert store["optional"] is False
        if name == "exec-configure":
            assert hub == []
            continue
        (token,) = hub
        assert token["secretNameParameter"]["componentInputParameter"].endswith("hf_token_secret")
        assert token["keyToEnv"] == [{"envVar": "HF_TOKEN", "secretKey": "HF_TOKEN"}]
        assert token["optional"] is True  # a public model needs no token: the pods start without the Secret
    params = docs[0]["root"]["inputDefinitions"]["parameters"]
    assert params["store_secret"]["defaultValue"] == "mlpipeline-minio-artifact"
    assert params["hf_token_secret"]["defaultValue"] == "hf-token"
    # No literal credential anywhere: not as a container env value, not as a parameter default.
    for executor in docs[0]["deploymentSpec"]["executors"].values():
        for env in executor["container"].get("env", []):
            assert "KEY" not in env["name"].upper(), env
    for value in ("minio123", "AKIA", "aws_secret_access_key="):
        assert value.lower() not in text.lower()
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", text)  # a Hugging Face token's form


def test_the_training_step_is_never_cached():
    spec = yaml.safe_load_all((REPO / "compiled" / "training_pipeline.yaml").read_text())
    tasks = next(spec)["root"]["dag"]["tasks"]
    assert tasks["train"]["cachingOptions"] == {}
    assert tasks["data-prep"]["cachingOptions"] == {"enableCache": True}
    # Nothing run-specific reaches data prep, so its cache key can match across runs.
    assert set(tasks["data-prep"]["inputs"]["parameters"]) == {"config"}


def test_task_identity_placeholders_are_whole_values_the_driver_resolves():
    """KFP's driver resolves a placeholder only when it is a parameter's whole constant value
    (resolve.go, an exact `switch`): run id, task name and enclosing DAG execution id must
    each arrive as their own parameter."""
    spec = next(yaml.safe_load_all((REPO / "compiled" / "training_pipeline.yaml").read_text()))
    tasks = spec["root"]["dag"]["tasks"]
    expected = {
        "run_id": "{{$.pipeline_job_uuid}}",
        "task_name": "{{$.pipeline_task_name}}",
        "dag_execution_id": "{{$.pipeline_task_uuid}}",
    }
    for name in ("train", "evaluate"):
        params = tasks[name]["inputs"]["parameters"]
        assert {k: params[k]["runtimeValue"]["constant"] for k in expected} == expected


def test_steps_install_nothing_at_pod_start():
    for path in (REPO / "compiled").rglob("*.yaml"):
        assert "pip install" not in path.read_text(), path


def test_the_docs_list_every_component_parameter():
    section = (REPO / "docs" / "components.md").read_text()
    for component in COMPONENTS.values():
        for name in (component.component_spec.inputs or {}) | (component.component_spec.outputs or {}):
            if name not in BY_NAME:  # the knobs: tests/unit/test_components_params.py checks their table
                assert f"`{name}`" in section, (component.name, name)


def test_configure_is_never_cached_and_data_prep_is_cached_by_the_source_s_version():
    """A cached configure gave a later run with the same config text an earlier run's effective
    config: its checks skipped, checkpoint.resume_from pinned to an older checkpoint, and the data
    prep it feeds cached on a source since changed in place. Now configure runs every time and its
    output (data prep's only input) holds data.source_version."""
    tasks = next(yaml.safe_load_all((REPO / "compiled" / "training_pipeline.yaml").read_text()))["root"]["dag"]["tasks"]
    assert tasks["configure"]["cachingOptions"] == {}
    assert tasks["data-prep"]["cachingOptions"] == {"enableCache": True}
    assert set(tasks["data-prep"]["inputs"]["parameters"]) == {"config"}
    assert tasks["data-prep"]["inputs"]["parameters"]["config"]["taskOutputParameter"]["producerTask"] == "configure"


def test_the_plan_step_runs_between_data_prep_and_training():
    """The plan reads the prepared dataset's manifest (the model's shape, the epoch's length), and
    training waits for it, so that plan.strict stops a run before training starts."""
    tasks = next(yaml.safe_load_all((REPO / "compiled" / "training_pipeline.yaml").read_text()))["root"]["dag"]["tasks"]
    assert "plan" in tasks["train"]["dependentTasks"]
    assert tasks["plan"]["dependentTasks"] == ["configure", "data-prep"]
    # The task's identity names its output folder under store.uri, as for every other step.
    assert set(tasks["plan"]["inputs"]["parameters"]) == {"config", "run_id", "task_name", "dag_execution_id"}
    assert set(tasks["plan"]["inputs"]["artifacts"]) == {"dataset"}


def _obstacle(out: Path, kind: str) -> str:
    """Put in `out` what a compile must not replace; return what the refusal names."""
    (out / "components").mkdir(parents=True)
    if kind == "user file":
        (out / "components" / "train.yaml").write_text("precious\n")
        return "components/train.yaml is not a compiled pipeline"
    if kind == "another compiled pipeline":  # a user's own, of the same file name (was: replaced)
        (out / "training_pipeline.yaml").write_text("# PIPELINE DEFINITION\n# Name: my-own-pipeline\nprecious\n")
        return "training_pipeline.yaml is another compiled pipeline ('# Name: my-own-pipeline', not '# Name: kftrain"
    if kind == "link":
        (out.parent / "outside.txt").write_text("precious\n")
        (out / "training_pipeline.yaml").symlink_to(out.parent / "outside.txt")
        return "training_pipeline.yaml is a link"
    if kind == "linked folder":
        (out / "components").rmdir()
        (out.parent / "elsewhere").mkdir()
        (out / "components").symlink_to(out.parent / "elsewhere")
        return "components is a link"
    if kind == "folder":
        (out / "training_pipeline.yaml").mkdir()
        return "training_pipeline.yaml is not a regular file"
    (out / "components").rmdir()
    (out / "components").write_text("precious\n")
    return "components is not a folder"


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): (p.read_text() if p.is_file() else "")
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


@pytest.mark.parametrize(
    "kind", ["user file", "another compiled pipeline", "link", "linked folder", "folder", "a file where a folder goes"]
)
def test_compile_replaces_only_its_own_earlier_output_and_writes_nothing_when_refused(tmp_path, kind):
    out = tmp_path / "out"
    named = _obstacle(out, kind)
    before = _tree(tmp_path)
    with pytest.raises(CompileRefused, match=re.escape(named)):
        compile_all(out)
    assert _tree(tmp_path) == before  # no file replaced, no partial output, no staging folder left
    fresh = compile_all(tmp_path / "fresh")
    assert compile_all(tmp_path / "fresh") == fresh  # an earlier compile's files are replaced
    assert not list((tmp_path / "fresh").glob(".kftrain-compile-*"))


def test_an_output_folder_named_through_a_link_is_written_in(tmp_path):
    """The folder the user names may be a link (a work folder often is): the files go into the
    folder it points at (was: refused, "move those files", with no files to move). Links inside it
    stay refused (above)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    paths = compile_all(tmp_path / "link")
    assert paths and all(p.is_relative_to(tmp_path / "real") and p.is_file() for p in paths)


def test_an_earlier_compile_with_crlf_line_ends_is_replaced(tmp_path):
    """A checkout with `core.autocrlf` ends the committed files' lines with CRLF: still the compile's own."""
    paths = compile_all(tmp_path)
    paths[0].write_bytes(paths[0].read_bytes().replace(b"\n", b"\r\n"))
    assert compile_all(tmp_path) == paths


def test_the_own_pipeline_example_compiles_and_its_job_gets_an_owner(tmp_path, monkeypatch):
    """docs/components.md's pipeline of one's own, compiled as a user would: the training task
    gets the pod's name and uid (without them its job has no owner; the launcher warns)."""
    from kfp import compiler

    text = (REPO / "docs" / "components.md").read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO)  # the example loads compiled/components/*.yaml by relative path
    scope: dict = {}
    exec(compile(code, "docs/components.md", "exec"), scope)
    out = tmp_path / "mine.yaml"
    compiler.Compiler().compile(scope["my_pipeline"], str(out))
    docs = list(yaml.safe_load_all(out.read_text()))
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    fields = {e["name"]: e["fieldPath"] for e in executors["exec-train"]["fieldPathAsEnv"]}
    assert fields == {"KFTRAIN_POD_NAME": "metadata.name", "KFTRAIN_POD_UID": "metadata.uid"}
    # configure uncached and reading the store with its keys, as the training_pipeline has it.
    assert docs[0]["root"]["dag"]["tasks"]["configure"]["cachingOptions"] == {}
    assert "secretAsEnv" in executors["exec-configure"]
    # The training task's settings reach its replicas (was: dropped by kfp's own YAML loader).
    assert docs[0]["components"]["comp-train"]["taskConfigPassthroughs"]
