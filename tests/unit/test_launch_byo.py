"""The bring-your-own-image launcher: the pure builder, its manifest, and the Kubernetes backend
(against the FAKE API in tests/fake_kube.py) running a job named from the task identity."""

# No `from __future__ import annotations`: KFP reads the test pipeline's annotations as types.
import json
import re
from dataclasses import replace

import pytest

from components.runtime import task_identity
from tests.fake_kube import FakeCluster, launcher
from trainer.config import ConfigError, parse_config
from trainer.launch.backend import JobFailed, run_job
from trainer.launch.byo import byo_job
from trainer.launch.kubernetes import KubernetesBackend
from trainer.launch.preflight import ManifestError, validate_pytorchjob
from trainer.launch.pytorchjob import pytorchjob_manifest
from trainer.launch.spec import job_name

pytestmark = pytest.mark.timeout(60)

OUT = "minio://mlpipeline/v2/artifacts/byo/run-1/pytorchjob/model"
IN = "s3://datasets/digits/v1"
PVC = {"name": "data", "persistentVolumeClaim": {"claimName": "shared-data", "readOnly": True}}
MOUNT = {"name": "data", "mountPath": "/data", "readOnly": True}
# tolerationSeconds needs effect NoExecute (the API server refuses it with any other effect).
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}


def byo(**overrides):
    args = {
        "name": "byo-job",
        "image": "registry.example/team/train:1.2",
        "command": ["python", "/app/train.py", "--epochs", "3"],
        "output_uri": OUT,
        "replicas": 3,
        "cluster": True,
    }
    return byo_job(**{**args, **overrides})


