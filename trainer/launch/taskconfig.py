"""The KFP training task's own pod settings, merged into the replicas' `kubernetes` section.

Where the KFP SDK has `dsl.TaskConfig` (kfp >= 2.15), the training component declares
`task_config_passthroughs` and receives the settings made on its task (`set_cpu_limit`,
`set_accelerator_limit`, `kfp.kubernetes.add_toleration`, `add_node_selector`,
`use_secret_as_env`, `mount_pvc`, ...). What arrives is the driver's `TaskConfig` struct
(kubeflow/pipelines `backend/src/v2/driver/driver.go`, `type TaskConfig`), JSON of Kubernetes
types with camelCase keys: `affinity`, `tolerations`, `nodeSelector`, `env`, `volumes`,
`volumeMounts` (each null when nothing was set) and `resources` (`{"limits": {...}, "requests":
{...}}`, quantities as strings). The driver fills a key only for a field the component passes
through (`getTaskConfigOptions`); `env` also holds KFP's own entries (plugin and proxy variables,
`use_field_path_as_env`).

Precedence: a `kubernetes.*` field set in the config wins over the task's setting of the same
thing, key by key; the task fills in what the config leaves unset. Each task setting the config
overrides is reported, so the launcher can say so. This module never imports kfp.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainer.config import HF_TOKEN, Config, ConfigError
from trainer.errors import KftrainError
from trainer.launch.container_env import OWN_CONTAINER_ENV
from trainer.launch.spec import OPERATOR_ENV, POD_NAME_ENV, POD_UID_ENV, UNBUFFERED_ENV

#: The keys of the driver's TaskConfig JSON.
TASK_CONFIG_KEYS = ("affinity", "tolerations", "nodeSelector", "env", "volumes", "volumeMounts", "resources")
#: Resources kftrain sets on a replica, and the `kubernetes` field each one fills.
RESOURCE_FIELDS = {"cpu": "cpu", "memory": "memory", "nvidia.com/gpu": "gpus_per_node"}
#: Variables the launcher pod has that would be wrong on a replica: they name the launcher pod
#: (owner of the job), or are set on the replicas by kftrain, the operator or torchrun themselves.
_NOT_PASSED = {POD_NAME_ENV, POD_UID_ENV, UNBUFFERED_ENV, *OWN_CONTAINER_ENV, *OPERATOR_ENV}


class TaskConfigError(KftrainError, ValueError):
    """The KFP task's settings cannot be given to the replicas as they are."""


def apply_task_config(cfg: Config, task_config: Mapping[str, Any] | None) -> tuple[Config, list[str]]:
    """`cfg` with the KFP task's settings (the driver's TaskConfig JSON, see the module docstring)
    merged into `cfg.kubernetes`, and one line per task setting that the config overrides.

    Config wins per key: a set `cpu`, `memory` or `gpus_per_node`; a `node_selector` label; the
    whole `affinity`; a volume of the same name (the task's mounts of it are dropped); a mount at
    the same path; a variable of the same name (`kubernetes.env`, `kubernetes.extra_env`, or one kftrain sets
    itself). Tolerations add up. TaskConfigError for a value kftrain cannot express."""
    tc = dict(task_config or {})
    unknown = sorted(set(tc) - set(TASK_CONFIG_KEYS))
    if unknown:
        raise TaskConfigError(
            f"task config: unknown keys {unknown}; expected the KFP driver's TaskConfig keys {list(TASK_CONFIG_KEYS)}"
        )
    kc = cfg.kubernetes
    notes: list[str] = []
    changes: dict[str, Any] = {}

    changes.update(_resources(kc, tc.get("resources") or {}, notes))

    tolerations = list(kc.tolerations)
    tolerations += [t for t in tc.get("tolerations") or [] if t not in tolerations]
    changes["tolerations"] = tolerations

    selector = dict(tc.get("nodeSelector") or {})
    for key, value in kc.node_selector.items():
        if key in selector and selector[key] != value:
            notes.append(f"node selector {key}={selector[key]!r}: kubernetes.node_selector sets {value!r}")
        selector[key] = value
    changes["node_selector"] = selector

    affinity = tc.get("affinity") or {}
    if affinity and kc.affinity and affinity != kc.affinity:
        notes.append("affinity: kubernetes.affinity is set and replaces the task's")
    changes["affinity"] = dict(kc.affinity or affinity)

    changes["volumes"], changes["volume_mounts"] = _volumes(kc, tc, notes)
    changes["extra_env"] = _env(cfg, tc.get("env") or [], notes)

    try:
        merged = dataclasses.replace(cfg, kubernetes=dataclasses.replace(kc, **changes))
    except ConfigError as exc:
        raise TaskConfigError(f"the KFP task's settings given to the replicas: {exc}") from None
    return merged, notes


