"""The final model of an FSDP run, consolidated from its checkpoint's shards one tensor at a time:
after real multi-process runs, through S3, in bounded memory, fetching only the model's blocks, and
naming a missing or changed part."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as library_save
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict

from tests.conftest import run_group
from tests.jobs import fsdp_runs as shared_fsdp_runs
from tests.jobs import record_of, weights_of
from trainer.checkpoint import COMMIT, METADATA, CheckpointError, CheckpointManager, step_dir
from trainer.consolidate import consolidate
from trainer.model_io import load_model, publish_model
from trainer.storage import PART_SIZE, LocalStore, open_store
from trainer.tasks.classification.model import build_mlp
from trainer.train import parameter_digest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def fsdp_runs(shared):
    """(folder, lines of the checkpointed run, lines of the run without checkpoints): tests/jobs.py's
    FSDP_CKPT runs, shared by the session."""
    return shared_fsdp_runs(shared)


def loaded_whole(prefix: str, names) -> tuple[dict, dict[str, torch.Tensor]]:
    """The latest checkpoint's model, loaded in one process (DCP reassembles every tensor)."""

    mgr = CheckpointManager(LocalStore(), prefix)
    record = mgr.latest()
    index = FileSystemReader(step_dir(prefix, record["step"])).read_metadata().state_dict_metadata
    model = {}
    for name in names:
        md = index[f"model.{name}"]
        model[name] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    mgr.load(record, {"model": model})
    return record, model


# -- memory: one tensor at a time -------------------------------------------------------------------

TENSOR_MB = 32
MEASURE = textwrap.dedent(
    """
    import json, sys
    from trainer.checkpoint import step_dir
    from trainer.consolidate import consolidate
    from trainer.storage import PART_SIZE, LocalStore, open_store

    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024

    before = status("VmRSS:")
    try:  # reset the peak to now (Linux >= 4.0); without it the peak bounds ours from above
        open("/proc/self/clear_refs", "w").write("5")
    except OSError:
        pass
    consolidate(LocalStore(), step_dir(sys.argv[1], 1), sys.argv[2])
    print(json.dumps({"before": before, "peak": status("VmHWM:")}))
    """
)


def test_the_fsdp_model_is_consolidated_from_the_final_checkpoint(fsdp_runs):
    root, with_ckpt, without = fsdp_runs
    prefix = str(root / "ckpt")
    assert CheckpointManager(LocalStore(), prefix).committed_steps() == [10, 12]  # 12: saved for the export
    assert any("consolidated" in line and "step-00000012" in line for line in with_ckpt)
    assert not any("gathering the full FSDP weights" in line for line in with_ckpt)
    assert any("gathering the full FSDP weights" in line for line in without)  # the fallback says why

    exported = weights_of(str(root / "model"))
    assert "lm_head.weight" not in exported  # tied to wte.weight: stored once, as save_model does
    record, whole = loaded_whole(prefix, [*exported, "lm_head.weight"])
    assert record["step"] == 12
    for name, tensor in exported.items():
        assert torch.equal(tensor, whole[name]), name
    assert torch.equal(whole["lm_head.weight"], exported["wte.weight"])

    # load_model rebuilds it unchanged, and the digest is the one gathered weights give.
    model, _ = load_model(LocalStore(), str(root / "model"))
    digest = record_of(str(root / "model"))["parameter_digest"]
    assert digest == parameter_digest(model)
    assert any(f"final parameter digest {digest}" in line for line in with_ckpt)
    # The run without checkpoints gathered the same weights, bit for bit.
    gathered = weights_of(str(root / "gathered"))
    assert gathered.keys() == exported.keys()
    for name, tensor in exported.items():
        assert torch.equal(tensor, gathered[name]), name
    assert record_of(str(root / "gathered"))["parameter_digest"] == digest