def container(manifest, replica="Master"):
    return manifest["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]


def env_of(manifest, replica="Master"):
    return {e["name"]: e for e in container(manifest, replica)["env"]}


# -- the Kubernetes backend (FAKE API) ------------------------------------------------------


def backend_for(cluster: FakeCluster, owner_uid: str, lines: list[str]) -> KubernetesBackend:
    return launcher(cluster, owner_uid, lines.append)


def task_job(task_name: str = "pytorchjob"):
    name = job_name(task_identity("run-1", task_name, "dag-7", OUT))
    return byo_job(name=name, image="user/img:1", command=["python", "train.py"], output_uri=OUT, cluster=True)


def test_the_replicas_environment_contract():
    spec = byo(input_uri=IN, s3_endpoint="http://seaweedfs.kubeflow:9000", env={"EPOCHS": "3"})
    env = env_of(pytorchjob_manifest(spec, "team"))
    # KFP's minio:// is the same bucket and key on the S3 endpoint, spelt the way S3 libraries read it.
    assert env["KFTRAIN_OUTPUT_URI"] == {"name": "KFTRAIN_OUTPUT_URI", "value": OUT.replace("minio://", "s3://")}
    assert env["KFTRAIN_INPUT_URI"]["value"] == IN
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://seaweedfs.kubeflow:9000"
    assert env["EPOCHS"]["value"] == "3"
    bare = env_of(pytorchjob_manifest(byo(), "team"))
    assert "KFTRAIN_INPUT_URI" not in bare and "AWS_ENDPOINT_URL" not in bare


def test_store_keys_reach_the_replicas_only_through_secret_key_refs():
    manifest = pytorchjob_manifest(byo(store_secret="team-s3", store_secret_keys={"id": "S3_ID", "key": "S3_KEY"}))
    for replica in ("Master", "Worker"):
        env = env_of(manifest, replica)
        for var, key in (("S3_ID", "id"), ("S3_KEY", "key")):
            assert "value" not in env[var]
            assert env[var]["valueFrom"] == {"secretKeyRef": {"name": "team-s3", "key": key, "optional": False}}
    defaults = env_of(pytorchjob_manifest(byo()))
    assert defaults["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlpipeline-minio-artifact",
        "key": "secretkey",
        "optional": False,
    }
    # No Secret (workload identity): no reference to one either.
    env = container(pytorchjob_manifest(byo(store_secret="")))["env"]
    assert not [e for e in env if "secretKeyRef" in e.get("valueFrom", {})]


def test_pod_settings_reach_the_manifest_and_pass_preflight():
    spec = byo(
        gpus_per_node=8,
        nproc_per_node=8,
        command=["torchrun", "/app/train.py"],
        node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        tolerations=[TOLERATION],
        volumes=[PVC],
        volume_mounts=[MOUNT],
        namespace="team-a",
        queue="gpu-queue",
        timeout_s=7200,
    )
    manifest = pytorchjob_manifest(spec, "team-a")
    validate_pytorchjob(manifest)  # CRD schema (strict), webhook rules, core pod schemas
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert manifest["spec"]["nprocPerNode"] == "8"
    assert manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 7200
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    for replica in ("Master", "Worker"):
        pod = replicas[replica]["template"]["spec"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        assert pod["tolerations"] == [TOLERATION]
        assert [v["name"] for v in pod["volumes"]] == ["dshm", "data"] and PVC in pod["volumes"]
        c = container(manifest, replica)
        assert c["image"] == "registry.example/team/train:1.2"
        assert c["command"] == ["torchrun", "/app/train.py"]
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
        assert MOUNT in c["volumeMounts"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AWS_SECRET_ACCESS_KEY", "abc"),
        ("AWS_ACCESS_KEY_ID", "abc"),
        ("AWS_SESSION_TOKEN", "abc"),
        ("HF_TOKEN", "abc"),
        ("WANDB_API_KEY", "abc"),
        ("DB_PASSWORD", "abc"),
        ("client_secret", "abc"),
        ("MY_SECRET_SAUCE", "abc"),
        ("GIT_CREDENTIALS", "abc"),
        ("DEPLOY_SSH_KEY", "abc"),
        ("SOME_SETTING", "AKIAIOSFODNN7EXAMPLE"),
        ("SOME_SETTING", "-----BEGIN RSA PRIVATE KEY-----\nMIIE"),
        ("SOME_SETTING", "ghp_" + "a1B2" * 9),
        ("SOME_SETTING", "hf_" + "x" * 34),
        ("DATABASE_URL", "postgres://trainer:hunter22@db:5432/runs"),
        # Names and values a probe found accepted and printed into the manifest.
        ("AUTHORIZATION", "x"),
        ("NPM_AUTH", "x"),
        ("WANDB_KEY", "0123456789abcdef0123456789abcdef01234567"),
        ("SESSION_COOKIE", "abc"),
        ("SOME_SETTING", "Bearer 4f9a8b7c6d5e4f3a2b1c"),
        ("SOME_SETTING", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJl"),
        ("DATA_URL", "https://h/data.csv?X-Amz-Signature=abc123"),
        # A key of no known format under an ordinary name: an AWS secret key's shape, a random token
        # (were: accepted, and printed into the manifest).
        ("MY_VAR", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("S3_KEY2", "Zx8Qw2Lp9Rt4Vb7Nm1Kj6Hg3Fd5Sa0Yu+Pq7Ws"),
        # A secret key with three '/', a '//' or a leading '/' (one in 25 of them; were: read as paths).
        ("STORE_SK", "k8Fq2/Lw9Zr4Tx7W/m3Np6Ys1Bv5/Hc0Jd8Ge2Qu"),
        ("STORE_SK", "k8Fq2//Lw9Zr4Tx7Wm3Np6Ys1Bv5Hc0Jd8Ge2Qux"),
        ("STORE_SK", "/k8Fq2Lw9Zr4Tx7Wm3Np6Ys1Bv5Hc0Jd8Ge2Quxa"),
        # URLs with a password in the forms the URL check of store URIs refuses (were: accepted).
        ("CACHE_URL", "redis://:hunter2probeXYZ@db:6379/0"),
        ("CACHE_URL", "postgres://u:hunter2/probeXYZ@db/x"),
        ("CACHE_URL", "https://k8Fq2Lw9Zr4Tx7Wm3Np6Ys1Bv5Hc0Jd8Ge2Qux@git.example.com/repo.git"),  # a token as user
        ("CACHE_URL", "postgres://u:hunter2 probeXYZ@db/x"),
        ("SOME_ARGS", "--db postgres://u:hunter2probeXYZ@db/x --fast"),
        # The client variables of libpq and MySQL, and names ending in PASS or PAT.
        ("PGPASSWORD", "abc"),
        ("MYSQL_PWD", "abc"),
        ("DB_PASS", "abc"),
        ("GITHUB_PAT", "abc"),
        # Token formats of other services.
        ("SOME_SETTING", "glpat-" + "a1B2c3D4e5" * 2),
        ("SOME_SETTING", "AIza" + "SyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"),
        ("SOME_SETTING", "sk_live_" + "a1B2c3D4e5F6g7H8"),
        ("SOME_SETTING", "npm_" + "a1B2c3D4e5F6" * 3),
        ("SOME_SETTING", "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"),
        ("SOME_SETTING", "DefaultEndpointsProtocol=https;AccountName=x;AccountKey=a1B2c3D4e5F6g7H8i9J0==;"),
        # Forms a probe found accepted: a PGP key, a Docker config, connection strings' passwords, a
        # lower-case scheme, a Google access token, URLs a slash short or long.
        ("SOME_SETTING", "-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF"),
        ("DOCKER_CONFIG_JSON", '{"auths": {"registry.example.com": {"auth": "dXNlcjpodW50ZXIy"}}}'),
        ("DB_DSN", "Server=db;Database=runs;User Id=ml;Password=hunter2probe;"),
        ("DB_DSN", "host=db dbname=runs user=ml password=hunter2probe"),
        ("DB_DSN", "Driver={ODBC};Uid=ml;Pwd=hunter2probe"),
        ("SOME_SETTING", "basic dXNlcjpwYXNzd29yZDEyMw=="),
        ("SOME_SETTING", "ya29.a0AfH6SMBx1234567890abcdefgh"),
        ("CACHE_URL", "redis:/:hunter2probeXYZ@db:6379/0"),
        ("CACHE_URL", "postgres:///u:hunter2probeXYZ@db/x"),
        ("DATABASE", "app:hunter2probeXYZ@db.example.com:5432/x"),  # a DSN without its scheme
        ("DATABASE", "app:hunter2/probeXYZ@db.example.com:5432/x"),  # ... its password holding a '/'
        ("DB_PASSWORD", "/Summer2024probe"),  # a password starting with '/' is no file's path
        ("MOUNT_OPTIONS", "user=bob,password=hunter2probe"),
        ("DB_DSN", "host=db user=bob password = hunter2probe"),  # libpq allows spaces around '='
        ("DB_DSN", "Server=db;Pwd = hunter2probe"),
    ],
)
def test_credential_looking_plain_env_is_refused_in_both_places(name, value):
    with pytest.raises(ConfigError) as byo_err:
        byo(env={name: value})
    with pytest.raises(ConfigError) as cfg_err:
        parse_config(json.dumps({"kubernetes": {"env": {name: value}}}))
    for err, hint in ((byo_err, "store_secret and store_secret_keys"), (cfg_err, "kubernetes.store_secret")):
        message = str(err.value)
        assert name in message and "looks like a credential" in message and hint in message
        if len(value) > 3:
            assert value not in message  # the error must not leak what it refuses


@pytest.mark.parametrize(
    "env",
    [
        {"TOKENIZERS_PARALLELISM": "false"},
        {"NCCL_DEBUG": "INFO", "HF_HOME": "/cache/hf", "KEY_COLUMN": "label", "AUTHOR": "me"},
        {"DATA_URL": "https://example.com/data.csv?version=3", "MODE": "Basic"},
        # Text that starts like an Authorization value is text (a review found these refused).
        {"SYSTEM_PROMPT": "Basic questions about colours", "RUN_NOTE": "Basic fine-tuning-run", "T": "Token ring"},
        {"DATA_URL": "https://example.com/data.csv"},
        # Long values that are not keys: a commit, a digest, a path, a CamelCase name.
        {"GIT_COMMIT": "0123456789abcdef0123456789abcdef01234567", "RUN": "TeamNlpProject2024Q3Experiment7"},
        {"WEIGHTS": "/models/Llama-3.1-8B-Instruct/model-00001-of-00004.safetensors"},
        {"HF_HOME": "/workspace/Src2/Lib/Python3/Site/Pkgs/xy", "OUT": "Runs2024/Model7Qx/ckpt9Step/Ab3xYz9Qw"},
        # Paths of a secret key's length and letters, and URLs whose '@' is after the host.
        {"CKPT": "/checkpoints/Run2024Q3/Model7B/Step12000", "DATA": "s3://bucket/key@v1", "PWD": "/work"},
        {"PIP_INDEX": "git+https://github.com/org/repo@v1.2"},
        # A URL beside an address, and a port before a key's '@' (were: refused as credentials).
        {"NOTE": "see https://wiki.example.com or mail ml-team@example.com", "DATA": "http://minio:9000/b/key@v1"},
        # A user name alone is no secret (was: refused): pip's git form, ssh, ftp.
        {"PKG": "git+ssh://git@github.com/org/repo.git@v1.2", "MIRROR": "ftp://anonymous@ftp.example.com/pub"},
        # Text near the new forms: a DSN without a password, a path after `pwd=`, words after `basic`.
        {"DB_DSN": "host=db dbname=runs user=ml", "NOTE": "basic questions about colours", "DIR": "pwd=/work"},
        {"LOCAL": "file:///data/set@v2", "ODD": "file:/data/set@v2"},
        # A credential's name whose value is a file's path, a switch, or whose last word names a
        # setting (were: refused, with a fix that did not apply).
        {"GOOGLE_APPLICATION_CREDENTIALS": "/var/secrets/google/key.json", "AWS_SHARED_CREDENTIALS_FILE": "/x/c"},
        {"SECRET_NAME": "my-secret", "TOKEN_LIMIT": "4096", "AUTH_MODE": "none", "USE_AUTH": "false"},
        {"NOTE": "mailto:ml-team@example.com", "IMAGE": "reg.io:5000/img@sha256:abc", "AT": "10:30@site"},
        # A review's cases (were: refused): an image's tag and digest, an IAM member, lower-case words
        # after `basic` or `token`, JSON members that hold no secret, a relative key file.
        {"BASE_IMAGE": "ghcr.io/acme/trainer:v1.2@sha256:" + "0a" * 32, "MEMBER": "serviceAccount:sa@p.iam.x.com"},
        {"NOTE": "basic resnet50-imagenet-baseline", "TOK": "token sentencepiece-bpe-32000"},
        {"CFG": '{"auth": "workload-identity", "secret": "my-db-secret", "token": "${HF_TOKEN}"}'},
        {"GOOGLE_APPLICATION_CREDENTIALS": "./sa.json"},
    ],
)
def test_ordinary_plain_env_is_accepted(env):
    assert {k: v for k, v in byo(env=env).env.items() if k in env} == env
    assert parse_config(json.dumps({"kubernetes": {"env": env}})).kubernetes.env == env


TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0kLmNoPqRsTuVwXyZ"  # a GitHub token's form: 36 characters


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["--token", TOKEN], "command[3]: it looks like a credential"),  # by its form
        (["--hf-token", "hunter2probe"], "command[3]: the value of --hf-token"),  # by the flag's name
        ([f"--hf-token={TOKEN}"], "command[2]: the value of hf-token"),
        (["--password=hunter2probe"], "command[2]: the value of password"),
        (["--db-password", "hunter2probe"], "command[3]: the value of --db-password"),
        ([TOKEN], "command[2]: it looks like a credential"),
        (["--api-key", "sk-live-4f9a8b7c6d5e4f3a2b1c0d9e"], "command[3]: the value of --api-key"),
        # Hydra's overrides, `env NAME=...`, and a shell's command line (was: let through)
        (["trainer.hf_token=hunter2probe"], "command[2]: the value of trainer.hf_token"),
        (["+db.password=hunter2probe"], "command[2]: the value of db.password"),
        (["wandb.api_key=hunter2probe"], "command[2]: the value of wandb.api_key"),
        ([f"cmd --token {TOKEN} --epochs 3"], "command[2]: a word of it looks like a credential"),
        (["python t.py --password=hunter2probe"], "command[2]: the value of password"),
    ],
)
def test_a_credential_in_the_command_is_refused_as_in_env(args, where):
    """Was: refused in `env` but taken in the command, which is as readable (parameters, YAML, job object)."""
    with pytest.raises(ConfigError) as err:
        byo(command=["python", "train.py", *args])
    message = str(err.value)
    assert message.startswith(where) and "store_secret and store_secret_keys" in message, message
    assert TOKEN not in message and "hunter2probe" not in message and "sk-live" not in message


