"""Validation of KServe InferenceService manifests (the deploy/serving examples) before they
reach a cluster: KServe's v1beta1 CRD structural schema (shipped in `schemas/`, vendored by
scripts/vendor_inferenceservice_schema.py), made strict like the PyTorchJob's, plus the rules
of KServe's webhook that a wrong example would most likely break: the name format, exactly one
model implementation in the predictor, a storage URI of a scheme KServe downloads, replica bounds,
and storageUris (multiple storage URIs, the LoRA example) not set with a storageUri and
downloading under one common parent folder; and the API server's rules for single fields (names,
labels, annotations, quantities: trainer/launch/fieldrules.py, as for a training job) and a
container's requests against its limits, which a wrong variant would break with no word until
its pods never start.
"""

from __future__ import annotations

import copy
import functools
import json
import posixpath
import re
from importlib import resources
from typing import Any

from trainer import k8s_formats as k8s
from trainer.launch.fieldrules import field_problems, path_text
from trainer.launch.preflight import ManifestError, _path, _strict

#: KServe's IsvcNameFmt (pkg/apis/serving/v1beta1/inference_service_validation.go).
_ISVC_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
#: The longest name whose predictor revision (`NAME-predictor-00001`, Knative's) is a DNS label:
#: a longer one is accepted by the API server and fails when KServe deploys it (kserve#4807).
ISVC_NAME_MAX = 63 - len("-predictor-00001")
#: The storage URI schemes KServe's storage initializer downloads (its webhook refuses others).
STORAGE_SCHEMES = (
    "gs://",
    "s3://",
    "pvc://",
    "file://",
    "https://",
    "http://",
    "hdfs://",
    "webhdfs://",
    "oci://",
    "hf://",
)
#: Predictor fields that each name one way to run the model (the "1-of" fields of PredictorSpec).
PREDICTOR_IMPLEMENTATIONS = (
    "model",
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "huggingface",
    "pmml",
    "lightgbm",
    "paddle",
)


@functools.cache
def _validator():
    import jsonschema

    text = resources.files("trainer.launch").joinpath("schemas/inferenceservice.v1beta1.json").read_text()
    schema = _strict(copy.deepcopy(json.loads(text)["openAPIV3Schema"]))
    schema["properties"].pop("status", None)  # written by the KServe controller
    return jsonschema.Draft7Validator(schema)