def _resources(kc: Any, resources: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    """A replica requests what it may use (kftrain sets request = limit): the task's limit, else
    its request, fills an unset `kubernetes.cpu` / `memory` / `gpus_per_node`."""
    limits, requests = dict(resources.get("limits") or {}), dict(resources.get("requests") or {})
    changes: dict[str, Any] = {}
    for name in sorted(set(limits) | set(requests)):
        if name not in RESOURCE_FIELDS:
            raise TaskConfigError(
                f"task resources: {name!r} cannot be given to the replicas (kftrain sets only "
                f"{sorted(RESOURCE_FIELDS)}); remove it from the training task, or run with job.kind and a "
                "runtime that provide it"
            )
        value = str(limits.get(name) or requests.get(name))
        field = RESOURCE_FIELDS[name]
        current = getattr(kc, field)
        if field == "gpus_per_node":
            if not value.isdigit():
                raise TaskConfigError(f"task resources: {name} {value!r} must be a whole number of GPUs")
            task_value: Any = int(value)
        else:
            task_value = value
        if current:
            if current != task_value:
                notes.append(f"resources {name}={value}: kubernetes.{field} sets {current}")
            continue
        changes[field] = task_value
    return changes


def _volumes(kc: Any, tc: Mapping[str, Any], notes: list[str]) -> tuple[list[Any], list[Any]]:
    volumes = list(kc.volumes)
    names = {v.get("name") for v in volumes}
    replaced = set()  # the task's volumes a config volume of the same name stands in for
    for vol in tc.get("volumes") or []:
        if vol.get("name") in names:
            if vol not in volumes:
                notes.append(f"volume {vol.get('name')!r}: kubernetes.volumes has one of that name")
                replaced.add(vol.get("name"))
            continue
        volumes.append(dict(vol))
        names.add(vol.get("name"))
    mounts = list(kc.volume_mounts)
    taken = {(m.get("name"), m.get("mountPath")) for m in mounts}
    paths = {m.get("mountPath") for m in mounts}
    for mount in tc.get("volumeMounts") or []:
        if (mount.get("name"), mount.get("mountPath")) in taken or mount.get("name") in replaced:
            continue
        if mount.get("mountPath") in paths:
            notes.append(f"volume mount at {mount.get('mountPath')!r}: kubernetes.volume_mounts mounts another there")
            continue
        mounts.append(dict(mount))
        paths.add(mount.get("mountPath"))
    return volumes, mounts


def _env(cfg: Config, entries: list[Any], notes: list[str]) -> list[Any]:
    from trainer.launch.job import job_env

    kc = cfg.kubernetes
    configured = {n: {"name": n, "value": v} for n, v in kc.env.items()}
    configured.update({e["name"]: e for e in kc.extra_env})
    # The pipeline's own store or token Secret, the launcher's identity, the operator's rendezvous:
    # the replicas already get their own value of these, so the task's is not passed on.
    kftrain = (set(job_env(cfg)) - set(kc.env)) | _NOT_PASSED
    if kc.store_secret:
        kftrain |= set(kc.store_secret_keys.values())
    if kc.hf_token_secret:
        kftrain.add(HF_TOKEN)
    extra = list(kc.extra_env)
    seen = set(configured) | kftrain
    for entry in entries:
        name = entry.get("name")
        if name in configured and entry != configured[name]:
            notes.append(f"variable {name}: the config sets it (kubernetes.env or kubernetes.extra_env)")
        if not name or name in seen:
            continue
        seen.add(name)
        extra.append(dict(entry))
    return extra
