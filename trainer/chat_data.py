"""Chat data for fine-tuning a pretrained model (`data.format: chat`): conversations rendered
with the model's own chat template, one conversation per row, the loss on the assistant's
tokens only.

**Reading.** The source is a JSON Lines object, or every object under a prefix (in name order),
read in blocks of about a MiB: one conversation per line, its `data.messages_field` a list of
OpenAI-style `{"role", "content"}` messages (roles: system, user, assistant, tool; an assistant
message may call tools with `tool_calls`, its content then null, and one with OpenAI's `"weight": 0`
is part of the later turns' prompt but not learned). Every record
is checked as it is read; the first bad one stops data prep with an error naming the object, the
line and the fix. At most `data.max_bytes` of records are taken (whole records only). Record `i`
(counted across the objects) goes to the val or test split when a hash of `(data.seed, i)` falls
in the first `data.val_fraction` or the next `data.test_fraction` of its range: the same source
and seed always give the same splits, and no split depends on how the source is ordered.

**Masking.** The model's tokenizer (its folder's tokenizer files, loaded by transformers) renders
each conversation with its chat template. The characters of assistant turn `i` are those its own
rendering adds to the generation prompt before it: `render(messages[:i], add_generation_prompt)`
must be a prefix of `render(messages[:i + 1])`, and that a prefix of the whole conversation's
rendering; a template that breaks either (one that rewrites earlier turns once later ones follow)
cannot say which tokens are the assistant's and is refused, naming the record. The whole
rendering is tokenized once with character offsets; a token is labelled when its characters
overlap an assistant turn. A turn runs to the end of its rendering, whitespace after the last
character left out: the template's end-of-turn token (`<|im_end|>`, `<|eot_id|>`) is the
assistant's, so the model learns to stop.

**Layout: padding, not packing.** A row holds one conversation: `model.block_size + 1` token ids,
right-padded with the tokenizer's pad id (else its end-of-sequence id), the input `row[:-1]`
and the labels `row[1:]` with -100 wherever the loss mask is 0 (prompts, template text,
padding). Packing several conversations into a row would let each attend to the ones before it
unless the model got a block-diagonal 4D attention mask or flash-attention's variable-length
kernels, which not every attention backend (nor the CPU) has; right padding needs no mask at all
on any backend, since causal attention never looks at the padding after a token, and each
conversation starts at position 0 as it does when the model is served. What it costs is the
compute of the padding, at most `block_size` minus the conversation's length per row: bounded,
and small when `model.block_size` is close to the longest conversations. A conversation longer
than the row is cut at it; one left with no assistant token is dropped; data prep logs both
counts and records them in the manifest.

Shards are `.npz` archives (`trainer/shards.py`, rows) of `tokens` (rows x (block_size + 1),
the smallest unsigned dtype that holds the vocabulary) and `mask` (the same shape, uint8, 1 on
the tokens the loss counts).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import pretrained
from trainer.config import Config, json_kind
from trainer.data_rules import (
    ARRAY_HINT,
    BUILTIN_SOURCES,
    json_line,
    nothing_there,
    refuse_lone_surrogate,
    source_listing,
    source_store,
    text_chunks,
)
from trainer.progress import ProgressLine
from trainer.shards import (
    CHAT_FORMAT,
    MANIFEST,
    SPLITS,
    DataError,
    ShardInfo,
    ShardWriter,
    read_manifest,
    split_shards,
    token_dtype,
)
from trainer.storage import ObjectStore, join_uri, read_chunks, version_size
from trainer.streaming import first_items
from trainer.tasks.causal_lm import BLOCK_BYTES, IGNORE, _bounded_map, max_bytes_note

#: The dataset format of chat data (its manifest's `format`).


log = logging.getLogger("kftrain.data")
#: The roles a message may have (OpenAI's chat format; `tool` carries a tool's result).
ROLES = ("system", "user", "assistant", "tool")
#: Conversations rendered and tokenized together (one task of a `data.num_proc` worker).
GROUP = 64
#: A rendering: `(messages, add_generation_prompt) -> text`.
Render = Callable[[list[dict], bool], str]


def conversation(record: Any, field_name: str, where: str) -> list[dict]:
    """The messages of one JSON Lines record, checked: an object whose `field_name` is a list of
    messages with string `role` and `content`, every role one of :data:`ROLES`, and at least one
    assistant turn. `where` (object and line) names the record in the error."""
    if not isinstance(record, dict):
        hint = f"; {ARRAY_HINT}" if isinstance(record, list) else ""
        raise DataError(
            f"{where}: the record is a JSON {json_kind(record)}, not an object; each line of a chat JSON Lines "
            f'file is one object like {{"{field_name}": [{{"role": "user", "content": "..."}}, ...]}}{hint}'
        )
    if field_name not in record:
        sharegpt = "; ShareGPT's `conversations` of from/value are written as OpenAI's messages of role/content"
        raise DataError(
            f"{where}: the record has no {field_name!r} field (data.messages_field); its keys: "
            f"{sorted(record)[:10]}; set data.messages_field to the field that holds the messages"
            + (sharegpt if "conversations" in record else "")
        )
    messages = record[field_name]
    if not isinstance(messages, list):
        raise DataError(
            f"{where}: {field_name!r} is a JSON {json_kind(messages)}, not a list of messages "
            '(`[{"role": "user", "content": "..."}, ...]`)'
        )
    refuse_lone_surrogate(messages, where, field_name)  # what the template renders; other fields may hold one
    checked = []
    for number, message in enumerate(messages, 1):
        if not isinstance(message, dict):
            raise DataError(
                f"{where}: message {number} is a JSON {json_kind(message)}, not an object with "
                "string 'role' and 'content'"
            )
        if message.get("tool_calls") in (None, []):  # exports write `"tool_calls": null` on every message
            message = {k: v for k, v in message.items() if k != "tool_calls"}
        calls = "tool_calls" in message and message.get("role") == "assistant"
        for key in ("role", "content"):
            if key == "content" and calls and message.get(key) is None:
                continue  # an OpenAI tool call: its turn is the calls the template renders
            if not isinstance(message.get(key), str):
                found = "missing" if key not in message else f"a JSON {json_kind(message[key])}"
                only = " (or, on an assistant message, null beside its 'tool_calls')" if key == "content" else ""
                if key not in message and {"from", "value"} <= message.keys():
                    only += (
                        "; 'from' and 'value' are ShareGPT's form: write each message as OpenAI's "
                        "{'role', 'content'}, 'human' as 'user' and 'gpt' as 'assistant'"
                    )
                raise DataError(
                    f"{where}: message {number} has no string {key!r} ({found}); every message needs one{only}"
                )
        if message["role"] not in ROLES:
            raise DataError(
                f"{where}: message {number} has role {message['role']!r}; data.format: chat allows {', '.join(ROLES)}"
            )
        if "tool_calls" in message:
            message = with_tool_calls(message, f"{where}: message {number}")
        if "weight" in message:  # OpenAI's fine-tuning files: weight 0 keeps a turn out of the loss
            weight = message["weight"]
            if message["role"] != "assistant" or weight not in (0, 1) or isinstance(weight, bool):
                raise DataError(
                    f"{where}: message {number} has 'weight' {weight!r}; as in OpenAI's fine-tuning files, an "
                    "assistant message may have weight 0 (not learned) or 1 (learned, as without one)"
                )
        empty = "tool_calls" not in message and not (message["content"] or "").strip()
        if message["role"] == "assistant" and empty and message.get("weight", 1):
            # Its only learned token would be the end of the turn: it teaches answering nothing.
            raise DataError(
                f"{where}: message {number} is an assistant message with empty content, which would teach the "
                "model to answer nothing; leave the record out, give the answer, or weight 0 to keep it out of the loss"
            )
        checked.append(message)
    messages = checked
    if not messages:
        raise DataError(f"{where}: {field_name!r} is an empty list; every record needs its conversation's messages")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(
            f"{where}: the conversation has no assistant message, so nothing to learn; every record needs "
            "at least one message with role 'assistant'"
        )
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise DataError(
            f"{where}: every assistant message has weight 0, so nothing to learn; give at least one weight 1 "
            "(or leave the record out)"
        )
    if messages[0]["role"] == "assistant":  # its prompt would be an empty conversation, which templates refuse
        raise DataError(
            f"{where}: the conversation starts with an assistant message, answering no prompt; begin each record "
            "with a system or user message"
        )
    return messages


def with_tool_calls(message: dict, where: str) -> dict:
    """An assistant `message` whose `tool_calls` are in OpenAI's form, checked: a non-empty list
    of objects, each with a `function` object holding a string `name`. Its `arguments`, which
    OpenAI writes as a JSON string, become the object they hold (what transformers' chat
    templates expect: those that render `arguments | tojson` would teach the model a quoted
    string); other arguments go to the template as they are. :class:`DataError` naming `where`."""
    form = '[{"type": "function", "function": {"name": "...", "arguments": "{...}"}}, ...]'
    calls = message["tool_calls"]
    if message["role"] != "assistant":
        raise DataError(f"{where}: a {message['role']} message has 'tool_calls'; only an assistant message calls tools")
    if not isinstance(calls, list):
        raise DataError(f"{where}: 'tool_calls' is a JSON {json_kind(calls)}, not a list of calls like {form}")
    parsed = []
    for k, call in enumerate(calls, 1):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise DataError(f"{where}: tool call {k} has no 'function' with a string 'name'; each call is like {form}")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                value = json.loads(arguments)
            except ValueError:
                value = None
            if isinstance(value, dict):
                function = {**function, "arguments": value}
        parsed.append({**call, "function": function})
    return {**message, "tool_calls": parsed}


def assistant_spans(render: Render, messages: list[dict], where: str) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's rendering and the character spans `[start, end)` of its assistant turns
    in it (see the module docstring); :class:`DataError` naming `where` when the template does not
    extend a turn's generation prompt, or renders a turn differently once later turns follow."""
    text = render(messages, False)
    spans = []
    turn = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        turn += 1
        if message.get("weight", 1) == 0:
            continue  # the prompt of the turns after it, not learned
        prompt = render(messages[:i], True)
        upto = render(messages[: i + 1], False)
        if not upto.startswith(prompt):
            raise DataError(
                f"{where}: the model's chat template does not render assistant turn {turn} (message {i + 1}) as a "
                "continuation of its generation prompt (render(messages[:i], add_generation_prompt=True) is not a "
                "prefix of render(messages[:i+1])), so its tokens cannot be told from the prompt's; data.format: "
                "chat needs a template that does (ChatML, Llama 3 and most instruct templates do)"
            )
        if not text.startswith(upto):
            raise DataError(
                f"{where}: the model's chat template renders the conversation up to assistant turn {turn} "
                f"(message {i + 1}) differently once later messages follow (render(messages[:i+1]) is not a prefix "
                "of the whole rendering; templates that drop earlier turns' reasoning do this); give each assistant "
                "turn its own record (the conversation up to and including that turn)"
            )
        if message.get("tool_calls"):
            bare = {**{k: v for k, v in message.items() if k != "tool_calls"}, "content": message["content"] or ""}
            if render([*messages[:i], bare], False) == upto:
                raise DataError(
                    f"{where}: the model's chat template does not render the tool calls of assistant turn {turn} "
                    f"(message {i + 1}: the turn renders the same without them), so the turn would teach no call; "
                    "use a model whose chat template renders 'tool_calls', or leave tool-call turns out"
                )
        end = max(len(prompt), len(upto.rstrip()))
        if end > len(prompt):
            spans.append((len(prompt), end))
    return text, spans