@pytest.mark.parametrize(
    "args",
    [
        ["--epochs=3", "--lr", "0.1"],
        ["--token-file", "/var/run/secrets/tok", "--key", "/keys/a.pem"],  # files, not the secrets
        ["--password"],  # a flag alone (the script prompts, or reads it elsewhere)
        ["--revision", "main", "--use-auth=false", "--model-name=gpt2"],
        # Flags named like a key or a token that hold none (a review found these refused)
        ["--text-key", "content", "--label_key", "labels", "--metric-key", "eval_loss", "--sort-key=timestamp"],
        ["--eos-token-id", "2", "--pad-token", "[PAD]", "--bos_token", "<s>", "--max-token-length", "512"],
        ["--token-budget", "4096", "--num-pass", "2", "--hf-token-env", "HF_TOKEN", "--session-key", "exp-42"],
        ["--use_auth_token", "--epochs", "3"],  # a switch, then another flag: not its value
        ["--hf-token", "$HF_TOKEN"],  # the shell's variable: the value is not in the command
        ["git_commit=0123456789abcdef0123456789abcdef01234567", "data=s3://bucket/key@v1"],
    ],
)
def test_ordinary_command_arguments_are_taken(args):
    assert list(byo(command=["python", "train.py", *args]).command[-len(args) :]) == args


