"""What the API server, the operator and NCCL accept in single fields of a job manifest, as one table.

The CRD schemas say a label is a string and a replica count an integer; the API server says
much more (apimachinery's and core/v1's validation, Kubernetes 1.30): label keys and values,
annotation sizes, namespace and object names, environment variable names, tolerations,
resource quantities. The operator owns the rendezvous environment, and NCCL reads `NCCL_DEBUG`
by a fixed list of names (a misspelt level is silently ignored). A manifest that breaks one of
these is created and then refused, or worse, runs misconfigured.

:data:`RULES` maps a manifest path pattern to a rule; `preflight.validate_fields` walks the manifest
once and applies every rule whose pattern matches a node. A refusal names the config field the
value came from (:data:`SOURCES`), the bad value, what is allowed, and the manifest path:

    kubernetes.labels: key 'team name' is not a label key: ... (PyTorchJob metadata.labels)

Patterns are dotted paths: a literal key, `*` (any key), `**` (any depth), `[*]` (any list item),
`[NAME]` (the list item whose `name` is NAME), `'a.b/c'` (a key holding dots).

The formats themselves (what a namespace, a label or a quantity is, and the words that say so)
are trainer/k8s_formats.py's, which the config checks the same fields with at load.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trainer import k8s_formats as k8s
from trainer.config import NCCL_DEBUG_LEVELS
from trainer.launch.spec import OPERATOR_ENV

# -- the rules: (value, key) -> what is wrong, or None ------------------------------------------
# `key` is the node's last path segment: a mapping key, or a list item's name (else its index).


def _of_value(problem: Callable[[Any], str | None]) -> Callable[[Any, Any], str | None]:
    """The rule that asks `problem` about the value alone."""
    return lambda value, key: problem(value)


def _label(value: Any, key: Any) -> str | None:
    return k8s.label_problem(key, value)


def _annotation_key(value: Any, key: Any) -> str | None:
    return k8s.annotation_key_problem(key)


def _env_var(value: Any, key: Any) -> str | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    name = value["name"]
    if why := k8s.env_name_problem(name):
        return why
    if name in OPERATOR_ENV:
        return (
            f"{name} is set in every replica by the job's operator or by torchrun (docs/cluster.md, the "
            "environment each replica gets); remove it"
        )
    source = value.get("valueFrom")
    if value.get("value") and source is not None:  # an empty value is none (the API server's rule)
        return f"{name} has both `value` and `valueFrom`: Kubernetes takes one; keep one"
    sources = sorted(source) if isinstance(source, dict) else []
    if source is not None and len(sources) != 1:
        return f"{name}: `valueFrom` must have exactly one of {', '.join(_ENV_SOURCES)}, got {sources}"
    if name == "NCCL_DEBUG" and str(value.get("value", "")).upper() not in NCCL_DEBUG_LEVELS:
        return (
            f"NCCL_DEBUG {k8s.show(value.get('value', ''))} is not a level NCCL knows "
            f"({', '.join(NCCL_DEBUG_LEVELS[1:])}); "
            "NCCL would silently log nothing"
        )
    return None


#: Where a variable's `valueFrom` may read it.
_ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
#: The pod fields a variable may read through `fieldRef` (the API server's list).
_FIELD_PATHS = re.compile(
    r"metadata\.(name|namespace|uid|labels\['[^']+'\]|annotations\['[^']+'\])"
    r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs)"
)


def _field_path(value: Any, key: Any) -> str | None:
    if isinstance(value, str) and _FIELD_PATHS.fullmatch(value):
        return None
    return (
        f"{k8s.show(value)} is not a pod field a variable can read: metadata.name, metadata.namespace, "
        "metadata.uid, metadata.labels['KEY'], metadata.annotations['KEY'], spec.nodeName, "
        "spec.serviceAccountName, status.hostIP, status.podIP (or their plural)"
    )


def _selector_requirement(value: Any, key: Any) -> str | None:
    """A `matchExpressions` entry: In/NotIn with values, Exists/DoesNotExist without, Gt/Lt one integer."""
    if not isinstance(value, dict):
        return None
    op, values = value.get("operator"), value.get("values") or []
    if op in ("In", "NotIn") and not values:
        return f"operator {op} needs a non-empty `values` list"
    if op in ("Exists", "DoesNotExist") and values:
        return f"operator {op} takes no `values`, got {k8s.show(values)}"
    if op in ("Gt", "Lt") and not (len(values) == 1 and re.fullmatch(r"[-+]?[0-9]+", str(values[0]))):
        return f"operator {op} needs one integer in `values`, got {k8s.show(values)}"
    return None


def _node_selector_terms(value: Any, key: Any) -> str | None:
    """A required node affinity's terms: the API server refuses the pod without one."""
    if isinstance(value, list) and not value:
        return (
            "must have at least one node selector term (the API server refuses the pod): remove the affinity "
            "or add a term"
        )
    return None


