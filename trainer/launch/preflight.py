"""Preflight validation of a PyTorchJob or TrainJob manifest, before anything is submitted.

Three kinds of checks, each error naming the field:

1. the CRD's structural schema (shipped in `schemas/`), made strict: an unknown field anywhere
   is an error (the CRDs have no `additionalProperties: false`, so the API server would silently
   drop a misspelt field);
2. the admission-webhook rules (Training Operator v1.9 for PyTorchJob; Trainer v2.3.0's TrainJob
   webhook and the CRD's CEL rules for TrainJob), which the JSON schema cannot express, and the
   API server's pod rule that every volumeMount names a volume of the pod;
3. the API server's, the operator's and NCCL's rules for single fields (label keys and values,
   annotation sizes, names, environment, tolerations, quantities, integer ranges): one table
   (`fieldrules.RULES`) applied in one walk, each error naming the config field it came from;
4. for a PyTorchJob, each replica's pod template against the core Kubernetes schemas
   (kubernetes-validate), when that package is installed (it is in the project image and the
   test extra). A TrainJob carries no whole pod template, only the CRD's typed patch fields,
   which check 1 covers.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

from trainer.config import POD_SPEC_FIELDS
from trainer.errors import KftrainError
from trainer.k8s_formats import DNS_1035_LABEL, DNS_SUBDOMAIN
from trainer.launch.fieldrules import config_field, describe, field_problems, named_path, problem_at
from trainer.yaml_scalars import octal_text_problem, unquoted_problem

REPLICA_TYPES = ("Master", "Worker")
KUBERNETES_VERSION = "1.30.0"  # the oldest minor the pod-template check holds the manifest to


class ManifestError(KftrainError, ValueError):
    """The manifest would be rejected or misread by the cluster; the message names the field."""


def _strict(schema: Any) -> Any:
    """A copy of `schema` in which every object with declared properties rejects unknown keys."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


#: The CRDs' integer formats: the API server decodes these fields into Go int32/int64, and a
#: value beyond the range is refused (or, through some clients, wraps around).
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _format_checker():
    import jsonschema

    checker = jsonschema.FormatChecker(formats=())  # only ours: `date-time` stays unchecked, as before
    for fmt, (lo, hi) in INT_RANGES.items():
        checker.checks(fmt)(lambda v, lo=lo, hi=hi: not isinstance(v, int) or isinstance(v, bool) or lo <= v <= hi)
    return checker


@functools.cache
def _validator(schema_file: str = "pytorchjob.v1.json"):
    import jsonschema

    doc = json.loads(resources.files("trainer.launch").joinpath(f"schemas/{schema_file}").read_text())
    schema = _strict(copy.deepcopy(doc["openAPIV3Schema"]))
    schema["properties"].pop("status", None)  # set by the operator, never by us
    return jsonschema.Draft7Validator(schema, format_checker=_format_checker())


@functools.cache
def _env_var_validator():
    """The strict schema of one entry of a container's `env` (an EnvVar), from the PyTorchJob CRD."""
    import jsonschema

    node = _validator().schema["properties"]["spec"]["properties"]["pytorchReplicaSpecs"]["additionalProperties"]
    for key in ("template", "spec", "containers"):
        node = node["properties"][key]
    return jsonschema.Draft7Validator(node["items"]["properties"]["env"]["items"], format_checker=_format_checker())


def env_var_problem(entry: Any) -> tuple[str, str] | None:
    """`(where, why)` the CRD's schema refuses `entry`, one variable in pod-spec form (`where`: the
    path below it, `.valueFrom.configMapKeyRef`), or None. The config asks this of each
    `kubernetes.extra_env` entry: in a built job an entry is one of the container's `env`, which
    `kubernetes.env` and the store Secret's variables fill too, and only the config can name it."""
    errors = sorted(_env_var_validator().iter_errors(entry), key=lambda e: -len(e.absolute_path))
    if not errors:
        return None
    e = errors[0]
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path), e.message


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(manifest)"


_SCHEMA_FILES = {"PyTorchJob": "pytorchjob.v1.json", "TrainJob": "trainjob.v1alpha1.json"}


