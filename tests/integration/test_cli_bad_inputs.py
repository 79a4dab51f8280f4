"""Bad configs through the real `kftrain` command: a non-zero exit at once, the last line the user
sees names the field or key, and nothing was written (no step started)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_group
from tests.hf_models import base_model_config, model_variant
from tests.unit.test_config_yaml import alias_bomb
from trainer.example_model import tiny_llama_folder

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)

# (config text, phrases the last line must hold)
ROWS = [
    pytest.param(
        alias_bomb(), ["c.yaml: line 1:", "anchors and aliases (a value starting with '&') are not"], id="alias-bomb"
    ),
    pytest.param(
        "job:\n  replicas: 2\n  replicas: 4\n", ["c.yaml: job.replicas: duplicate key, on lines 2 and 3"], id="dup-key"
    ),
    pytest.param(
        "kubernetes:\n  labels:\n    team name: ml\n",
        ["kubernetes.labels: key 'team name' is not a label key"],
        id="label-key",
    ),
    pytest.param(
        "kubernetes:\n  env:\n    WORLD_SIZE: '8'\n",
        ["kubernetes.env.WORLD_SIZE: WORLD_SIZE is set in every replica"],
        id="operator-env",
    ),
    pytest.param("job:\n  nccl_debug: LOUD\n", ["job.nccl_debug", "'LOUD'"], id="nccl-debug"),
    pytest.param(
        "kubernetes:\n  tolerations:\n  - {key: gpu, operator: Maybe}\n",
        ["kubernetes.tolerations[0]: operator 'Maybe' is not one of Equal or Exists"],
        id="toleration",
    ),
    pytest.param(
        "plan:\n  enabled: true\n  gpu: H999\n",
        ["plan.gpu: not a GPU type the plan knows, got 'H999'", "H200-141GB", "kubernetes.gpu_memory_gb"],
        id="plan-gpu",
    ),
    pytest.param("plan:\n  nodes: [2, 0]\n", ["plan.nodes: must be a list of positive node counts"], id="plan-nodes"),
    pytest.param(
        "checkpoint:\n  resume_from: nosuchrun\n",
        ["checkpoint.resume_from 'nosuchrun': no committed checkpoint for run nosuchrun under", "kftrain runs"],
        id="resume-from-unknown-run",
    ),
    pytest.param(
        "checkpoint:\n  resume_from: ./nowhere\n",
        ["checkpoint.resume_from './nowhere': no committed checkpoint at or under"],
        id="resume-from-no-checkpoint",
    ),
]


@pytest.mark.parametrize(("config", "phrases"), ROWS)
def test_kftrain_run_refuses_a_bad_config_before_any_step(tmp_path, config, phrases):
    (tmp_path / "c.yaml").write_text(config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--local", "--config", "c.yaml", "--output-dir", "out"]
    start = time.monotonic()
    rc, out = run_group(cmd, timeout=60, env=env, cwd=str(tmp_path))
    assert time.monotonic() - start < 60
    assert rc == 2, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("kftrain: error: "), out
    for phrase in phrases:
        assert phrase in last, out
    assert "Traceback" not in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"], out  # no output dir, nothing written


# -- a pretrained base model (model.init_from): refused before any step, naming the fix -----------

LORA = "train:\n  method: lora\n"
# (how the folder differs from the tiny Llama: None for no folder, config, phrases the last line holds)
BASE_MODEL_ROWS = [
    pytest.param(None, "", ["model.init_from", "no such folder", "fix the path"], id="no-folder"),
    pytest.param(
        {"config": {"auto_map": {"AutoModelForCausalLM": "modeling.My"}}},
        "",
        ["model.init_from", "needs its own Python code", "model.trust_remote_code: true"],
        id="remote-code",
    ),
    pytest.param(
        {"drop": ("model.safetensors",)},
        "",
        ["model.init_from", "safetensors only", "save_pretrained"],
        id="no-weights",
    ),
    pytest.param({}, "model:\n  block_size: 512\n", ["model.block_size 512", "at most 256"], id="block-size"),
    pytest.param(
        {"tokenizer_config": {"chat_template": None}, "drop": ("chat_template.jinja",)},
        "data:\n  format: chat\n  source: CHAT_JSONL\n",
        ["data.format: chat needs the model's chat template", "data.format: text or jsonl"],
        id="chat-template",
    ),
    pytest.param(
        {},
        LORA + "lora:\n  target_modules: [qkv]\n",
        ["lora.target_modules ['qkv']", "The model's linear layers: down_proj"],
        id="lora-target",
    ),
    pytest.param(
        {},
        "kubernetes:\n  gpu_memory_gb: 0.001\n  gpus_per_node: 1\njob:\n  nproc_per_node: 1\n",
        ["kubernetes.gpu_memory_gb 0.001", "1.0 MiB", "train.strategy: fsdp", "train.method: lora", "larger GPUs"],
        id="gpu-memory",
    ),
    pytest.param("hf://org/na me", "", ["model.init_from 'hf://org/na me'", "hf://<org>/<name>"], id="hub-uri"),
]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("base") / "tiny-llama")


def run_refused(cwd: Path, config: str, env: dict[str, str], phrases: list[str]) -> None:
    """`kftrain run --local` with `config` exits 2 within seconds, its last line names the fix, and
    nothing was written."""
    (cwd / "c.yaml").write_text(config)
    env = {**env, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--local", "--config", "c.yaml", "--output-dir", "out"]
    start = time.monotonic()
    rc, out = run_group(cmd, timeout=120, env=env, cwd=str(cwd))
    assert time.monotonic() - start < 120  # imports of torch, transformers and peft on a busy machine
    assert rc == 2, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("kftrain: error: "), out
    for phrase in phrases:
        assert phrase in last, out
    assert "Traceback" not in out and "Executing task" not in out, out
    assert sorted(p.name for p in cwd.iterdir()) == ["c.yaml"], out  # no output dir, nothing written


@pytest.mark.parametrize(("variant", "extra", "phrases"), BASE_MODEL_ROWS)
def test_kftrain_run_refuses_a_bad_base_model_before_any_step(tmp_path, tiny_llama, variant, extra, phrases):
    if variant is None:
        init_from = str(tmp_path / "models" / "no-such-model")
    elif isinstance(variant, str):
        init_from = variant
    else:
        init_from = model_variant(tiny_llama, tmp_path / "models" / "tiny", **variant)
    run = tmp_path / "run"
    run.mkdir()
    if "CHAT_JSONL" in extra:  # chat data needs a JSON Lines source; outside the run's folder, which stays empty
        from trainer.example_model import write_chat_jsonl

        extra = extra.replace("CHAT_JSONL", write_chat_jsonl(tmp_path / "chat.jsonl", n=20))
    run_refused(run, base_model_config(init_from, extra), dict(os.environ), phrases)


def test_a_base_model_in_the_store_is_checked_there(tmp_path, tiny_llama, s3_env, bucket):
    """The headers come from S3 with ranged reads: a model in the store is checked like a local one."""
    client = s3_env.client()
    for path in Path(tiny_llama).iterdir():
        client.fput_object(bucket, f"models/tiny/{path.name}", str(path))
    config = base_model_config(f"s3://{bucket}/models/tiny", "model:\n  block_size: 512\n")
    run_refused(tmp_path, config, {**os.environ, **s3_env.env()}, ["model.block_size 512", "at most 256"])
    lora = base_model_config(f"s3://{bucket}/models/tiny", LORA + "lora:\n  target_modules: [qkv]\n")
    run_refused(tmp_path, lora, {**os.environ, **s3_env.env()}, ["lora.target_modules ['qkv']"])
    # A model at a bucket's root is a folder too (was, for a moment: "names a bucket, not an object").
    root = f"{bucket}-model"
    client.make_bucket(root)
    for path in Path(tiny_llama).iterdir():
        client.fput_object(root, path.name, str(path))
    at_root = base_model_config(f"s3://{root}", "model:\n  block_size: 512\n")
    run_refused(tmp_path, at_root, {**os.environ, **s3_env.env()}, ["model.block_size 512", "at most 256"])


@pytest.mark.parametrize("through", ["output_dir", "store.uri", "--summary"])
def test_a_write_into_the_data_source_through_a_bind_mount_of_it_is_refused(tmp_path, mounts, through):
    """The source folder seen at a second path (a bind mount; one host folder mounted twice in a
    container): a place under that path is inside it (was: a real path of its own, and the run's
    files became the next data prep's rows). Needs a bind mount, where this machine allows one."""
    from trainer.checks import check_writes_outside_inputs, run_writes
    from trainer.config import ConfigError, load_config

    (tmp_path / "corpus").mkdir()
    mounts.bind(tmp_path / "corpus", tmp_path / "view")
    place = str(tmp_path / "view" / "runs")
    cfg = load_config(
        overrides={"data.source": str(tmp_path / "corpus"), **({"store.uri": place} if through == "store.uri" else {})}
    )
    writes = run_writes(cfg, place if through == "output_dir" else "")
    if through == "--summary":
        writes["--summary"] = f"{place}/summary.json"
    with pytest.raises(ConfigError, match=r"is inside data.source .*: data prep would read the run's own files"):
        check_writes_outside_inputs(cfg, writes)
    check_writes_outside_inputs(load_config(overrides={"data.source": str(tmp_path / "corpus")}), {"x": str(tmp_path)})


def test_a_temporary_folder_too_full_for_the_steps_is_refused_before_any_step(tmp_path, mounts):
    """(was: every step failed before kftrain's code ran, "printf: I/O error", read as "a bug in
    kftrain"). A small tmpfs as TMPDIR, where this machine allows one to be mounted."""
    scratch = tmp_path / "tmp"
    mounts.tmpfs(scratch, "1m")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(scratch)}
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--local", "--output-dir", "out"]
    rc, out = run_group(cmd, timeout=60, env=env, cwd=str(tmp_path))
    assert rc == 2, out
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith(f"kftrain: error: the temporary folder {scratch} has 1.0 MiB free, under the 16 MiB")
    ), out
    assert not (tmp_path / "out").exists() and list(scratch.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "--output-dir (default: kftrain-outputs) '"),  # was: "--output-dir", a flag the user never gave
        (["--output-dir", "out"], "--output-dir '"),
    ],
)
def test_an_output_folder_inside_the_data_source_names_the_flag_and_its_default(
    tmp_path, monkeypatch, capsys, args, said
):
    from pipelines.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("some text\n" * 100)
    (tmp_path / "c.yaml").write_text("task: causal_lm\ndata:\n  source: ./\n")
    assert main(["run", "--local", "--config", "c.yaml", *args]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    # data.source as the run records it: absolute, from the folder it started in
    assert last.startswith(f"kftrain: error: {said}") and f"is inside data.source '{tmp_path}'" in last, last
    assert not (tmp_path / "kftrain-outputs").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"AWS_REGION": "bad region"}, "$AWS_REGION: 'bad region' is not a region name"),
        ({"AWS_ENDPOINT_URL": "minio:9000"}, "$AWS_ENDPOINT_URL: S3 endpoint 'minio:9000' must be a URL"),
    ],
)
def test_a_bad_store_setting_from_the_environment_is_named_alone_through_the_cli(
    tmp_path, monkeypatch, capsys, env, said
):
    """Was: "store.uri: $AWS_REGION: ...", blaming a flag that is fine."""
    from pipelines.cli import main

    monkeypatch.chdir(tmp_path)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["run", "--local", "--store", "s3://bucket/prefix"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"kftrain: error: {said}"), last
    assert not (tmp_path / "kftrain-outputs").exists()
