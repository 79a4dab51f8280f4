"""What data prep accepts from a source, as small pure rules, and the check that runs them first.

- **Class labels** (`data.label_column`) are compared after :func:`canonical_label`: surrounding
  whitespace is stripped, and a label that reads as a decimal number is one class per number,
  named in its plain shortest form (`"1"`, `"1.0"`, `" 1"` and `"+1"` are class `1`; `"0.50"` is
  `0.5`). Other labels are kept as written, case included (`Cat` and `cat` stay two classes). An
  empty label, or one that marks a missing value (:func:`missing_label`: `NaN`, `NA`, `N/A`,
  `NULL`, ...), is an error naming the row.
- **Feature values** must be finite numbers that float32 (the model's and the shards' type)
  holds: NaN, infinities and magnitudes above ~3.4e38 (`1e308`) are refused by
  :func:`bad_feature`, naming the row, line and column, before a single shard is written.
- **Text sources** (CSV, text, JSON Lines) must be UTF-8 text: the first chunk of every object
  is sniffed (:func:`binary_reason`), and a NUL byte or bytes that are not UTF-8 make it an error
  naming the object and, where its first bytes tell, what it is (an ELF executable, gzip, Parquet).
- **File suffixes** are compared case-blind (:func:`trainer.storage.has_suffix`): `CORPUS.JSONL`
  is JSON Lines.
- **The source is checked before any step** (:func:`check_source`): it exists and is readable,
  it is the kind of object its task reads, and it is text (and a `data.tokenizer` file exists),
  so a wrong `data.source` fails within seconds naming the field and the URI instead of inside
  data prep or training.
"""

from __future__ import annotations

import codecs
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any

import numpy as np

from trainer.config import Config
from trainer.shards import DataError
from trainer.storage import (
    CHECK_BUDGET_S,
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    answer_within,
    check_deadline,
    has_suffix,
    join_uri,
    open_store,
    parse_uri,
    under_setting,
    version_size,
)
from trainer.tokenizer import parse_spec

log = logging.getLogger("kftrain.data")

