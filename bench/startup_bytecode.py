"""Benchmark: the CPU a fresh process spends importing kftrain, with and without the project's
modules compiled (`scripts/setup` compiles them once).

Reported, not asserted. Where PYTHONDONTWRITEBYTECODE is set (CI machines, the project image) no
process writes the bytecode of the project's own modules, which an editable install does not
compile: each torchrun rank, agent and pipeline step then compiles them again. Both cases run in
the same script, alternating, on a copy of the project's sources; the baseline is the uncompiled
copy, and the ratio is what compiling saves per process.

    .venv/bin/python bench/startup_bytecode.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "components", "pipelines")
#: What a training rank and a pipeline step import before their first line of work.
IMPORTS = {
    "digits rank": "import trainer.train, trainer.tasks.classification.data, trainer.tasks.classification.model",
    "fine-tuning rank": "import trainer.train, trainer.tasks.pretrained_lm, trainer.pretrained",
    "evaluate step": "import components.runtime, trainer.pipeline_steps, trainer.evaluate",
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def import_cpu(source: Path, statement: str) -> float:
    """CPU seconds of one fresh interpreter that runs `statement` against the sources in `source`."""
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONDONTWRITEBYTECODE": "1"}
    before = children_cpu()
    subprocess.run([sys.executable, "-c", statement], env=env, cwd=source, check=True)
    return children_cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain, compiled = Path(tmp, "plain"), Path(tmp, "compiled")
        for copy in (plain, compiled):
            for package in PACKAGES:
                shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
        for package in PACKAGES:
            compileall.compile_dir(compiled / package, quiet=1)
        import_cpu(plain, "import torch, transformers")  # the page cache warm for both
        print(f"CPU seconds of one fresh process, median of {args.repeats}:")
        for name, statement in IMPORTS.items():
            times: dict[str, list[float]] = {"plain": [], "compiled": []}
            for _ in range(args.repeats):
                times["plain"].append(import_cpu(plain, statement))
                times["compiled"].append(import_cpu(compiled, statement))
            medians = {case: statistics.median(values) for case, values in times.items()}
            print(
                f"  {name:14s} uncompiled {medians['plain']:.2f} s, compiled {medians['compiled']:.2f} s: "
                f"{medians['compiled'] / medians['plain']:.2f}x the CPU"
            )


if __name__ == "__main__":
    main()
