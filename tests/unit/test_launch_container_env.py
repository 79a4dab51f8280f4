"""The training container's environment: every source's variables, each name once, the same for
both job kinds; a name two sources set is refused naming both (the API server would refuse the
container, or one value would silently win)."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError, load_config
from trainer.launch.job import check_job_manifests, training_job
from trainer.launch.pytorchjob import pytorchjob_manifest
from trainer.launch.trainjob import trainjob_manifest

SECRET_REF = {"valueFrom": {"secretKeyRef": {"name": "other", "key": "k"}}}


@pytest.mark.parametrize(
    ("kubernetes", "job", "refused"),
    [
        ({"env": {"OMP_NUM_THREADS": "8"}}, {"omp_num_threads": 4}, "kubernetes.env.OMP_NUM_THREADS: kftrain sets it"),
        ({"env": {"NCCL_DEBUG": "INFO"}}, {"nccl_debug": "WARN"}, "from job.nccl_debug: set that instead"),
        ({"env": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}}, {}, "always, so that a failed collective ends the job"),
        ({"env": {"KFTRAIN_TERMINATION_GRACE_SECONDS": "5"}}, {}, "from kubernetes.termination_grace_seconds"),
        # The operator appends its own after the pod's (a PyTorchJob's was silently overwritten).
        ({"env": {"PYTHONUNBUFFERED": "0"}}, {}, "kubernetes.env.PYTHONUNBUFFERED: PYTHONUNBUFFERED is set to '1'"),
        (
            {"extra_env": [{"name": "PYTHONUNBUFFERED", "value": "0"}]},
            {},
            "kubernetes.extra_env[0]: PYTHONUNBUFFERED is set to '1' in every replica",
        ),
        (
            {"extra_env": [{"name": "OMP_NUM_THREADS", "value": "8"}]},
            {},
            "kubernetes.extra_env[0]: sets OMP_NUM_THREADS, which kftrain's own environment sets too",
        ),
        (
            {"extra_env": [{"name": "KFTRAIN_NODE_NAME", "value": "x"}]},
            {},
            "kubernetes.extra_env[0]: sets KFTRAIN_NODE_NAME, which kftrain's own environment sets too",
        ),
        (
            {"hf_token_secret": "hf", "extra_env": [{"name": "HF_TOKEN", **SECRET_REF}]},
            {},
            "kubernetes.extra_env[0]: sets HF_TOKEN, which kubernetes.hf_token_secret sets too",
        ),
        (
            {"extra_env": [{"name": "AWS_SECRET_ACCESS_KEY", **SECRET_REF}]},
            {},
            "kubernetes.extra_env[0]: sets AWS_SECRET_ACCESS_KEY, which kubernetes.store_secret_keys sets too",
        ),
        (
            {"store_secret_keys": {"a": "AWS_ACCESS_KEY_ID", "b": "AWS_ACCESS_KEY_ID", "c": "AWS_SECRET_ACCESS_KEY"}},
            {},
            "kubernetes.store_secret_keys: sets AWS_ACCESS_KEY_ID, which kubernetes.store_secret_keys sets too",
        ),
        (
            {
                "env": {"MY_SETTING": "1"},
                "store_secret_keys": {"id": "AWS_ACCESS_KEY_ID", "key": "AWS_SECRET_ACCESS_KEY", "x": "MY_SETTING"},
            },
            {},
            "kubernetes.store_secret_keys: sets MY_SETTING, which kubernetes.env.MY_SETTING sets too",
        ),
    ],
)
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_a_variable_two_sources_set_is_refused_naming_both(kubernetes, job, refused, kind):
    overrides = {f"kubernetes.{k}": v for k, v in kubernetes.items()} | {f"job.{k}": v for k, v in job.items()}
    cfg = load_config(overrides={**overrides, "job.kind": kind})
    with pytest.raises(ConfigError) as info:
        check_job_manifests(cfg)
    assert refused in str(info.value) and str(info.value).startswith("kubernetes."), str(info.value)


def test_both_kinds_give_the_container_the_same_variables():
    cfg = load_config(
        overrides={
            "kubernetes.env": {"MY_SETTING": "1"},
            "kubernetes.hf_token_secret": "hf",
            "kubernetes.extra_env": [{"name": "DB_URL", **SECRET_REF}],
            "job.nccl_debug": "WARN",
        }
    )
    spec = training_job(cfg, "j", "s3://b/d", "s3://b/m")
    pytorch = pytorchjob_manifest(spec)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    train = trainjob_manifest(spec)["spec"]["trainer"]
    names = [e["name"] for e in pytorch["env"]]
    assert len(names) == len(set(names))
    assert {"MY_SETTING", "HF_TOKEN", "DB_URL", "NCCL_DEBUG", "OMP_NUM_THREADS", "AWS_ACCESS_KEY_ID"} <= set(names)
    # The kinds differ only in the variable naming the job (from each operator's pod label) and
    # PYTHONUNBUFFERED, which the Training Operator sets itself and Trainer v2 does not.
    differ = {"KFTRAIN_PYTORCHJOB_NAME", "KFTRAIN_TRAINJOB_NAME", "PYTHONUNBUFFERED"}
    strip = lambda env: [e for e in env if e["name"] not in differ]  # noqa: E731
    assert strip(pytorch["env"]) == strip(train["env"])


def test_a_credential_pair_may_come_from_two_secrets():
    """The store Secret fills the key, kubernetes.extra_env the secret (another Secret): a whole pair."""
    cfg = load_config(
        overrides={
            "kubernetes.store_secret_keys": {"accesskey": "AWS_ACCESS_KEY_ID"},
            "kubernetes.extra_env": [{"name": "AWS_SECRET_ACCESS_KEY", **SECRET_REF}],
        }
    )
    check_job_manifests(cfg)


def kubelet_expands(text: str, env: dict[str, str]) -> str:
    """What the kubelet makes of a container's `command`/`args` item or env `value`
    (k8s.io/kubernetes third_party/forked/golang/expansion): `$$` is `$`, `$(NAME)` a defined
    variable's value (an undefined one stays as written), any other `$` itself."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            if text[i + 1] == "(" and (end := text.find(")", i + 2)) != -1:
                name = text[i + 2 : end]
                out.append(env.get(name, text[i : end + 1]))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize(
    "text", ["Price: $$5", "$(OMP_NUM_THREADS) threads", "$(AWS_SECRET_ACCESS_KEY)", "ends in $", "$$(X) and $$$"]
)
def test_the_pods_get_every_dollar_as_a_local_process_does(kind, text):
    """The command (the config's JSON: a prompt, a column name) and `kubernetes.env` values reach
    the process as written, not expanded against the container's other variables."""
    cfg = load_config(
        overrides={"task": "causal_lm", "data.eval_prompts": [text], "kubernetes.env": {"MY_SETTING": text}}
    )
    spec = training_job(cfg, "j", "s3://b/d", "s3://b/m")
    if kind == "pytorchjob":
        container = pytorchjob_manifest(spec)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
        container = container["containers"][0]
    else:
        container = trainjob_manifest(spec)["spec"]["trainer"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    defined = {"OMP_NUM_THREADS": "1", "AWS_SECRET_ACCESS_KEY": "hunter2-secret", "X": "x"}
    assert [kubelet_expands(arg, defined) for arg in container["command"]] == list(spec.command)
    assert kubelet_expands(env["MY_SETTING"], defined) == text == spec.env["MY_SETTING"]