@pytest.mark.parametrize("name", ["MASTER_ADDR", "RANK", "WORLD_SIZE", "PET_NNODES", "KFTRAIN_OUTPUT_URI"])
def test_env_that_the_operator_or_the_launcher_sets_is_refused(name):
    with pytest.raises(ConfigError, match=f"env.{name}: set by the Training Operator or the launcher"):
        byo(env={name: "x"})


@pytest.mark.parametrize(
    ("overrides", "where", "ref"),
    [
        ({"command": ["python", "train.py", "--master=$(MASTER_ADDR)"]}, "command[2]", "$(MASTER_ADDR)"),
        ({"command": ["torchrun", "--node-rank", "$(PET_NODE_RANK)", "t.py"]}, "command[2]", "$(PET_NODE_RANK)"),
        ({"env": {"DATA": "/data/$(POD_NAME)"}}, "env.DATA", "$(POD_NAME)"),
    ],
)
def test_a_kubernetes_variable_reference_is_refused_as_it_would_differ_locally(overrides, where, ref):
    """The kubelet expands `$(NAME)` in a pod; a local process gets the text: kftrain gives both the
    text (each `$` written `$$`), so a reference meant to expand is refused, saying what to do."""
    with pytest.raises(ConfigError) as err:
        byo(**overrides)
    message = str(err.value)
    assert message.startswith(f"{where}: {ref} is Kubernetes' reference to another variable"), message
    assert "os.environ" in message and '["sh", "-c"' in message


