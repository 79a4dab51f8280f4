"""Write a safetensors file one tensor at a time, and read one back the same way.

The format: 8 bytes (little-endian u64) giving the header's length, the header (JSON: for every
tensor its dtype, shape and ``data_offsets`` into the data section, optionally ``__metadata__``,
padded with spaces to a multiple of 8 bytes), then every tensor's raw little-endian bytes, back
to back, in header order. Everything in the header is known from names, shapes and dtypes, so it
is written first and each tensor's bytes are appended as they arrive: the writer never holds
more than the tensor it is given (``safetensors.torch.save`` builds the whole file in memory).

Tensors are laid out in the order safetensors' own writer uses (widest dtype first, then by name),
which keeps every tensor naturally aligned and makes the file byte-for-byte the one
``safetensors.torch.save`` writes for the same tensors (and at most one ``__metadata__`` key:
the library orders several differently from call to call; this writer sorts them).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import torch

#: torch dtype -> safetensors dtype name, in the safetensors writer's layout order (widest
#: first; within one width, the order of its dtype enum, which the file bytes depend on).
DTYPES: dict[torch.dtype, str] = {
    torch.uint64: "U64",
    torch.int64: "I64",
    torch.float64: "F64",
    torch.complex64: "C64",
    torch.float32: "F32",
    torch.uint32: "U32",
    torch.int32: "I32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.uint16: "U16",
    torch.int16: "I16",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_RANK = {dtype: i for i, dtype in enumerate(DTYPES)}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """What the header records of one tensor: its name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of its data."""
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        """The spec of `tensor` stored under `name`."""
        return cls(name, tensor.dtype, tuple(tensor.shape))


def layout(specs: list[TensorSpec]) -> list[TensorSpec]:
    """`specs` in file order; ValueError for a dtype safetensors cannot store or a repeated name."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"tensor names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    for s in specs:
        if s.dtype not in _RANK:
            raise ValueError(f"{s.name}: dtype {s.dtype} cannot be stored in safetensors")
    return sorted(specs, key=lambda s: (_RANK[s.dtype], s.name))


def header(specs: list[TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
    """The file's first bytes for `specs` (already in file order): length prefix and padded JSON."""
    entries: dict[str, object] = {}
    if metadata:
        # Sorted: the same file every time (the library's own order is a hash map's and varies).
        entries["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for s in specs:
        entries[s.name] = {
            "dtype": DTYPES[s.dtype],
            "shape": list(s.shape),
            "data_offsets": [offset, offset + s.nbytes],
        }
        offset += s.nbytes
    # Compact separators and raw UTF-8, as the library writes it; spaces pad the data section to
    # an 8-byte boundary.
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


class SafetensorsWriter:
    """A safetensors file written header first, then one tensor at a time in :attr:`order`.

    Use it as a context manager: leaving the block checks every tensor was written and removes
    the partial file on an error.
    """

    def __init__(self, path: str | Path, specs: list[TensorSpec], metadata: Mapping[str, str] | None = None) -> None:
        if sys.byteorder != "little":
            raise NotImplementedError("safetensors stores little-endian bytes; this host is big-endian")
        self.path = Path(path)
        self._specs = layout(list(specs))
        #: Names in the order :meth:`write` expects them.
        self.order = [s.name for s in self._specs]
        self._next = 0
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by close()/__exit__)
        self._file.write(header(self._specs, metadata))

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append `tensor`'s bytes (copied to the CPU first if it is elsewhere); `name` must be the
        next one of :attr:`order` and the tensor must have the dtype and shape its header gave."""
        if self._next >= len(self._specs):
            raise ValueError(f"{name}: every tensor of {self.path} was already written")
        spec = self._specs[self._next]
        if name != spec.name:
            raise ValueError(f"{self.path}: expected tensor {spec.name} next, got {name}")
        if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"{name}: the header says {spec.dtype} {list(spec.shape)}, the tensor is "
                f"{tensor.dtype} {list(tensor.shape)}"
            )
        t = tensor.detach().cpu().contiguous()
        if t.numel():
            # A byte view of the tensor's own memory: no copy (numpy has no bf16/fp8, bytes do).
            self._file.write(t.reshape(-1).view(torch.uint8).numpy().data)
        self._next += 1

    def close(self) -> None:
        """Finish the file; ValueError naming the first tensor missing (and no file) when not all
        were written."""
        if self._file.closed:
            return
        self._file.close()
        if self._next != len(self._specs):
            self.path.unlink(missing_ok=True)
            raise ValueError(f"{self.path}: tensor {self._specs[self._next].name} (and any after it) was never written")

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
            return
        self._file.close()
        self.path.unlink(missing_ok=True)


def write_safetensors(path: str | Path, tensors: Mapping[str, torch.Tensor], metadata=None) -> None:
    """Write `tensors` to a safetensors file at `path`, one at a time (a CUDA tensor is copied to
    the host only while its own bytes are written)."""
    with SafetensorsWriter(path, [TensorSpec.of(k, v) for k, v in tensors.items()], metadata) as writer:
        for name in writer.order:
            writer.write(name, tensors[name])


class TensorFile(Mapping[str, torch.Tensor]):
    """The tensors of a local safetensors file by name, each read from disk when asked for (only
    the tensor asked for is in memory)."""

    def __init__(self, path: str | Path) -> None:
        from safetensors import safe_open

        self._handle = safe_open(os.fspath(path), framework="pt", device="cpu")
        self._names = list(self._handle.keys())

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._names:
            raise KeyError(name)
        return self._handle.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