def label_mask(offsets: np.ndarray, spans: Sequence[tuple[int, int]], length: int) -> np.ndarray:
    """1 for each token (character `offsets`, n x 2, of a text of `length` characters) whose
    characters overlap one of `spans`, else 0 (uint8)."""
    chars = np.zeros(length + 1, dtype=np.int64)
    for start, end in spans:
        chars[start:end] = 1
    covered = np.concatenate([[0], np.cumsum(chars)])
    starts = np.clip(offsets[:, 0], 0, length)
    ends = np.clip(np.maximum(offsets[:, 1], offsets[:, 0] + 1), 0, length + 1)  # an empty token: its position
    return (covered[ends] - covered[starts] > 0).astype(np.uint8)


@dataclass(frozen=True, slots=True)
class Row:
    """One conversation as a row of the dataset, or why it has none."""

    tokens: np.ndarray | None
    """`block_size + 1` token ids (int64), right-padded; None: dropped."""
    mask: np.ndarray | None
    """1 on the tokens the loss counts (uint8), 0 on the rest and the padding."""
    cut: bool
    """The conversation was longer than the row and was cut at it."""


def layout_row(ids: np.ndarray, mask: np.ndarray, block_size: int, pad_id: int) -> Row:
    """A conversation's token ids and mask as one row of `block_size + 1` tokens: cut at the row,
    right-padded with `pad_id` (mask 0); dropped (no tokens) when no assistant token is left to
    predict (the row's first token is never a label)."""
    width = block_size + 1
    cut = len(ids) > width
    ids, mask = ids[:width], mask[:width]
    if not mask[1:].any():
        return Row(None, None, cut)
    tokens = np.full(width, pad_id, dtype=np.int64)
    tokens[: len(ids)] = ids
    row_mask = np.zeros(width, dtype=np.uint8)
    row_mask[: len(mask)] = mask
    return Row(tokens, row_mask, cut)


