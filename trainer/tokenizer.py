"""Tokenizers of the causal LM: bytes, a trained byte-level BPE, or a Hugging Face tokenizer.json.

`data.tokenizer` takes one of three forms (:func:`parse_spec`):

- ``bytes`` (the default): one token per byte, id = byte value, 256 ids, no special token and
  no dependency;
- ``bpe:<vocab_size>``: a byte-level BPE trained during data prep with the Hugging Face
  ``tokenizers`` library on a sample of the source, GPT-2 style (ByteLevel pre-tokenizer and
  decoder, all 256 bytes in the alphabet so any input is encodable, ``<|endoftext|>`` special);
- the URI of a ``tokenizer.json`` (``s3://``, ``minio://``, a path) in the ``tokenizers`` format.

Whatever the kind, :meth:`Tokenizer.to_json` is the ``tokenizer.json`` stored beside the dataset
and shipped in the Hugging Face export, so training, evaluation and serving share one definition.

Only the standard library is imported at module level: the config imports :func:`parse_spec`, and
compiling pipelines must not import numpy; ``bytes`` must work without ``tokenizers``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from trainer.k8s_formats import show
from trainer.storage import ObjectNotFound, ObjectStore, has_suffix, typed_location_problem

if TYPE_CHECKING:
    import numpy as np
    import tokenizers

KINDS = ("bytes", "bpe", "file")
#: The one special token of a trained BPE: the document separator, named as in GPT-2.
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN,)
#: 256 byte tokens, the specials, and at least one merge (fewer would be `bytes` with extra steps).
MIN_BPE_VOCAB = 256 + len(SPECIAL_TOKENS) + 1
#: Far above any useful size (GPT-4 class: ~200k); it bounds the trainer's memory on a typo.
MAX_BPE_VOCAB = 2**20
_FORMS = (
    "use `bytes` (one token per byte, the default), "
    f"`bpe:<vocab_size>` (train a byte-level BPE, vocab_size {MIN_BPE_VOCAB}..{MAX_BPE_VOCAB}) "
    "or the URI of a Hugging Face tokenizer.json (s3://bucket/key.json, minio://bucket/key.json or a path)"
)
_WHAT_TO_DO = (
    "data.tokenizer must name a Hugging Face tokenizer.json (as written by tokenizers' Tokenizer.save "
    "or a transformers tokenizer's save_pretrained); or use `bytes` or `bpe:<vocab_size>`"
)
# Bytes that are not valid UTF-8, after `decode("utf-8", "surrogateescape")`: U+DC80..U+DCFF.
_ESCAPED = re.compile("([\udc80-\udcff]+)")
# A line break before a non-space character: GPT-2's pre-tokenizer regex makes that break a word
# of its own, so text cut just before it encodes to the same ids as the whole. (Cutting after it
# would not: a run of breaks at the end of a text is one word, inside it the last break is apart.)
_LINE_START = re.compile(r"\n(?=\S)")
#: Characters per piece and pieces per library call when a long text is encoded in parts: one
#: call on megabytes of text is single-threaded and holds every token's string and offsets at once.
_PIECE_CHARS = 64 * 1024
_PIECES_PER_CALL = 16


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """A parsed `data.tokenizer`: `kind`, the BPE `vocab_size` (bpe) or the `uri` (file)."""

    kind: str
    vocab_size: int = 0
    uri: str = ""


def parse_spec(spec: str) -> TokenizerSpec:
    """Parse a `data.tokenizer` value; ValueError naming the value and the three accepted forms."""
    if not isinstance(spec, str):
        raise ValueError(f"tokenizer {spec!r} is not a string: {_FORMS}")
    if spec == "bytes":
        return TokenizerSpec("bytes", vocab_size=256)
    if spec.startswith("bpe:"):
        size = spec[4:]
        if not size.isdigit() or not MIN_BPE_VOCAB <= int(size) <= MAX_BPE_VOCAB:
            raise ValueError(f"tokenizer {spec!r}: the BPE vocabulary size is out of range or not an integer; {_FORMS}")
        return TokenizerSpec("bpe", vocab_size=int(size))
    if has_suffix(spec, ".json"):
        try:
            problem = typed_location_problem(spec)
        except ValueError as exc:
            raise ValueError(f"tokenizer {spec!r}: {exc}; {_FORMS}") from None
        if problem:
            raise ValueError(f"tokenizer {spec!r} {problem}")
        return TokenizerSpec("file", uri=spec)
    raise ValueError(f"tokenizer {show(spec)} is not a known form: {_FORMS}")


class Tokenizer(Protocol):
    """What data prep, training and export need from a tokenizer."""

    kind: str
    """`bytes`, `bpe` (trained here) or `file` (loaded from a tokenizer.json)."""
    vocab_size: int
    """Token ids are below this; the model's vocabulary follows it."""
    eos_id: int | None
    """Id of `<|endoftext|>` (the document separator); None when the tokenizer has none."""

    def encode(self, data: bytes) -> np.ndarray:
        """Token ids of `data`, in the smallest unsigned dtype that holds `vocab_size`."""

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes that `ids` stand for."""

    def specials_before_text(self) -> list[str]:
        """The special tokens (their text) the tokenizer puts before one text."""

    def to_json(self) -> bytes:
        """The tokenizer as a Hugging Face tokenizer.json."""


@lru_cache(maxsize=1)
def byte_chars() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable character table of byte-level tokenizers, by byte.

    Printable Latin-1 bytes stand for themselves; the rest (controls, space, ...) are shifted to
    U+0100 upwards in byte order, so every token of a byte-level vocabulary is visible text.
    """
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    table, extra = [], 0
    for b in range(256):
        if b in keep:
            table.append(chr(b))
        else:
            table.append(chr(256 + extra))
            extra += 1
    return tuple(table)


