"""Serving the exported models: the InferenceService examples against KServe's CRD schema, and
the language model's Hugging Face folder as vLLM's GPT-2 loader reads it.

vLLM itself is not run here (no GPU, and its wheel is several GB): the checks hold the export to
the fields vLLM's GPT2LMHeadModel reads and asserts (vllm/model_executor/models/gpt2.py) and to
how vLLM finds the generation defaults (a generation_config.json, else one made from config.json).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from trainer.launch.inferenceservice import validate_inferenceservice
from trainer.launch.preflight import ManifestError

SERVING = Path(__file__).resolve().parents[2] / "deploy" / "serving"
EXAMPLES = sorted(SERVING.glob("*.yaml"))


def load(path: Path) -> dict:
    (doc,) = yaml.safe_load_all(path.read_text())
    return doc


def _broken(mutate, example: str = "inferenceservice-vllm.yaml"):
    doc = copy.deepcopy(load(SERVING / example))
    mutate(doc)
    return doc


def _arg(args: list[str], flag: str) -> str:
    """The value of `flag` in a container's args: `--flag=value` or `--flag value`."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
        if arg == flag:
            return args[i + 1]
    raise AssertionError(f"{flag} not in {args}")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    import torch

    from trainer.gpt import GPT, GPTConfig
    from trainer.hf_export import hf_folder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("hf")
    for name, data in hf_folder(GPT(GPTConfig(block_size=64, n_layer=2, n_head=2, n_embd=32))).items():
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_inferenceservice_validates_against_the_kserve_schema(path):
    validate_inferenceservice(load(path))


def test_the_vllm_example_serves_the_hugging_face_export():
    from trainer.tasks.causal_lm import HF_FOLDER

    isvc = load(SERVING / "inferenceservice-vllm.yaml")
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "huggingface" and model["runtime"] == "kserve-huggingfaceserver"
    assert model["storageUri"].endswith(f"/exported/{HF_FOLDER}")
    assert "--backend=vllm" in model["args"]
    assert f"--model_name={isvc['metadata']['name']}" in model["args"]


def test_the_lora_example_serves_the_exported_adapter_on_the_base_model():
    from trainer.config import LoraConfig
    from trainer.export_pretrained import ADAPTER_CONFIG, ADAPTER_FOLDER, ADAPTER_WEIGHTS

    isvc = load(SERVING / "inferenceservice-vllm-lora.yaml")
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    assert model["modelFormat"]["name"] == "huggingface" and model["runtime"] == "kserve-huggingfaceserver"
    assert "storageUri" not in model  # storageUris instead: KServe refuses both
    mounts = {u["uri"].rsplit("/", 1)[-1]: u["mountPath"] for u in predictor["storageUris"]}
    adapter = next(u for u in predictor["storageUris"] if u["uri"].endswith(f"/exported/{ADAPTER_FOLDER}"))
    args = model["args"]
    assert "--backend=vllm" in args and "--enable-lora" in args
    assert _arg(args, "--model_name") == isvc["metadata"]["name"]
    # vLLM's NAME=PATH: the adapter folder as downloaded; the base model is the runtime's model.
    name, path = _arg(args, "--lora-modules").split("=", 1)
    assert name and name != isvc["metadata"]["name"] and path == adapter["mountPath"]
    assert _arg(args, "--model_dir") in set(mounts.values()) - {adapter["mountPath"]}
    assert int(_arg(args, "--max-lora-rank")) >= LoraConfig().rank
    assert (ADAPTER_CONFIG, ADAPTER_WEIGHTS) == ("adapter_config.json", "adapter_model.safetensors")  # peft's names


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d["spec"]["predictor"]["model"].update(storageUri="s3://x/y"),
            "storageUris and a storageUri are both set",
        ),
        (
            lambda d: d["spec"]["predictor"]["storageUris"][1].update(mountPath="/adapters/a"),
            "must share a parent folder other than /",
        ),
        (lambda d: d["spec"]["predictor"]["storageUris"][1].update(mountPath="/mnt/models/../x"), "no '..'"),
        (lambda d: d["spec"]["predictor"]["storageUris"][1].update(path="/mnt/models/a"), "'path' was unexpected"),
    ],
    ids=["storageUri too", "no common parent", "dot-dot", "path not mountPath"],
)
def test_storage_uris_follow_kserves_webhook_rules(mutate, message):
    with pytest.raises(ManifestError, match="InferenceService") as exc:
        validate_inferenceservice(_broken(mutate, "inferenceservice-vllm-lora.yaml"))
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["spec"]["predictor"]["model"].update(storageURI="s3://x/y"), "storageURI"),
        (lambda d: d["spec"]["predictor"]["model"].update(args="--backend=vllm"), "spec.predictor.model.args"),
        (lambda d: d["spec"]["predictor"].update(sklearn={"storageUri": "s3://x/y"}), "exactly one of"),
        (lambda d: d["spec"]["predictor"].pop("model"), "exactly one of"),
        (lambda d: d["metadata"].update(name="Kftrain_LM"), "metadata.name"),
        (lambda d: d["metadata"].update(name="a" * 48), "is 48 characters; KServe names the predictor's revision"),
        (lambda d: d["metadata"].update(name="a" * 70), "use 47 or fewer"),
        (lambda d: d.update(kind="Deployment"), "apiVersion/kind"),
        # Was: a traceback (AttributeError, TypeError) from the checks before the schema's.
        (lambda d: d.update(metadata=None), "metadata: must be a mapping with a name"),
        (lambda d: d["metadata"].update(name=123), "metadata.name: 123 must match"),
        # The API server's rules for single fields, and KServe's webhook's (were: passed).
        (lambda d: d["metadata"].update(namespace="team.a"), "metadata.namespace: 'team.a' is not a namespace"),
        (lambda d: d["metadata"].update(labels={"a": "b c"}), "metadata.labels.a: 'a': value 'b c' is not a label"),
        (lambda d: d["metadata"].update(annotations={"x": 1}), "annotation's value is text"),
        (lambda d: d["spec"]["predictor"].update(serviceAccountName="KF_x"), "serviceAccountName: 'KF_x' is not"),
        (lambda d: d["spec"]["predictor"]["model"].update(storageUri="ftp://x/y"), "is no storage URI KServe"),
        (lambda d: d["spec"]["predictor"].update(minReplicas=-1), "minReplicas: -1 is negative"),
        # Was: accepted; KServe's webhook: "MinReplicas cannot be greater than MaxReplicas".
        (
            lambda d: d["spec"]["predictor"].update(minReplicas=2, maxReplicas=1),
            "spec.predictor: minReplicas 2 is above maxReplicas 1; KServe refuses it",
        ),
        (
            lambda d: d["spec"]["predictor"]["model"].update(resources={"requests": {"nvidia.com/gpu": "1"}}),
            "requests nvidia.com/gpu 1 without a limit",
        ),
        (
            lambda d: d["spec"]["predictor"]["model"].update(
                resources={
                    "requests": {"cpu": "8", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "4", "nvidia.com/gpu": "1"},
                }
            ),
            "requests cpu 8 against a limit of 4",
        ),
        (
            lambda d: d["spec"]["predictor"]["model"].update(resources={"limits": {"memory": "8Gx"}}),
            "resources.limits.memory",
        ),
    ],
    ids=[
        "misspelt field",
        "args not a list",
        "two implementations",
        "no implementation",
        "bad name",
        "long name",
        "too long for a label",
        "wrong kind",
        "metadata not a mapping",
        "name not text",
        "bad namespace",
        "bad label",
        "annotation not text",
        "bad service account",
        "storage scheme",
        "negative replicas",
        "min above max",
        "gpu not limited",
        "cpu over its limit",
        "bad quantity",
    ],
)
def test_the_validator_rejects_what_kserve_would_reject_or_drop(mutate, message):
    with pytest.raises(ManifestError, match="InferenceService") as exc:
        validate_inferenceservice(_broken(mutate))
    assert message in str(exc.value)