#: More characters than one token of any real vocabulary spans (what bounds the text tokenized).
MAX_CHARS_PER_TOKEN = 64


class ChatEncoder:
    """Renders conversations with a transformers tokenizer's chat template and lays each out as a
    :class:`Row` of `block_size + 1` tokens."""

    def __init__(self, tokenizer: Any, block_size: int) -> None:
        self.tokenizer, self.block_size = tokenizer, block_size
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0  # masked out: any id would do

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The template's text of `messages`."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, items: list[tuple[str, list[dict]]]) -> list[Row]:
        """`(where, messages)` pairs as rows; a template that fails on a conversation is a
        :class:`DataError` naming `where`."""
        texts, spans = [], []
        for where, messages in items:
            try:
                text, turn_spans = assistant_spans(self.render, messages, where)
            except DataError:
                raise
            except Exception as exc:  # the template's own raise_exception (roles must alternate, ...)
                raise DataError(
                    f"{where}: the model's chat template refused the conversation ({type(exc).__name__}: {exc}); "
                    "fix the record to the form the model's template expects"
                ) from None
            # Only the row's first `block_size + 1` tokens are kept: tokenize no more text than they
            # can span (a 40 MB message took 17 GB in the tokenizer's offsets, then was cut anyway).
            texts.append(text[: (self.block_size + 1) * MAX_CHARS_PER_TOKEN])
            spans.append(turn_spans)
        # The template writes the special tokens it wants (a BOS among them): add none.
        encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        rows = []
        for text, turn_spans, ids, offsets in zip(
            texts, spans, encoded["input_ids"], encoded["offset_mapping"], strict=True
        ):
            offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
            mask = label_mask(offsets, turn_spans, len(text))
            rows.append(layout_row(np.asarray(ids, dtype=np.int64), mask, self.block_size, self.pad_id))
        return rows