def _object_name(value: Any, key: Any) -> str | None:
    return k8s.object_name_problem(value, f"a valid {key}")


def _quantity(value: Any, key: Any) -> str | None:
    return k8s.quantity_problem(value, key)


def _port(value: Any, key: Any) -> str | None:
    if isinstance(value, int) and 1 <= value <= 65535:
        return None
    return f"{k8s.show(value)} is not a port number (1-65535)"


@dataclass(frozen=True, slots=True)
class Rule:
    """One row: the nodes at `pattern` must pass `check`."""

    pattern: str
    check: Callable[[Any, Any], str | None]


#: The table, applied by :func:`validate_fields` in one walk (both kinds; a pattern that matches
#: nothing in a kind costs nothing).
RULES = (
    Rule("metadata.namespace", _of_value(k8s.namespace_problem)),
    Rule("**.metadata.labels.*", _label),
    Rule("**.metadata.labels.'kueue.x-k8s.io/queue-name'", _of_value(k8s.kueue_queue_problem)),
    Rule("**.metadata.annotations", _of_value(k8s.annotations_size_problem)),
    Rule("**.metadata.annotations.*", _annotation_key),
    Rule("**.nodeSelector.*", _label),
    Rule("**.tolerations[*]", _of_value(k8s.toleration_problem)),
    Rule("**.env[*]", _env_var),
    Rule("**.env[*].valueFrom.fieldRef.fieldPath", _field_path),
    Rule("**.matchExpressions[*]", _selector_requirement),
    Rule("**.nodeSelectorTerms", _node_selector_terms),
    Rule("**.env[*].valueFrom.secretKeyRef.name", _of_value(k8s.secret_name_problem)),
    Rule("**.env[*].valueFrom.secretKeyRef.key", _of_value(k8s.secret_key_problem)),
    Rule("**.imagePullSecrets[*].name", _of_value(k8s.secret_name_problem)),
    Rule("**.volumes[*].secret.secretName", _of_value(k8s.secret_name_problem)),
    Rule("**.serviceAccountName", _object_name),
    Rule("**.priorityClassName", _object_name),
    Rule("spec.runPolicy.schedulingPolicy.priorityClass", _object_name),
    Rule("spec.runPolicy.schedulingPolicy.queue", _of_value(k8s.queue_name_problem)),
    Rule("spec.runtimeRef.name", _of_value(k8s.runtime_name_problem)),
    Rule("**.volumes[*].name", _of_value(k8s.volume_name_problem)),
    Rule("**.resources.*.*", _quantity),
    Rule("spec.trainer.resourcesPerNode.*.*", _quantity),
    Rule("**.emptyDir.sizeLimit", _quantity),
    Rule("**.containers[*].ports[*].containerPort", _port),
    Rule("**.containers[*].image", _of_value(k8s.image_problem)),
    Rule("spec.trainer.image", _of_value(k8s.image_problem)),
)

