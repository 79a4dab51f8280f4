"""The built-in causal language-model task: a GPT-2-architecture model over the tokens of
`data.tokenizer` (by default the bytes of the text: vocabulary 256, nothing to download).

Data prep streams the source (Python's standard library, one text or JSON Lines object, or every
such object under a prefix) in blocks of about a MiB, never holding more than a block per
process: each block is cut at line ends into its train, val and test parts (so every split
samples the whole corpus), tokenised by `data.num_proc` processes, and appended to its split's
shards as they fill. Shards are `.npy` arrays of the smallest unsigned dtype that holds the
vocabulary. Training reads non-overlapping windows of `block_size + 1` tokens within a shard;
nothing is widened but the windows of a batch.
"""

from __future__ import annotations

import json
import logging
import math
import sysconfig
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainer.config import Config, json_kind
from trainer.data_rules import (
    ARRAY_HINT,
    json_line,
    nothing_there,
    refuse_lone_surrogate,
    source_listing,
    source_store,
    text_chunks,
)
from trainer.gpt import GPT, GPTConfig
from trainer.progress import ProgressLine
from trainer.shards import (
    MANIFEST,
    SPLITS,
    TOKENS_FORMAT,
    DataError,
    ShardInfo,
    ShardWriter,
    read_manifest,
    split_shards,
    token_dtype,
)
from trainer.storage import ObjectStore, has_suffix, join_uri, read_chunks, version_size
from trainer.streaming import first_items
from trainer.tasks.base import Task, evaluating
from trainer.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer, parse_spec, tokenizer_from_json

HF_FOLDER = "huggingface"
TOKENIZER_FILE = "tokenizer.json"
#: Text is read, split and tokenised in blocks of about this many bytes.
BLOCK_BYTES = 1 << 20
JSONL_SUFFIXES = (".jsonl", ".json")
#: Labels of positions that do not count in the loss (torch's cross_entropy default).
IGNORE = -100

log = logging.getLogger("kftrain.data")


@dataclass(frozen=True)
class Marks:
    """The special tokens' text data prep puts around each document (a JSON Lines record, a text
    object, a file of the built-in corpus) for a pretrained model: what its tokenizer adds before
    a text (a Llama tokenizer's beginning-of-text token) and its end-of-text token. Nothing for a
    model trained here from scratch. A line end follows each document either way."""

    start: bytes = b""
    end: bytes = b""

    def around(self, text: bytes) -> bytes:
        """`text` as one document."""
        return self.start + text + self.end + b"\n"


NO_MARKS = Marks()