def validate_schema(manifest: dict[str, Any]) -> None:
    """Check `manifest` against its kind's strict CRD schema; raise on the first (deepest-path) error."""
    kind = manifest.get("kind", "PyTorchJob")
    schema_file = _SCHEMA_FILES.get(kind)
    if schema_file is None:
        raise ManifestError(f"kind: {kind!r} is neither PyTorchJob nor TrainJob")
    validator = _validator(schema_file)
    errors = sorted(validator.iter_errors(manifest), key=lambda e: (-len(e.absolute_path), str(e.absolute_path)))
    if errors:
        e = errors[0]
        path = named_path(manifest, e.absolute_path)
        if problem := problem_at(path, e.instance):  # the field table's words, where it has a rule
            raise ManifestError(describe(kind, path, problem, e.instance))
        if e.validator == "type" and _user_written(path) and (problem := _type_problem(e.instance, e.validator_value)):
            leaf = path[-1] if path and isinstance(path[-1], str) else "the value"
            raise ManifestError(describe(kind, path, f"{leaf} {problem}"))
        if e.validator == "format" and e.validator_value in INT_RANGES:
            lo, hi = INT_RANGES[e.validator_value]
            problem = f"{e.instance} is out of range: the API server takes an {e.validator_value} ({lo}..{hi})"
            raise ManifestError(describe(kind, path, problem))
        raise ManifestError(describe(kind, path, e.message))


def _user_written(path: tuple[Any, ...]) -> bool:
    """Whether the manifest's node at `path` is one a user wrote in pod-spec form, typed by YAML
    alone (every other value kftrain builds from a typed config field)."""
    field = config_field(path) or ""
    return any(field == f or field.startswith((f"{f}[", f"{f} ", f"{f}.")) for f in POD_SPEC_FIELDS)


def _type_problem(value: Any, wanted: str | list[str]) -> str | None:
    """Why `value` is not of the schema's type `wanted`, where YAML's reading of a plain scalar
    explains it (an unquoted `true` for text, `0400` for an octal number), else None."""
    wanted = [wanted] if isinstance(wanted, str) else wanted
    if "string" in wanted:
        return unquoted_problem(value)
    if "integer" in wanted:
        return octal_text_problem(value)
    return None


#: What the API server fills in for a list-map key left out, before it compares the keys.
_KEY_DEFAULTS = {"protocol": "TCP"}