def test_consolidation_reads_and_writes_through_s3(bucket, tmp_path):
    """From checkpoint parts in an S3 bucket to a model in it: a file over one multipart part."""
    prefix = f"s3://{bucket}/run/checkpoints"
    store = open_store(prefix)
    torch.manual_seed(0)
    arch = {"num_features": 1200, "hidden_sizes": [2048], "num_classes": 3, "dropout": 0.0}
    model = build_mlp(**arch)  # 9.4 MiB of weights: the upload takes two parts of 8 MiB
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1200)).sum().backward()
    opt.step()
    model_state, optim_state = get_state_dict(model, opt)
    CheckpointManager(store, prefix).save(7, {"model": model_state, "optimizer": optim_state}, blocking=True)
    path = tmp_path / "model.safetensors"
    consolidate(store, step_dir(prefix, 7), path)
    assert path.stat().st_size > PART_SIZE
    model_uri = f"s3://{bucket}/run/model"
    publish_model(store, model_uri, path, {"task": "classification", "architecture": arch})
    loaded, _ = load_model(store, model_uri)
    for (name, want), got in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(want, got), name


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak RSS from /proc")
def test_consolidation_holds_about_one_tensor_not_the_model(tmp_path):
    numel = TENSOR_MB * 2**20 // 4
    prefix = str(tmp_path / "ckpt")
    model = {f"layer{i}.weight": torch.full((numel,), float(i)) for i in range(8)}
    optim = {"state": {"layer0.weight": {"exp_avg": torch.zeros(numel)}}}  # stays in the checkpoint
    CheckpointManager(LocalStore(), prefix).save(1, {"model": model, "optimizer": optim}, blocking=True)
    del model, optim
    out = tmp_path / "model.safetensors"
    # A fresh process: its peak RSS is what it needed before consolidating, then while doing it.
    # glibc then maps every block over 64 KiB on its own and unmaps it when freed (by default it
    # may keep freed memory and reuse it unseen): RSS follows the bytes held.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
    cmd = [sys.executable, "-c", MEASURE, prefix, str(out)]
    rc, output = run_group(cmd, timeout=120, env=env, cwd=str(REPO))
    assert rc == 0, output
    rss = json.loads(output.strip().splitlines()[-1])
    grew = rss["peak"] - rss["before"]
    tensor_bytes = numel * 4
    # DCP reads a tensor's saved chunk and copies it into the one being written: ~2 tensors at
    # the peak; the whole model would be 8.
    assert grew < 3 * tensor_bytes, f"peak grew {grew / 2**20:.0f} MiB, one tensor is {TENSOR_MB} MiB"
    with safe_open(str(out), framework="pt") as f:
        assert sorted(f.keys()) == [f"layer{i}.weight" for i in range(8)]
        assert float(f.get_tensor("layer7.weight")[-1]) == 7.0


class CountingStore(LocalStore):
    """A local store that counts what is downloaded: whole objects, and bytes of ranged reads."""

    def __init__(self) -> None:
        self.downloads: list[str] = []
        self.ranged: dict[str, int] = {}

    def get_file(self, uri, path):
        self.downloads.append(uri.rsplit("/", 1)[-1])
        super().get_file(uri, path)

    def get_bytes(self, uri, offset=0, length=0, version=""):
        data = super().get_bytes(uri, offset, length, version)
        name = uri.rsplit("/", 1)[-1]
        if name != COMMIT:  # read whole through get_bytes too, by every reader
            self.ranged[name] = self.ranged.get(name, 0) + len(data)
        return data


BLOCK = 4096


def copy_with_blocks(src: str, dest: Path, block_bytes: int | None) -> dict:
    """A copy of the checkpoint folder `src` whose commit record has the block hashes it would
    have had if saved with `block_bytes` blocks (None: none, as written before them)."""
    shutil.copytree(src, dest)
    record = json.loads((dest / COMMIT).read_text())
    for name, part in record["parts"].items():
        part.pop("blocks", None)
        part.pop("block_bytes", None)
        if block_bytes and name.endswith(".distcp"):
            raw = (dest / name).read_bytes()
            blocks = [hashlib.sha256(raw[i : i + block_bytes]).hexdigest() for i in range(0, len(raw), block_bytes)]
            part.update(block_bytes=block_bytes, blocks=blocks)
    (dest / COMMIT).write_text(json.dumps(record))
    return record


def assert_equals_whole(path: Path, prefix: str, names: list[str]) -> None:
    _, whole = loaded_whole(prefix, names)
    got = load_file(path)
    assert got.keys() == whole.keys()
    for name in names:
        assert torch.equal(got[name], whole[name]), name
    assert path.read_bytes() == library_save(whole)  # byte for byte the library's file


