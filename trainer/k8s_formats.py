"""The API server's formats for names and values (k8s.io/apimachinery/pkg/util/validation and
core/v1's validation, Kubernetes 1.30), each written once, with the words a refusal states.

The config (trainer/config.py) refuses a bad value at load, naming its field; the preflight's
field table (trainer/launch/fieldrules.py) refuses the same value in a built manifest. Both ask
this module, so the two cannot disagree on what a namespace, a label or a quantity is. A leaf:
it imports nothing of kftrain (the config imports it, and fieldrules imports the config).

Each `*_problem` function returns None for a value the API server takes, else one line saying
what the value is not and what is allowed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trainer.credentials import looks_like_credential, masked_parts
from trainer.yaml_scalars import unquoted_problem


def show(value: Any, limit: int = 60) -> str:
    """`repr(value)`, shortened: an error line must stay a line even for a 5 MB annotation; a value
    that looks like a credential (:func:`trainer.credentials.looks_like_credential`) is `'***'`."""
    if looks_like_credential(value):
        return "'***' (it looks like a credential)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value))} characters)"


def plain(segment: Any) -> str:
    """A key as written in a field path, unless that would break the line or run on (then quoted,
    cut) or it looks like a credential (then `***`: a token pasted as a key)."""
    if looks_like_credential(segment):
        return "***"
    text = masked_parts(str(segment))
    return text if text.isprintable() and len(text) <= 60 else show(text)


@dataclass(frozen=True, slots=True)
class NameForm:
    """A name format of the API server: the text it takes (`pattern`, at most `limit` characters)
    and how a refusal states it (`rule`)."""

    pattern: re.Pattern[str]
    limit: int
    rule: str

    def matches(self, value: Any) -> bool:
        """`value` is text of at most `limit` characters matching `pattern`."""
        return isinstance(value, str) and len(value) <= self.limit and bool(self.pattern.fullmatch(value))

    def problem(self, value: Any, what: str) -> str | None:
        """None when `value` matches, else why it is not `what`."""
        return None if self.matches(value) else f"{show(value)} is not {what}: {self.rule}"


#: A namespace, a volume's name (IsDNS1123Label).
DNS_LABEL = NameForm(
    re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"),
    63,
    "a DNS-1123 label, <= 63 lower-case letters, digits and '-', starting and ending alphanumeric",
)
#: The name of a PyTorchJob or a TrainJob (its operator's webhook: the name becomes a Service's, IsDNS1035Label).
DNS_1035_LABEL = NameForm(
    re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?"),
    63,
    "a DNS-1035 label, <= 63 lower-case letters, digits and '-', starting with a letter and ending alphanumeric",
)
#: Most object names: a Secret, a ServiceAccount, a PriorityClass, a custom resource (IsDNS1123Subdomain).
DNS_SUBDOMAIN = NameForm(
    re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"),
    253,
    "a DNS-1123 subdomain, <= 253 lower-case letters, digits, '-' and '.', starting and ending alphanumeric",
)
#: The name part of a qualified name (a label or annotation key, after an optional `prefix/`).
QUALIFIED_NAME = NameForm(
    re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"),
    63,
    "<= 63 letters, digits, '-', '_' and '.' starting and ending alphanumeric",
)
LABEL_VALUE = NameForm(
    re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"),
    63,
    "<= 63 letters, digits, '-', '_' and '.', starting and ending alphanumeric, or empty",
)
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
#: resource.Quantity: a signed decimal number, then a binary (Ki..Ei) or decimal (n, u, m, k..E)
#: suffix or an exponent (`1e3`; `1E` alone is exa).
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")
_QUANTITY_SCALE = {
    **{"": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18},
    **{"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60},
}
MAX_ANNOTATIONS_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB: keys and values together
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def namespace_problem(value: Any) -> str | None:
    """Why `value` is not a namespace's name, or None."""
    return DNS_LABEL.problem(value, "a namespace")


def secret_name_problem(value: Any) -> str | None:
    """Why `value` cannot name a Secret, or None."""
    return DNS_SUBDOMAIN.problem(value, "a Secret's name")


def object_name_problem(value: Any, what: str) -> str | None:
    """Why `value` cannot be `what`, the name of an object (a ServiceAccount, a PriorityClass, a
    custom resource such as a ClusterTrainingRuntime or a Volcano Queue), or None."""
    return DNS_SUBDOMAIN.problem(value, what)


def runtime_name_problem(value: Any) -> str | None:
    """Why `value` cannot name a ClusterTrainingRuntime (a TrainJob's `runtimeRef`), or None."""
    return DNS_SUBDOMAIN.problem(value, "a ClusterTrainingRuntime's name")


def queue_name_problem(value: Any) -> str | None:
    """Why `value` cannot name a gang scheduler's queue (a Volcano Queue object), or None."""
    return DNS_SUBDOMAIN.problem(value, "a scheduler queue's name")


