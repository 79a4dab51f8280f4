"""Compile every pipeline to `compiled/<name>.yaml` and every component to
`compiled/components/<name>.yaml` (deterministic output, kept in Git)."""

from __future__ import annotations

from pathlib import Path

from kfp import compiler

from pipelines.registry import COMPONENTS, PIPELINES


def compile_all(output_dir: str | Path = "compiled") -> list[Path]:
    """Write one YAML per pipeline and per component; return the paths written."""
    out = Path(output_dir)
    targets = [(out / f"{name}.yaml", func) for name, func in PIPELINES.items()]
    targets += [(out / "components" / f"{name}.yaml", comp) for name, comp in COMPONENTS.items()]
    for path, func in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(pipeline_func=func, package_path=str(path))
    return [path for path, _ in targets]
