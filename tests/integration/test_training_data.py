"""DataLoader workers in a real process whose temporary folder is nested as a local run's is."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import run_group

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

# Tensors come back from a worker through file descriptors sent over a Unix socket in the
# temporary folder (torch's default sharing strategy on Linux).
WORKERS = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
from trainer.training_data import worker_sockets_fit
if sys.argv[1] == "fit":
    worker_sockets_fit(2)
data = TensorDataset(torch.arange(64.0).reshape(16, 4))
total = sum(float(b[0].sum()) for b in DataLoader(data, batch_size=4, num_workers=2, timeout=8))
import multiprocessing
print("sum", total, "sockets in", multiprocessing.current_process()._config.get("tempdir"))
"""


@pytest.mark.parametrize("fit", ["fit", "as-is"])
def test_workers_hand_back_batches_under_a_temporary_folder_too_deep_for_their_sockets(tmp_path, fit):
    """Was: every `kftrain run --local` with train.num_workers hung to its timeout: the worker died of
    "AF_UNIX path too long" and the rank waited for its batch. As-is shows the failure is real here."""
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    env = {**os.environ, "TMPDIR": str(deep), "PYTHONPATH": str(REPO)}
    rc, out = run_group([sys.executable, "-c", WORKERS, fit], timeout=90, env=env)
    if fit == "fit":
        assert rc == 0 and "sum 2016.0" in out, out
        short = out.split("sockets in ")[1].split()[0]
        assert short.startswith("/tmp/kftrain-mp-") and not Path(short).exists(), out  # removed at exit
    else:
        assert rc != 0 and "AF_UNIX path too long" in out, out