def load_model_tokenizer(source: pretrained.ModelSource, parent: Path, trust_remote_code: bool) -> Any:
    """The model's tokenizer as transformers loads the model's folder, from its tokenizer files and
    config.json (copied from the store into a folder under `parent`, the tokenizer's
    `name_or_path`), so that data prep tokenizes as the exported folder does; :class:`DataError`
    naming `model.init_from` when the folder has none, they do not load, or the tokenizer is not a
    fast (tokenizer.json) one."""
    folder, copied = pretrained.copy_tokenizer_files(source, parent)
    if not copied:
        raise DataError(
            f"model.init_from {source.origin!r}: the folder has no tokenizer file "
            f"({', '.join(pretrained.TOKENIZER_FILES)}); kftrain tokenizes your data with the model's own "
            "tokenizer: copy the model's tokenizer files into the folder"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as exc:  # a broken or remote-code tokenizer: named, not a traceback
        fix = (
            "copy the model's tokenizer files again (transformers: `save_pretrained`)"
            if trust_remote_code
            else "a tokenizer with its own code needs model.trust_remote_code: true"
        )
        raise DataError(
            f"model.init_from {source.origin!r}: its tokenizer does not load ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); {fix}"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"model.init_from {source.origin!r}: its tokenizer is not a fast (tokenizer.json) one; kftrain "
            "tokenizes through tokenizer.json (the character offsets of chat data need it): add the model's "
            "tokenizer.json (transformers: `AutoTokenizer.from_pretrained(...).save_pretrained(folder)`)"
        )
    return tokenizer


def load_chat_tokenizer(source: pretrained.ModelSource, parent: Path, trust_remote_code: bool) -> Any:
    """:func:`load_model_tokenizer`, which for `data.format: chat` must have a chat template
    (:class:`DataError` naming `model.init_from` when it has none)."""
    tokenizer = load_model_tokenizer(source, parent, trust_remote_code)
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"model.init_from {source.origin!r}: its tokenizer has no chat template (no 'chat_template' in "
            "tokenizer_config.json, no chat_template.jinja); data.format: chat needs one: use the model's chat or "
            "instruct variant, or data.format: jsonl for plain text"
        )
    return tokenizer


