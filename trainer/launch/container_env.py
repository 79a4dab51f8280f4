"""The training container's environment in pod-spec form, from every source, each name once.

A PyTorchJob's and a TrainJob's trainer container get the same variables: the spec's plain
environment (kftrain's own settings and `kubernetes.env`), the store keys from `store_secret`,
where rank 0 reports progress, the node's name, the optional Hugging Face token and
`kubernetes.extra_env`. The API server refuses a container that names a variable twice (`env` is
a list keyed by `name`), so a name two sources set is refused here, naming both sources.
"""

from __future__ import annotations

from typing import Any

from trainer.config import HF_TOKEN, ConfigError
from trainer.job_status import JOB_NAMESPACE_ENV, PYTORCHJOB_NAME_ENV, TRAINJOB_NAME_ENV
from trainer.launch.spec import NODE_ENV, JobSpec

#: The variables the container gets from its pod, whichever the job's kind (the job's name, its
#: namespace, the node): a user's variable of the same name is refused.
OWN_CONTAINER_ENV = (PYTORCHJOB_NAME_ENV, TRAINJOB_NAME_ENV, JOB_NAMESPACE_ENV, NODE_ENV)


def literal(text: str) -> str:
    """`text` as a container's `command`, `args` or env `value` must say it for the process to get
    `text` itself: the kubelet expands `$(NAME)` to another variable's value there and reads `$$`
    as `$`, where a local process gets the string as it is (a config's JSON, a prompt with `$`)."""
    return text.replace("$", "$$")


def _secret_ref(secret: str, key: str, optional: bool) -> dict[str, Any]:
    return {"secretKeyRef": {"name": secret, "key": key, "optional": optional}}


def _field_ref(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def container_env(spec: JobSpec, job_name_env: str, job_name_label: str, plain: dict[str, str] | None = None) -> list:
    """The container's `env` list for `spec`: `plain` (the job kind's own additions) joins the
    spec's plain variables; `job_name_env` gets the job's name from the pod label `job_name_label`."""
    kc = spec.kubernetes
    sources: list[tuple[str, dict[str, Any]]] = []
    own = "kftrain's own environment"
    named = [(n, v, f"kubernetes.env.{n}" if n in kc.env else own) for n, v in spec.env.items()]
    named += [(n, v, own) for n, v in (plain or {}).items()]
    # By name, kftrain's own before a user's of the same name: the error then names the user's.
    for name, value, where in sorted(named, key=lambda item: (item[0], item[2] != own)):
        sources.append((where, {"name": name, "value": literal(value)}))
    if kc.store_secret:  # no Secret: the pods get their store access otherwise (workload identity)
        sources += [
            ("kubernetes.store_secret_keys", {"name": var, "valueFrom": _secret_ref(kc.store_secret, key, False)})
            for key, var in sorted(kc.store_secret_keys.items())
        ]
    # Where rank 0 reports progress (trainer/job_status.py) and the node a straggler runs on (trainer/health.py).
    sources += [
        (own, {"name": job_name_env, "valueFrom": _field_ref(f"metadata.labels['{job_name_label}']")}),
        (own, {"name": JOB_NAMESPACE_ENV, "valueFrom": _field_ref("metadata.namespace")}),
        (own, {"name": NODE_ENV, "valueFrom": _field_ref("spec.nodeName")}),
    ]
    if kc.hf_token_secret:  # optional: a public model needs no token, and a pod without it still starts
        sources.append(
            (
                "kubernetes.hf_token_secret",
                {"name": HF_TOKEN, "valueFrom": _secret_ref(kc.hf_token_secret, HF_TOKEN, True)},
            )
        )
    sources += [(f"kubernetes.extra_env[{i}]", dict(e)) for i, e in enumerate(kc.extra_env)]  # pod-spec form
    first: dict[str, str] = {}
    for where, entry in sources:
        if entry["name"] in first:
            raise ConfigError(
                f"{where}: sets {entry['name']}, which {first[entry['name']]} sets too: a container names a "
                "variable once; remove one of them"
            )
        first[entry["name"]] = where
    return [entry for _, entry in sources]
