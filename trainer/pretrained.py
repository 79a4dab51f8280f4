"""Pretrained Hugging Face causal LMs (`model.init_from`): find the folder, check it, build the
model without memory, and fill each rank's parameters from the safetensors files.

The model is built with its parameters on the meta device (its buffers, e.g. the rotary
frequencies, are computed for real: they are small and not always in the files), sharded or
replicated, then given storage and filled. Each parameter is read straight from the store with
a ranged read of exactly the rows this rank holds: FSDP2 shards dimension 0 in equal chunks
and safetensors stores tensors row-major, so a rank's shard is one contiguous byte range. No
process ever holds more than its own shards plus one tensor's rows in flight, and nothing is
copied to local disk first.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import re
import struct
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import KftrainError, first_and_more, has_userinfo, redact_url
from trainer.storage import ObjectNotFound, ObjectStore, StoreError, join_uri, open_store, parse_uri

if TYPE_CHECKING:  # torch is imported where a function needs it: the checks of a folder run without it
    import torch
    from torch import nn

    from trainer.config import Config

log = logging.getLogger("kftrain.pretrained")

HF_SCHEME = "hf://"
CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GENERATION_CONFIG = "generation_config.json"
#: Tokenizer files a Hugging Face folder may carry (copied into the export as they are).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)
#: `model_type` values of the architectures kftrain builds through transformers' Auto classes
#: (decoder layers in a ModuleList, one tokenizer.json, weights that shard along dimension 0).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gpt2")
#: safetensors dtype names -> the names of their torch dtypes.
_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "BF16": "bfloat16",
    "F16": "float16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
#: Weights are read in ranged reads of at most this many bytes (the memory in flight per rank).
READ_PIECE_BYTES = 8 << 20
#: Headers larger than this are not a safetensors file (the format's own limit is 100 MB).
_MAX_HEADER = 100_000_000
_HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
#: A revision: a branch or tag (git's ref-name rules: no space, control character, backslash or
#: `~^:?*[`) or a commit hash; `refs/pr/1` holds a slash.
_HF_REVISION = re.compile(r"[^\s\x00-\x1f\x7f~^:?*\[\\]+")


class PretrainedError(KftrainError, ValueError):
    """The pretrained model cannot be used; the message names the object or field and the fix."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """Where one tensor lies in the folder's safetensors files."""

    uri: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    """Absolute byte offset of the tensor's data in `uri`."""

    @property
    def row_bytes(self) -> int:
        """Bytes of one index of dimension 0 (the whole tensor for a scalar)."""
        import torch

        return math.prod(self.shape[1:]) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A resolved `model.init_from`: the folder's URI, the store that serves it, and its origin."""

    uri: str
    store: ObjectStore
    origin: str
    """What the user wrote (`hf://org/name@rev`, `s3://...`, a path)."""
    revision: str = ""
    """The Hub revision (commit) of an `hf://` model; empty otherwise."""


def tokenizer_record(source: ModelSource, vocab_size: int) -> dict[str, Any]:
    """The dataset manifest's record of the model it was tokenized with: what the user wrote and,
    for a Hub model, the commit, which training then reads too (:func:`source_for`'s `pinned`)."""
    record = {"kind": "pretrained", "vocab_size": vocab_size, "model": source.origin}
    if source.revision:
        record["revision"] = source.revision
    return record


def parse_hf_uri(uri: str) -> tuple[str, str]:
    """`hf://org/name[@revision]` -> (repo id, revision or "")."""
    if has_userinfo(uri):
        raise PretrainedError(
            f"model.init_from {redact_url(uri)!r}: what stands before '@' must be the model's <org>/<name> (a token "
            "there is never used, and would be printed): write hf://<org>/<name>[@<revision>] and give the token "
            "as $HF_TOKEN (on a cluster, kubernetes.hf_token_secret)"
        )
    rest = uri.removeprefix(HF_SCHEME)
    repo, _, revision = rest.partition("@")
    repo = repo.strip("/")
    if not _HF_REPO.fullmatch(repo) or (_ and not _HF_REVISION.fullmatch(revision)):
        raise PretrainedError(
            f"model.init_from {uri!r}: a Hub model is hf://<org>/<name> or hf://<org>/<name>@<revision> (a branch, "
            "tag or commit: no spaces)"
        )
    return repo, revision


def source_for(cfg: Config, weights: bool = True, pinned: str = "") -> ModelSource:
    """The folder `model.init_from` names, through the configured store. `weights`: False where
    a step reads only the config and tokenizer (a Hub model's weights are not downloaded).
    `pinned`: the Hub commit an earlier step used (the dataset's tokenizer record), for an
    `hf://` model given without `@revision`, so that every step and every restart of the job
    reads the same commit however the repository moves meanwhile."""
    s = cfg.store
    init_from = cfg.model.init_from
    if pinned and init_from.startswith(HF_SCHEME) and "@" not in init_from:
        init_from = f"{init_from}@{pinned}"
    return resolve(init_from, s.endpoint, s.region, s.policy(), weights=weights)