def test_a_dollar_that_is_no_reference_is_passed_as_written():
    spec = byo(command=["python", "t.py", "--price=$5", "--escaped=$$(X)"], env={"TEMPLATE": "${HOME}"})
    assert spec.command[2:] == ("--price=$5", "--escaped=$$(X)") and spec.env["TEMPLATE"] == "${HOME}"


@pytest.mark.parametrize(("which", "uri"), [("output_uri", "/tmp/model"), ("input_uri", "file:///data/ds")])
def test_a_local_path_is_refused_on_a_cluster_and_fine_locally(which, uri):
    with pytest.raises(ConfigError, match="is a local path, which each pod would see as its own empty disk"):
        byo(**{which: uri})
    spec = byo(**{which: uri}, cluster=False)
    var = "KFTRAIN_OUTPUT_URI" if which == "output_uri" else "KFTRAIN_INPUT_URI"
    assert spec.env[var] == uri.removeprefix("file://")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"volume_mounts": [{"name": "nope", "mountPath": "/x"}], "volumes": [PVC]}, "volume_mounts[0].name"),
        ({"volumes": [PVC, PVC], "volume_mounts": []}, "volumes[1].name: must be unique"),
        ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "kftrain's /dev/shm volume"),
        ({"volume_mounts": [{"name": "data", "mount_path": "/x"}], "volumes": [PVC]}, "`mountPath`"),
        (
            {
                "volume_mounts": [{"name": "data", "mountPath": "/x/"}, {"name": "data", "mountPath": "/x"}],
                "volumes": [PVC],
            },
            "volume_mounts[1].mountPath: must be unique",
        ),
        ({"volume_mounts": [{"name": "data", "mountPath": "/dev/shm"}], "volumes": [PVC]}, "kftrain mounts its shared"),
        ({"volume_mounts": [{"name": "data", "mountPath": "/x", "subPath": "a/../../b"}], "volumes": [PVC]}, "'..'"),
        ({"volumes": [{**PVC, "emptyDir": {}}]}, "volumes[0]: must have one source"),
        ({"env": {"KFTRAIN_NODE_NAME": "x"}}, "env.KFTRAIN_NODE_NAME: set by the Training Operator or the launcher"),
        ({"command": []}, "command: must be a non-empty list"),
        ({"image": ""}, "image: '' is not a container image"),
        ({"image": "user/img:1 "}, "image: 'user/img:1 ' is not a container image"),
        ({"s3_endpoint": "minio:9000"}, "s3_endpoint: 'minio:9000' must be a URL"),
        ({"replicas": 0}, "replicas must be >= 1"),
        (
            {"node_selector": {"pool": "not a label!"}},
            "node_selector: 'pool': value 'not a label!' is not a label value",
        ),
    ],
)
def test_bad_settings_fail_in_the_builder_naming_the_parameter(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        byo(**overrides)


#: A token (a GitHub one) and a password, as a user may paste them into a BYO parameter.
GHP, PASSWORD = "ghp_" + "a1B2" * 9, "hunter2probeXYZ"


@pytest.mark.parametrize(
    "overrides",
    [
        {"env": {GHP: 1}},
        {"env": {GHP: "$(HOME)"}},
        {"env": {"FOO": [GHP]}},
        {"node_selector": {GHP: 1}},
        {"command": ["python", f"$({GHP})"]},
        {"s3_endpoint": f"u:{PASSWORD}@minio:9000"},
        {"s3_endpoint": f"http:///u:{PASSWORD}@minio:9000"},
        {"kind": f"u:{PASSWORD}@x"},
        {"image": f"u:{PASSWORD}@reg.io/img:1"},
        {"tolerations": [{"key": GHP, "operator": "Exists"}]},
        {"store_secret": "s", "store_secret_keys": {"k": f"u:{PASSWORD}@x"}},
    ],
)
def test_a_bad_parameter_holding_a_credential_is_refused_without_showing_it(overrides):
    """The launcher's refusals printed a token written as a key, and a password in a value (the
    component's last line and its traceback carry them)."""
    with pytest.raises(ConfigError) as err:
        byo(**overrides)
    assert GHP not in str(err.value) and PASSWORD not in str(err.value), str(err.value)


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob", "auto"])
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tolerations": [{"key": "a", "operatr": "Exists"}]}, "tolerations[0]: Additional properties"),
        ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimname": "x"}}]}, "volumes (data): 'claimName'"),
        ({"volumes": [{"name": "data", "persistentVolumeClaim": {}}]}, "volumes (data): 'claimName' is a required"),
    ],
)
def test_what_the_clusters_schema_refuses_is_refused_by_the_local_launcher_too(kind, overrides, message):
    """(was: the local launcher ran the job, and the same arguments failed the step on a cluster
    after the pipeline's earlier steps; the parameter was named as `kubernetes.`'s field)"""
    with pytest.raises(ConfigError) as caught:
        byo(cluster=False, kind=kind, **overrides)
    assert str(caught.value).startswith(message), str(caught.value)