def kueue_queue_problem(value: Any) -> str | None:
    """Why `value` cannot be Kueue's `queue-name` label: a label value that names a LocalQueue
    (Kueue's job webhook refuses any other), or None."""
    return label_value_problem(value) or DNS_SUBDOMAIN.problem(value, "a Kueue LocalQueue's name")


def volume_name_problem(value: Any) -> str | None:
    """Why `value` is not a pod volume's name, or None."""
    return DNS_LABEL.problem(value, "a volume's name")


#: An image reference as the container runtime parses it (distribution's grammar): an optional
#: registry host (and port), a lower-case path, an optional tag and an optional digest.
_IMAGE_REF = re.compile(
    r"(?:(?:\[[0-9A-Fa-f:]+\]|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)"
    r"(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?"
)


def image_problem(value: Any) -> str | None:
    """Why `value` is not a container image reference (the API server refuses an empty one, the
    kubelet one it cannot parse: InvalidImageName, after the job started), or None."""
    if isinstance(value, str) and _IMAGE_REF.fullmatch(value):
        return None
    return (
        f"{show(value)} is not a container image: [registry[:port]/]path[:tag][@digest], the path in lower case, "
        "no spaces (e.g. ghcr.io/org/kftrain:0.1.0)"
    )


def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a qualified name (a label or annotation key), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and ("/" in prefix or not DNS_SUBDOMAIN.matches(prefix)):
        return f"its prefix {prefix!r} is not a DNS-1123 subdomain (<= 253 lower-case letters, digits, '-', '.')"
    if not QUALIFIED_NAME.matches(name):
        return f"its name {name!r} is not {QUALIFIED_NAME.rule}"
    return None


def label_value_problem(value: Any) -> str | None:
    """Why `value` is not a label value, or None."""
    why = LABEL_VALUE.problem(value, "a label value")
    return why and f"value {why}"


def label_problem(key: Any, value: Any) -> str | None:
    """Why `key: value` is not a label (or a nodeSelector entry), or None."""
    why = qualified_name_problem(key) if isinstance(key, str) else "it is not text"
    if why:
        return f"key {show(key)} is not a label key: {why}; an optional 'prefix/' may lead"
    why = label_value_problem(value)
    return why and f"{key!r}: {why}"


#: Kueue's LocalQueue label, on the job object of either kind (kftrain sets it from `kubernetes.queue`).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: What marks a job kftrain made.
MANAGED_BY_LABEL = {"app.kubernetes.io/managed-by": "kftrain"}
#: Prefixes of the labels the operators put on a job's pods and find them by.
OPERATOR_LABEL_PREFIXES = ("training.kubeflow.org/", "trainer.kubeflow.org/", "jobset.sigs.k8s.io/")


def own_label_problem(key: Any) -> str | None:
    """Why `key` may not be one of the user's labels, which kftrain puts on the job and its pods
    (kftrain or an operator sets it, and the user's value would win on some objects only), or None."""
    if key == KUEUE_QUEUE_LABEL:
        return f"key {key!r} is set from kubernetes.queue, on the job where Kueue reads it; set kubernetes.queue"
    if key in MANAGED_BY_LABEL:
        return f"key {key!r} marks the jobs kftrain made; leave it to kftrain"
    if isinstance(key, str) and key.startswith(OPERATOR_LABEL_PREFIXES):
        return f"key {key!r} is the operator's: it finds the job's pods by these labels; choose another key"
    return None


#: The prefix of the annotations kftrain keeps its own state in on a job (its deadline, its
#: re-creations, rank 0's progress): a user's value would be read back as that state.
OWN_ANNOTATION_PREFIX = "kftrain.io/"


def own_annotation_problem(key: Any) -> str | None:
    """Why `key` may not be one of the user's annotations (kftrain's own), or None."""
    if isinstance(key, str) and key.lower().startswith(OWN_ANNOTATION_PREFIX):
        return f"key {show(key)} is kftrain's own ({OWN_ANNOTATION_PREFIX}*: the job's state); choose another key"
    return None


def annotation_key_problem(key: Any) -> str | None:
    """Why `key` is not an annotation key (a qualified name, its case ignored), or None."""
    why = qualified_name_problem(key.lower()) if isinstance(key, str) else "it is not text"
    return why and f"key {show(key)} is not an annotation key: {why}; an optional 'prefix/' may lead"


def annotations_size_problem(annotations: Any) -> str | None:
    """Why a mapping of annotations is too large for the API server, or None."""
    if not isinstance(annotations, dict):
        return None
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size <= MAX_ANNOTATIONS_BYTES:
        return None
    biggest = max(annotations, key=lambda k: len(str(annotations[k])))
    return (
        f"{size} bytes of keys and values (the largest, {biggest!r}, {len(str(annotations[biggest]))} characters) "
        f"exceed the API server's {MAX_ANNOTATIONS_BYTES} bytes (256 KiB) for all annotations together"
    )


