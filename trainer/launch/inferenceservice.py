"""Validation of KServe InferenceService manifests (the deploy/serving examples) before they
reach a cluster: KServe's v1beta1 CRD structural schema (shipped in `schemas/`, vendored by
scripts/vendor_inferenceservice_schema.py), made strict like the PyTorchJob's, plus the rules
of KServe's webhook that a wrong example would most likely break: the name format, exactly one
model implementation in the predictor, and storageUris (multiple storage URIs, the LoRA example)
not set with a storageUri and downloading under one common parent folder.
"""

from __future__ import annotations

import copy
import functools
import json
import posixpath
import re
from importlib import resources
from typing import Any

from trainer.launch.preflight import ManifestError, _path, _strict

#: KServe's IsvcNameFmt (pkg/apis/serving/v1beta1/inference_service_validation.go).
_ISVC_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
#: The longest name whose predictor revision (`NAME-predictor-00001`, Knative's) is a DNS label:
#: a longer one is accepted by the API server and fails when KServe deploys it (kserve#4807).
ISVC_NAME_MAX = 63 - len("-predictor-00001")
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
    predictor = manifest.get("spec", {}).get("predictor", {})
    given = [f for f in PREDICTOR_IMPLEMENTATIONS if f in predictor]
    if len(given) + bool(predictor.get("containers")) != 1:
        raise ManifestError(
            "InferenceService spec.predictor: exactly one of [" + ", ".join(PREDICTOR_IMPLEMENTATIONS) + ", "
            f"containers] must be specified, got {given or 'none'}"
        )
    _check_storage_uris(predictor, predictor.get(given[0], {}) if given else {})


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
