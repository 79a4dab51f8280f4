"""Imports checked in fresh interpreters: compiling every pipeline imports no torch, and the
trainer imports without kfp installed."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_compiling_every_pipeline_imports_no_torch(tmp_path):
    code = (
        "import sys\n"
        "from pipelines.compile import compile_all\n"
        f"compile_all({str(tmp_path)!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'sklearn'))\n"
        "assert not heavy, heavy[:8]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_trainer_imports_without_kfp_installed():
    """Hide kfp entirely: the whole trainer package still imports (it runs in bare pods)."""
    code = (
        "import sys, pkgutil, importlib\n"
        "sys.modules['kfp'] = None\n"
        "import trainer\n"
        "for m in pkgutil.walk_packages(trainer.__path__, 'trainer.'):\n"
        "    importlib.import_module(m.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_launching_and_watching_a_local_job_imports_no_torch(tmp_path):
    """The processes that only start, watch or stop replicas (the CLI's local run, which claims the
    run's checkpoint prefix first, its watchdog, the training step's launcher, which claims the
    step's prefix and builds the job) stay light: torch is for the replicas themselves (1-2 CPU-s
    of import, and its memory, in each of those processes otherwise)."""
    code = (
        "import sys\n"
        "import trainer.launch.local, trainer.launch.kubernetes, components.train, pipelines.local_run\n"
        "from trainer.config import load_config\n"
        "from trainer.launch.job import training_job\n"
        "from trainer.pipeline_steps import claim_checkpoints\n"
        f"cfg = load_config(overrides={{'checkpoint.uri': {str(tmp_path / 'ckpt')!r}, 'checkpoint.owner': 'r'}})\n"
        "pipelines.local_run.claim_run_checkpoints(cfg)\n"
        f"step_cfg = load_config(overrides={{'checkpoint.uri': {str(tmp_path / 'step-ckpt')!r}}})\n"
        f"step_cfg = claim_checkpoints(step_cfg, {str(tmp_path / 'model')!r}, owner='local/train')\n"
        f"training_job(step_cfg, 'train', {str(tmp_path / 'ds')!r}, {str(tmp_path / 'model')!r})\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
        "assert not heavy, heavy[:8]\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
