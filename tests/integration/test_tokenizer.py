"""data.tokenizer: bytes, a trained byte-level BPE and a tokenizer.json file all round-trip text
exactly, and the Hugging Face export carries the tokenizer so transformers decodes the same text."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import pytest

from trainer.shards import DataError
from trainer.storage import LocalStore, open_store
from trainer.tokenizer import (
    EOS_TOKEN,
    load_tokenizer,
)

#: Source code, non-ASCII text, the special token's text, and bytes that are not UTF-8.
TEXTS = [
    b"",
    b"def hello(world):\n    return world + 42\n\n\n",
    'class Caf\u00e9:\n    """na\u00efve \u2014 \u65e5\u672c\u8a9e \U0001f600"""\n'.encode(),
    f"a document{EOS_TOKEN}the next one".encode(),
    b"valid \xff\xfe invalid \xc3 cut \x00\x01 controls",
]


def stdlib_chunks(limit: int = 400_000) -> list[bytes]:
    """A few hundred KB of Python's own library source, one chunk per file, in a fixed order."""
    chunks, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            return chunks
    raise AssertionError("the Python standard library has too little source to sample")


@pytest.fixture(scope="module")
def sample() -> list[bytes]:
    return stdlib_chunks()


@pytest.fixture(scope="module")
def bpe(sample):
    return load_tokenizer("bpe:1000", LocalStore(), iter(sample))


def assert_round_trip(tok) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids.dtype == np.dtype(np.uint8 if tok.vocab_size <= 256 else np.uint16)
        assert ids.size == 0 or int(ids.max()) < tok.vocab_size
        assert tok.decode(ids) == text
        assert tok.decode(iter(ids.tolist())) == text


def test_file_round_trip_from_s3(bpe, bucket):
    uri = f"s3://{bucket}/tokenizers/tokenizer.json"
    store = open_store(uri)
    store.put_bytes(uri, bpe.to_json())
    tok = load_tokenizer(uri, store)
    assert (tok.kind, tok.vocab_size) == ("file", bpe.vocab_size)
    assert_round_trip(tok)
    with pytest.raises(DataError, match=f"s3://{bucket}/tokenizers/other.json: no such object"):
        load_tokenizer(f"s3://{bucket}/tokenizers/other.json", store)
