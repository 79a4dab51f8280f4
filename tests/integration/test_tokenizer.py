"""data.tokenizer against a real S3 server process: a tokenizer.json file round-trips text exactly
through S3. The tokenizers themselves are tested in tests/unit/test_tokenizer.py."""

from __future__ import annotations

import pytest

from tests.unit.test_tokenizer import assert_round_trip
from trainer.shards import DataError
from trainer.storage import open_store
from trainer.tokenizer import (
    load_tokenizer,
)


def test_file_round_trip_from_s3(bpe, bucket):
    uri = f"s3://{bucket}/tokenizers/tokenizer.json"
    store = open_store(uri)
    store.put_bytes(uri, bpe.to_json())
    tok = load_tokenizer(uri, store)
    assert (tok.kind, tok.vocab_size) == ("file", bpe.vocab_size)
    assert_round_trip(tok)
    with pytest.raises(DataError, match=f"s3://{bucket}/tokenizers/other.json: no such object"):
        load_tokenizer(f"s3://{bucket}/tokenizers/other.json", store)