#: What a Hub model's download holds: config, tokenizer and chat-template files, and the weights.
_HUB_FILES = ["*.json", "*.jinja", "*.txt", "*.model"]
_HUB_WEIGHTS = ["*.safetensors"]


#: The store settings (`cfg.store`) through which a saved model's base folder is read again: see `bases_through`.
_BASES_STORE: ContextVar[Any] = ContextVar("kftrain_bases_store", default=None)


@contextmanager
def bases_through(store: Any) -> Iterator[None]:
    """Within the block, read a saved model's base folder (`resolve_saved_base`: evaluation, the
    report's generations, export) through the store settings `store` (`cfg.store`: endpoint,
    region, retry budget), as data prep and training read it. Without it, the environment's
    (`AWS_ENDPOINT_URL`, else AWS S3)."""
    token = _BASES_STORE.set(store)
    try:
        yield
    finally:
        _BASES_STORE.reset(token)


def resolve_saved_base(origin: str) -> ModelSource:
    """The base folder `origin` a saved model records, through the store of `bases_through`."""
    s = _BASES_STORE.get()
    return resolve(origin) if s is None else resolve(origin, s.endpoint, s.region, s.policy())


def resolve(init_from: str, endpoint: str = "", region: str = "", policy=None, weights: bool = True) -> ModelSource:
    """The folder `init_from` names. An `hf://` model is downloaded once into the local Hugging
    Face cache (config and tokenizer files, and with `weights` the weights; the token from
    `HF_TOKEN`)."""
    if not init_from.startswith(HF_SCHEME):
        parse_uri(init_from)
        return ModelSource(init_from, open_store(init_from, endpoint, region, policy), init_from)
    repo, revision = parse_hf_uri(init_from)
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(
            repo,
            revision=revision or None,
            allow_patterns=_HUB_FILES + (_HUB_WEIGHTS if weights else []),
            token=os.environ.get("HF_TOKEN") or None,
        )
    except Exception as exc:  # network, auth, a missing repo: all end here, named
        raise PretrainedError(
            f"model.init_from {init_from!r}: cannot fetch it from the Hugging Face Hub ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); check the network and the model's name (a gated "
            "model needs HF_TOKEN: exported here, from kubernetes.hf_token_secret on a cluster), or put the model "
            "folder in the store and point model.init_from at it"
        ) from None
    commit = os.path.basename(os.path.normpath(path))
    return ModelSource(path, open_store(path), init_from, revision=commit)


def read_config(source: ModelSource, trust_remote_code: bool = False) -> dict[str, Any]:
    """The folder's config.json, checked: present, an architecture kftrain builds, no remote code
    unless allowed."""
    uri = join_uri(source.uri, CONFIG)
    try:
        raw = source.store.get_bytes(uri)
    except StoreError as exc:
        if source.store.exists(uri):
            raise
        raise PretrainedError(
            f"model.init_from {source.origin!r}: no {CONFIG} in the folder ({exc}); point it at a Hugging Face "
            "model folder (config.json, *.safetensors, tokenizer.json)"
        ) from None
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise PretrainedError(f"{uri}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise PretrainedError(f"{uri}: not a JSON object")
    if config.get("auto_map") and not trust_remote_code:
        raise PretrainedError(
            f"model.init_from {source.origin!r}: the model needs its own Python code (config.json auto_map "
            f"{sorted(config['auto_map'])}), which would run in every training pod; review it and set "
            "model.trust_remote_code: true, or use a model transformers implements"
        )
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES and not (config.get("auto_map") and trust_remote_code):
        raise PretrainedError(
            f"model.init_from {source.origin!r}: model_type {model_type!r} is not supported; kftrain fine-tunes "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (and models with remote code under model.trust_remote_code)"
        )
    if problem := shape_problem(config):
        raise PretrainedError(f"{uri}: {problem}; the file is damaged or edited: take the model's own config.json")
    return config


#: config.json's sizes (Llama, Mistral and Qwen names, then GPT-2's), each a positive whole number
#: where the file has it: what every size, memory figure and layer of the model is computed from.
SHAPE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "n_embd",
    "n_layer",
    "n_head",
    "n_positions",
)


