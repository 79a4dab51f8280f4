"""Compile every pipeline to `compiled/<name>.yaml` and every component to
`compiled/components/<name>.yaml` (deterministic output, kept in Git).

The output folder may hold other files: a file of one of these names is replaced only when it
is an earlier compile of the same pipeline or component (KFP's header on its first line, its name
on the second), and every file is compiled aside first, so a compile that fails (or is refused)
changes nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from kfp import compiler

from pipelines.registry import COMPONENTS, PIPELINES
from trainer.errors import KftrainError

#: The first line KFP writes in every pipeline and component it compiles.
KFP_HEADER = "# PIPELINE DEFINITION\n"


class CompileRefused(KftrainError, ValueError):
    """A file where the compile would write is not one it wrote before."""


def _replace_problem(path: Path, compiled: Path | None = None) -> str | None:
    """Why the compile must not write `path` (None when it may): a link, something that is not a
    regular file, a regular file that is not a compiled pipeline (or, given the file `compiled`
    will be, not one of its name: another pipeline of the user's), or a parent that is a file."""
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                return f"{parent} is not a folder"
            break
    if path.is_symlink() or path.parent.is_symlink():
        link = path if path.is_symlink() else path.parent
        return f"{link} is a link (the compile writes only its own files, in the output folder)"
    if not path.exists():
        return None
    if not path.is_file():
        return f"{path} is not a regular file"
    first, name = _head(path)
    if first != KFP_HEADER.strip().encode():
        return f"{path} is not a compiled pipeline (its first line is not {KFP_HEADER.strip()!r})"
    if compiled is not None and name != _head(compiled)[1]:
        shown = name.decode(errors="replace")[:80]
        return f"{path} is another compiled pipeline ({shown!r}, not {_head(compiled)[1].decode()!r})"
    return None


def _refuse_if(problems: list[str], output_dir: str | Path) -> None:
    if problems:
        raise CompileRefused(
            f"--output-dir {output_dir}: {'; '.join(problems)}: nothing was written; move those files, or name "
            "another --output-dir"
        )


def _head(path: Path) -> tuple[bytes, bytes]:
    """The first two lines of `path` (KFP's header and `# Name: ...`), without their line ends
    (a checkout may end lines with CRLF)."""
    with open(path, "rb") as f:
        return f.readline(len(KFP_HEADER) + 2).rstrip(b"\r\n"), f.readline(400).rstrip(b"\r\n")


def compile_all(output_dir: str | Path = "compiled") -> list[Path]:
    """Write one YAML per pipeline and per component; return the paths written."""
    out = Path(output_dir)
    if out.is_symlink() and out.is_dir():  # the folder the user named, through a link: write in it
        out = out.resolve()
    targets = [(out / f"{name}.yaml", func) for name, func in PIPELINES.items()]
    targets += [(out / "components" / f"{name}.yaml", comp) for name, comp in COMPONENTS.items()]
    problems = list(dict.fromkeys(p for path, _ in targets if (p := _replace_problem(path))))
    _refuse_if(problems, output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Aside, in the output folder itself: the files then move into place on the same file system.
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".kftrain-compile-"))
    try:
        staged = []
        for i, (path, func) in enumerate(targets):
            compiler.Compiler().compile(pipeline_func=func, package_path=str(staging / f"{i}.yaml"))
            staged.append((staging / f"{i}.yaml", path))
        problems = list(dict.fromkeys(p for tmp, path in staged if (p := _replace_problem(path, tmp))))
        _refuse_if(problems, output_dir)  # now that the names are known: another pipeline of the user's
        for tmp, path in staged:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [path for path, _ in targets]