def test_consolidating_a_two_rank_checkpoint_equals_loading_it_whole(fsdp_runs, tmp_path):
    root, _, _ = fsdp_runs
    prefix = str(root / "ckpt")
    store = CountingStore()
    path = tmp_path / "model.safetensors"
    specs = consolidate(store, step_dir(prefix, 12), path)  # nothing excluded: lm_head too
    names = [s.name for s in specs]
    assert "lm_head.weight" in names and not any(n.startswith("optimizer") for n in names)
    assert_equals_whole(path, prefix, names)
    # The index whole; of the shard files, blocks only (here one 32 MiB block: the whole file);
    # never the ranks' RNG parts.
    assert store.downloads == [METADATA] and sorted(store.ranged) == ["__0_0.distcp", "__1_0.distcp"]


def test_consolidation_fetches_the_model_s_blocks_not_the_optimizer_s(fsdp_runs, tmp_path):
    root, _, _ = fsdp_runs
    prefix = str(root / "ckpt")
    folder = tmp_path / "step-00000012"
    record = copy_with_blocks(step_dir(prefix, 12), folder, BLOCK)
    store = CountingStore()
    path = tmp_path / "model.safetensors"
    specs = consolidate(store, str(folder), path)
    assert_equals_whole(path, prefix, [s.name for s in specs])
    total = sum(p["bytes"] for name, p in record["parts"].items() if name.endswith(".distcp"))
    fetched = sum(store.ranged.values())
    # AdamW keeps two tensors per parameter: the model is about a third of the shard files.
    assert fetched < 0.6 * total, f"fetched {fetched} of {total} bytes"
    assert store.downloads == [METADATA] and sorted(store.ranged) == ["__0_0.distcp", "__1_0.distcp"]


def test_a_changed_block_fails_consolidation_where_it_is_read_only(fsdp_runs, tmp_path):
    root, _, _ = fsdp_runs
    folder = tmp_path / "step-00000012"
    copy_with_blocks(step_dir(str(root / "ckpt"), 12), folder, BLOCK)
    spans = FileSystemReader(folder).read_metadata().storage_data
    shard = folder / "__1_0.distcp"
    model_blocks, optim_only = set(), set()
    for index, info in spans.items():
        if info.relative_path == shard.name:
            blocks = set(range(info.offset // BLOCK, (info.offset + info.length - 1) // BLOCK + 1))
            (model_blocks if index.fqn.startswith("model.") else optim_only).update(blocks)
    optim_only -= model_blocks
    raw = bytearray(shard.read_bytes())
    # Integrity is checked for everything read: a byte nobody reads may change unnoticed.
    raw[min(optim_only) * BLOCK + 7] ^= 0xFF
    shard.write_bytes(bytes(raw))
    path = tmp_path / "model.safetensors"
    consolidate(LocalStore(), str(folder), path)
    assert path.exists()
    path.unlink()
    block = max(model_blocks)
    raw[block * BLOCK + 7] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=rf"__1_0\.distcp block {block} .*changed after it was committed"):
        consolidate(LocalStore(), str(folder), path)
    assert not path.exists()


def test_a_checkpoint_without_block_hashes_is_consolidated_from_whole_files(fsdp_runs, tmp_path):
    root, _, _ = fsdp_runs
    prefix = str(root / "ckpt")
    folder = tmp_path / "step-00000012"
    copy_with_blocks(step_dir(prefix, 12), folder, None)
    store = CountingStore()
    path = tmp_path / "model.safetensors"
    specs = consolidate(store, str(folder), path)
    assert_equals_whole(path, prefix, [s.name for s in specs])
    assert sorted(store.downloads) == [METADATA, "__0_0.distcp", "__1_0.distcp"] and not store.ranged


def test_a_missing_or_changed_part_is_a_checkpoint_error_naming_it(fsdp_runs, tmp_path):
    root, _, _ = fsdp_runs
    folder = tmp_path / "step-00000012"
    shutil.copytree(step_dir(str(root / "ckpt"), 12), folder)
    path = tmp_path / "model.safetensors"
    shard = folder / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, other bytes (in its one block, which is read)
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp block 0 .*does not match its sha256"):
        consolidate(LocalStore(), str(folder), path)
    assert not path.exists()
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"no file at .*__1_0\.distcp"):
        consolidate(LocalStore(), str(folder), path)
    assert not path.exists()
    (folder / COMMIT).unlink()
    with pytest.raises(CheckpointError, match=r"is not committed .*COMMIT\.json"):
        consolidate(LocalStore(), str(folder), path)