def shape_problem(config: dict[str, Any]) -> str | None:
    """Why `config`'s sizes describe no model (a size that is no positive whole number, or heads that
    do not divide the width or the key-value heads), or None. Transformers answers these with an
    error naming no field (`integer modulo by zero`), or a negative dimension, when the model is built."""
    if config.get("vocab_size") is None:  # what the tokenizer's ids are checked against, and the plan sized by
        return "vocab_size is missing: add the model's vocabulary size (the rows of its embedding)"
    for key in SHAPE_KEYS:
        value = config.get(key)
        if value is None:
            continue  # left to the model's own default
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{key} must be a whole number, got {value!r}"
        if value < 1:
            return f"{key} must be positive, got {value}"
    hidden, heads, kv = (config.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads"))
    if isinstance(hidden, int) and isinstance(heads, int) and not config.get("head_dim") and hidden % heads:
        return f"hidden_size {hidden} does not divide by num_attention_heads {heads}"
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        return f"num_attention_heads {heads} does not divide by num_key_value_heads {kv}"
    return None


#: The folder's small files that transformers parses as JSON when it loads the tokenizer or
#: generates, besides config.json (each is optional).
JSON_FILES = (
    GENERATION_CONFIG,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
)


def copy_tokenizer_files(source: ModelSource, parent: Path) -> tuple[Path, list[str]]:
    """Copy what transformers loads the folder's tokenizer from out of the store into a folder under
    `parent`; that folder, and the :data:`TOKENIZER_FILES` it holds. config.json goes too, as
    transformers picks the tokenizer's class by the model's type (a qwen2 folder's tokenizer.json
    loads as Qwen2Tokenizer, with Qwen's own pre-tokenizer): without it, data prep would tokenize
    otherwise than the exported folder that transformers and vLLM load. So do the folder's Python
    files, for a tokenizer with its own code (`auto_map`, under `model.trust_remote_code`); the
    folder is named by a digest of what it holds, as transformers caches such code under the
    folder's name (one entry per tokenizer, not one per load)."""
    wanted = (*TOKENIZER_FILES, CONFIG)
    folder = _copied_by_digest(source, parent, "kftrain-tokenizer", lambda n: n in wanted or n.endswith(".py"))
    return folder, [name for name in TOKENIZER_FILES if (folder / name).exists()]


def _copied_by_digest(source: ModelSource, parent: Path, prefix: str, keep: Callable[[str], bool]) -> Path:
    """The files directly in the model's folder (not its sub-folders) whose names `keep` takes,
    copied into a folder under `parent` named `prefix` and a digest of their names and bytes:
    transformers caches a folder's Python code under the folder's name, so every load of the same
    files shares one entry (a random name added one per load, for good)."""
    files = parent / "files"
    files.mkdir()
    start = source.uri.rstrip("/") + "/"
    for uri in source.store.list(start):
        name = uri[len(start) :]
        if name and "/" not in name and keep(name):
            source.store.get_file(uri, files / name)
    digest = hashlib.sha256()
    for path in sorted(files.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    folder = parent / f"{prefix}-{digest.hexdigest()[:16]}"
    files.rename(folder)
    return folder


def check_tokenizer_files(source: ModelSource, config: dict[str, Any], chat: bool) -> None:
    """Before any step: each of the folder's :data:`JSON_FILES` there parses as a JSON object,
    tokenizer.json's token ids fit the model's `vocab_size` and, for chat data (`chat`), its chat
    template compiles (was: found in data prep, at evaluation or in the train step, with the data
    or the dataset blamed)."""
    origin = source.origin
    again = "copy the model's files again (transformers: `save_pretrained`)"
    parsed: dict[str, Any] = {}
    for name in JSON_FILES:
        uri = join_uri(source.uri, name)
        if not source.store.exists(uri):
            continue
        try:
            parsed[name] = json.loads(source.store.get_bytes(uri))
        except ValueError as exc:
            raise PretrainedError(f"model.init_from {origin!r}: {name} is not valid JSON ({exc}); {again}") from None
        if not isinstance(parsed[name], dict):
            raise PretrainedError(f"model.init_from {origin!r}: {name} is not a JSON object; {again}")
    if chat:
        _check_chat_template(source, parsed)
    if "tokenizer.json" in parsed:
        _check_declared_tokens(origin, parsed)
    top = _largest_token_id(parsed.get("tokenizer.json", {}))
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and top is not None and top >= vocab:
        raise PretrainedError(
            f"model.init_from {origin!r}: tokenizer.json has token ids up to {top}, but config.json's vocab_size is "
            f"{vocab} (the embedding has no row past {vocab - 1}): the folder's tokenizer and weights do not belong "
            "together; use the tokenizer saved with these weights"
        )


def _chat_templates(source: ModelSource, parsed: dict[str, Any]) -> tuple[str, list[Any]]:
    """Where transformers finds the folder's chat template (`chat_template.jinja`, then
    `chat_template.json`, then the `chat_template` key of `tokenizer_config.json`) and what is
    there: (file name, templates), or ("", []) for none."""
    jinja = join_uri(source.uri, "chat_template.jinja")
    if source.store.exists(jinja):
        return "chat_template.jinja", [source.store.get_bytes(jinja).decode("utf-8", errors="replace")]
    for name in ("chat_template.json", "tokenizer_config.json"):
        found = parsed.get(name, {}).get("chat_template")
        if found:
            # One template, or several by name (`[{"name": ..., "template": ...}]`).
            named = found if isinstance(found, list) else []
            return name, [found] if isinstance(found, str) else [
                t.get("template") for t in named if isinstance(t, dict)
            ]
    return "", []


def _check_chat_template(source: ModelSource, parsed: dict[str, Any]) -> None:
    """The folder has a chat template (:func:`_chat_templates`) and it compiles, as transformers
    compiles it (its extensions: loop controls, `{% generation %}`)."""
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    name, templates = _chat_templates(source, parsed)
    if not name:
        raise PretrainedError(
            f"data.format: chat needs the model's chat template, and model.init_from {source.origin!r} has none (no "
            "chat_template.jinja, chat_template.json or tokenizer_config.json chat_template); use the model's "
            "chat (instruct) variant, add a template to its tokenizer files, or train on data.format: text or jsonl"
        )
    for text in templates:
        if not isinstance(text, str):
            continue
        try:
            _compile_jinja_template(text)
        except jinja2.TemplateSyntaxError as exc:
            raise PretrainedError(
                f"model.init_from {source.origin!r}: the chat template in {name} does not parse (TemplateSyntaxError "
                f"line {exc.lineno}: {exc.message}); fix it, or copy the model's tokenizer files again"
            ) from None


#: The keys of tokenizer_config.json and special_tokens_map.json that declare a token, each as
#: transformers reads it: a named one (a string, or an AddedToken's mapping), or several.
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
_TOKEN_LISTS = ("additional_special_tokens", "extra_special_tokens")


def _declared_tokens(files: dict[str, Any]) -> dict[str, str]:
    """Every token text tokenizer_config.json and special_tokens_map.json declare, as transformers
    reads them, with the file each comes from: the map only beside a tokenizer_config.json
    without `added_tokens_decoder` (an older save), and then over it key by key (its
    `extra_special_tokens` list added to the config's)."""

    def text(value: Any) -> str | None:
        value = value.get("content") if isinstance(value, dict) else value
        return value if isinstance(value, str) and value else None

    config = files.get("tokenizer_config.json") or {}
    sources = {key: [("tokenizer_config.json", value)] for key, value in config.items()}
    if "added_tokens_decoder" not in config:
        for key, value in (files.get("special_tokens_map.json") or {}).items():
            kept = sources.get(key, []) if key == "extra_special_tokens" and isinstance(value, list) else []
            sources[key] = [*kept, ("special_tokens_map.json", value)]
    found: dict[str, str] = {}
    for key in (*_NAMED_TOKENS, *_TOKEN_LISTS, "added_tokens_decoder"):
        for name, value in sources.get(key, []):
            if key in _NAMED_TOKENS:
                values = [value]
            else:  # a list, or a mapping (by name, or by id for added_tokens_decoder)
                values = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
            for token in filter(None, map(text, values)):
                found.setdefault(token, name)
    return found


def _check_declared_tokens(origin: str, files: dict[str, Any]) -> None:
    """Every token tokenizer_config.json (or special_tokens_map.json) declares is one of
    tokenizer.json's: transformers adds one it lacks past tokenizer.json's ids, where the model's
    embedding has no row trained for it (was: a failure in the train step)."""
    tokenizer = files["tokenizer.json"]
    vocab = _vocabulary(tokenizer)
    if vocab is None:  # a form not read here: transformers' own check stands
        return
    known = {token for _, token in vocab + _added_tokens(tokenizer)}
    lacking = {token: name for token, name in _declared_tokens(files).items() if token not in known}
    if lacking:
        token, name = next(iter(lacking.items()))
        more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        raise PretrainedError(
            f"model.init_from {origin!r}: {name} declares the token {token!r}{more}, which tokenizer.json lacks: "
            "transformers would add it past tokenizer.json's ids, where the model's embedding has no row trained "
            "for it; save the tokenizer whole (transformers: "
            "`tokenizer.save_pretrained(folder)` writes it into tokenizer.json; resize the embeddings to fit), or "
            f"drop it from {name}"
        )


def _largest_token_id(tokenizer: dict[str, Any]) -> int | None:
    """The largest id a tokenizer.json gives a token (its vocabulary's and its added tokens'), or
    None where it does not say in a form read here."""
    ids = [i for i, _ in _added_tokens(tokenizer) + (_vocabulary(tokenizer) or []) if isinstance(i, int)]
    return max(ids) if ids else None


def _vocabulary(tokenizer: dict[str, Any]) -> list[tuple[Any, Any]] | None:
    """tokenizer.json's vocabulary as (id, token) pairs, or None where it is in no form read here."""
    model = tokenizer.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        return [(i, token) for token, i in vocab.items()]
    if isinstance(vocab, list):  # Unigram: [token, score] by id
        return [(i, entry[0] if isinstance(entry, list) and entry else None) for i, entry in enumerate(vocab)]
    return None


def _added_tokens(tokenizer: dict[str, Any]) -> list[tuple[Any, Any]]:
    """tokenizer.json's added tokens as (id, token) pairs."""
    return [(t.get("id"), t.get("content")) for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict)]


def _json_object(source: ModelSource, name: str) -> dict[str, Any]:
    """The folder's JSON file `name` as an object; {} where it is absent (each is optional, and
    :func:`check_tokenizer_files` has refused a damaged one before any step)."""
    uri = join_uri(source.uri, name)
    if not source.store.exists(uri):
        return {}
    try:
        parsed = json.loads(source.store.get_bytes(uri))
    except ValueError as exc:
        raise PretrainedError(f"model.init_from {source.origin!r}: {name} is not valid JSON ({exc})") from None
    return parsed if isinstance(parsed, dict) else {}


def end_token(source: ModelSource) -> str:
    """The model's end-of-text token, as text: one that generation stops at. Where transformers'
    generate() stops: generation_config.json's `eos_token_id` (one or a list), else config.json's;
    the tokenizer's own `eos_token` (tokenizer_config.json, then special_tokens_map.json) where it
    is one of them or none is named, else the first of them, with a warning (a model that learned
    to end with a token generation does not stop at runs on). "" where the folder names none."""
    named = ""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        token = _json_object(source, name).get("eos_token")
        if isinstance(token, dict):  # an AddedToken written out: {"content": ..., "special": ...}
            token = token.get("content")
        if isinstance(token, str) and token:
            named = token
            break
    tokenizer = _json_object(source, "tokenizer.json")
    tokens = _added_tokens(tokenizer) + (_vocabulary(tokenizer) or [])
    by_id = {i: token for i, token in reversed(tokens) if type(i) is int and isinstance(token, str) and token}
    stops: list[int] = []
    for name in (GENERATION_CONFIG, CONFIG):
        eos = _json_object(source, name).get("eos_token_id")
        stops = [i for i in (eos if isinstance(eos, list) else [eos]) if type(i) is int and i in by_id]
        if stops:
            break
    if not stops or named in (by_id[i] for i in stops):
        return named or (by_id[stops[0]] if stops else "")
    if named:
        log.warning(
            "model.init_from %r: its tokenizer's eos_token %r is not a token generation stops at (eos_token_id %s); "
            "documents end in %r, which it stops at",
            source.origin,
            named,
            stops,
            by_id[stops[0]],
        )
    return by_id[stops[0]]


def context_length(config: dict[str, Any]) -> int:
    """The longest context the model was built for (0 where config.json does not say)."""
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return int(config[key])
    return 0


def _read_header(store: ObjectStore, uri: str) -> tuple[dict[str, Any], int, int]:
    """A safetensors file's header (two ranged reads), the offset of its data section and the
    file's size."""
    size = store.size(uri)
    again = "the model's weights are damaged or cut short: copy them again (transformers: `save_pretrained`)"
    if size < 8:
        raise PretrainedError(f"{uri}: not a safetensors file ({size} bytes, shorter than its header); {again}")
    n = struct.unpack("<Q", store.get_bytes(uri, 0, 8))[0]
    if n <= 0 or n > _MAX_HEADER or 8 + n > size:
        raise PretrainedError(
            f"{uri}: not a safetensors file (its first 8 bytes give a header of {n} bytes in a file of {size}); {again}"
        )
    try:
        header = json.loads(store.get_bytes(uri, 8, n))
    except ValueError as exc:
        raise PretrainedError(f"{uri}: the safetensors header is not JSON ({exc}); {again}") from None
    return header, 8 + n, size


def weight_files(source: ModelSource) -> list[str]:
    """The folder's safetensors files: those the index lists, else `model.safetensors`; a folder
    holding both, an index of other files beside `model.safetensors`, is refused: transformers
    loads `model.safetensors` where vLLM loads the index's shards, two different models."""
    index_uri = join_uri(source.uri, INDEX_FILE)
    single = join_uri(source.uri, SINGLE_FILE)
    if source.store.exists(index_uri):
        try:
            names = sorted({str(name) for name in json.loads(source.store.get_bytes(index_uri))["weight_map"].values()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PretrainedError(
                f"{index_uri}: not a safetensors index (no weight_map of tensor names to files: {exc!r}); copy the "
                "model's files again"
            ) from None
        if outside := [n for n in names if not n or "/" in n or "\\" in n or n in (".", "..")]:
            raise PretrainedError(
                f"{index_uri}: weight_map names {outside[0]!r}, not a file of the folder; an index names its "
                "safetensors files by their bare names (model-00001-of-00002.safetensors)"
            )
        if SINGLE_FILE not in names and source.store.exists(single):
            _refuse_two_saves(source, names)
        return [join_uri(source.uri, name) for name in names]
    if source.store.exists(single):
        return [single]
    folder = source.uri.rstrip("/") + "/"
    shards = sorted(u[len(folder) :] for u in source.store.list(folder) if u.endswith(".safetensors"))
    if shards:  # the weights are there, the map of which tensor is in which file is not
        raise PretrainedError(
            f"model.init_from {source.origin!r}: {first_and_more(shards, 'safetensors files')} but no {INDEX_FILE}, "
            f"which says which tensors each holds; copy it from where the model came from (or, for one file, name "
            f"it {SINGLE_FILE})"
        )
    raise PretrainedError(
        f"model.init_from {source.origin!r}: no {SINGLE_FILE} or {INDEX_FILE} in the folder; kftrain reads "
        "safetensors only (no pickle): convert the weights with `model.save_pretrained(folder)` in transformers"
    )


def _refuse_two_saves(source: ModelSource, shards: list[str]) -> None:
    """PretrainedError for a folder holding `model.safetensors` beside an index of other files
    (`shards`): transformers loads the one file, vLLM the index's shards, so which weights are the
    model is unclear; or, where none of the shards is there, the index is an older save's left
    behind (transformers' `save_pretrained` keeps it), which vLLM would still follow."""
    listed = first_and_more(shards)
    if not any(source.store.exists(join_uri(source.uri, name)) for name in shards):
        what = (
            f"{INDEX_FILE} lists {listed}, which the folder does not hold: an older save's index beside {SINGLE_FILE}"
        )
        drop = f"remove {INDEX_FILE}"
    else:
        what = (
            f"holds both {SINGLE_FILE} and {INDEX_FILE} (of {listed}), two sets of weights: transformers loads the "
            "first, vLLM the second's"
        )
        drop = f"keep one save in the folder (remove {SINGLE_FILE}, or the index and its shards)"
    if source.origin.startswith(HF_SCHEME):  # the Hub's files are not the user's to change
        drop = (
            f"download the model (`hf download {source.origin[len(HF_SCHEME) :].split('@')[0]} --local-dir DIR`), "
            f"there {drop}, and set model.init_from to DIR or its copy in your store"
        )
    raise PretrainedError(f"model.init_from {source.origin!r}: {what}; {drop}")


#: A base model's fingerprint reads, of each weight file, its size, its header and this many
#: samples of :data:`FINGERPRINT_SAMPLE_BYTES` spread over its data.
FINGERPRINT_SAMPLES = 8
FINGERPRINT_SAMPLE_BYTES = 4096


def weights_fingerprint(source: ModelSource) -> str:
    """What identifies the base model's weights, for a checkpoint or an adapter to be resumed or
    loaded only on the weights it was trained on: each weight file's name, size and header, and
    samples of its data (a few ranged reads a file, not the model: a model replaced in place by
    another version, or by the same one retrained, differs in nearly every value)."""
    digest = hashlib.sha256()
    for uri in weight_files(source):
        header, start, size = _read_header(source.store, uri)
        digest.update(f"{uri.rsplit('/', 1)[-1]}\0{size}\0".encode())
        digest.update(json.dumps(header, sort_keys=True).encode())
        for i in range(FINGERPRINT_SAMPLES):
            offset = start + (size - start) * i // FINGERPRINT_SAMPLES
            if (length := min(FINGERPRINT_SAMPLE_BYTES, size - offset)) > 0:
                digest.update(source.store.get_bytes(uri, offset, length))
    return digest.hexdigest()


def check_same_weights(source: ModelSource, fingerprint: str, when: str) -> None:
    """The base model's weights are those `fingerprint` (:func:`weights_fingerprint`) was taken
    of `when` (what happened on them: "the adapters were trained"); nothing recorded: not checked."""
    if fingerprint and weights_fingerprint(source) != fingerprint:
        raise PretrainedError(f"{base_changed(source.origin, when)}: put back those weights, or train again on these")


def base_changed(origin: str, when: str) -> str:
    """What is wrong with a base model whose weights changed since `when`; the caller says what to do."""
    return (
        f"model.init_from {origin!r} holds other weights than when {when} (the folder was replaced, or a new "
        "version put over it)"
    )


def file_index(store: ObjectStore, uri: str) -> dict[str, TensorEntry]:
    """Every tensor of one safetensors file by name, from its header alone."""
    import torch

    header, data_start, size = _read_header(store, uri)
    index: dict[str, TensorEntry] = {}
    data_end = 0
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(spec.get("dtype"))
        if dtype is None:
            raise PretrainedError(f"{uri}: tensor {name!r} has dtype {spec.get('dtype')!r}, which kftrain cannot read")
        begin, end = spec["data_offsets"]
        data_end = max(data_end, end)
        index[name] = TensorEntry(uri, getattr(torch, dtype), tuple(spec["shape"]), data_start + begin)
    if size < data_start + data_end:  # a copy cut short: found now, not when a rank reads the last tensor
        raise PretrainedError(
            f"{uri}: the file is cut short: its header places {data_start + data_end} bytes, the file holds {size}; "
            "copy the model's weights again"
        )
    return index


def tensor_index(source: ModelSource) -> dict[str, TensorEntry]:
    """Every tensor of the folder by name, from the files' headers alone, named as the model
    transformers builds names its parameters (see `with_base_prefix`)."""
    index: dict[str, TensorEntry] = {}
    for uri in weight_files(source):
        index.update(file_index(source.store, uri))
    try:
        config = json.loads(source.store.get_bytes(join_uri(source.uri, CONFIG)))
    except ObjectNotFound:  # weights alone: named as they are
        config = {}
    # A model with its own code names its weights as its code does, whatever its model_type says.
    model_type = None if not isinstance(config, dict) or config.get("auto_map") else config.get("model_type")
    return with_base_prefix(index, base_model_prefix(model_type))


def base_model_prefix(model_type: Any) -> str:
    """Where the causal LM of `model_type` keeps its base model (`transformer` for GPT-2, `model` for
    Llama), '' for a model type transformers' Auto classes do not know."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    return getattr(getattr(transformers, name, None), "base_model_prefix", "") if name else ""


def with_base_prefix(index: dict[str, TensorEntry], prefix: str) -> dict[str, TensorEntry]:
    """`index` with the base model's names under `prefix`, where the files hold none under it: a
    base model saved on its own (the Hub's GPT-2: `wte.weight`, `h.0.attn.c_attn.weight`), which
    transformers loads into the causal LM the same way. The head (`lm_head.*`) keeps its name."""
    if not prefix or any(name.startswith(f"{prefix}.") for name in index):
        return index
    return {name if name.startswith("lm_head.") else f"{prefix}.{name}": entry for name, entry in index.items()}


def parameter_bytes(index: dict[str, TensorEntry]) -> int:
    """Bytes of all the folder's tensors as stored."""
    return sum(e.row_bytes * (e.shape[0] if e.shape else 1) for e in index.values())


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, no init cost);
    buffers stay real, so values computed at construction (rotary frequencies) are kept."""
    from torch import nn

    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


@contextmanager
def code_folder(source: ModelSource) -> Iterator[str]:
    """A local folder holding the model's config.json and Python files, from which transformers
    imports a remote-code model: the folder itself where it is local, else a copy of those small
    files (never the weights), removed after the block. transformers keeps what it imported in
    its module cache (`~/.cache/huggingface/modules`) under the folder's name: the copy is named
    by a digest of the files, so every build of one model's code shares one entry (a random name
    had added one per build, for good)."""
    if not parse_uri(source.uri).is_remote:
        yield source.uri
        return
    with tempfile.TemporaryDirectory(prefix="kftrain-model-code-") as parent:
        yield str(
            _copied_by_digest(source, Path(parent), "kftrain-model-code", lambda n: n == CONFIG or n.endswith(".py"))
        )


def build_on_meta(config: dict[str, Any], dtype: torch.dtype, source: ModelSource | None = None) -> nn.Module:
    """The model of `config` (transformers' Auto classes) with parameters on the meta device. A
    model with its own code (`auto_map`, allowed by :func:`read_config` under
    `model.trust_remote_code`) is built from the code in its folder, `source`."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig, AutoModelForCausalLM

    if config.get("auto_map"):
        if source is None:
            raise PretrainedError("a model with its own code (auto_map) is built from its folder; none was given")
        try:
            with code_folder(source) as folder:
                hf_config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
                with parameters_on_meta():
                    return AutoModelForCausalLM.from_config(hf_config, dtype=dtype, trust_remote_code=True)
        except (OSError, ImportError, ValueError, AttributeError, TypeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PretrainedError(
                f"model.init_from {source.origin!r}: its own code (config.json auto_map {config['auto_map']}) "
                f"does not build a model: {first}; put the model's .py files beside config.json"
            ) from None
    try:
        # A deep copy: transformers writes into the nested dicts it is given (rope_theta into a
        # legacy rope_scaling), and `config` is what the export writes out again.
        hf_config = AutoConfig.for_model(**copy.deepcopy(config))
        with parameters_on_meta():
            return AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    except (
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        IndexError,
        ZeroDivisionError,
        StrictDataclassError,
    ) as exc:
        # What config.json's values break in transformers (its config classes validate with
        # huggingface_hub's strict dataclasses); anything else is no fault of the file's.
        first = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())[:300]
        where = f"model.init_from {source.origin!r}: " if source is not None else ""
        raise PretrainedError(
            f"{where}transformers cannot build the model its config.json describes ({type(exc).__name__}: {first}); "
            "take the model's own config.json"
        ) from None


def buffers_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the model's buffers (computed at construction), to put back after `to_empty`."""
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def give_storage(model: nn.Module, device: torch.device, buffers: dict[str, torch.Tensor]) -> None:
    """Allocate (uninitialised) storage for every parameter on `device`, then put back the buffers
    computed at construction (`to_empty` leaves them as garbage: a wrong rotary buffer shifts the
    logits silently). Tied weights stay tied (`to_empty` would give each name its own tensor)."""
    import torch

    shared: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    model.to_empty(device=device)
    for first, *others in (names for names in shared.values() if len(names) > 1):
        param = model.get_parameter(first)
        for name in others:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, param)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name in buffers:
                buf.copy_(buffers[name])


def base_name(name: str) -> str:
    """The name a parameter of a (possibly peft-wrapped) model has in the base model's files."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tensor this rank fills and the index of its first row in the full tensor: a DTensor
    sharded on dimension 0 (FSDP2, equal chunks as `torch.chunk` cuts) or a plain tensor."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(tensor, DTensor):
        return tensor, 0
    local = tensor.to_local()
    placements = tensor.placements
    if all(isinstance(p, Replicate) for p in placements):
        return local, 0
    if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        raise PretrainedError(f"cannot load into a parameter sharded as {placements}: kftrain shards dimension 0")
    mesh = tensor.device_mesh
    chunk = -(-tensor.shape[0] // mesh.size())
    start = min(mesh.get_local_rank() * chunk, tensor.shape[0])
    if local.shape[0] != max(0, min(chunk, tensor.shape[0] - start)):
        raise PretrainedError(f"unexpected shard layout: {local.shape[0]} rows at {start} of {tensor.shape[0]}")
    return local, start


def read_rows(store: ObjectStore, entry: TensorEntry, start: int, count: int) -> torch.Tensor:
    """Rows [start, start + count) of a stored tensor (one ranged read); a scalar whole."""
    import torch

    shape = (count, *entry.shape[1:]) if entry.shape else ()
    if count == 0 and entry.shape:
        return torch.empty(shape, dtype=entry.dtype)
    length = entry.row_bytes * (count if entry.shape else 1)
    raw = store.get_bytes(entry.uri, entry.offset + start * entry.row_bytes, length)
    if len(raw) != length:
        raise PretrainedError(f"{entry.uri}: a tensor's data is cut short ({len(raw)} of {length} bytes)")
    return torch.frombuffer(bytearray(raw), dtype=entry.dtype).reshape(shape)


def fill_tensor(target: torch.Tensor, rows: Callable[[int, int], torch.Tensor], row_bytes: int = 0) -> int:
    """Copy into `target` (this rank's part) the rows `rows(start, count)` returns, in pieces of
    at most READ_PIECE_BYTES when `row_bytes` is given (so a rank never holds a large tensor's
    rows twice: once as read, once as copied); return the bytes read."""
    import torch

    with torch.no_grad():
        local, start = _local_rows(target)
        if local.numel() == 0:
            return 0
        if not local.dim():
            data = rows(start, 1)
            local.copy_(data.reshape(()))
            return data.element_size()
        n = local.shape[0]
        step = max(1, READ_PIECE_BYTES // row_bytes) if row_bytes else n
        read = 0
        for at in range(0, n, step):
            piece = local[at : at + step]
            data = rows(start + at, piece.shape[0])
            piece.copy_(data.reshape(piece.shape))
            read += data.numel() * data.element_size()
        return read


def load_base_weights(
    model: nn.Module,
    source: ModelSource,
    index: dict[str, TensorEntry],
    key: Callable[[str], str] = base_name,
    only: set[str] | None = None,
) -> list[str]:
    """Fill every parameter and persistent buffer of `model` (or those named in `only`) that the
    files of `index` hold, under the name `key` gives, this rank's shards only; return the names
    they do not hold (adapters, for the caller to initialise). A tensor of another shape is an
    error."""
    from trainer.model_io import tied_names

    tied = tied_names(model)
    not_in_base: list[str] = []
    read = 0
    for name, tensor in model.state_dict(keep_vars=True).items():
        if name in tied or (only is not None and name not in only):
            continue
        key_name = key(name)
        entry = index.get(key_name)
        if entry is None:
            not_in_base.append(name)
            continue
        if tuple(entry.shape) != tuple(tensor.shape):
            raise PretrainedError(
                f"{entry.uri}: tensor {key_name!r} has shape {list(entry.shape)}, the model built from config.json "
                f"expects {list(tensor.shape)}; the folder's weights and config.json disagree"
            )
        read += fill_tensor(
            tensor, lambda start, count, e=entry: read_rows(source.store, e, start, count), entry.row_bytes
        )
    log.info("read %d bytes (%.1f MiB) of pretrained weights for this rank from %s", read, read / 2**20, source.origin)
    return not_in_base