def byte_tokenizer_json() -> bytes:
    """tokenizer.json of the `bytes` tokenizer: byte-level BPE without merges, so id = byte value."""
    # use_regex=False: with no merges, splitting into words changes nothing but costs time.
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {ch: b for b, ch in enumerate(byte_chars())},
            "merges": [],
        },
    }
    return json.dumps(tokenizer, ensure_ascii=False).encode()


def _check_ids(ids: np.ndarray, vocab_size: int) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size}), got {int(ids.min())}..{int(ids.max())}")


class ByteTokenizer:
    """One token per byte (id = byte value); needs no library and no file."""

    kind = "bytes"
    vocab_size = 256
    eos_id = None

    def encode(self, data: bytes) -> np.ndarray:
        """The bytes themselves as uint8 ids."""
        import numpy as np

        return np.frombuffer(bytes(data), dtype=np.uint8).copy()

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes whose values are `ids`; ValueError for an id above 255."""
        import numpy as np

        arr = np.asarray(ids if not isinstance(ids, Iterator) else list(ids)).astype(np.int64, copy=False)
        _check_ids(arr, 256)
        return arr.astype(np.uint8).tobytes()

    def specials_before_text(self) -> list[str]:
        """None: bytes have no special tokens."""
        return []

    def to_json(self) -> bytes:
        """The equivalent byte-level tokenizer.json (see :func:`byte_tokenizer_json`)."""
        return byte_tokenizer_json()


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer`: a BPE trained here or a loaded tokenizer.json.

    For a byte-level tokenizer (ByteLevel decoder, all 256 byte tokens in the vocabulary) both
    directions are exact on any bytes: bytes that are not valid UTF-8 become their byte tokens
    (the library only takes text), and :meth:`decode` maps tokens back to bytes itself instead of
    the library's lossy UTF-8 step. Other tokenizers encode invalid UTF-8 as U+FFFD and decode
    through the library, exactly as `transformers` would.
    """

    def __init__(self, tok: tokenizers.Tokenizer, kind: str, raw: bytes | None = None) -> None:
        from tokenizers import decoders, pre_tokenizers

        # Data prep reads whole documents, as transformers' `tokenizer(text)` does unless asked to
        # cut: a tokenizer.json's own truncation (`max_length`) or padding would cut or pad each in silence.
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok
        self.kind = kind
        self._raw = raw
        vocab = tok.get_vocab(with_added_tokens=True)
        # The largest id, not the count: a tokenizer.json may leave holes in its ids.
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0
        self.eos_id = tok.token_to_id(EOS_TOKEN)
        pre = tok.pre_tokenizer
        self._splittable = (
            tok.normalizer is None
            and isinstance(pre, pre_tokenizers.ByteLevel)
            and pre.use_regex
            and not pre.add_prefix_space
        )
        self._byte_ids: list[int] | None = None
        self._id_bytes: list[bytes] | None = None
        if isinstance(tok.decoder, decoders.ByteLevel):
            byte_ids = [tok.token_to_id(ch) for ch in byte_chars()]
            if None not in byte_ids:
                self._byte_ids = byte_ids
            char_byte = {ch: b for b, ch in enumerate(byte_chars())}
            id_bytes = [b""] * self.vocab_size
            for token, i in vocab.items():
                # As the library's ByteLevel decoder: a token with a character outside the table
                # (an added token written as plain text, e.g. with a space) stands for its UTF-8.
                if all(ch in char_byte for ch in token):
                    id_bytes[i] = bytes(char_byte[ch] for ch in token)
                else:
                    id_bytes[i] = token.encode()
            self._id_bytes = id_bytes

    def encode(self, data: bytes) -> np.ndarray:
        """Token ids of `data` (no special tokens added), in the smallest dtype that holds them."""
        import numpy as np

        from trainer.shards import token_dtype

        text = bytes(data).decode("utf-8", errors="surrogateescape")
        pieces = _ESCAPED.split(text)
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            if not piece:
                continue
            if i % 2 == 0:
                ids.extend(self._encode_text(piece))
            elif self._byte_ids is not None:
                ids.extend(self._byte_ids[ord(ch) - 0xDC00] for ch in piece)
            else:
                ids.extend(self._tok.encode("\ufffd" * len(piece), add_special_tokens=False).ids)
        return np.array(ids, dtype=token_dtype(self.vocab_size))

    def _encode_text(self, text: str) -> list[int]:
        if not self._splittable or len(text) <= 2 * _PIECE_CHARS:
            return self._tok.encode(text, add_special_tokens=False).ids
        pieces, start = [], 0
        while len(text) - start > _PIECE_CHARS:
            cut = _LINE_START.search(text, start + _PIECE_CHARS)
            if cut is None:
                break
            pieces.append(text[start : cut.start()])
            start = cut.start()
        pieces.append(text[start:])
        ids: list[int] = []
        for first in range(0, len(pieces), _PIECES_PER_CALL):
            batch = pieces[first : first + _PIECES_PER_CALL]
            for enc in self._tok.encode_batch_fast(batch, add_special_tokens=False):
                ids.extend(enc.ids)
        return ids

    def specials_before_text(self) -> list[str]:
        """The special tokens the tokenizer's post-processor puts before one text, as their text:
        what transformers' `tokenizer(text)` begins with (a Llama tokenizer's beginning-of-text
        token; nothing for GPT-2's or Qwen's)."""
        bare = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        at = next((at for at in range(len(full) - len(bare) + 1) if full[at : at + len(bare)] == bare), 0)
        return [self._tok.id_to_token(i) for i in full[:at]]

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes that `ids` stand for (special tokens as their text, like transformers)."""
        import numpy as np

        arr = np.asarray(ids if not isinstance(ids, Iterator) else list(ids)).astype(np.int64, copy=False)
        _check_ids(arr, self.vocab_size)
        if self._id_bytes is not None:
            table = self._id_bytes
            return b"".join(table[i] for i in arr.tolist())
        return self._tok.decode(arr.tolist(), skip_special_tokens=False).encode()

    def to_json(self) -> bytes:
        """The tokenizer.json: the file as it was read, or the trained tokenizer serialised."""
        return self._raw if self._raw is not None else self._tok.to_str().encode()


def tokenizer_from_json(raw: bytes, where: str, kind: str = "file") -> HFTokenizer:
    """Load a tokenizer.json's bytes; :class:`DataError` naming `where` when they are not one."""
    from tokenizers import Tokenizer as RustTokenizer

    from trainer.shards import DataError

    try:
        json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"tokenizer {where} is not JSON ({exc}): {_WHAT_TO_DO}") from None
    try:
        tok = RustTokenizer.from_str(raw.decode())
    except Exception as exc:  # the library raises plain Exception for a malformed tokenizer
        raise DataError(f"tokenizer {where} is JSON but not a tokenizer ({exc}): {_WHAT_TO_DO}") from None
    out = HFTokenizer(tok, kind, raw=bytes(raw))
    if out.vocab_size == 0:
        raise DataError(f"tokenizer {where} has an empty vocabulary: {_WHAT_TO_DO}")
    return out