#: Sources that are built in, not objects in a store.
BUILTIN_SOURCES = ("", "digits", "python-stdlib")
#: Bytes of an object's start read to tell text from binary before data prep.
HEAD_BYTES = 64 * 1024
#: Objects under a causal_lm prefix whose start is sniffed before any step (data prep sniffs every one).
CHECK_OBJECTS = 16
#: The largest magnitude float32 holds; a feature beyond it cannot reach the model.
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: Suffixes of formats the classification task does not read (it reads CSV text).
NOT_CSV = {
    ".jsonl": "JSON Lines",
    ".json": "JSON",
    ".parquet": "Parquet",
    ".npz": "numpy",
    ".npy": "numpy",
    ".xlsx": "Excel",
    ".xls": "Excel",
}
#: First bytes that name a binary format, for the error message.
_MAGIC = (
    (b"\x7fELF", "an ELF executable", ""),
    (b"\xcf\xfa\xed\xfe", "a Mach-O executable", ""),
    (b"MZ", "a Windows executable", ""),
    (b"\x1f\x8b", "gzip-compressed", "decompress it first"),
    (b"BZh", "bzip2-compressed", "decompress it first"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first"),
    (b"PK\x03\x04", "a zip archive", "unpack it first"),
    (b"PAR1", "a Parquet file", ""),
    (b"\x93NUMPY", "a numpy array", ""),
    (b"%PDF-", "a PDF document", ""),
    (b"\x89PNG", "a PNG image", ""),
    (b"\xff\xd8\xff", "a JPEG image", ""),
    (b"\xff\xfe", "UTF-16 text", "save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text", "save it as UTF-8"),
)
# A decimal number as people write one in a table: no `_`, `nan` or `inf` (those stay text).
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def canonical_label(raw: str) -> str:
    """The class a label cell names (see the module docstring): whitespace stripped, a decimal
    number in its plain shortest form, anything else as written."""
    text = raw.strip()
    if not _NUMBER.fullmatch(text):
        return text
    value = Decimal(text)
    if value.is_zero():
        return "0"
    value = value.normalize()
    # Plain notation for ordinary magnitudes; scientific beyond, so `1e999999` stays short.
    return format(value, "f") if -30 < value.adjusted() < 40 else str(value)


#: Label cells that mark a missing value (pandas' `read_csv` defaults, R's `NA`, spreadsheets' `#N/A`), casefolded.
#: `None` is not among them: it is a common class name ("no defect").
MISSING_LABELS = frozenset(
    {"nan", "-nan", "na", "n/a", "#n/a", "#n/a n/a", "#na", "<na>", "null", "1.#ind", "-1.#ind", "1.#qnan", "-1.#qnan"}
)


def missing_label(label: str) -> bool:
    """Whether a class name (:func:`canonical_label`'s) is empty or marks a missing value
    (:data:`MISSING_LABELS`): a row without a class, which no class of its own may stand for."""
    return not label or label.casefold() in MISSING_LABELS


def class_order(labels: Iterable[str]) -> list[str]:
    """Class names in index order: by value when every class is a number (`-1`, `2`, `10`), else
    shorter first, then alphabetical (so `2` still comes before `10` among other names)."""
    names = set(labels)
    if names and all(_NUMBER.fullmatch(n) for n in names):
        return sorted(names, key=lambda n: (Decimal(n), n))
    return sorted(names, key=lambda s: (len(s), s))


def bad_feature(x: np.ndarray) -> tuple[int, int, str] | None:
    """The first cell of a float64 batch (rows x features) that float32 cannot carry, as (row,
    column, what is wrong); None when every cell is a finite number within float32's range."""
    bad = ~np.isfinite(x)
    bad |= np.abs(np.where(bad, 0.0, x)) > FLOAT32_MAX
    if not bad.any():
        return None
    i, j = (int(k) for k in np.argwhere(bad)[0])
    value = float(x[i, j])
    if math.isnan(value):
        return i, j, "is NaN (not a number)"
    if math.isinf(value):
        return i, j, "is infinite"
    return i, j, f"overflows float32, the model's feature type (at most ±{FLOAT32_MAX:.4g})"


def binary_reason(head: bytes, complete: bool = False) -> str | None:
    """Why `head`, the first bytes of an object, is not UTF-8 text; None when it is.

    `complete`: `head` is the whole object (else a multi-byte character cut at its end is fine)."""
    nul = head.find(b"\0")
    invalid = None
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=complete)
    except UnicodeDecodeError as exc:
        invalid = exc.start
    if nul < 0 and invalid is None:
        return None
    for magic, kind, hint in _MAGIC:
        if head.startswith(magic):
            return f"is {kind}, not UTF-8 text" + (f" ({hint})" if hint else "")
    lf = ends_in_lf(head)
    if nul >= 0 and (invalid is None or nul <= invalid):
        return f"is binary, not UTF-8 text (a NUL byte at offset {nul}, line {line_breaks(head[:nul], lf) + 1})"
    line = line_breaks(head[:invalid], lf) + 1
    return f"is not UTF-8 text (line {line}: byte 0x{head[invalid]:02x} at offset {invalid}; save it as UTF-8)"


def ends_in_lf(head: bytes) -> bool:
    """Whether an object whose first bytes are `head` ends its lines in LF (CRLF too), else CR."""
    return b"\n" in head or b"\r" not in head


def line_breaks(data: bytes, lf: bool | None) -> int:
    """The line ends in `data`, of an object whose lines end in LF (CRLF too; a CR elsewhere is no
    line end) or, not `lf`, in CR alone (was: LF counted alone, so every error in a file of CR line
    ends said line 1); None: no line end seen yet, none counted."""
    return 0 if lf is None else data.count(b"\n" if lf else b"\r")