def split_of(index: int, seed: int, val_fraction: float, test_fraction: float) -> str:
    """The split of record `index`: a hash of (seed, index) mapped to [0, 1) and compared with
    the fractions (val first, then test)."""
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    if u < val_fraction:
        return "val"
    return "test" if u < val_fraction + test_fraction else "train"


def _lines(store: ObjectStore, uri: str) -> Iterator[tuple[int, bytes]]:
    """The lines of one object with their numbers (from 1), one block in memory at a time."""
    carry, number = b"", 0
    for chunk in text_chunks(read_chunks(store, uri, BLOCK_BYTES), uri, "chat JSON Lines"):
        *lines, carry = (carry + chunk).split(b"\n")
        for line in lines:
            number += 1
            yield number, line
    if carry:
        yield number + 1, carry


@dataclass(slots=True)
class _Reading:
    """How far reading the source got (for the empty-source error)."""

    records: int = 0
    bytes: int = 0
    stopped_at_max_bytes: bool = False
    objects: list[str] = field(default_factory=list)


def chat_records(cfg: Config, reading: _Reading) -> Iterator[tuple[str, list[dict]]]:
    """`(where, messages)` of every record of `data.source` in order, checked, whole records only up
    to `data.max_bytes`; blank lines are skipped."""
    d = cfg.data
    # The source's own store: it need not be the dataset's.
    store = source_store(cfg, d.source)
    listing = source_listing(store, d.source)
    reading.objects = sorted(listing)
    if not reading.objects:
        raise nothing_there(d.source)
    limit = d.max_bytes or math.inf
    # Against what will be read: the objects' bytes, or data.max_bytes where smaller (was: against
    # data.max_bytes alone, whatever the source's size).
    size = sum(version_size(version) for version in listing.values())
    progress = ProgressLine(f"data prep: reading {d.source}", total=min(size, d.max_bytes) if d.max_bytes else size)
    for uri in reading.objects:
        for number, line in _lines(store, uri):
            if not line.strip():
                continue
            if reading.bytes + len(line) + 1 > limit:
                reading.stopped_at_max_bytes = True
                progress.done("data.max_bytes reached")
                log.warning(max_bytes_note(cfg, f"{reading.records} conversation(s)"))
                return
            reading.bytes += len(line) + 1
            progress.add(len(line) + 1)
            where = f"{uri} line {number}"
            messages = chat_record(line, d.messages_field, where)
            reading.records += 1
            yield where, messages
    progress.done()


def chat_record(line: bytes, field_name: str, where: str) -> list[dict]:
    """The messages of one JSON Lines line of chat data, checked (:func:`conversation`); a line
    that is not JSON is a :class:`DataError` naming `where`."""
    reads = f"data.format: chat reads JSON Lines, one object with a {field_name!r} list per line"
    return conversation(json_line(line, where, reads), field_name, where)


#: The encoder of a data-prep worker process (`data.num_proc` > 1).
_WORKER: ChatEncoder | None = None