def test_preflight_catches_a_misspelt_volume_source_and_a_dangling_mount():
    manifest = pytorchjob_manifest(byo())
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimname": "x"}}]
    with pytest.raises(ManifestError, match="persistentVolumeClaim"):
        validate_pytorchjob(manifest)
    manifest = pytorchjob_manifest(byo())
    container(manifest)["volumeMounts"].append({"name": "ghost", "mountPath": "/ghost"})
    with pytest.raises(ManifestError, match=r"volumeMounts\[1\].name: 'ghost' is not a volume of the pod"):
        validate_pytorchjob(manifest)


def test_the_byo_job_is_named_from_the_task_and_a_second_launcher_reattaches():
    spec = task_job()
    assert spec.name == job_name(task_identity("run-1", "pytorchjob", "dag-7", "another-uri"))
    assert task_job("pytorchjob-2").name != spec.name  # another task of the run: another job
    cluster = FakeCluster()
    first_lines: list[str] = []
    backend_for(cluster, "uid-1", first_lines).submit(spec)  # this launcher pod dies; its job runs on
    assert container(cluster.jobs[spec.name])["image"] == "user/img:1"

    def running(c: FakeCluster) -> None:
        if f"{spec.name}-master-0" not in c.pods:
            c.add_pod(spec.name, "master", 0, "Running", logs=["rank 0 step 4 loss 0.12"])
            c.add_pod(spec.name, "worker", 0, "Running", logs=["rank 1 step 4 loss 0.13"])

    cluster.timeline = [running, running, lambda c: c.set_condition(spec.name, "Succeeded")]
    lines: list[str] = []
    run_job(backend_for(cluster, "uid-2", lines), replace(task_job(), timeout_s=60))
    assert [c for c in cluster.calls if c[0] == "create"] == [("create", spec.name)] * 2  # the 2nd got 409
    assert len(cluster.jobs) == 1 and any("re-attaching" in line for line in lines)
    assert [o["uid"] for o in cluster.jobs[spec.name]["metadata"]["ownerReferences"]] == ["uid-1", "uid-2"]
    assert "[master-0] rank 0 step 4 loss 0.12" in lines and "[worker-0] rank 1 step 4 loss 0.13" in lines


