"""Regenerate trainer/launch/schemas/inferenceservice.v1beta1.json from KServe's CRD.

    git -C KSERVE show v0.20.0:config/crd/full/serving.kserve.io_inferenceservices.yaml > isvc.yaml
    python scripts/vendor_inferenceservice_schema.py isvc.yaml v0.20.0

Takes the structural schema (openAPIV3Schema of v1beta1), drops every `description` text, and,
because the CRD repeats the whole pod and container schemas for the predictor, transformer,
explainer and worker specs, moves each large repeated subtree into `definitions` once and
points at it with `$ref` (about 640 KB becomes a fraction of that). The source is
kserve/kserve (Apache-2.0).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "trainer" / "launch" / "schemas" / "inferenceservice.v1beta1.json"
#: Subtrees whose compact JSON is shorter than this stay inline (a $ref would not pay).
MIN_SHARED = 400


def strip_descriptions(node):
    if isinstance(node, dict):
        # Only description *texts*: a property that happens to be called "description" stays.
        return {k: strip_descriptions(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def canonical(node) -> str:
    return json.dumps(node, sort_keys=True, separators=(",", ":"))


def count_subtrees(node, counts: Counter) -> None:
    if isinstance(node, dict):
        counts[canonical(node)] += 1
        for v in node.values():
            count_subtrees(v, counts)
    elif isinstance(node, list):
        for v in node:
            count_subtrees(v, counts)


def share(node, counts: Counter, definitions: dict, under_properties: bool = False):
    """`node` with every large subtree that occurs more than once replaced by a $ref."""
    if isinstance(node, list):
        return [share(v, counts, definitions) for v in node]
    if not isinstance(node, dict):
        return node
    key = canonical(node)
    # A `properties` map is not a schema: it must stay a map of names to schemas.
    if not under_properties and counts[key] > 1 and len(key) >= MIN_SHARED:
        name = hashlib.sha256(key.encode()).hexdigest()[:12]
        if name not in definitions:
            definitions[name] = None  # reserve first: a subtree never contains itself
            definitions[name] = {k: share(v, counts, definitions, k == "properties") for k, v in node.items()}
        return {"$ref": f"#/definitions/{name}"}
    return {k: share(v, counts, definitions, k == "properties") for k, v in node.items()}


def main(src: str, version: str) -> None:
    crd = yaml.safe_load(Path(src).read_text())
    (v1beta1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    schema = strip_descriptions(v1beta1["schema"]["openAPIV3Schema"])
    counts: Counter = Counter()
    count_subtrees(schema, counts)
    definitions: dict = {}
    top = {k: share(v, counts, definitions, k == "properties") for k, v in schema.items()}
    doc = {
        "source": f"{crd['metadata']['name']} CRD, kserve/kserve {version} (Apache-2.0), "
        "descriptions removed, repeated subtrees moved to definitions",
        "group": crd["spec"]["group"],
        "version": "v1beta1",
        "kind": crd["spec"]["names"]["kind"],
        "openAPIV3Schema": {**top, "definitions": definitions},
    }
    OUT.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB, {len(definitions)} shared definitions)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