def _start_worker(folder: str, trust_remote_code: bool, block_size: int) -> None:
    global _WORKER
    from transformers import AutoTokenizer

    _WORKER = ChatEncoder(AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code), block_size)


#: Conversations to encode, each with its split: `(splits, [(where, messages), ...])`.
Group = tuple[list[str], list[tuple[str, list[dict]]]]


def _encode_in_worker(group: Group) -> tuple[list[str], list[Row]]:
    assert _WORKER is not None, "the worker's initializer did not run"
    return group[0], _WORKER.encode(group[1])


def _groups(records: Iterator[tuple[str, list[dict]]], cfg: Config) -> Iterator[Group]:
    """Records in groups of :data:`GROUP`, each record with its split (:func:`split_of` of its
    index in the source)."""
    d = cfg.data
    names: list[str] = []
    items: list[tuple[str, list[dict]]] = []
    for index, item in enumerate(records):
        names.append(split_of(index, d.seed, d.val_fraction, d.test_fraction))
        items.append(item)
        if len(items) == GROUP:
            yield names, items
            names, items = [], []
    if items:
        yield names, items


@dataclass(slots=True)
class _SplitStats:
    """One split's counts, as its manifest entry states them."""

    rows: int = 0
    """Rows written (conversations kept)."""
    assistant_tokens: int = 0
    """Tokens the loss counts: the assistant's, within the rows."""
    cut: int = 0
    """Conversations longer than a row, cut at it."""
    dropped: int = 0
    """Conversations with no assistant token within a row, left out."""


def prepare_chat(cfg: Config, store: ObjectStore, dataset_uri: str, source: pretrained.ModelSource) -> dict[str, Any]:
    """Data prep of `data.format: chat` (see the module docstring): the shards of every split
    and the manifest (written last), which is returned."""
    d, block = cfg.data, cfg.model.block_size
    if d.source in BUILTIN_SOURCES:
        raise DataError(
            f"data.source {d.source or '(empty)'!r}: data.format: chat needs a JSON Lines object (or a prefix of "
            "them) of conversations; set data.source"
        )
    with tempfile.TemporaryDirectory(prefix="kftrain-tokenizer-") as tmp:
        tokenizer = load_chat_tokenizer(source, Path(tmp), cfg.model.trust_remote_code)
        vocab_size = len(tokenizer)
        dtype = token_dtype(vocab_size)
        encoder = ChatEncoder(tokenizer, block)
        writers = {split: ShardWriter(store, dataset_uri, split, d.shard_rows, kind="rows") for split in SPLITS}
        stats = {split: _SplitStats() for split in SPLITS}
        reading = _Reading()
        pool = (
            ProcessPoolExecutor(
                d.num_proc,
                initializer=_start_worker,
                initargs=(tokenizer.name_or_path, cfg.model.trust_remote_code, block),
            )
            if d.num_proc > 1
            else None
        )
        encode = (lambda group: (group[0], encoder.encode(group[1]))) if pool is None else _encode_in_worker
        try:
            groups = _groups(chat_records(cfg, reading), cfg)
            for names, rows in _bounded_map(pool, encode, groups, ahead=2 * d.num_proc):
                _write_group(rows, names, writers, stats, dtype)
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    if reading.records == 0:
        hint = (
            f"its first record is longer than data.max_bytes {d.max_bytes}; raise data.max_bytes"
            if reading.stopped_at_max_bytes
            else f"it is empty or holds blank lines only; data.format: chat reads one JSON object with a "
            f"{d.messages_field!r} list per line"
        )
        raise DataError(f"data.source {d.source}: no conversation read ({len(reading.objects)} object(s)): {hint}")
    splits = {}
    for split, writer in writers.items():
        shards = writer.close()
        if not shards:
            raise DataError(_empty_split(cfg, split, reading.records, stats))
        s = stats[split]
        splits[split] = {**asdict(s), "shards": [sh.as_dict() for sh in shards]}
    total = {f.name: sum(getattr(s, f.name) for s in stats.values()) for f in fields(_SplitStats)}
    _log_counts(reading.records, total, block)
    manifest: dict[str, Any] = {
        "format": CHAT_FORMAT,
        "source": d.source,
        "vocab_size": vocab_size,
        "tokenizer": pretrained.tokenizer_record(source, vocab_size),
        "block_size": block,
        "pad_id": encoder.pad_id,
        "dtype": dtype.name,
        "conversations": reading.records,
        **total,
        "splits": splits,
    }
    store.put_bytes(join_uri(dataset_uri, MANIFEST), json.dumps(manifest, indent=2).encode())
    return manifest