#: Manifest path pattern -> the config field it is built from (the longest matching prefix of a
#: bad node's path wins; `{}` is the last `*` or `[*]` it matched).
SOURCES = (
    ("metadata.namespace", "kubernetes.namespace"),
    ("**.metadata.labels.'kueue.x-k8s.io/queue-name'", "kubernetes.queue"),
    ("**.metadata.labels", "kubernetes.labels"),
    ("**.metadata.annotations", "kubernetes.annotations"),
    ("**.nodeSelector", "kubernetes.node_selector"),
    ("**.tolerations[*]", "kubernetes.tolerations[{}]"),
    ("**.affinity", "kubernetes.affinity"),
    ("**.imagePullSecrets", "kubernetes.image_pull_secrets"),
    ("**.serviceAccountName", "kubernetes.service_account"),
    ("**.priorityClassName", "kubernetes.priority_class"),
    ("spec.runPolicy.schedulingPolicy.priorityClass", "kubernetes.priority_class"),
    ("**.env[NCCL_DEBUG]", "job.nccl_debug (or kubernetes.env.NCCL_DEBUG)"),
    ("**.env[OMP_NUM_THREADS]", "job.omp_num_threads"),
    ("**.env[TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC]", "job.nccl_heartbeat_timeout_seconds"),
    ("**.env[HF_TOKEN].valueFrom.secretKeyRef.name", "kubernetes.hf_token_secret"),
    ("**.env[HF_TOKEN].valueFrom", "kubernetes.hf_token_secret"),
    ("**.env[*].valueFrom.secretKeyRef.name", "kubernetes.store_secret"),
    ("**.env[*].valueFrom", "kubernetes.store_secret_keys"),
    ("**.env[*]", "kubernetes.env.{}"),
    ("**.volumes[dshm]", "kubernetes.shm_size"),
    ("**.volumes[*]", "kubernetes.volumes ({})"),
    ("**.volumeMounts[*]", "kubernetes.volume_mounts ({})"),
    ("**.resources.*.cpu", "kubernetes.cpu"),
    ("**.resources.*.memory", "kubernetes.memory"),
    ("**.resources.*.'nvidia.com/gpu'", "kubernetes.gpus_per_node"),
    ("spec.trainer.resourcesPerNode.*.cpu", "kubernetes.cpu"),
    ("spec.trainer.resourcesPerNode.*.memory", "kubernetes.memory"),
    ("spec.trainer.resourcesPerNode.*.'nvidia.com/gpu'", "kubernetes.gpus_per_node"),
    ("**.containers[*].image", "job.image"),
    ("spec.trainer.image", "job.image"),
    ("spec.pytorchReplicaSpecs.*.replicas", "job.replicas"),
    ("spec.trainer.numNodes", "job.replicas"),
    ("spec.nprocPerNode", "job.nproc_per_node"),
    ("spec.trainer.numProcPerNode", "job.nproc_per_node"),
    ("**.activeDeadlineSeconds", "kubernetes.active_deadline_seconds (0: job.timeout_seconds)"),
    ("spec.runPolicy.ttlSecondsAfterFinished", "kubernetes.ttl_seconds_after_finished"),
    ("spec.runPolicy.backoffLimit", "kubernetes.backoff_limit"),
    ("spec.runPolicy.schedulingPolicy.minAvailable", "kubernetes.min_available"),
    ("spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds", "kubernetes.schedule_timeout_seconds"),
    ("spec.runPolicy.schedulingPolicy.queue", "kubernetes.scheduling_queue"),
    ("spec.elasticPolicy.minReplicas", "kubernetes.elastic.min_replicas"),
    ("spec.elasticPolicy.maxReplicas", "kubernetes.elastic.max_replicas"),
    ("spec.elasticPolicy.maxRestarts", "kubernetes.elastic.max_restarts"),
    ("spec.runtimeRef.name", "kubernetes.runtime"),
)


# -- paths, patterns and the walk --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    """A list item in a path: its index, and its `name` when it has one (env, containers, volumes)."""

    index: int
    name: str | None = None

    def __str__(self) -> str:
        return f"[{k8s.plain(self.name) if self.name is not None else self.index}]"

    @property
    def label(self) -> Any:
        return self.name if self.name is not None else self.index