def train_bpe(sample: Iterable[bytes], vocab_size: int, max_sample_bytes: int = 0) -> HFTokenizer:
    """Train a byte-level BPE of at most `vocab_size` tokens on `sample` (chunks of the source).

    The same chunks give the same tokenizer. Reads at most `max_sample_bytes` (0: all). The
    vocabulary is smaller than asked when the sample has too few repeated pairs; the model
    follows `vocab_size` of the result.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from trainer.shards import DataError

    seen = 0

    def texts() -> Iterator[str]:
        nonlocal seen
        for chunk in sample:
            if max_sample_bytes:
                if seen >= max_sample_bytes:
                    return
                chunk = chunk[: max_sample_bytes - seen]
            if not chunk:
                continue
            seen += len(chunk)
            # A chunk may end inside a multi-byte character: replacing it only touches the
            # sample's statistics, never the data, which encode() reads losslessly.
            yield chunk.decode("utf-8", errors="replace")

    tok = RustTokenizer(models.BPE())
    # add_prefix_space=False keeps decode(encode(x)) == x; the GPT-2 regex stops merges across words.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a pair seen once is noise of the sample, not a pattern of the source
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    if seen == 0:
        raise DataError("the sample for training the BPE tokenizer is empty: check data.source")
    out = HFTokenizer(tok, "bpe")
    if out.vocab_size < vocab_size:  # never silent: the model is that much smaller than asked
        logging.getLogger("kftrain.data").warning(
            "data.tokenizer bpe:%d: the %d bytes of text it trained on hold merges for %d tokens only, the model's "
            "vocabulary (more text, or a smaller bpe:N, to match)",
            vocab_size,
            seen,
            out.vocab_size,
        )
    return out


def load_tokenizer(
    spec: str,
    store: ObjectStore | None = None,
    sample: Iterable[bytes] | None = None,
    *,
    max_sample_bytes: int = 0,
) -> Tokenizer:
    """The tokenizer `spec` (a `data.tokenizer` value) names.

    `bytes` needs nothing; a tokenizer.json URI is read through `store`; `bpe:N` is trained on
    `sample` (chunks of the source, at most `max_sample_bytes` of them read; 0: all).
    Raises :class:`trainer.shards.DataError` naming the object when a file is missing or is not a
    tokenizer, and ValueError for a malformed `spec`.
    """
    from trainer.shards import DataError

    parsed = parse_spec(spec)
    if parsed.kind == "bytes":
        return ByteTokenizer()
    if parsed.kind == "bpe":
        if sample is None:
            raise ValueError(f"tokenizer {spec!r}: training a BPE needs a sample of the source")
        return train_bpe(sample, parsed.vocab_size, max_sample_bytes)
    if store is None:
        raise ValueError(f"tokenizer {spec!r}: reading a tokenizer.json needs a store")
    try:
        raw = store.get_bytes(parsed.uri)
    except ObjectNotFound:
        raise DataError(
            f"tokenizer {parsed.uri}: no such object; upload the tokenizer.json there or fix data.tokenizer"
        ) from None
    return tokenizer_from_json(raw, parsed.uri)