def _write_group(
    rows: list[Row], names: list[str], writers: dict[str, ShardWriter], stats: dict[str, _SplitStats], dtype
) -> None:
    for split in SPLITS:
        kept = [r for r, name in zip(rows, names, strict=True) if name == split and r.tokens is not None]
        s = stats[split]
        s.dropped += sum(1 for r, name in zip(rows, names, strict=True) if name == split and r.tokens is None)
        if not kept:
            continue
        tokens = np.stack([r.tokens for r in kept]).astype(dtype)
        mask = np.stack([r.mask for r in kept])
        writers[split].add(tokens=tokens, mask=mask)
        s.rows += len(kept)
        s.cut += sum(r.cut for r in kept)
        s.assistant_tokens += int(mask[:, 1:].sum())


def _empty_split(cfg: Config, split: str, records: int, stats: dict[str, _SplitStats]) -> str:
    d = cfg.data
    dropped = stats[split].dropped
    why = (
        f"{dropped} conversation(s) of it were dropped as no assistant token fit in model.block_size "
        f"{cfg.model.block_size}"
        if dropped
        else "no record fell into it"
    )
    if split == "train":
        fix = "use more conversations (data.source, data.max_bytes) or smaller data.val_fraction/data.test_fraction"
    else:
        fix = f"use more conversations (data.source, data.max_bytes) or a larger data.{split}_fraction"
    if dropped:
        fix += " or a larger model.block_size"
    return f"data.source {d.source}: the {split} split of its {records} conversation(s) is empty ({why}); {fix}"


def _log_counts(records: int, total: dict[str, int], block: int) -> None:
    log.info(
        "chat data: %d conversations -> %d rows of %d tokens, %d assistant tokens to learn",
        records,
        total["rows"],
        block + 1,
        total["assistant_tokens"],
    )
    if total["cut"] or total["dropped"]:
        log.warning(
            "chat data: of the conversations longer than model.block_size + 1 = %d tokens, %d were cut at it and %d "
            "dropped, with no assistant token left within it; a larger model.block_size keeps more",
            block + 1,
            total["cut"],
            total["dropped"],
        )


def take_rows(arrays: dict[str, np.ndarray], idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `idx` of a decoded shard as (input ids, labels), int64: the labels are the next
    tokens, -100 where the loss mask is 0."""
    tokens = torch.from_numpy(arrays["tokens"][idx].astype(np.int64))
    counted = torch.from_numpy(arrays["mask"][idx, 1:].astype(bool))
    labels = tokens[:, 1:].masked_fill(~counted, IGNORE)
    return tokens[:, :-1].contiguous(), labels


def _rows(info: ShardInfo) -> int:
    return info.items


def chat_stream(cfg: Config, manifest: dict) -> tuple[Callable[[ShardInfo], int], Callable]:
    """How to stream a chat dataset (`trainer/streaming.py`): a shard's items are its rows, a
    batch is :func:`take_rows`; :class:`DataError` when the rows were laid out for another
    `model.block_size`."""
    prepared = manifest.get("block_size")
    if prepared != cfg.model.block_size:
        raise DataError(
            f"the chat dataset was prepared with model.block_size {prepared} (rows of {prepared} + 1 tokens), the "
            f"training config has {cfg.model.block_size}; prepare the data again with this model.block_size"
        )
    return _rows, take_rows


def evaluation_rows(store: ObjectStore, dataset_uri: str, max_items: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `max_items` rows of a chat dataset's test split as (input ids, labels)."""
    manifest = read_manifest(store, dataset_uri, CHAT_FORMAT)
    shards = split_shards(manifest, "test", dataset_uri)
    return first_items(store, dataset_uri, shards, _rows, take_rows, max_items)