def env_name_problem(name: Any) -> str | None:
    """Why `name` is not an environment variable name the API server takes, or None."""
    if isinstance(name, str) and _ENV_NAME.fullmatch(name) and name != "." and not name.startswith(".."):
        return None
    return (
        f"name {show(name)} is not an environment variable name: letters, digits, '_', '-' and '.', not starting "
        "with a digit (no '=')"
    )


def secret_key_problem(value: Any) -> str | None:
    """Why `value` is not a key of a Secret (or ConfigMap), or None."""
    text = isinstance(value, str) and len(value) <= 253 and bool(_SECRET_KEY.fullmatch(value))
    if text and value != "." and not value.startswith(".."):  # IsConfigMapKey: not `.`, `..`, nor `..` leading
        return None
    return f"{show(value)} is not a Secret key: <= 253 letters, digits, '-', '_' and '.' (not '.' or '..*')"


#: Quantities in bytes: the names of resources and of the fields that hold sizes.
BYTE_RESOURCES = frozenset({"memory", "ephemeral-storage", "storage", "sizeLimit", "shm_size"})
#: The least byte quantity taken (1 MiB): a container, a volume or /dev/shm below it cannot hold
#: a Python process or a file it writes; such a value is a unit left out.
MIN_BYTES = 2**20


def quantity_problem(value: Any, resource: str = "") -> str | None:
    """Why `value` is not a non-negative quantity of `resource` (e.g. `cpu`), or None. An extended
    resource (`nvidia.com/gpu`) cannot be split: its quantity is a whole number."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # a quantity as JSON's number, read by the same rules
    if isinstance(value, str) and _QUANTITY.fullmatch(value) and not value.startswith("-"):
        if resource in BYTE_RESOURCES and value.endswith("m"):  # valid, and never what was meant
            return f"{show(value)} is thousandths of a byte ('m' is milli): write {value[:-1]}Mi or {value[:-1]}M"
        unit = _QUANTITY.fullmatch(value).group(2) or ""
        # Bytes with no unit (or in fractions: 5n) under 1 MiB: valid, and never what was meant.
        tiny = resource in BYTE_RESOURCES and 0 < quantity_value(value) < MIN_BYTES
        if tiny and (unit in ("", "n", "u") or unit[:1] in ("e", "E")):
            meant = f"{value}Mi or {value}Gi" if re.fullmatch(r"[0-9.]+", value) else "512Mi or 8Gi"
            return (
                f"{show(value)} is {quantity_value(value):g} bytes, too little for a process or its files (a "
                f"number without a unit is bytes): write the unit, e.g. {meant}"
            )
        if resource != "nvidia.com/gpu" or value.isdigit():
            return None
        return f"{resource} {show(value)} is not a whole number (extended resources cannot be split)"
    return (
        f"{show(value)} is not a Kubernetes quantity: a non-negative number with an optional suffix "
        "(m, k, M, G, T, Ki, Mi, Gi, Ti, ... or an exponent, e.g. 500m, 8, 64Gi, 1e3)"
    )


def quantity_value(quantity: str) -> float:
    """The number a quantity :func:`quantity_problem` takes stands for (`64Gi`: 64 * 2**30, `1e3`: 1000)."""
    number, suffix = _QUANTITY.fullmatch(quantity).groups()
    suffix = suffix or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return float(number) * 10.0 ** int(suffix[1:])
    return float(number) * _QUANTITY_SCALE[suffix]


def toleration_problem(toleration: Any) -> str | None:
    """Why a pod-spec toleration (`key`, `operator`, `value`, `effect`, `tolerationSeconds`) is
    refused, or None."""
    if not isinstance(toleration, dict):
        return None
    for name in ("key", "operator", "value", "effect"):
        if why := unquoted_problem(toleration.get(name)):
            return f"{name} {why}"
    key, op, value, effect = (toleration.get(k) or "" for k in ("key", "operator", "value", "effect"))
    if key and (why := qualified_name_problem(key) if isinstance(key, str) else "it is not text"):
        return f"key {show(key)} is not a label key: {why}"
    if op not in ("", *TOLERATION_OPERATORS):
        return f"operator {show(op)} is not one of {' or '.join(TOLERATION_OPERATORS)} (empty: Equal)"
    if not key and op != "Exists":
        return "an empty key needs operator Exists (it matches every taint)"
    if op == "Exists" and value:
        return f"value {show(value)} must be empty with operator Exists"
    if op != "Exists" and (why := label_value_problem(value)):
        return why
    if effect not in ("", *TAINT_EFFECTS):
        return f"effect {show(effect)} is not one of {', '.join(TAINT_EFFECTS)} (empty: every effect)"
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        return f"tolerationSeconds needs effect NoExecute, got {show(effect or '')}"
    return None