def _segments(pattern: str) -> tuple[str, ...]:
    return tuple(s.strip("'") for s in re.findall(r"'[^']*'|\[[^\]]*\]|[^.\[]+", pattern))


_COMPILED: dict[str, tuple[str, ...]] = {}


def _match(pattern: str, path: tuple[Any, ...]) -> list[Any] | None:
    """What the wildcards (`*`, `[*]`) matched if `path` matches `pattern` in full, else None."""
    segs = _COMPILED.get(pattern) or _COMPILED.setdefault(pattern, _segments(pattern))

    def go(i: int, j: int) -> list[Any] | None:
        if i == len(segs):
            return [] if j == len(path) else None
        seg = segs[i]
        if seg == "**":
            return next((m for k in range(j, len(path) + 1) if (m := go(i + 1, k)) is not None), None)
        if j == len(path):
            return None
        part = path[j]
        if seg.startswith("["):
            if not isinstance(part, Item) or (seg != "[*]" and seg[1:-1] != part.name):
                return None
        elif isinstance(part, Item) or (seg != "*" and seg != part):
            return None
        rest = go(i + 1, j + 1)
        if rest is None or seg not in ("*", "[*]"):
            return rest
        return [part.label if isinstance(part, Item) else part, *rest]

    return go(0, 0)


def path_text(path: tuple[Any, ...]) -> str:
    """`spec.trainer.env[NCCL_DEBUG]`: dotted keys, list items by name (else index)."""
    out = ""
    for p in path:
        out += str(p) if isinstance(p, Item) else (f".{k8s.plain(p)}" if out else k8s.plain(p))
    return out or "(manifest)"


def named_path(manifest: Any, parts: Any) -> tuple[Any, ...]:
    """A path of keys and list indexes (as jsonschema reports it) with list items named."""
    out: list[Any] = []
    node = manifest
    for p in parts:
        if isinstance(p, int) and isinstance(node, list):
            item = node[p] if p < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            out.append(Item(p, name if isinstance(name, str) else None))
            node = item
        else:
            out.append(p)
            node = node.get(p) if isinstance(node, dict) else None
    return tuple(out)


def config_field(path: tuple[Any, ...]) -> str | None:
    """The config field a manifest node is built from, or None (kftrain's own settings)."""
    for end in range(len(path), 0, -1):
        for pattern, field in SOURCES:
            captured = _match(pattern, path[:end])
            if captured is not None:
                return field.format(*(k8s.plain(c) for c in captured[-1:]))
    return None


def describe(kind: str, path: tuple[Any, ...], problem: str, node: Any = None) -> str:
    """One line: the config field, the problem, and where in the manifest. A mapping `node` is
    also looked up by its keys first (an env entry with `valueFrom` is a Secret's key, not
    `kubernetes.env`)."""
    deeper = [config_field((*path, k)) for k in node if isinstance(k, str)] if isinstance(node, dict) else []
    field = next((f for f in deeper if f and f != config_field(path)), None) or config_field(path)
    where = f"{kind} {path_text(path)}"
    return f"{field}: {problem} ({where})" if field else f"{where}: {problem}"


def _walk(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            name = v.get("name") if isinstance(v, dict) else None
            yield from _walk(v, (*path, Item(i, name if isinstance(name, str) else None)))


def problem_at(path: tuple[Any, ...], node: Any, rules: tuple[Rule, ...] = RULES) -> str | None:
    """What the table says of `node` at `path`, or None: the schema check asks this first, so that
    a value both refuse is explained in the table's words (not the schema's regular expression)."""
    key = path[-1].label if path and isinstance(path[-1], Item) else (path[-1] if path else None)
    return next((p for r in rules if _match(r.pattern, path) is not None and (p := r.check(node, key))), None)


def field_problems(
    manifest: dict[str, Any], rules: tuple[Rule, ...] = RULES
) -> Iterator[tuple[tuple[Any, ...], Any, str]]:
    """Every (path, node, problem) the table finds, in manifest order."""
    for path, node in _walk(manifest):
        if problem := problem_at(path, node, rules):
            yield path, node, problem