def text_chunks(chunks: Iterable[bytes], uri: str, what: str) -> Iterator[bytes]:
    """`chunks` of the object at `uri` unchanged, as long as they are UTF-8 text: the first one
    passes :func:`binary_reason`, and every later byte decodes (was: only the head was checked, so
    a bad byte further on was replaced where a tokenizer decodes the text). `what` names the text
    expected (`CSV`, `text or JSON Lines`) in the error."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = lines = 0
    lf: bool | None = None  # how the object ends its lines: decided at its first line end
    for chunk in chunks:
        if lf is None and (b"\n" in chunk or b"\r" in chunk):
            lf = ends_in_lf(chunk)
        if not offset:
            reason = binary_reason(chunk[:HEAD_BYTES], complete=len(chunk) < HEAD_BYTES)
            if reason:
                raise DataError(f"data.source {uri} {reason}: data prep reads {what}")
        pending = decoder.getstate()[0]  # the start of a character the previous chunk ended in
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            data = pending + chunk
            line = lines + line_breaks(data[len(pending) : max(exc.start, len(pending))], lf) + 1
            raise DataError(
                f"data.source {uri} is not UTF-8 text (line {line}: byte 0x{data[exc.start]:02x} at offset "
                f"{offset - len(pending) + exc.start}; save it as UTF-8): data prep reads {what}"
            ) from None
        if (nul := chunk.find(b"\0")) >= 0:  # valid UTF-8, and no text: refused wherever it is, as at the start
            line = lines + line_breaks(chunk[:nul], lf) + 1
            raise DataError(
                f"data.source {uri} is binary, not UTF-8 text (a NUL byte at offset {offset + nul}, line {line}): "
                f"data prep reads {what}"
            )
        offset += len(chunk)
        lines += line_breaks(chunk, lf)
        yield chunk
    if decoder.getstate()[0]:
        raise DataError(f"data.source {uri} is not UTF-8 text (it ends inside a character; save it as UTF-8)")


#: What a line of a bracket alone, or an indented line, most often is: JSON written over several lines.
INDENTED_HINT = (
    "is the file indented (pretty-printed) JSON? JSON Lines holds each record on one line: rewrite it, e.g. "
    "`jq -c . data.json > data.jsonl`"
)
#: What a JSON array where a JSON Lines record belongs most often is: a whole `.json` file of records.
ARRAY_HINT = (
    "is the file one JSON array of records? JSON Lines holds one object per line: convert it, e.g. "
    "`jq -c '.[]' data.json > data.jsonl`"
)


def json_line(line: bytes, where: str, reads: str) -> Any:
    """One JSON Lines line, parsed; a :class:`DataError` naming `where` when it is not JSON, saying
    what the format `reads` there (and how to convert a whole-file array, when the line opens one)."""
    try:
        return json.loads(line)
    except ValueError as exc:
        bare = line.strip()
        hint = f"; {ARRAY_HINT}" if bare.startswith(b"[") else ""
        if not hint and (bare in (b"{", b"}", b"]", b"},", b"],") or line[:1] in (b" ", b"\t")):
            hint = f"; {INDENTED_HINT}"  # a record over several lines: pretty-printed (jq's array hint reads that too)
        # A decode error's msg alone can end mid-sentence ("Unterminated string starting at").
        said = f"{exc.msg}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise DataError(f"{where} is not JSON ({said}); {reads}{hint}") from None


def refuse_lone_surrogate(value: Any, where: str, path: str) -> None:
    """A :class:`DataError` naming `where` when the parsed JSON `value` a task reads (at `path` in
    its record: a text field, chat messages) holds a lone UTF-16 surrogate. JSON may escape one (a
    pair cut in two, as truncated exports hold); no encoder or tokenizer takes it (was: a bare
    `'utf-8' codec can't encode` error, or "a bug in kftrain"). Fields no task reads may hold one."""
    if found := _lone_surrogate(value, path):
        at, index, char = found
        raise DataError(
            f"{where}: {at} holds a lone surrogate \\u{ord(char):04x} at character {index} (half of a character "
            "written as two \\u escapes, such as an emoji cut in two), which is not text: fix or drop the record"
        )


def _lone_surrogate(value: Any, path: str) -> tuple[str, int, str] | None:
    """(where in `value`, the character's index, the character) of its first lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")  # at C speed: a long text without one is not walked
        except UnicodeEncodeError as exc:
            return path, exc.start, value[exc.start]
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"
        if isinstance(key, str) and (found := _lone_surrogate(key, f"a key of {path}")):
            return found
        if found := _lone_surrogate(item, where):
            return found
    return None


def source_format_problem(task: str, uri: str) -> str | None:
    """Why the object at `uri` is not a source `task` reads, judged by its suffix alone; None when it may be."""
    if task == "classification":
        for suffix, kind in NOT_CSV.items():
            if has_suffix(uri, suffix):
                return f"is a {kind} file ({suffix}); the classification task reads a CSV table"
    return None


def _head(store: ObjectStore, uri: str, size: int) -> bytes:
    try:
        return store.get_bytes(uri, 0, min(size, HEAD_BYTES))
    except ObjectNotFound:
        raise
    except OSError as exc:  # a local file that is there but not readable (permissions)
        raise DataError(f"data.source {uri}: cannot read it ({exc.strerror or exc})") from None


def _check_header(cfg: Config, store: ObjectStore, uri: str) -> None:
    """The CSV's header row, checked as data prep checks it (it names `data.label_column` and a
    feature column besides it, each once): a wrong column fails before any step, not in data prep."""
    from trainer.tasks.classification.data import csv_rows  # that module imports this one

    try:
        csv_rows(store, uri, cfg.data.label_column, chunk_bytes=HEAD_BYTES)  # the header alone, not a chunk of rows
    except DataError as exc:
        message = str(exc)  # a decoding error names data.source itself
        raise DataError(message if message.startswith("data.source") else f"data.source {message}") from None


def _check_object(cfg: Config, store: ObjectStore, uri: str, what: str, one: bool = True) -> int:
    """One object of the source (`one`: the whole source, so it must not be empty); its size."""
    size = store.size(uri)
    if size == 0:
        if one:
            raise DataError(f"data.source {uri} is empty (0 bytes)")
        return 0
    problem = source_format_problem(cfg.task, uri)
    if problem:
        raise DataError(f"data.source {uri} {problem}")
    head = _head(store, uri, size)
    if cfg.task in ("classification", "causal_lm"):
        reason = binary_reason(head, complete=size <= len(head))
        if reason:
            raise DataError(f"data.source {uri} {reason}: data prep reads {what}")
    if cfg.task == "causal_lm":
        _check_first_record(cfg, uri, head, complete=size <= len(head))
    return size


def _check_first_record(cfg: Config, uri: str, head: bytes, complete: bool) -> None:
    """The first JSON Lines record in `head` (the object's first bytes), read as data prep reads
    it (`data.format` `jsonl`, `auto` on a `.jsonl`/`.json` object, or `chat`): chat records read
    as text records, or records without `data.text_field`, fail before any step, not in data
    prep. A first line longer than the head is left to data prep."""
    from trainer.chat_data import chat_record  # both modules import this one
    from trainer.tasks.causal_lm import reads_as_jsonl, record_text

    fmt = cfg.data.format
    if not (fmt == "chat" or reads_as_jsonl(fmt, uri)):
        return
    lines = head.split(b"\n")
    whole = lines if complete else lines[:-1]  # the last piece may be cut at the head's end
    number, line = next(((n, line) for n, line in enumerate(whole, 1) if line.strip()), (0, b""))
    if not number:
        if head.lstrip().startswith(b"["):  # a record is an object: one long line opening an array is a whole file's
            raise DataError(f"data.source {uri} line 1 opens a JSON array, not a record; {ARRAY_HINT}")
        return
    try:
        if fmt == "chat":
            chat_record(line, cfg.data.messages_field, f"{uri} line {number}")
        else:
            record_text(line, f"{uri} line {number}", cfg.data.text_field)
    except DataError as exc:
        raise DataError(f"data.source {exc}") from None


def source_objects(store: ObjectStore, source: str) -> list[str]:
    """The objects a source names (:func:`source_listing`)."""
    return list(source_listing(store, source, versions=False))


def source_listing(store: ObjectStore, source: str, versions: bool = True) -> dict[str, str]:
    """The objects a source names, in order, each with its version (`versions`, else ""): the
    object `source` is, unless it names a folder (it ends in '/', or is a bucket's root); else
    every object below it but hidden ones (a name or a folder starting with '.': `.git/`,
    `.ipynb_checkpoints/`) and folder markers (an empty key ending in '/', the S3 console's
    "Create folder"), the same in every store; an object holding data under a name no file path
    can hold (ending in '/', a '.' or '..' segment) is refused naming it. A local file name that is not UTF-8, which no
    object store could hold either, is refused naming it."""
    names_a_folder = source.endswith("/") or not parse_uri(source).key.strip("/")
    if not names_a_folder:
        try:
            if store.exists(source):
                return {source: store.version(source) if versions else ""}
        except ObjectNotFound:
            pass
    folder = source.rstrip("/") + "/"
    found = {}
    # The versions come with the listing in every store; their sizes tell a folder marker from data.
    for uri, version in store.versions(folder).items():
        below = uri[len(folder) :] if uri.startswith(folder) else uri.rsplit("/", 1)[-1]
        parts = below.split("/")
        if not below or (below.endswith("/") and version_size(version) == 0):  # the folder's own marker, or one below
            continue
        if any(part.startswith(".") and part not in (".", "..") for part in parts):  # hidden
            continue
        if below.endswith("/") or any(part in (".", "..") for part in parts):
            # Data no folder can hold (was: left out in silence, as if a marker or hidden).
            why = "ends in '/', a folder's name" if below.endswith("/") else "has a '.' or '..' segment"
            raise DataError(
                f"data.source {source}: the object {below!r} below it holds {version_size(version)} bytes, but its "
                f"name {why}, which no file path can hold (nor tools that copy a prefix to disk); rename it, or "
                "move it out of this prefix"
            )
        try:
            parse_uri(uri)
        except ValueError as exc:  # a key S3 holds and no URI can name (an empty segment `//`)
            raise DataError(
                f"data.source {source}: the object {below!r} below it has a name kftrain cannot read as a store "
                f"URI ({exc}); rename it, or move it out of this prefix"
            ) from None
        try:
            below.encode("utf-8")
        except UnicodeEncodeError:
            raw = below.encode("utf-8", "surrogateescape")
            raise DataError(
                f"data.source {source}: the file name {raw!r} below it is not UTF-8, which data prep and object "
                "stores take; rename it (e.g. `convmv -f latin1 -t utf8 -r --notest FOLDER`)"
            ) from None
        found[uri] = version if versions else ""
    return _each_file_once(store, source, found) if isinstance(store, LocalStore) else found


def _each_file_once(store: LocalStore, source: str, found: dict[str, str]) -> dict[str, str]:
    """`found` with each local file once: a second path to one (a link to a file beside it, a
    hard link) would read its text twice, and a split of both copies puts test lines into
    training. The first path in the listing's order is kept."""
    first: dict[tuple[int, int], str] = {}
    kept = {}
    for uri, version in found.items():
        try:
            identity = store.file_identity(uri)
        except OSError:  # gone since the listing: what reading it says
            kept[uri] = version
            continue
        if identity in first:
            log.warning("data.source %s: %s is %s again (a link): read once", source, uri, first[identity])
            continue
        first[identity] = uri
        kept[uri] = version
    return kept


#: How causal_lm data prep makes tokens of its text, in `data.source_version`: KFP's cache keys
#: data prep on the effective config, not on kftrain's code in the image, so a change to the
#: tokens the same text gives must change it. 2: each document ends in a line end, and a
#: pretrained model's documents are in its special tokens. 3: each document tokenized from its
#: own start where the tokenizer reads an input's start specially (SentencePiece's `▁`). 4: a
#: pretrained model's tokenizer as transformers loads its folder, config.json included (a qwen2
#: folder's pre-tokenizer is Qwen's own), for text and chat data alike.
TEXT_PREP_VERSION = 4


def source_version(cfg: Config) -> str:
    """`data.source_version` for `cfg`: a digest of the version of every object data prep reads
    from a store (the source's, a `data.tokenizer` file, a base model's tokenizer files and config.json) and, for
    causal_lm, of how it makes tokens of them (:data:`TEXT_PREP_VERSION`); '' when it reads no
    object and makes no text tokens (the built-in digits). A store that fails raises
    :class:`StoreError` naming the field."""
    import hashlib

    from trainer.pretrained import CONFIG, HF_SCHEME, TOKENIZER_FILES

    named = []  # (field, URI, how: "listing" a source's objects, "object", or an "optional" object)
    if cfg.data.source not in BUILTIN_SOURCES:
        named.append(("data.source", cfg.data.source, "listing"))
    spec = parse_spec(cfg.data.tokenizer) if cfg.task == "causal_lm" else None
    if spec is not None and spec.kind == "file":
        named.append(("data.tokenizer", spec.uri, "object"))
    base = cfg.model.init_from
    if cfg.task == "causal_lm" and base and not base.startswith(HF_SCHEME):
        # A base model's tokenizer makes the tokens, as transformers builds it for the model's type
        # (config.json); an hf:// one's revision is in the config, or the Hub's now.
        named += [("model.init_from", join_uri(base, name), "optional") for name in (*TOKENIZER_FILES, CONFIG)]
    if not named and cfg.task != "causal_lm":
        return ""
    digest = hashlib.sha256()
    if cfg.task == "causal_lm":
        digest.update(f"text-prep={TEXT_PREP_VERSION}\n".encode())
    for field, uri, how in named:
        store = source_store(cfg, uri)
        try:
            answer_within(store, uri)
            if how == "listing":
                versions = source_listing(store, uri)
            elif how == "object" or store.exists(uri):
                versions = {uri: store.version(uri)}
            else:
                versions = {}
            for obj, version in versions.items():
                digest.update(f"{obj}={version}\n".encode())
        except StoreError as exc:
            raise under_setting(f"{field} {uri}", exc) from None
    return digest.hexdigest()[:16]


def check_source(cfg: Config) -> None:
    """Before any step: `data.source` exists, is readable, is what its task reads and is text
    (a causal_lm prefix: its first `CHECK_OBJECTS` objects), and a causal_lm `data.tokenizer`
    file exists.

    Raises :class:`DataError` (a ValueError) naming the field and the URI; a store that cannot be
    reached fails as :class:`StoreError` within `CHECK_BUDGET_S` seconds (its first answer; a
    listing of many objects then takes the time it takes), naming them too.
    """
    source = cfg.data.source
    if source not in BUILTIN_SOURCES:
        try:
            store = source_store(cfg, source)
            answer_within(store, source)
            _check_source(cfg, store, source)
        except StoreError as exc:
            raise type(exc)(f"data.source {source}: {exc}") from None
    if cfg.task == "causal_lm":
        spec = parse_spec(cfg.data.tokenizer)
        if spec.kind == "file":
            try:
                with check_deadline(CHECK_BUDGET_S):
                    found = source_store(cfg, spec.uri).exists(spec.uri)
            except StoreError as exc:
                raise type(exc)(f"data.tokenizer {spec.uri}: {exc}") from None
            if not found:
                raise DataError(
                    f"data.tokenizer {spec.uri}: no such object; upload the tokenizer.json there or fix data.tokenizer"
                )
            from trainer.tokenizer import tokenizer_from_json

            # Read as data prep reads it: a JSON file that is no tokenizer is found now, not in data prep.
            try:
                raw = source_store(cfg, spec.uri).get_bytes(spec.uri)
            except StoreError as exc:
                raise type(exc)(f"data.tokenizer {spec.uri}: {exc}") from None
            tokenizer_from_json(raw, spec.uri)


def source_store(cfg: Config, uri: str) -> ObjectStore:
    """The store serving `uri`, a data source or a tokenizer file, with the configured endpoint:
    data prep reads it there, whichever store the artifacts go to (:func:`check_source` reads it
    the same way, under the check's deadline)."""
    return open_store(uri, cfg.store.endpoint, cfg.store.region, cfg.store.policy())


def nothing_there(source: str, given: str = "") -> DataError:
    """The error for a `data.source` with no object at it or below it (`given`: the value as
    configured, where `source` is its resolved form), with a hint for a built-in source's name in
    other letters or a wildcard pattern, which a source is not (was: "check the URI" for `t/*.txt`)."""
    return DataError(
        f"data.source {source}: no object there and none below it; check the URI{_source_hint(given or source)}"
    )


def _source_hint(value: str) -> str:
    """A hint when a missing source is a built-in one's name in other letters (`Digits`), or a
    wildcard pattern, which a source is not."""
    name = value.strip().lower()
    if name and name != value and name in BUILTIN_SOURCES:
        return f" (the built-in source is {name!r}, in lower case)"
    if any(c in parse_uri(value).key for c in "*?["):
        return "; data.source takes no wildcard patterns: name the folder, and every object below it is read"
    return ""


def _check_source(cfg: Config, store: ObjectStore, source: str) -> None:
    if cfg.task == "classification":
        try:
            _check_object(cfg, store, source, "CSV")
        except ObjectNotFound:
            below = source_objects(store, source)
            location = parse_uri(source)
            if below:
                hint = f"it is a folder or prefix of {len(below)} object(s); point data.source at one CSV object"
            elif not location.is_remote and os.path.isdir(location.key):
                hint = "it is an empty folder; point data.source at one CSV object"
            else:
                hint = "no such object; check the URI" + _source_hint(cfg.data.source)
            raise DataError(f"data.source {source}: {hint}") from None
        _check_header(cfg, store, source)
        return
    objects = source_objects(store, source)
    if not objects:
        raise nothing_there(source, cfg.data.source)
    if cfg.task == "causal_lm":
        sizes = [
            _check_object(cfg, store, uri, "text or JSON Lines", one=len(objects) == 1)
            for uri in objects[:CHECK_OBJECTS]
        ]
        if len(objects) <= CHECK_OBJECTS and not any(sizes):
            raise DataError(
                f"data.source {source}: its {len(objects)} objects are all empty (0 bytes); put the text there, "
                "or point data.source at the text"
            )
