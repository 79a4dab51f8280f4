"""Preflight validation of a PyTorchJob manifest, before anything is submitted.

Three kinds of checks, each error naming the field:

1. the PyTorchJob CRD's structural schema (shipped in `schemas/`), made strict: an unknown field
   anywhere is an error (the CRD itself has no `additionalProperties: false`, so the API server
   would silently drop a misspelt field);
2. the Training Operator's admission-webhook rules, which the schema cannot express, and the
   API server's pod rule that every volumeMount names a volume of the pod;
3. each replica's pod template against the core Kubernetes schemas (kubernetes-validate), when
   that package is installed (it is in the project image and the test extra).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from importlib import resources
from typing import Any

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
REPLICA_TYPES = ("Master", "Worker")
KUBERNETES_VERSION = "1.30.0"  # the oldest minor the pod-template check holds the manifest to


class ManifestError(ValueError):
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


@functools.cache
def _validator():
    import jsonschema

    doc = json.loads(resources.files("trainer.launch").joinpath("schemas/pytorchjob.v1.json").read_text())
    schema = _strict(copy.deepcopy(doc["openAPIV3Schema"]))
    schema["properties"].pop("status", None)  # set by the operator, never by us
    return jsonschema.Draft7Validator(schema)


def _path(parts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(manifest)"


def validate_schema(manifest: dict[str, Any]) -> None:
    """Check `manifest` against the strict CRD schema; raise on the first (deepest-path) error."""
    errors = sorted(_validator().iter_errors(manifest), key=lambda e: (-len(e.absolute_path), str(e.absolute_path)))
    if errors:
        e = errors[0]
        raise ManifestError(f"PyTorchJob {_path(e.absolute_path)}: {e.message}")


def validate_webhook_rules(manifest: dict[str, Any]) -> None:
    """The Training Operator v1.9 validating webhook's rules for PyTorchJob."""
    name = manifest.get("metadata", {}).get("name", "")
    if not name or len(name) > 63 or not _DNS_1035.match(name):
        raise ManifestError(
            f"PyTorchJob metadata.name: {name!r} must be a DNS-1035 label (<= 63 lower-case "
            "alphanumerics or '-', starting with a letter)"
        )
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
    validate_volume_references(manifest)
    validate_pod_templates(manifest)
