"""Regenerate trainer/launch/schemas/pytorchjob.v1.json from the PyTorchJob CRD.

    python scripts/vendor_crd_schema.py PATH/TO/kubeflow.org_pytorchjobs.v1.9.4.yaml

Takes the CRD's structural schema (openAPIV3Schema of version v1), drops every `description`
(most of the file's size; nothing validates on it) and writes compact, key-sorted JSON that ships
inside the package, so preflight validation works in a user's clone and in the image. The
source CRD is kubeflow/trainer v1.9.4 (Apache-2.0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "trainer" / "launch" / "schemas" / "pytorchjob.v1.json"


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def main(src: str) -> None:
    crd = yaml.safe_load(Path(src).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strip_descriptions(version["schema"]["openAPIV3Schema"])
    doc = {
        "source": f"{crd['metadata']['name']} CRD, kubeflow/trainer v1.9.4 (Apache-2.0), descriptions removed",
        "group": crd["spec"]["group"],
        "version": "v1",
        "kind": crd["spec"]["names"]["kind"],
        "openAPIV3Schema": schema,
    }
    OUT.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv[1])
