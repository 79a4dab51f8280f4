"""A committed checkpoint's model weights as one ``model.safetensors``, one tensor at a time.

Under FSDP no rank holds the whole model, and gathering it (``full_state_dict``) needs host RAM
for all of it on rank 0. The checkpoint already holds every weight, in shards spread over the
ranks' ``.distcp`` files. This reads them back in one process, on the CPU and without a process
group: DCP's ``.metadata`` gives every model tensor's name, shape and dtype, so the safetensors
header is written first; then each tensor alone is loaded from its shards (``dcp.load`` of a
state dict holding only that tensor, which reads and reassembles just its chunks) and appended
to the file. Peak memory is about one tensor plus one shard of it being read.

Only the entries under ``model.`` of the checkpoint state (``{"model": ..., "optimizer": ...}``)
are read, and only they are downloaded: of each ``.distcp`` file, the blocks that hold a model
tensor's chunks (ranged reads, each block checked against its sha256 in the commit record; see
:mod:`trainer.checkpoint`), so the optimizer state (AdamW: twice the model) stays in the store.
A file's local copy is deleted as soon as no tensor still to come needs it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Collection
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from trainer.checkpoint import CheckpointError, StoreReader, commit_record, quiet_no_process_group
from trainer.progress import ProgressLine
from trainer.safetensors_file import SafetensorsWriter, TensorSpec
from trainer.storage import ObjectStore, StoreError

#: Where the model's weights live in the trainer's checkpoint state.
MODEL_PREFIX = "model."
log = logging.getLogger("kftrain.consolidate")


def model_specs(metadata: Metadata, exclude: Collection[str] = ()) -> list[TensorSpec]:
    """Every model tensor DCP's index lists (names without the ``model.`` prefix), except the
    names in `exclude`; CheckpointError when a model entry is not a tensor."""
    specs = []
    for fqn, md in metadata.state_dict_metadata.items():
        if not fqn.startswith(MODEL_PREFIX) or fqn[len(MODEL_PREFIX) :] in exclude:
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise CheckpointError(f"checkpoint entry {fqn} is not a tensor: a safetensors file cannot hold it")
        specs.append(TensorSpec(fqn[len(MODEL_PREFIX) :], md.properties.dtype, tuple(md.size)))
    return specs


def consolidate(
    store: ObjectStore,
    folder: str,
    path: str | Path,
    *,
    exclude: Collection[str] = (),
    scratch: str | Path | None = None,
) -> list[TensorSpec]:
    """Write the model weights of the committed checkpoint in `folder` (``.../step-XXXXXXXX``)
    to a safetensors file at the local `path`, one tensor at a time; return what was written.

    `exclude`: names not to store, e.g. tied weights (:func:`trainer.model_io.tied_names`), which
    the checkpoint holds under each name and a saved model holds once. `scratch`: the folder
    for the downloaded (parts of) ``.distcp`` files (default: the system's temporary folder).
    Everything read is checked against the commit record; a missing part, or a changed one
    where it is read, is a CheckpointError naming it, and no partial file is left at `path`.
    """
    t0 = time.perf_counter()
    quiet_no_process_group()  # dcp.load below, once per tensor, without a group
    record = commit_record(store, folder)
    cache = Path(tempfile.mkdtemp(prefix="kftrain-consolidate-", dir=scratch))
    try:
        reader = StoreReader(store, folder, cache, record["parts"])
        metadata = reader.read_metadata()
        specs = model_specs(metadata, exclude)
        if not specs:
            raise CheckpointError(f"checkpoint {folder} holds no model tensors (no entries under {MODEL_PREFIX!r})")
        line = ProgressLine(f"consolidating {folder}", total=sum(s.nbytes for s in specs))
        wanted = {MODEL_PREFIX + s.name: s for s in specs}
        # Each tensor's chunks: file -> (offset, length) of each in it.
        files: dict[str, dict[str, list[tuple[int, int]]]] = {s.name: {} for s in specs}
        for index, info in metadata.storage_data.items():
            if index.fqn in wanted:
                files[wanted[index.fqn].name].setdefault(info.relative_path, []).append((info.offset, info.length))
        # How many tensors still to write read each file: at 0 its local copy goes.
        pending = Counter(f for names in files.values() for f in names)
        with SafetensorsWriter(path, specs) as writer:
            spec_of = {s.name: s for s in specs}
            for name in writer.order:
                # Fetched here rather than inside DCP, whose wrapper would bury our error message.
                for part, ranges in sorted(files[name].items()):
                    reader.fetch(part, ranges)
                spec = spec_of[name]
                tensor = torch.empty(spec.shape, dtype=spec.dtype)
                try:
                    dcp.load({MODEL_PREFIX + name: tensor}, storage_reader=reader, no_dist=True)
                except CheckpointException as exc:
                    raise CheckpointError(f"cannot read {MODEL_PREFIX + name} from checkpoint {folder}: {exc}") from exc
                writer.write(name, tensor)
                line.add(spec.nbytes)
                del tensor  # before the next one is allocated: one tensor at a time
                for part in files[name]:
                    pending[part] -= 1
                    if not pending[part]:
                        reader.release(part)
    except StoreError as exc:
        raise CheckpointError(f"cannot read checkpoint {folder}: {exc}") from exc
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    log.info(
        "consolidated %d tensors (%.1f MB) from %s in %.1fs (read %d of its parts, %.1f MB)",
        len(specs),
        sum(s.nbytes for s in specs) / 1e6,
        folder,
        time.perf_counter() - t0,
        len(reader.fetched),
        reader.fetched_bytes / 1e6,
    )
    return specs