def _list_map_duplicates(node: Any, schema: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every entry of a `x-kubernetes-list-type: map` list in `node` whose keys an earlier entry
    has, as (its path, its keys); the schema says which lists are maps and by which keys."""
    if not isinstance(schema, dict):
        return
    if isinstance(node, dict):
        properties, rest = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, value in node.items():
            yield from _list_map_duplicates(value, properties.get(key, rest), (*path, key))
    elif isinstance(node, list):
        keys = schema.get("x-kubernetes-list-map-keys") if schema.get("x-kubernetes-list-type") == "map" else None
        seen: set[str] = set()
        for i, item in enumerate(node):
            if keys and isinstance(item, dict):
                value = tuple(item.get(k, _KEY_DEFAULTS.get(k)) for k in keys)
                if json.dumps(value, default=str) in seen:
                    yield (*path, i), value if len(value) > 1 else value[0]
                seen.add(json.dumps(value, default=str))
            yield from _list_map_duplicates(item, schema.get("items"), (*path, i))


def validate_list_maps(manifest: dict[str, Any]) -> None:
    """The API server refuses two entries of a keyed list (`env` by name, `volumeMounts` by
    mountPath, `ports` by port and protocol, ...) with the same key: raise naming the first."""
    kind = manifest.get("kind", "PyTorchJob")
    for path, value in _list_map_duplicates(manifest, _validator(_SCHEMA_FILES[kind]).schema):
        problem = f"{value!r} appears more than once in a list the API server keys by it"
        raise ManifestError(describe(kind, named_path(manifest, path), problem))


def validate_fields(manifest: dict[str, Any]) -> None:
    """The field table (`fieldrules.RULES`): raise on the first field the API server, the operator
    or NCCL would refuse or misread, naming the config field it came from."""
    for path, node, problem in field_problems(manifest):
        raise ManifestError(describe(manifest.get("kind", "PyTorchJob"), path, problem, node))


def validate_webhook_rules(manifest: dict[str, Any]) -> None:
    """The Training Operator v1.9 validating webhook's rules for PyTorchJob."""
    name = manifest.get("metadata", {}).get("name", "")
    if not DNS_1035_LABEL.matches(name):
        raise ManifestError(f"PyTorchJob metadata.name: {name!r} must be {DNS_1035_LABEL.rule}")
    spec = manifest.get("spec", {})
    replicas = spec.get("pytorchReplicaSpecs") or {}
    if not replicas:
        raise ManifestError("PyTorchJob spec.pytorchReplicaSpecs: at least one replica type is required")
    for rtype, rspec in replicas.items():
        where = f"PyTorchJob spec.pytorchReplicaSpecs.{rtype}"
        if rtype not in REPLICA_TYPES:
            raise ManifestError(f"{where}: unknown replica type; use {' or '.join(REPLICA_TYPES)}")
        containers = rspec.get("template", {}).get("spec", {}).get("containers") or []
        named = [c for c in containers if c.get("name") == "pytorch"]
        if not named:
            raise ManifestError(f"{where}.template.spec.containers: needs a container named 'pytorch'")
        if not named[0].get("image"):
            raise ManifestError(f"{where}.template.spec.containers[pytorch].image: must not be empty")
        if rtype == "Master" and rspec.get("replicas", 1) != 1:
            raise ManifestError(f"{where}.replicas: must be 1, got {rspec.get('replicas')}")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "Worker" not in replicas:
            raise ManifestError("PyTorchJob spec.elasticPolicy: needs a Worker replica spec")
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            raise ManifestError(
                "PyTorchJob spec.elasticPolicy.nProcPerNode: must not be set together with spec.nprocPerNode"
            )
        lo, hi = elastic.get("minReplicas"), elastic.get("maxReplicas")
        if lo is not None and hi is not None and lo > hi:
            raise ManifestError(f"PyTorchJob spec.elasticPolicy.minReplicas: {lo} exceeds maxReplicas {hi}")


def validate_volume_references(manifest: dict[str, Any]) -> None:
    """Every volumeMount names a volume of its pod, and volume names are unique: the API server's
    pod validation, which neither the CRD schema nor the core JSON schemas express, and which
    would otherwise surface only as pods that never get created."""
    for rtype, rspec in (manifest.get("spec", {}).get("pytorchReplicaSpecs") or {}).items():
        pod = rspec.get("template", {}).get("spec", {})
        where = f"PyTorchJob spec.pytorchReplicaSpecs.{rtype}.template.spec"
        names = [v.get("name") for v in pod.get("volumes") or []]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ManifestError(f"{where}.volumes[{i}].name: {name!r} is used by more than one volume")
        for c in pod.get("containers") or []:
            for j, mount in enumerate(c.get("volumeMounts") or []):
                if mount.get("name") not in names:
                    raise ManifestError(
                        f"{where}.containers[{c.get('name')}].volumeMounts[{j}].name: {mount.get('name')!r} "
                        f"is not a volume of the pod (volumes: {names})"
                    )


def validate_pod_templates(manifest: dict[str, Any]) -> bool:
    """Each replica's pod template against the core Kubernetes schema; False when unavailable."""
    try:
        import kubernetes_validate
    except ImportError:
        return False
    for rtype, rspec in manifest["spec"]["pytorchReplicaSpecs"].items():
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{manifest['metadata']['name']}-{rtype.lower()}"},
            "template": rspec["template"],
        }
        try:
            kubernetes_validate.validate(wrapped, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = _path(["template", *list(e.path)[1:]]) if list(e.path)[:1] == ["template"] else _path(e.path)
            raise ManifestError(f"PyTorchJob spec.pytorchReplicaSpecs.{rtype}.{path}: {e.message}") from None
    return True


def validate_pytorchjob(manifest: dict[str, Any]) -> None:
    """All preflight checks; raise :class:`ManifestError` naming the field on the first failure."""
    validate_webhook_rules(manifest)
    validate_schema(manifest)
    validate_list_maps(manifest)
    validate_fields(manifest)
    validate_volume_references(manifest)
    validate_pod_templates(manifest)


# -- TrainJob (Kubeflow Trainer v2.3.0) ------------------------------------------------------

#: The names the torch plugin injects; its webhook refuses them in `spec.trainer.env`
#: (`constants.TorchRunReservedEnvNames`).
TORCHRUN_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
#: The webhook's protected containers: their environment comes from `trainer`/`initializer` only.
_ENV_PROTECTED_CONTAINERS = ("node", "dataset-initializer", "model-initializer")
_HTTP_PATH = re.compile(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+")
#: The replicated job and container every Trainer v2 torch runtime has (`constants.Node`);
#: kftrain only patches those, and the webhook refuses a patch of one the runtime lacks.
TRAINER_JOB = "node"


def _unique(items: list[dict[str, Any]], key: str, where: str) -> None:
    """A `listType=map` list: the API server refuses two entries with the same key."""
    seen: list[Any] = []
    for i, item in enumerate(items):
        if item.get(key) in seen:
            raise ManifestError(f"{where}[{i}].{key}: {item.get(key)!r} appears more than once")
        seen.append(item.get(key))


def validate_trainjob_rules(manifest: dict[str, Any]) -> None:
    """The TrainJob CRD's CEL rules and Trainer v2.3.0's validating webhook (TrainJob webhook,
    JobSet and Torch plugins) as far as they can be checked without the runtime object: name,
    reserved `PET_*` env, runtime patch manager, patch targets, env in a protected container,
    duplicate list-map keys, and every volumeMount naming a patched volume."""
    name = manifest.get("metadata", {}).get("name", "")
    if not DNS_1035_LABEL.matches(name):
        raise ManifestError(f"TrainJob metadata.name: {name!r} must be {DNS_1035_LABEL.rule}")
    spec = manifest.get("spec") or {}
    if not (spec.get("runtimeRef") or {}).get("name"):
        raise ManifestError("TrainJob spec.runtimeRef.name: must name a (Cluster)TrainingRuntime")
    trainer = spec.get("trainer") or {}
    env = trainer.get("env") or []
    _unique(env, "name", "TrainJob spec.trainer.env")
    for i, entry in enumerate(env):
        if isinstance(entry, dict) and entry.get("name") in TORCHRUN_RESERVED_ENV:
            # Named by the field it came from: kubernetes.env, or a Secret's key (store_secret_keys).
            path = named_path(manifest, ("spec", "trainer", "env", i))
            raise ManifestError(
                describe("TrainJob", path, f"{entry['name']} is set by the torch plugin (reserved); remove it", entry)
            )
    for key in ("numNodes", "numProcPerNode"):
        if isinstance(trainer.get(key), int) and trainer[key] < 1:
            raise ManifestError(f"TrainJob spec.trainer.{key}: must be >= 1, got {trainer[key]}")
    patches = spec.get("runtimePatches") or []
    _unique(patches, "manager", "TrainJob spec.runtimePatches")
    for i, patch in enumerate(patches):
        where = f"TrainJob spec.runtimePatches[{i}]"
        manager = patch.get("manager", "")
        host, _, path = manager.partition("/")
        if not (host and path and DNS_SUBDOMAIN.matches(host) and _HTTP_PATH.fullmatch(path)):
            raise ManifestError(f"{where}.manager: {manager!r} must be a domain-prefixed path (such as 'acme.io/foo')")
        rjobs = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
            "replicatedJobs"
        ) or []
        _unique(rjobs, "name", f"{where}.trainingRuntimeSpec.template.spec.replicatedJobs")
        for j, rjob in enumerate(rjobs):
            rwhere = f"{where}.trainingRuntimeSpec.template.spec.replicatedJobs[{j}]"
            if rjob.get("name") != TRAINER_JOB:
                raise ManifestError(
                    f"{rwhere}.name: {rjob.get('name')!r}: kftrain patches only the trainer job {TRAINER_JOB!r} "
                    "of a torch runtime (the webhook refuses a job the runtime lacks)"
                )
            pod = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            pwhere = f"{rwhere}.template.spec.template.spec"
            volumes = pod.get("volumes") or []
            _unique(volumes, "name", f"{pwhere}.volumes")
            names = [v.get("name") for v in volumes]
            for group in ("initContainers", "containers"):
                _unique(pod.get(group) or [], "name", f"{pwhere}.{group}")
                for k, c in enumerate(pod.get(group) or []):
                    cwhere = f"{pwhere}.{group}[{k}]"
                    if group == "containers" and c.get("name") != TRAINER_JOB:
                        raise ManifestError(
                            f"{cwhere}.name: {c.get('name')!r}: the runtime's trainer container is {TRAINER_JOB!r}"
                        )
                    if c.get("env") and c.get("name") in _ENV_PROTECTED_CONTAINERS:
                        raise ManifestError(
                            f"{cwhere}.env: must not be set for the {c.get('name')!r} container; use spec.trainer.env"
                        )
                    mounts = c.get("volumeMounts") or []
                    _unique(mounts, "name", f"{cwhere}.volumeMounts")
                    for m, mount in enumerate(mounts):
                        if mount.get("name") not in names:
                            raise ManifestError(
                                f"{cwhere}.volumeMounts[{m}].name: {mount.get('name')!r} is not a volume of "
                                f"the patch (volumes: {names})"
                            )


def validate_trainjob(manifest: dict[str, Any]) -> None:
    """All TrainJob preflight checks; raise :class:`ManifestError` naming the field on the first failure."""
    validate_trainjob_rules(manifest)
    validate_schema(manifest)
    validate_list_maps(manifest)
    validate_fields(manifest)
