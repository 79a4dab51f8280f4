"""The streaming safetensors writer the consolidated FSDP model (and the DDP one) is written with, in
one process: the library's own bytes, and order, dtype and shape checked with no partial file left."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as library_save

from trainer.safetensors_file import SafetensorsWriter, TensorSpec, write_safetensors

pytestmark = pytest.mark.timeout(300)


# -- the writer -----------------------------------------------------------------------------------


def mixed_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "emb.weight": torch.randn(7, 3, generator=g),
        "a.bias": torch.randn(5, generator=g).to(torch.bfloat16),
        "counts": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "half": torch.randn(4, generator=g).half(),
        "mask": torch.tensor([True, False, True]),
        "bytes": torch.arange(5, dtype=torch.uint8),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "ünicode.name": torch.ones(2, dtype=torch.int32),
    }


# One metadata key at most: the library orders several by a hash map, differently from call to call.
@pytest.mark.parametrize("metadata", [None, {"format": "pt"}], ids=["plain", "metadata"])
def test_the_writer_writes_the_library_s_own_bytes(tmp_path, metadata):
    tensors = mixed_tensors()
    path = tmp_path / "w.safetensors"
    write_safetensors(path, tensors, metadata)
    # Header first, tensors appended one by one: the very file safetensors writes in one go.
    assert path.read_bytes() == library_save(tensors, metadata=metadata)
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == metadata


def test_the_writer_checks_order_dtype_shape_and_leaves_no_partial_file(tmp_path):
    specs = [TensorSpec("b", torch.float32, (2,)), TensorSpec("a", torch.float32, (3,))]
    path = tmp_path / "w.safetensors"

    def write(*tensors):
        with SafetensorsWriter(path, specs) as writer:
            assert writer.order == ["a", "b"]  # the library's layout, not the order given
            for name, tensor in tensors:
                writer.write(name, tensor)

    with pytest.raises(ValueError, match="expected tensor a next, got b"):
        write(("b", torch.zeros(2)))
    assert not path.exists()
    with pytest.raises(ValueError, match=r"header says torch.float32 \[3\], the tensor is torch.float64 \[3\]"):
        write(("a", torch.zeros(3, dtype=torch.float64)))
    assert not path.exists()
    with pytest.raises(ValueError, match="tensor b .* was never written"):
        write(("a", torch.zeros(3)))
    assert not path.exists()
    write(("a", torch.zeros(3)), ("b", torch.ones(2)))
    assert torch.equal(load_file(path)["b"], torch.ones(2))