def test_a_failed_byo_job_fails_with_the_replicas_last_lines_and_is_deleted():
    spec = task_job()
    cluster = FakeCluster()

    def fail(c: FakeCluster) -> None:
        c.add_pod(spec.name, "worker", 0, "Failed", exit_code=3, logs=["rank 1 reading shard", "disk full"])
        c.set_condition(spec.name, "Failed", "JobFailed", "1 Worker replica(s) failed.")

    cluster.timeline = [fail]
    with pytest.raises(JobFailed) as info:
        run_job(backend_for(cluster, "uid-1", []), replace(spec, timeout_s=60))
    assert f"replica worker-0 (pod {spec.name}-worker-0) exited with code 3" in str(info.value)
    assert "[worker-0] disk full" in str(info.value)
    assert ("delete", spec.name) in cluster.calls and spec.name not in cluster.jobs


def test_the_component_refuses_a_local_output_path_on_a_cluster(tmp_path):
    from kfp.dsl import Model

    from components.pytorchjob import pytorchjob

    model = Model(name="model", uri=str(tmp_path / "model"))
    with pytest.raises(ConfigError, match="output URI .* is a local path"):
        pytorchjob.python_func(image="user/img:1", command=["python", "train.py"], model=model, launcher="kubernetes")


@pytest.mark.parametrize(("gpus", "warned"), [(1, True), (0, False)])
def test_a_byo_job_asking_for_gpus_on_a_machine_without_any_is_said_to_run_on_the_cpu(
    tmp_path, monkeypatch, caplog, gpus, warned
):
    """As the train component says it (was: the pytorchjob component's `gpus_per_node` ignored
    locally in silence). The job itself is not run here: what reaches `run_job` is."""
    import logging

    import torch
    from kfp.dsl import Model

    from components.pytorchjob import pytorchjob

    if torch.cuda.is_available():
        pytest.skip("says what a machine without a GPU does")
    ran = []

    def run_job(backend, spec):  # as a job whose rank 0 writes its output
        ran.append(spec)
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "model.pt").write_bytes(b"weights")

    monkeypatch.setattr("trainer.launch.backend.run_job", run_job)
    model = Model(name="model", uri=str(tmp_path / "model"))
    with caplog.at_level(logging.WARNING, logger="kftrain"):
        pytorchjob.python_func(
            image="user/img:1", command=["python", "train.py"], model=model, launcher="local", gpus_per_node=gpus
        )
    said = [r.getMessage() for r in caplog.records if "gpus_per_node" in r.getMessage()]
    assert said == (
        [
            "gpus_per_node 1: the local launcher's replicas are processes on this machine, which has "
            "no GPU: they train on the CPU"
        ]
        if warned
        else []
    )
    assert [spec.kubernetes.gpus_per_node for spec in ran] == [gpus]


@pytest.mark.parametrize(
    ("value", "text"),
    # As KFP hands a UI's JSON over (every number a float), and as a pipeline's Python writes it.
    [(True, "true"), (False, "false"), (5, "5"), (1.0, "1"), (2.5, "2.5"), ("x", "x"), ({"a": 1.0}, {"a": 1})],
)
def test_a_json_scalar_where_text_goes_is_its_json_text(value, text):
    """Was `str(v)`: `true` reached the pods as `True` (a nodeSelector no node matches)."""
    from components.params import as_text

    assert as_text(value) == text


@pytest.mark.parametrize(
    ("parameter", "value", "message"),
    [
        ("env", {"W": {"a": 1.0}}, "env.W: must be a string, got dict {'a': 1}"),
        ("node_selector", {"pool": ["a", "b"]}, "node_selector.pool: must be a string, got list ['a', 'b']"),
        ("command", ["python", "train.py", {"epochs": 3.0}], "command[2]: must be a string, got dict {'epochs': 3}"),
        ("command", ["python", ""], "command[1]: must be a non-empty string"),
    ],
)
def test_a_json_object_or_list_where_text_goes_is_refused_naming_it(tmp_path, parameter, value, message):
    """It has no one text (was: Python's repr on the pods)."""
    from kfp.dsl import Model

    from components.pytorchjob import pytorchjob

    given = {"command": ["python", "train.py"], parameter: value}
    with pytest.raises(ConfigError, match=re.escape(message)):
        pytorchjob.python_func(
            image="user/img:1", model=Model(name="model", uri=str(tmp_path / "model")), launcher="local", **given
        )


