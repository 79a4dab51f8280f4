"""Regenerate a vendored CRD schema under trainer/launch/schemas/ from the CRD YAML.

    python scripts/vendor_crd_schema.py PATH/TO/kubeflow.org_pytorchjobs.v1.9.4.yaml
    python scripts/vendor_crd_schema.py PATH/TO/trainer.kubeflow.org_trainjobs.v2.3.0.yaml

Takes the CRD's structural schema (openAPIV3Schema of the served version), drops every
`description` (most of the file's size; nothing validates on it) and writes compact, key-sorted
JSON that ships inside the package, so preflight validation works in a user's clone and in the
image. The CEL rules (`x-kubernetes-validations`) stay in the file; preflight implements the ones
that matter by hand. Sources: kubeflow/trainer v1.9.4 (PyTorchJob) and v2.3.0 (TrainJob), Apache-2.0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

SCHEMAS = Path(__file__).resolve().parents[1] / "trainer" / "launch" / "schemas"
#: CRD name -> (version, output file, upstream release).
KNOWN = {
    "pytorchjobs.kubeflow.org": ("v1", "pytorchjob.v1.json", "kubeflow/trainer v1.9.4"),
    "trainjobs.trainer.kubeflow.org": ("v1alpha1", "trainjob.v1alpha1.json", "kubeflow/trainer v2.3.0"),
}


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def main(src: str) -> None:
    crd = yaml.safe_load(Path(src).read_text())
    name = crd["metadata"]["name"]
    if name not in KNOWN:
        sys.exit(f"unknown CRD {name!r}; known: {sorted(KNOWN)}")
    version_name, out_name, release = KNOWN[name]
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == version_name]
    schema = strip_descriptions(version["schema"]["openAPIV3Schema"])
    doc = {
        "source": f"{name} CRD, {release} (Apache-2.0), descriptions removed",
        "group": crd["spec"]["group"],
        "version": version_name,
        "kind": crd["spec"]["names"]["kind"],
        "openAPIV3Schema": schema,
    }
    out = SCHEMAS / out_name
    out.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv[1])
