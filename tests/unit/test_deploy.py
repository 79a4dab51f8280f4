"""The deploy kit: valid Kubernetes objects, and the RBAC the launcher's API calls need.

No kustomize binary or cluster here: the test resolves the kustomizations' `resources` itself
and validates every object against the core Kubernetes schemas.
"""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def build(overlay: Path) -> list[dict]:
    kust = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    objects = []
    for res in kust["resources"]:
        path = (overlay / res).resolve()
        if path.is_dir():
            objects += build(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for obj in objects:
        if "namespace" in kust:
            obj.setdefault("metadata", {})["namespace"] = kust["namespace"]
    return objects


@pytest.mark.parametrize(("overlay", "account"), [("standalone", "pipeline-runner"), ("multi-user", "default-editor")])
def test_rbac_overlays(overlay, account):
    objects = build(DEPLOY / "rbac" / overlay)
    for obj in objects:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Role"}
    bindings = {o["roleRef"]["name"]: o for o in objects if o["kind"] == "RoleBinding"}
    assert set(roles) == set(bindings) == {"kftrain-launcher", "kftrain-trainer"}
    role = roles["kftrain-launcher"]
    assert bindings["kftrain-launcher"]["subjects"][0]["name"] == account
    granted = {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    # Exactly the calls KubernetesBackend makes.
    for verb in ("create", "get", "list", "watch", "delete", "patch"):
        assert ("kubeflow.org", "pytorchjobs", verb) in granted
        assert ("trainer.kubeflow.org", "trainjobs", verb) in granted
    for resource in ("pods", "pods/log", "events"):
        for verb in ("get", "list", "watch"):
            assert ("", resource, verb) in granted


@pytest.mark.parametrize("overlay", ["standalone", "multi-user"])
def test_training_pods_may_annotate_their_pytorchjob_and_nothing_more(overlay):
    """Rank 0 merge-patches its PyTorchJob's progress annotation (trainer/job_status.py) as the
    namespace's `default` service account; a TrainJob's pods need no grant (the controller's
    status server authenticates their projected token)."""
    objects = build(DEPLOY / "rbac" / overlay)
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "kftrain-trainer"]
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and o["roleRef"]["name"] == "kftrain-trainer"]
    assert role["rules"] == [{"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get", "patch"]}]
    assert binding["subjects"][0]["name"] == "default"


def test_secret_template_holds_placeholders_only():
    (secret,) = yaml.safe_load_all((DEPLOY / "secret" / "storage-credentials.yaml").read_text())
    kubernetes_validate.validate(secret, "1.30.0", strict=True)
    assert set(secret["stringData"]) == {"accesskey", "secretkey"}
    assert all(v.startswith("REPLACE_WITH_") for v in secret["stringData"].values())


def test_inferenceservice_points_at_the_exported_model_repository():
    from trainer.export import ONNX, REPOSITORY, SERVING_NAME

    (isvc,) = yaml.safe_load_all((DEPLOY / "serving" / "inferenceservice.yaml").read_text())
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "onnx" and model["runtime"] == "kserve-tritonserver"
    assert model["storageUri"].endswith(f"/exported/{REPOSITORY}")
    assert f"{REPOSITORY}/{SERVING_NAME}/1/model.onnx" == ONNX  # Triton's <model>/<version>/model.onnx