def stdlib_documents(marks: Marks = NO_MARKS) -> Iterator[bytes]:
    """Python's own standard-library source (always installed; sorted, so stable), file by file,
    each one document (:class:`Marks`)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if "site-packages" in rel or "test" in rel or "tests" in rel:
            continue
        yield marks.around(path.read_bytes())


def reads_as_jsonl(fmt: str, uri: str) -> bool:
    """Whether `data.format` `fmt` reads the object `uri` as JSON Lines text records (`jsonl`, or
    `auto` on a `.jsonl`/`.json` object)."""
    return fmt == "jsonl" or (fmt == "auto" and has_suffix(uri, *JSONL_SUFFIXES))


def _object_pieces(
    store: ObjectStore, uri: str, text_field: str, fmt: str = "auto", marks: Marks = NO_MARKS
) -> Iterator[bytes]:
    """One object's text in pieces of at most a block: as it is (`data.format: text`), or the
    `text_field` of each JSON Lines record, one record per line (`jsonl`); `auto` by the suffix.
    Each record, and a text object as a whole, is one document (:class:`Marks`): it ends in a
    line end, so the next object's first line never continues this one's last."""
    carry, number, last = b"", 0, b""
    jsonl = reads_as_jsonl(fmt, uri)
    for i, raw in enumerate(text_chunks(read_chunks(store, uri, BLOCK_BYTES), uri, "text or JSON Lines")):
        chunk = carry + raw
        if not jsonl:
            if i == 0:
                chunk = chunk.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark (Notepad's) is no text
                _warn_if_records(chunk, uri, fmt)
            if chunk and not last:  # the object's first text
                chunk = marks.start + chunk
            last = chunk[-1:] or last
            yield chunk
            continue
        *lines, carry = chunk.split(b"\n")
        for line in lines:
            number += 1
            if line.strip():
                yield marks.around(record_text(line, f"{uri} line {number}", text_field))
    if carry.strip():
        yield marks.around(record_text(carry, f"{uri} line {number + 1}", text_field))
    if last and (marks.end or last != b"\n"):  # a text object that is not empty
        yield marks.end + b"\n"


def _warn_if_records(chunk: bytes, uri: str, fmt: str) -> None:
    """Text read as plain text trains on its bytes as they are; an object whose first line is a
    JSON object is most likely records, whose keys and quotes the model would learn: say so once."""
    line = chunk.split(b"\n", 1)[0].strip()
    if not line.startswith(b"{"):
        return
    try:
        record = json.loads(line)
    except ValueError:
        return
    if isinstance(record, dict):
        chat = isinstance(record.get("messages"), list)
        log.warning(
            "%s is read as plain text (data.format: %s), JSON syntax included, but its first line is a JSON record; %s",
            uri,
            fmt,
            "set data.format: chat for records of messages"
            if chat
            else "set data.format: jsonl to train on each record's data.text_field",
        )


def record_text(line: bytes, where: str, field: str) -> bytes:
    """The `field` text of one JSON Lines record (`data.format: jsonl`), UTF-8; :class:`DataError`
    naming `where` (the object and line) when the line is not JSON or not a record holding that
    text (with a hint for chat records). A user's source is not an artifact kftrain wrote: it is
    named as data, not as a corrupt object to delete."""
    reads = f"data.format: jsonl reads JSON Lines, one object with a {field!r} text field (data.text_field) per line"
    record = json_line(line, where, reads)
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        chat = isinstance(record, dict) and isinstance(record.get("messages"), list)
        hint = "; records of `messages` are chat data: set data.format: chat" if chat else ""
        hint += f"; {ARRAY_HINT}" if isinstance(record, list) else ""
        if isinstance(record, dict) and field in record:  # there, but not text (a list of messages, a number)
            what = f"its {field!r} (data.text_field) is a JSON {json_kind(record[field])}, not text"
        else:
            keys = sorted(record) if isinstance(record, dict) else f"none: it is a JSON {json_kind(record)}"
            what = f"the record has no text field {field!r} (data.text_field); its keys: {keys}"
        raise DataError(f"{where}: {what}{hint}")
    refuse_lone_surrogate(record[field], where, field)
    return record[field].encode("utf-8")


def source_pieces(cfg: Config, progress: str = "", marks: Marks = NO_MARKS) -> Iterator[bytes]:
    """The configured source as pieces of text, in a fixed order, at most `data.max_bytes` in all,
    read from the source's own store (:func:`trainer.data_rules.source_store`), each document in
    its `marks`.
    With `progress` (what the reading is for), logs the bytes taken every few seconds and at the
    end, with percent and ETA against what will be read (the source's size, or `data.max_bytes`
    when smaller) where that is known: for plain text, not for JSON Lines records, whose text is
    less than their objects' bytes (was: against `data.max_bytes`, "16% ... eta 54s" of a source
    read in full 3 s later)."""
    d = cfg.data
    source = d.source or "python-stdlib"
    total, what = 0, f"reading {source}"
    if source == "python-stdlib":
        pieces = stdlib_documents(marks)
        total = d.max_bytes  # the built-in corpus is cut at it by design (its whole is tens of MB)
    else:
        store = source_store(cfg, source)
        listing = source_listing(store, source)
        if not listing:
            raise nothing_there(source)
        pieces = (piece for uri in listing for piece in _object_pieces(store, uri, d.text_field, d.format, marks))
        if any(reads_as_jsonl(d.format, uri) for uri in listing):
            what = f"reading the records' text of {source}"
        else:
            size = sum(version_size(version) for version in listing.values())
            total = min(size, d.max_bytes) if d.max_bytes else size
    left = d.max_bytes or math.inf
    line = ProgressLine(f"{progress}: {what}", total=total) if progress else None
    cut = False
    for taken, piece in enumerate(pieces):
        if marks.end and piece == marks.end + b"\n":  # a text object's end, not the source's text: not counted
            yield piece
            continue
        if left <= 0:
            if not piece or piece == b"\n":
                continue  # a piece without the source's text (a text object's line end) leaves nothing unread
            cut = True
            break
        if len(piece) > left:
            cut = True
            if marks != NO_MARKS:  # a document in marks is cut between its pieces, never inside a mark
                if not taken:  # nothing would be read at all
                    raise DataError(
                        f"data.max_bytes {d.max_bytes}: the first document of data.source {source} is larger "
                        f"({len(piece)} bytes or more, with its special tokens); raise data.max_bytes, or set it "
                        "to 0 to take the whole source"
                    )
                break
            piece = piece[: int(left)]
        left -= len(piece)
        if line is not None:
            line.add(len(piece))
        yield piece
    if line is not None:
        line.done()
    if cut and progress and source != "python-stdlib":  # the built-in corpus is cut by design
        log.warning(max_bytes_note(cfg))


def max_bytes_note(cfg: Config, after: str = "") -> str:
    """What data prep says when `data.max_bytes` left part of the user's source unread (the
    causal_lm default takes 4 MB); `after`: what it did take, where whole records count."""
    return (
        f"data.max_bytes {cfg.data.max_bytes} reached{f' after {after}' if after else ''}: the rest of data.source "
        f"{cfg.data.source} is not used; set data.max_bytes: 0 to take all of it, or a larger limit"
    )


def blocks(pieces: Iterator[bytes], size: int = 0) -> Iterator[bytes]:
    """Pieces regrouped into blocks of at least `size` bytes (default BLOCK_BYTES; the last may be
    shorter), each ending at a line end: a block's tail and the next block's head go to different
    splits (:func:`split_block`), so a line cut there was split between them (a text object is
    read in pieces of a MiB, cut anywhere). A line longer than half a block is cut at a
    character's start."""
    size = size or BLOCK_BYTES
    buf: list[bytes] = []
    held = 0
    for piece in pieces:
        buf.append(piece)
        held += len(piece)
        if held >= size:
            block = b"".join(buf)
            end = _block_end(block, size // 2)
            yield block[:end]
            buf, held = ([block[end:]], len(block) - end) if end < len(block) else ([], 0)
    if buf:
        yield b"".join(buf)


def _line_end(block: bytes, at: int) -> int:
    """The offset after the first line end at or after `at` (LF, CRLF, or a lone CR: an old Mac
    file's), or -1 for none."""
    ends = [i for i in (block.find(b"\n", at), block.find(b"\r", at)) if i != -1]
    if not ends:
        return -1
    i = min(ends)
    return i + 2 if block[i : i + 2] == b"\r\n" else i + 1


def _char_start(block: bytes, at: int) -> int:
    """`at`, moved back to the start of the UTF-8 character it falls in."""
    while 0 < at < len(block) and block[at] & 0xC0 == 0x80:  # a continuation byte
        at -= 1
    return at


def _block_end(block: bytes, within: int) -> int:
    """Where a block cut from a text ends: after its last line end, if one is among its last
    `within` bytes; else at the start of its last character."""
    last = max(block.rfind(b"\n"), block.rfind(b"\r"))
    if last >= len(block) - within:
        return last + 1
    return _char_start(block, len(block) - 1) if block[-1] & 0x80 else len(block)


#: How far past a split's share a cut may move to end at a line end (see :func:`_cut`).
LINE_END_REACH = 4096


def _cut(block: bytes, at: int, marks: Marks = NO_MARKS, before: int | None = None) -> int:
    """The first line end at or after `at` (so a line is never split between splits), within
    :data:`LINE_END_REACH` bytes and before `before` (the next cut's target: a line end past it
    would leave the split between them empty); where there is none (a long line), `at` itself,
    moved back to a character's start and out of a document mark: before a start mark, after an
    end mark (a cut through one left its halves as text tokens)."""
    if at >= len(block):
        return len(block)
    end = _line_end(block, at)
    if end != -1 and end - at <= LINE_END_REACH and (before is None or end < before):
        return end
    at = _char_start(block, at)
    for mark, opens in ((marks.start, True), (marks.end, False)):
        if mark:
            found = block.rfind(mark, max(0, at - len(mark) + 1), at + len(mark) - 1)
            if found != -1 and found < at < found + len(mark):
                return found if opens else found + len(mark)
    return at


#: A block is split piece by piece, each about this many bytes (cut at a line end): every split
#: then samples the whole corpus, also one of a few small files (a block's tail alone would be
#: its last file's).
SPLIT_PIECE_BYTES = 16 << 10


def split_block(block: bytes, val_fraction: float, test_fraction: float, marks: Marks = NO_MARKS) -> dict[str, bytes]:
    """A block's train, val and test parts: of each piece of about :data:`SPLIT_PIECE_BYTES`, its
    first (1 - val - test) share, then val, then test (each cut by :func:`_cut`)."""
    parts: dict[str, list[bytes]] = {"train": [], "val": [], "test": []}
    start = 0
    while start < len(block):
        end = _cut(block, start + SPLIT_PIECE_BYTES, marks)
        if len(block) - end < SPLIT_PIECE_BYTES // 2:  # no short last piece: its shares would be a few lines
            end = len(block)
        piece, n = block[start:end], end - start
        # A line end past the next cut's target is not taken: a text of long lines (one paragraph)
        # was all train, its val and test cut at the same line end, the piece's last.
        val_at, test_at = int(n * (1 - val_fraction - test_fraction)), int(n * (1 - test_fraction))
        a = _cut(piece, val_at, marks, before=test_at)
        b = max(a, _cut(piece, test_at, marks, before=n))
        parts["train"].append(piece[:a])
        parts["val"].append(piece[a:b])
        parts["test"].append(piece[b:])
        start = end
    return {split: b"".join(pieces) for split, pieces in parts.items()}


#: The tokenizer of this data-prep process (set once per worker: a tokenizer.json can be MBs).
_TOKENIZER: Tokenizer = ByteTokenizer()


#: Whether this process's tokenizer reads a text after a document's start mark otherwise than the
#: same text alone, by start mark (see :func:`_encode_documents`).
_READS_THE_START: dict[bytes, bool] = {}


def _use_tokenizer(raw: bytes | None) -> None:
    global _TOKENIZER
    _TOKENIZER = ByteTokenizer() if raw is None else tokenizer_from_json(raw, "the dataset's tokenizer")
    _READS_THE_START.clear()


def _encode_documents(text: bytes, marks: Marks) -> np.ndarray:
    """The token ids of `text`, each document as transformers' `tokenizer(document)` makes them.
    A tokenizer whose pre-tokenizer reads the start of its input specially (SentencePiece's `▁`
    before the first word only: Llama 2's, Mistral's) would read a document after the start mark
    as the middle of a text: such a tokenizer encodes each document on its own (the start mark's
    ids, then the document), the others the whole text at once."""
    if not marks.start:
        return _TOKENIZER.encode(text)
    start = _TOKENIZER.encode(marks.start)
    head, *documents = text.split(marks.start)
    if marks.start not in _READS_THE_START and documents:  # asked of real documents: their words are in its vocabulary
        _READS_THE_START[marks.start] = any(
            not np.array_equal(_TOKENIZER.encode(marks.start + doc), np.concatenate([start, _TOKENIZER.encode(doc)]))
            for doc in documents[:16]
        )
    if not _READS_THE_START.get(marks.start):
        return _TOKENIZER.encode(text)
    parts = [_TOKENIZER.encode(head)] + [ids for doc in documents for ids in (start, _TOKENIZER.encode(doc))]
    return np.concatenate(parts).astype(start.dtype, copy=False)


def tokenize_block(
    block: bytes, val_fraction: float, test_fraction: float, marks: Marks = NO_MARKS
) -> dict[str, np.ndarray]:
    """The token ids of a block's three parts, with this process's tokenizer."""
    parts = split_block(block, val_fraction, test_fraction, marks)
    return {split: _encode_documents(text, marks) for split, text in parts.items()}


def _bounded_map(pool: Executor | None, fn, items: Iterator, *args, ahead: int) -> Iterator:
    """`fn(item, *args)` for each item, in order, with at most `ahead` items in flight (so a
    huge source never queues up in memory)."""
    if pool is None:
        for item in items:
            yield fn(item, *args)
        return
    pending: deque[Future] = deque()
    for item in items:
        pending.append(pool.submit(fn, item, *args))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _windows(info: ShardInfo, block_size: int) -> int:
    return max(0, (info.items - 1) // block_size)


def _window_batch(tokens: np.ndarray, idx: np.ndarray, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows `idx` of a shard as (inputs, targets), widened to int64 only here."""
    rows = tokens[(idx * block_size)[:, None] + np.arange(block_size + 1)].astype(np.int64)
    return torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])


class CausalLMTask(Task):
    name = "causal_lm"
    item_name = "tokens"
    serving_input = "tokens"
    serving_dynamic_dims = (0, 1)

    def tokenizer(self, cfg: Config) -> Tokenizer:
        """The tokenizer data prep uses: `data.tokenizer` (a BPE learns from the start of the same
        stream it then tokenizes; a tokenizer.json is read from its own store)."""
        d = cfg.data
        uri = parse_spec(d.tokenizer).uri
        store = source_store(cfg, uri) if uri else None
        return load_tokenizer(d.tokenizer, store, sample=source_pieces(cfg), max_sample_bytes=d.tokenizer_sample_bytes)

    def tokenizer_record(self, cfg: Config, tokenizer: Tokenizer) -> dict[str, Any]:
        """What the manifest (and the model) records of the tokenizer: its kind and vocabulary,
        and a trained or given tokenizer.json itself (the model carries it into the export)."""
        info: dict[str, Any] = {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size}
        if tokenizer.kind != "bytes":
            info.update(file=TOKENIZER_FILE, json=tokenizer.to_json().decode("utf-8"))
        return info

    def document_marks(self, cfg: Config, tokenizer: Tokenizer) -> Marks:
        """What data prep puts around each document before tokenizing it (:class:`Marks`):
        nothing for a model trained here from scratch, whose documents are joined by line ends."""
        return NO_MARKS

    def prepare(self, cfg: Config, store: ObjectStore, dataset_uri: str) -> dict[str, Any]:
        d = cfg.data
        tokenizer = self.tokenizer(cfg)
        marks = self.document_marks(cfg, tokenizer)
        dtype = token_dtype(tokenizer.vocab_size)
        raw_tokenizer = None if tokenizer.kind == "bytes" else tokenizer.to_json()
        writers = {
            split: ShardWriter(store, dataset_uri, split, d.shard_rows * 1024, kind="tokens") for split in SPLITS
        }
        _use_tokenizer(raw_tokenizer)
        # Byte "tokenizing" is a copy: shipping blocks to worker processes only costs (4x slower
        # measured, bench/README.md), so the pool is for real tokenizers.
        pool = (
            ProcessPoolExecutor(d.num_proc, initializer=_use_tokenizer, initargs=(raw_tokenizer,))
            if d.num_proc > 1 and raw_tokenizer is not None
            else None
        )
        try:
            texts = blocks(source_pieces(cfg, progress="data prep", marks=marks))
            for ids in _bounded_map(
                pool, tokenize_block, texts, d.val_fraction, d.test_fraction, marks, ahead=2 * d.num_proc
            ):
                for split, tokens in ids.items():
                    if len(tokens):
                        writers[split].add(tokens=tokens.astype(dtype, copy=False))
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        source = d.source or "python-stdlib"
        block = cfg.model.block_size
        if not any(writer.items for writer in writers.values()):  # no shard or context length would help
            raise DataError(
                f"{source}: no text read from it (its objects are empty, or their records hold no text); put the "
                "text there, or point data.source at it"
            )
        splits = {}
        for split, writer in writers.items():
            shards = writer.close()
            if not any(_windows(sh, block) for sh in shards):
                # Larger shards help only tokens that are there, split over shards each shorter than a window.
                shards_help = ", a larger data.shard_rows" if writer.items > block else ""
                raise DataError(
                    f"{source}: the {split} split has {writer.items} tokens, no shard of which holds a window of "
                    f"model.block_size + 1 = {block + 1}; use more text (data.max_bytes, data.source){shards_help} "
                    "or a shorter context"
                )
            splits[split] = {"tokens": writer.items, "shards": [sh.as_dict() for sh in shards]}
        tokenizer_info = self.tokenizer_record(cfg, tokenizer)
        if raw_tokenizer is not None:
            # Beside the dataset for people and tools.
            store.put_bytes(join_uri(dataset_uri, TOKENIZER_FILE), raw_tokenizer)
        manifest: dict[str, Any] = {
            "format": TOKENS_FORMAT,
            "source": source,
            "vocab_size": tokenizer.vocab_size,
            "tokenizer": tokenizer_info,
            "dtype": dtype.name,
            "splits": splits,
        }
        if marks != NO_MARKS:
            manifest["document_marks"] = {"start": marks.start.decode(), "end": marks.end.decode()}
        store.put_bytes(join_uri(dataset_uri, MANIFEST), json.dumps(manifest, indent=2).encode())
        return manifest

    def stream(self, cfg, manifest):
        block = cfg.model.block_size
        return (lambda info: _windows(info, block)), (lambda tokens, idx: _window_batch(tokens, idx, block))

    def build_model(self, cfg, manifest):
        m = cfg.model
        gpt = GPTConfig(
            vocab_size=manifest["vocab_size"],
            block_size=m.block_size,
            n_layer=m.n_layer,
            n_head=m.n_head,
            n_embd=m.n_embd,
            dropout=m.dropout,
        )
        # The model carries its tokenizer: evaluation and the export need no dataset to decode.
        tokenizer = manifest.get("tokenizer") or {"kind": "bytes", "vocab_size": manifest["vocab_size"]}
        meta = {"architecture": gpt.as_dict(), "tokenizer": tokenizer, "vocab_size": manifest["vocab_size"]}
        return GPT(gpt), meta

    def model_from_meta(self, meta):
        return GPT(GPTConfig(**meta["architecture"]))

    def loss(self, model, batch):
        x, y = batch
        logits = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

    def synthetic_batch(self, cfg, manifest, size):
        vocab, block = manifest["vocab_size"], cfg.model.block_size
        return torch.randint(0, vocab, (size, block)), torch.randint(0, vocab, (size, block))

    def items_per_sample(self, cfg):
        return cfg.model.block_size

    def flops_per_item(self, model, cfg):
        return float(model.flops_per_token())

    @torch.no_grad()
    def _mean_loss(self, model, dataset, device, batch_size):
        # The mean over the tokens that count (every token of a window; a chat row labels only
        # the assistant's), whatever the batch size.
        total, count = 0.0, 0
        with evaluating(model):
            for start in range(0, len(dataset), batch_size):
                x, y = (t[start : start + batch_size].to(device) for t in dataset.tensors)
                n = int((y != IGNORE).sum())
                if n:
                    total += float(self.loss(model, (x, y))) * n
                    count += n
        return total / max(count, 1)

    def validate(self, model, dataset, device, batch_size):
        loss = self._mean_loss(model, dataset, device, batch_size)
        return {"val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0))}

    def evaluate(self, model, meta, store, dataset_uri, max_items):
        from torch.utils.data import TensorDataset

        manifest = read_manifest(store, dataset_uri, TOKENS_FORMAT)
        block = meta["architecture"]["block_size"]
        shards = split_shards(manifest, "test", dataset_uri)
        x, y = first_items(
            store, dataset_uri, shards, lambda i: _windows(i, block), lambda t, i: _window_batch(t, i, block), max_items
        )
        loss = self._mean_loss(model, TensorDataset(x, y), torch.device("cpu"), 8)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "test_tokens": int(x.numel())}

    def serving_module(self, model, meta):
        gen = torch.Generator().manual_seed(0)
        return model.eval(), torch.randint(
            0, meta["vocab_size"], (2, meta["architecture"]["block_size"]), generator=gen
        )

    def extra_exports(self, model, meta):
        from trainer.hf_export import hf_folder

        raw = meta.get("tokenizer", {}).get("json") if isinstance(meta.get("tokenizer"), dict) else None
        files = hf_folder(model, raw.encode("utf-8") if raw else None)
        return {f"{HF_FOLDER}/{name}": data for name, data in files.items()}
