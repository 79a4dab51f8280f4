"""Bring your own image (BYO): any image and command as a PyTorchJob or a TrainJob, with the launcher's guarantees.

This is what the deleted upstream Kubeflow pytorch-launcher was for, as a pure function: it
turns an image, a command and pod settings into the :class:`JobSpec` every backend runs, so the
job gets kftrain's preflight, deterministic name, re-attach, cancel-on-exit, deadline, Pending
events and replica-prefixed logs without the image importing kftrain.

The replicas' environment contract, on top of what the Training Operator injects
(`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `PET_*`; see :func:`replica_env`), or, with
`kind="trainjob"`, what Kubeflow Trainer v2 injects (only `PET_*`; see :func:`replica_env_v2`:
start the command through torchrun there):

- ``KFTRAIN_OUTPUT_URI``: where rank 0 writes the output artifact (a directory-like prefix);
- ``KFTRAIN_INPUT_URI``: the input artifact, only when one is given;
- ``AWS_ENDPOINT_URL``: the S3 endpoint, only when one is given (boto3, s3fs and the AWS CLI
  read it);
- the store Secret's keys (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` by default), through
  ``secretKeyRef`` on a cluster, never as literal values.

On a cluster the URIs are object-store URIs, given as ``s3://bucket/key``: KFP's
``minio://bucket/key`` is the same bucket and key on the S3 endpoint, and ``s3://`` is the
spelling every S3 library understands. Locally they are plain paths.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.config import (
    JOB_KINDS,
    KFP_STORE_SECRET,
    KFP_STORE_SECRET_KEYS,
    PYTORCHJOB,
    ConfigError,
    KubernetesConfig,
    check_plain_env,
)
from trainer.credentials import credential_in, looks_like_credential
from trainer.errors import KftrainError, redact_url
from trainer.k8s_formats import env_name_problem, image_problem, plain, show
from trainer.launch.container_env import OWN_CONTAINER_ENV
from trainer.launch.jobkind import kinds_it_may_become
from trainer.launch.preflight import ManifestError
from trainer.launch.spec import OPERATOR_ENV, UNBUFFERED_ENV, JobSpec, require_object_store
from trainer.storage import RetryPolicy, StoreError, endpoint_problem, open_store, parse_uri
from trainer.yaml_scalars import unquoted_problem

#: `$(NAME)`, which the kubelet replaces in a container's command and env values by another
#: variable's value (`$$(NAME)`: the text `$(NAME)`).
_K8S_REFERENCE = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")

OUTPUT_URI_ENV = "KFTRAIN_OUTPUT_URI"
INPUT_URI_ENV = "KFTRAIN_INPUT_URI"
ENDPOINT_ENV = "AWS_ENDPOINT_URL"
_SECRET_HINT = "the store_secret and store_secret_keys parameters map a Secret's keys to variables via secretKeyRef"
# Kubernetes' rule for environment variable names (C identifiers plus '-' and '.').


#: What the operator, torchrun and this launcher set: a user value would be shadowed or would shadow them.
RESERVED_ENV = OPERATOR_ENV | {
    UNBUFFERED_ENV,
    OUTPUT_URI_ENV,
    INPUT_URI_ENV,
    ENDPOINT_ENV,
    *OWN_CONTAINER_ENV,
}


def replica_uri(uri: str, what: str, cluster: bool) -> str:
    """The artifact URI as the replicas get it; on a cluster, refuse anything but an object store.

    A local path on a cluster names the launcher pod's own disk, which no replica pod can see: the
    job would write its model where nobody reads it.
    """
    try:
        if cluster:
            require_object_store({what: uri})
        loc = parse_uri(uri)
    except ValueError as exc:
        raise ConfigError(str(exc) if cluster else f"{what}: {exc}") from None
    return f"s3://{loc.bucket}/{loc.key}".rstrip("/") if loc.is_remote else loc.key


class OutputMissing(KftrainError, RuntimeError):
    """The job succeeded and wrote nothing where its output artifact is."""


#: How long the launcher asks the store whether the job wrote its output: a question, not a transfer.
OUTPUT_CHECK = RetryPolicy(budget_s=30.0, connect_timeout_s=5.0, read_timeout_s=15.0)


def check_output_written(job: str, output_uri: str, s3_endpoint: str = "") -> str:
    """Raise :class:`OutputMissing` when nothing is at `output_uri` (an object, or objects under it
    as a folder) after job `job` succeeded: the step would pass on an output the next step cannot
    read (was: found there, as a bare FileNotFoundError). Returns a note when the store could not
    be asked (the launcher may lack the replicas' store keys), else ''."""
    try:
        store = open_store(output_uri, endpoint=s3_endpoint, policy=OUTPUT_CHECK)
        written = store.exists(output_uri) or bool(store.list(output_uri))
    except (StoreError, OSError, ValueError) as exc:
        return f"job {job}'s output at {redact_url(output_uri)} was not checked: this step could not read it ({exc})"
    if not written:
        raise OutputMissing(
            f"job {job} succeeded, but nothing is at {redact_url(output_uri)} ({OUTPUT_URI_ENV}), where rank 0 is "
            "to write the step's `model` output: the next step would find no model there; have the script write "
            f"its output under ${OUTPUT_URI_ENV}"
        )
    return ""


#: Programs (or `python -m` modules) that start a replica's processes: torchrun, and launchers built on it.
_PROCESS_STARTERS = frozenset(
    {"torchrun", "accelerate", "deepspeed", "torch.distributed.run", "torch.distributed.launch"}
)
#: The last words (or last two) of a flag or key that holds a secret whatever its value looks like
#: (`--db-password`, `wandb.api_key`, `--hf-token`); others (`--text-key`, `--pad-token`,
#: `--eos-token-id`) are judged by their value alone.
_SECRET_LAST_WORDS = frozenset({"PASSWORD", "PASSWD", "SECRET", "APIKEY"})
_SECRET_LAST_PAIRS = frozenset(
    {("API", "KEY"), ("ACCESS", "KEY"), ("SECRET", "KEY"), ("PRIVATE", "KEY"), ("HF", "TOKEN"), ("API", "TOKEN"),
     ("AUTH", "TOKEN"), ("ACCESS", "TOKEN")}
)  # fmt: skip
_SETTING = re.compile(r"[-+]*([A-Za-z_][\w.-]*)=(.*)", re.S)


def _words(command: Sequence[str]) -> list[tuple[int, str]]:
    """The command's words, each with the index of its argument: an argument a shell runs
    (`sh -c "python t.py --token ..."`) counts as the words it holds."""
    out = []
    for i, arg in enumerate(command):
        try:
            words = shlex.split(arg) if any(c.isspace() for c in arg) else [arg]
        except ValueError:  # unbalanced quotes: not a shell line after all
            words = arg.split()
        out += [(i, w) for w in words]
    return out


def _secret_name(name: str) -> bool:
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    return bool(words) and (words[-1] in _SECRET_LAST_WORDS or tuple(words[-2:]) in _SECRET_LAST_PAIRS)


def _secret_value(value: str) -> bool:
    """Whether a secret's flag gives a secret: a value that is neither empty, a variable (`$HF_TOKEN`),
    a path nor a switch."""
    return bool(value) and not value.startswith("$") and bool(credential_in("PASSWORD", value))


def _check_command(command: Sequence[str]) -> None:
    """ConfigError naming the argument of `command` that holds a credential, never showing it: a
    token or key by its form anywhere, or the value of a flag or key named for a secret
    (`--password=...`, `--hf-token VALUE`, Hydra's `db.password=...`, `env API_KEY=...`), also
    within a shell's command line. The command is in the pipeline's parameters, its YAML and the
    job object, as `env` is."""
    words = _words(command)
    for n, (i, word) in enumerate(words):
        at = i  # the argument the message names: the value's, for a flag followed by its value
        shell = len(command[i]) != len(word)  # a word of a shell's command line
        where = "a word of it" if shell else "it"
        if setting := _SETTING.fullmatch(word):
            name, value = setting.group(1), setting.group(2)
            found = looks_like_credential(value) or (_secret_name(name.split(".")[-1]) and _secret_value(value))
            where = f"the value of {plain(name)}"
        elif word.startswith("-") and _secret_name(word) and n + 1 < len(words):
            at, value = words[n + 1]
            found = not value.startswith("-") and _secret_value(value)
            where = f"the value of {plain(word)}"
        else:
            found = looks_like_credential(word)
        if found:
            raise ConfigError(
                f"command[{at}]: {where} looks like a credential, and the command is in the pipeline's parameters, "
                "its YAML and the job object, readable by anyone who can list them; have the script read it from a "
                f"Kubernetes Secret ({_SECRET_HINT}, or a mounted `secret` volume)"
            )


def _starts_processes(command: Sequence[str]) -> bool:
    """Whether the command runs a program or `python -m` module that starts a replica's processes."""
    return any(word.rsplit("/", 1)[-1] in _PROCESS_STARTERS for _, word in _words(command))


def _check_env(env: Mapping[str, str], store_env: Sequence[str]) -> None:
    check_plain_env(dict(env), "env", _SECRET_HINT)
    for name in env:
        if why := env_name_problem(name):
            raise ConfigError(f"env.{name}: {why}")
        if name in RESERVED_ENV or name in store_env:
            raise ConfigError(
                f"env.{name}: set by the Training Operator or the launcher (see the replicas' environment "
                "contract); use the matching parameter (s3_endpoint, store_secret_keys, the input/output "
                "artifacts) instead"
            )


def byo_job(
    *,
    name: str,
    image: str,
    command: Sequence[str],
    output_uri: str,
    input_uri: str = "",
    replicas: int = 1,
    nproc_per_node: int = 1,
    gpus_per_node: int = 0,
    env: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] | None = None,
    volumes: Sequence[Mapping[str, Any]] | None = None,
    volume_mounts: Sequence[Mapping[str, Any]] | None = None,
    namespace: str = "",
    queue: str = "",
    timeout_s: int = 3600,
    store_secret: str = KFP_STORE_SECRET,
    store_secret_keys: Mapping[str, str] | None = None,
    s3_endpoint: str = "",
    cluster: bool = False,
    kind: str = PYTORCHJOB,
) -> JobSpec:
    """The job that runs `command` in `image` on `replicas` replicas (1 Master + Workers).

    Args:
        name: The job's name (`job_name(task_identity(...))`: deterministic per task).
        image: The replicas' container image; it need not contain kftrain.
        command: The container command. With `nproc_per_node` > 1 it must be a `torchrun` (`RANK`
            is then a node rank; torchrun reads `PET_*`).
        output_uri: The output artifact's URI; the replicas get it as `KFTRAIN_OUTPUT_URI`.
        input_uri: The input artifact's URI (`KFTRAIN_INPUT_URI`); empty: none.
        replicas: Replicas in total, the Master included.
        nproc_per_node: Processes per replica (sets `PET_NPROC_PER_NODE` and `WORLD_SIZE`).
        gpus_per_node: `nvidia.com/gpu` limit per replica; 0: none.
        env: Extra plain environment; credential-looking names or values are refused.
        node_selector: Pod nodeSelector labels.
        tolerations: Pod tolerations, as in a pod spec.
        volumes: Extra pod volumes, as in a pod spec.
        volume_mounts: Mounts of `volumes` in the training container, as in a pod spec.
        namespace: The job's namespace; empty: the launcher pod's own.
        queue: Kueue LocalQueue (the `kueue.x-k8s.io/queue-name` label); empty: none.
        timeout_s: Wall-clock limit of the job (also its `activeDeadlineSeconds`).
        store_secret: Secret with the object-store keys; empty: no keys (e.g. workload identity).
        store_secret_keys: Key in `store_secret` -> variable it fills; empty: KFP's
            `accesskey`/`secretkey` -> `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`.
        s3_endpoint: S3 endpoint URL (`AWS_ENDPOINT_URL`); empty: not set.
        cluster: The job runs on Kubernetes: the URIs must then be object-store URIs.
        kind: `pytorchjob`, `trainjob` (Kubeflow Trainer v2: the replicas get only `PET_*`, so the
            command must be a torchrun), or `auto` (whichever the cluster serves).

    Raises:
        ConfigError: a value the cluster would reject or misread, naming the parameter.
    """
    command = list(command)
    if not command:
        raise ConfigError("command: must be a non-empty list of strings, got []")
    for where, text in [
        *((f"command[{i}]", c) for i, c in enumerate(command)),
        *((f"env.{plain(k)}", v) for k, v in (env or {}).items()),
        *((f"node_selector.{plain(k)}", v) for k, v in (node_selector or {}).items()),
    ]:
        # A JSON `true` or `8` in a parameter: the pod must get the text the user meant, not Python's.
        if not isinstance(text, str):
            why = unquoted_problem(text) or f"must be a string, got {type(text).__name__} {show(text)}"
            raise ConfigError(f"{where}: {why}")
        if where.startswith("command") and not text:
            raise ConfigError(f"{where}: must be a non-empty string")
        if ref := _K8S_REFERENCE.search(text):
            raise ConfigError(
                f"{where}: $({plain(ref.group(1))}) is Kubernetes' reference to another variable, which a pod "
                "would expand and a local run would not: the job gets the text as written in both; read the variable "
                f'in your script (os.environ), or run the command through a shell: ["sh", "-c", "... '
                f'${plain(ref.group(1))}"]'
            )
    _check_command(command)
    if problem := image_problem(image):
        raise ConfigError(f"image: {problem}")
    if timeout_s <= 0:
        raise ConfigError(f"timeout_seconds: must be > 0, got {timeout_s}")
    if kind not in JOB_KINDS:
        raise ConfigError(f"kind: must be one of {JOB_KINDS}, got {show(kind)}")
    if s3_endpoint and (problem := endpoint_problem(s3_endpoint)):
        raise ConfigError(f"s3_endpoint: {redact_url(s3_endpoint)!r} {problem}")
    keys = dict(store_secret_keys or KFP_STORE_SECRET_KEYS)
    user_env = dict(env or {})
    _check_env(user_env, list(keys.values()) if store_secret else [])

    contract = {OUTPUT_URI_ENV: replica_uri(output_uri, "output URI", cluster)}
    if input_uri:
        contract[INPUT_URI_ENV] = replica_uri(input_uri, "input URI", cluster)
    if s3_endpoint:
        contract[ENDPOINT_ENV] = s3_endpoint
    try:
        kubernetes = KubernetesConfig(
            namespace=namespace,
            gpus_per_node=gpus_per_node,
            node_selector=dict(node_selector or {}),
            tolerations=[dict(t) for t in tolerations or []],
            volumes=[dict(v) for v in volumes or []],
            volume_mounts=[dict(m) for m in volume_mounts or []],
            queue=queue,
            store_secret=store_secret,
            store_secret_keys=keys,
        )
    except ConfigError as exc:
        # The parameters are named without the config section (one spelling per concept).
        raise ConfigError(str(exc).removeprefix("kubernetes.")) from None
    try:
        spec = JobSpec(
            name=name,
            image=image,
            command=tuple(command),
            replicas=replicas,
            nproc_per_node=nproc_per_node,
            env={**user_env, **contract},
            timeout_s=timeout_s,
            timeout_field="timeout_seconds",
            kubernetes=kubernetes,
            kind=kind,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # What the cluster's schema and webhooks would refuse, on the local launcher too: a step
    # tried locally first must fail there, not after the pipeline's earlier steps on a cluster.
    for job_kind in kinds_it_may_become(kind):
        try:
            job_kind.validate(job_kind.build(spec, namespace, None))
        except ManifestError as exc:
            raise ConfigError(str(exc).removeprefix("kubernetes.")) from None
    if nproc_per_node > 1 and not _starts_processes(command):
        # Each replica then runs one process where WORLD_SIZE counts nproc_per_node: the rendezvous
        # waits for processes that never start, until timeout_seconds.
        logging.getLogger("kftrain").warning(
            "nproc_per_node %d, but the command starts no torchrun (python -m torch.distributed.run ...): each "
            "replica runs one process, and the job waits for the %d others of WORLD_SIZE until timeout_seconds; "
            "start the script through torchrun, or set nproc_per_node 1",
            nproc_per_node,
            (nproc_per_node - 1) * replicas,
        )
    return spec