@pytest.mark.parametrize(("low", "high"), [(1, 1), (2, 0), (0, 3)], ids=["equal", "no upper bound", "scale to zero"])
def test_replica_bounds_kserve_takes_pass(low, high):
    validate_inferenceservice(_broken(lambda d: d["spec"]["predictor"].update(minReplicas=low, maxReplicas=high)))


@pytest.mark.parametrize("manifest", [[], "InferenceService", None])
def test_a_manifest_that_is_no_mapping_is_named(manifest):
    with pytest.raises(ManifestError, match="InferenceService: must be a mapping"):
        validate_inferenceservice(manifest)


def test_the_vendored_schema_names_its_source():
    from importlib import resources

    doc = json.loads(resources.files("trainer.launch").joinpath("schemas/inferenceservice.v1beta1.json").read_text())
    assert "kserve/kserve v0.20.0" in doc["source"] and "Apache-2.0" in doc["source"]
    assert (doc["group"], doc["version"], doc["kind"]) == ("serving.kserve.io", "v1beta1", "InferenceService")
    assert "description" not in json.dumps(doc["openAPIV3Schema"])


def test_the_export_has_what_vllms_gpt2_loader_reads(hf_dir):
    transformers = pytest.importorskip("transformers")
    names = {p.name for p in hf_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    raw = json.loads((hf_dir / "config.json").read_text())
    # The architecture name is vLLM's registry key; the rest sizes its GPT-2.
    assert raw["architectures"] == ["GPT2LMHeadModel"] and raw["model_type"] == "gpt2"
    assert (raw["vocab_size"], raw["n_positions"], raw["n_ctx"]) == (256, 64, 64)
    assert (raw["n_embd"], raw["n_head"], raw["n_layer"], raw["n_inner"]) == (32, 2, 2, 128)
    assert raw["tie_word_embeddings"] is True and raw["activation_function"] == "gelu_new"
    cfg = transformers.AutoConfig.from_pretrained(hf_dir)
    # The names vLLM's GPT2Model uses, through GPT2Config's attribute map.
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers, cfg.max_position_embeddings) == (
        32,
        2,
        2,
        64,
    )
    # vLLM asserts these are off, and always scales attention by 1/sqrt(head_dim).
    assert not (cfg.add_cross_attention or cfg.scale_attn_by_inverse_layer_idx or cfg.reorder_and_upcast_attn)
    assert cfg.scale_attn_weights
    # No special tokens in a byte vocabulary: not GPT2Config's default 50256, outside it.
    assert cfg.bos_token_id is None and cfg.eos_token_id is None


def test_generation_config_has_no_out_of_vocabulary_end_token(hf_dir):
    transformers = pytest.importorskip("transformers")
    raw = json.loads((hf_dir / "generation_config.json").read_text())
    assert raw == {"bos_token_id": None, "eos_token_id": None, "max_length": 64}
    gen = transformers.GenerationConfig.from_pretrained(hf_dir)
    assert gen.eos_token_id is None and gen.bos_token_id is None and gen.max_length == 64
    # What vLLM would build without the file (GenerationConfig.from_model_config) now agrees too.
    derived = transformers.GenerationConfig.from_model_config(transformers.AutoConfig.from_pretrained(hf_dir))
    assert derived.eos_token_id is None
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert tok.eos_token_id is None and tok.model_max_length == 64
    assert tok.encode("hé") == list("hé".encode())
