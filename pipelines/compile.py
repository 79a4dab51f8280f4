"""Compile every pipeline to `compiled/<name>.yaml` (deterministic output, kept in Git)."""

from __future__ import annotations

from pathlib import Path

from kfp import compiler

from pipelines.registry import PIPELINES


def compile_all(output_dir: str | Path = "compiled") -> list[Path]:
    """Write one YAML per pipeline; return the paths written."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, func in PIPELINES.items():
        path = out / f"{name}.yaml"
        compiler.Compiler().compile(pipeline_func=func, package_path=str(path))
        paths.append(path)
    return paths