def validate_inferenceservice(manifest: dict[str, Any]) -> None:
    """Raise ManifestError naming the field if KServe would reject or silently drop part of `manifest`."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"InferenceService: must be a mapping (a YAML document), got a {type(manifest).__name__}")
    if (manifest.get("apiVersion"), manifest.get("kind")) != ("serving.kserve.io/v1beta1", "InferenceService"):
        raise ManifestError("InferenceService: apiVersion/kind must be serving.kserve.io/v1beta1 InferenceService")
    metadata = manifest.get("metadata")
    if not isinstance(metadata, dict):
        raise ManifestError("InferenceService metadata: must be a mapping with a name")
    name = metadata.get("name", "")
    if not isinstance(name, str) or not _ISVC_NAME.fullmatch(name):
        raise ManifestError(f"InferenceService metadata.name: {name!r} must match {_ISVC_NAME.pattern}")
    if len(name) > ISVC_NAME_MAX:
        raise ManifestError(
            f"InferenceService metadata.name: {name!r} is {len(name)} characters; KServe names the predictor's "
            f"revision NAME-predictor-00001, a DNS label of at most 63: use {ISVC_NAME_MAX} or fewer"
        )
    errors = sorted(_validator().iter_errors(manifest), key=lambda e: (-len(e.absolute_path), str(e.absolute_path)))
    if errors:
        e = errors[0]
        raise ManifestError(f"InferenceService {_path(e.absolute_path)}: {e.message}")
    for path, _, problem in field_problems(manifest):  # the first, as the schema's
        raise ManifestError(f"InferenceService {path_text(path)}: {problem}")
    for path, node in _nodes(manifest):
        problem = _kserve_problem(path[-1] if path else None, node)
        if problem:
            raise ManifestError(f"InferenceService {path_text(path)}: {problem}")
    predictor = manifest.get("spec", {}).get("predictor", {})
    given = [f for f in PREDICTOR_IMPLEMENTATIONS if f in predictor]
    if len(given) + bool(predictor.get("containers")) != 1:
        raise ManifestError(
            "InferenceService spec.predictor: exactly one of [" + ", ".join(PREDICTOR_IMPLEMENTATIONS) + ", "
            f"containers] must be specified, got {given or 'none'}"
        )
    _check_storage_uris(predictor, predictor.get(given[0], {}) if given else {})


def _nodes(node: Any, path: tuple[Any, ...] = ()) -> Any:
    """Every (path, node) of a manifest, depth first."""
    yield path, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from _nodes(value, (*path, key))


def _kserve_problem(key: Any, node: Any) -> str | None:
    """What KServe's webhook or the API server refuses of one node, by its key: a storage URI of
    another scheme, an annotation's value that is not text, a negative replica bound or a lower
    one above the upper, a container's requests past its limits (an extended resource such as a
    GPU must be limited, and requested as much as limited)."""
    if key in ("storageUri", "uri") and isinstance(node, str) and not node.startswith(STORAGE_SCHEMES):
        return f"{k8s.show(node)} is no storage URI KServe downloads (one of {', '.join(STORAGE_SCHEMES)})"
    if key == "annotations" and isinstance(node, dict):
        odd = next((k for k, v in node.items() if not isinstance(v, str)), None)
        if odd is not None:
            return f"the value of {k8s.show(odd)} is {k8s.show(node[odd])}; an annotation's value is text (quote it)"
    if key in ("minReplicas", "maxReplicas") and isinstance(node, int) and node < 0:
        return f"{node} is negative; KServe's bounds are 0 or more"
    if isinstance(node, dict) and all(isinstance(node.get(k), int) for k in ("minReplicas", "maxReplicas")):
        low, high = node["minReplicas"], node["maxReplicas"]
        if 0 < high < low:  # a maxReplicas of 0 sets no bound (KServe's webhook)
            return (
                f"minReplicas {low} is above maxReplicas {high}; KServe refuses it: raise maxReplicas, or lower "
                "minReplicas"
            )
    if key == "resources" and isinstance(node, dict):
        requests, limits = node.get("requests") or {}, node.get("limits") or {}
        for name, asked in requests.items() if isinstance(requests, dict) and isinstance(limits, dict) else ():
            limit = limits.get(name)
            if "/" in str(name) and limit is None:
                return f"requests {name} {asked} without a limit; an extended resource is limited, as much as asked"
            if limit is None or not isinstance(asked, str | int | float) or not isinstance(limit, str | int | float):
                continue
            over = k8s.quantity_value(str(asked)) > k8s.quantity_value(str(limit))
            if over or ("/" in str(name) and k8s.quantity_value(str(asked)) != k8s.quantity_value(str(limit))):
                return f"requests {name} {asked} against a limit of {limit}; ask at most the limit (a GPU: as much)"
    return None


def _check_storage_uris(predictor: dict[str, Any], implementation: dict[str, Any]) -> None:
    """KServe's webhook rules for `storageUris` (validateMultipleStorageURIs): not together with
    the implementation's storageUri, absolute paths without `..`, and one common parent folder
    other than / for the non-PVC ones."""
    uris = predictor.get("storageUris")
    if uris is None:
        return
    if "storageUri" in implementation:
        raise ManifestError(
            "InferenceService spec.predictor: storageUris and a storageUri are both set; KServe accepts one of "
            "them (move the storageUri into storageUris)"
        )
    # The CRD's default mountPath.
    paths = [u.get("mountPath", "/mnt/models") for u in uris if not u["uri"].startswith("pvc://")]
    for path in paths:
        if path == "/" or ".." in path:
            raise ManifestError(f"InferenceService spec.predictor.storageUris mountPath {path!r}: not / and no '..'")
    if len(paths) > 1 and posixpath.commonpath(paths) == "/":
        raise ManifestError(
            f"InferenceService spec.predictor.storageUris: the mountPaths {paths} must share a parent folder other "
            "than / (e.g. /mnt/models/base and /mnt/models/adapter)"
        )