def test_the_builder_refuses_what_is_no_text_with_the_text_to_write():
    with pytest.raises(
        ConfigError, match=re.escape("env.FLAG: must be a string (unquoted, YAML and JSON read it as a")
    ):
        byo(env={"FLAG": True})


def test_the_component_compiles_to_yaml_that_a_pipeline_loads(tmp_path):
    """What the README shows: load the compiled component, turn caching off, expose the pod."""
    import yaml
    from kfp import compiler, dsl
    from kfp.components import load_component_from_file

    from components.pytorchjob import pytorchjob
    from components.task_options import launcher_task_options

    compiler.Compiler().compile(pytorchjob, str(tmp_path / "pytorchjob.yaml"))
    loaded = load_component_from_file(str(tmp_path / "pytorchjob.yaml"))

    @dsl.pipeline(name="byo")
    def byo_pipeline(data_uri: str = "s3://datasets/digits/v1"):
        data = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset)
        job = loaded(
            image="user/img:1",
            command=["torchrun", "/app/train.py"],
            input_data=data.output,
            tolerations=[TOLERATION],
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
            dag_execution_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER,
        )
        launcher_task_options(job)

    compiler.Compiler().compile(byo_pipeline, str(tmp_path / "p.yaml"))
    docs = list(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    task = docs[0]["root"]["dag"]["tasks"]["pytorchjob"]
    assert task["cachingOptions"] == {}  # KFP writes caching off as an empty mapping
    assert task["inputs"]["parameters"]["task_name"]["runtimeValue"]["constant"] == "{{$.pipeline_task_name}}"
    envs = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-pytorchjob"]["fieldPathAsEnv"]
    assert {e["name"]: e["fieldPath"] for e in envs} == {
        "KFTRAIN_POD_NAME": "metadata.name",
        "KFTRAIN_POD_UID": "metadata.uid",
    }


def test_a_byo_job_names_its_own_time_limit_parameter():
    assert byo_job(name="j", image="i:1", command=["python", "t.py"], output_uri="/tmp/o").timeout_field == (
        "timeout_seconds"
    )


def test_an_unknown_kind_is_refused_naming_the_parameter():
    with pytest.raises(ConfigError, match=r"^kind: must be one of \('pytorchjob', 'trainjob', 'auto'\), got 'podjob'$"):
        byo(kind="podjob")


@pytest.mark.parametrize(
    ("command", "warned"),
    [
        (["python", "train.py"], True),  # was: silent, the job waiting for processes that never start
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], False),
        (["torchrun", "--nproc-per-node=2", "train.py"], False),
        (["sh", "-c", "cd /app && torchrun train.py"], False),
        (["accelerate", "launch", "train.py"], False),
        (["bash", "start.sh"], True),  # said, not refused: the script may start them; the user knows
        # A launcher's name inside an argument is no launcher (was: silenced the warning)
        (["python", "train.py", "--deepspeed", "ds.json"], True),
        (["python", "/app/accelerate_demo/train.py", "--output", "/out/torchrun-logs"], True),
    ],
)
def test_several_processes_per_node_without_torchrun_are_warned_of(caplog, command, warned):
    import logging

    with caplog.at_level(logging.WARNING, logger="kftrain"):
        byo(command=command, nproc_per_node=2)
    said = [r.getMessage() for r in caplog.records if "starts no torchrun" in r.getMessage()]
    assert len(said) == warned
    if warned:
        assert said[0].startswith("nproc_per_node 2, but the command starts no torchrun") and "the 3 others" in said[0]


@pytest.mark.parametrize(
    ("made", "written"),
    [
        ("a file in the folder", True),
        ("the output as one file", True),
        ("nothing", False),
        ("an empty folder", False),
        ("an empty sub-folder", False),
    ],
)
def test_a_job_s_output_counts_as_written_when_a_file_is_there(tmp_path, made, written):
    from trainer.launch.byo import OutputMissing, check_output_written

    out = tmp_path / "model"
    if made == "a file in the folder":
        (out / "sub").mkdir(parents=True)
        (out / "sub" / "model.pt").write_bytes(b"w")
    elif made == "the output as one file":
        out.write_bytes(b"w")
    elif made == "an empty folder":
        out.mkdir()
    elif made == "an empty sub-folder":
        (out / "sub").mkdir(parents=True)
    if written:
        assert check_output_written("job-1", str(out)) == ""
    else:
        with pytest.raises(
            OutputMissing, match=r"job job-1 succeeded, but nothing is at .*model \(KFTRAIN_OUTPUT_URI\)"
        ):
            check_output_written("job-1", str(out))
