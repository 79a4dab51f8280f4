"""Bad configs through the real `kftrain` command: a non-zero exit at once, the last line the user
sees names the field or key, and nothing was written (no step started)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_group
from tests.unit.test_config_yaml import alias_bomb

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(180)

# (config text, phrases the last line must hold)
ROWS = [
    pytest.param(alias_bomb(), ["c.yaml: line 1:", "anchors and aliases (&l0) are not allowed"], id="alias-bomb"),
    pytest.param(
        "job:\n  replicas: 2\n  replicas: 4\n", ["c.yaml: job.replicas: duplicate key, on lines 2 and 3"], id="dup-key"
    ),
    pytest.param(
        "kubernetes:\n  labels:\n    team name: ml\n",
        ["kubernetes.labels: key 'team name' is not a label key"],
        id="label-key",
    ),
    pytest.param(
        "kubernetes:\n  env:\n    WORLD_SIZE: '8'\n",
        ["kubernetes.env.WORLD_SIZE: WORLD_SIZE is set in every replica"],
        id="operator-env",
    ),
    pytest.param("job:\n  nccl_debug: LOUD\n", ["job.nccl_debug", "'LOUD'"], id="nccl-debug"),
    pytest.param(
        "kubernetes:\n  tolerations:\n  - {key: gpu, operator: Maybe}\n",
        ["kubernetes.tolerations[0]: operator 'Maybe' is not one of Equal or Exists"],
        id="toleration",
    ),
]


@pytest.mark.parametrize(("config", "phrases"), ROWS)
def test_kftrain_run_refuses_a_bad_config_before_any_step(tmp_path, config, phrases):
    (tmp_path / "c.yaml").write_text(config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--local", "--config", "c.yaml", "--output-dir", "out"]
    start = time.monotonic()
    rc, out = run_group(cmd, timeout=60, env=env, cwd=str(tmp_path))
    assert time.monotonic() - start < 60
    assert rc == 2, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("kftrain: error: "), out
    for phrase in phrases:
        assert phrase in last, out
    assert "Traceback" not in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"], out  # no output dir, nothing written
