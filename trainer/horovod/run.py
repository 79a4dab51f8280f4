"""Run a Horovod PyTorch script unchanged, on torch.distributed.

    python -m trainer.horovod.run train.py [ARGS]          # one process per pod / machine
    python -m torch.distributed.run --nproc-per-node 4 -m trainer.horovod.run train.py [ARGS]
    kftrain horovod-run train.py [ARGS]

Inside this process only, `import horovod` and `import horovod.torch` resolve to kftrain's shim
(`trainer/horovod/shim/`, first on `sys.path`): the script's multiprocessing children (spawn,
forkserver) get that path; a program it starts with `subprocess` does not.
A real Horovod installation is never shadowed: if one is importable the runner refuses (a script
meant for real Horovod should be started with `horovodrun`, which this runner does not replace).
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from trainer.launch.spec import torchrun_command

SHIM_DIR = Path(__file__).resolve().parent / "shim"
MODULE = "trainer.horovod.run"


class RealHorovodInstalled(RuntimeError):
    """A real `horovod` package is importable, and the shim will not hide it."""


def real_horovod(path: list[str]) -> str | None:
    """Where a real (non-shim) `horovod` package is importable from `path`, or None."""
    for entry in path:
        root = Path(entry or os.getcwd())
        if root.resolve() == SHIM_DIR:
            continue
        for candidate in (root / "horovod" / "__init__.py", root / "horovod.py"):
            if candidate.is_file():
                return str(candidate)
    # Packages that finders other than plain directories provide (zip files, editable installs).
    spec = importlib.util.find_spec("horovod") if "horovod" not in sys.modules else None
    if spec is not None and spec.origin and not Path(spec.origin).resolve().is_relative_to(SHIM_DIR):
        return spec.origin
    return None


#: The files of this runner's frames above a script's own: this one, and runpy's where it is not
#: frozen (Python 3.10, `-X frozen_modules=off`).
_RUNNER_FILES = {Path(__file__).resolve(), Path(runpy.__file__).resolve()}


def run_script(script: str, args: list[str]) -> None:
    """Run `script` as `__main__` with `args`, `horovod` resolving to the shim.

    Raises RealHorovodInstalled before running anything if a real Horovod is importable."""
    script_dir = str(Path(script).resolve().parent)
    search = [script_dir, *sys.path]  # what `python script.py` would search
    found = real_horovod(search)
    if found:
        raise RealHorovodInstalled(
            f"a real Horovod is installed ({found}); kftrain's Horovod shim will not shadow it. Start the script "
            "with horovodrun to use that Horovod, or run it in an environment without Horovod "
            "(pip uninstall horovod) to run it on torch.distributed through kftrain."
        )
    sys.argv = [script, *args]
    sys.path[:0] = [str(SHIM_DIR), script_dir]
    runpy.run_path(script, run_name="__main__")


def not_in_shim(exc: ImportError) -> str | None:
    """The `horovod` module a script's import asked for that the shim lacks (`horovod.tensorflow`,
    `horovod.keras`, `horovod.mxnet`, ...), else None (another module is missing: the script's own
    error). A script that catches the ImportError itself never gets here: it runs on as it would."""
    name = exc.name or ""
    if isinstance(exc, ModuleNotFoundError) and name.startswith("horovod."):
        return name
    # `from horovod import tensorflow`, `from horovod.common import util`: Python reports the
    # package and the name it could not import from it.
    if (name == "horovod" or name.startswith("horovod.")) and (
        found := re.match(r"cannot import name '([\w.]+)'", str(exc))
    ):
        return f"{name}.{found.group(1)}"
    return None


def shim_modules() -> list[str]:
    """The modules of the `horovod` package the shim provides (Horovod's PyTorch side), but
    `horovod.torch.elastic`: importing that one says what to use instead."""
    names = {
        ".".join(p.relative_to(SHIM_DIR).with_suffix("").parts).removesuffix(".__init__")
        for p in SHIM_DIR.rglob("*.py")
    }
    return sorted(names - {"horovod", "horovod.torch.elastic"})


#: How to start processes without Horovod's own launchers (`horovod.run`, Spark, Ray).
START_PROCESSES = (
    "start the processes with torchrun (`python -m torch.distributed.run --nproc-per-node N -m "
    "trainer.horovod.run SCRIPT [ARGS]`) or as a PyTorchJob (docs/horovod.md)"
)


def not_provided(missing: str) -> str:
    """Why the shim lacks the `horovod` module (or name) `missing`, and what to do."""
    part = missing.split(".")[1]
    if part in ("torch", "common"):
        return (
            "which kftrain's Horovod shim does not provide: it has Horovod's PyTorch API in "
            f"{', '.join(shim_modules())}; import the names from horovod.torch"
        )
    if part in ("run", "runner", "spark", "ray"):
        return (
            "which kftrain's Horovod shim does not provide: Horovod's own launchers (horovod.run, horovodrun, "
            f"Spark and Ray) are not part of it; {START_PROCESSES}, each process running the training function"
        )
    return (
        "which kftrain's Horovod shim does not provide: it provides only horovod.torch (a PyTorch script's Horovod "
        "API, on torch.distributed); run a TensorFlow, Keras or MXNet script with horovodrun and a real Horovod"
    )


def launcher_word_problem(first: str, is_file: bool = False) -> str | None:
    """What is wrong when the first word after the runner is not a script but what horovodrun
    takes there: its flags (`-np 4`, `-H host:4`, `--gloo`; unless a file of that name exists,
    a script named `-x.py`) or the interpreter (`python x.py`, `/usr/bin/python3`)."""
    if first.startswith("-") and not is_file:
        return (
            f"{first}: a horovodrun flag; this runner starts no processes, each one it runs in is one "
            f"Horovod process: {START_PROCESSES}"
        )
    if re.fullmatch(r"python[\d.]*", Path(first).name):
        return f"{first}: name the script itself, without the interpreter (kftrain horovod-run train.py [ARGS])"
    return None


def horovod_command(script: str, args: list[str] | tuple[str, ...] = (), python: str = "python") -> tuple[str, ...]:
    """The PyTorchJob container command that runs a Horovod script through torchrun
    (`JobSpec(command=...)`; torchrun reads the job's shape from the operator's `PET_*`)."""
    return torchrun_command(MODULE, [script, *args], python=python)


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.horovod.run SCRIPT [ARGS]`; the exit status of the script."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0] + "\n\nusage: python -m trainer.horovod.run SCRIPT [ARGS]")
        return 0 if argv else 2
    script = Path(argv[0])
    if problem := launcher_word_problem(argv[0], script.is_file()):
        print(f"kftrain horovod-run: {problem}", file=sys.stderr)
        return 2
    if not (script.is_file() or (script / "__main__.py").is_file()):
        what = "a folder without __main__.py" if script.is_dir() else "no such file"
        print(f"kftrain horovod-run: {argv[0]}: {what}; name the Horovod script to run", file=sys.stderr)
        return 2
    try:
        run_script(argv[0], argv[1:])
    except RealHorovodInstalled as exc:
        print(f"kftrain horovod-run: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        api = sys.modules.get("trainer.horovod.api")
        if api is not None and isinstance(exc, api.ShimUnsupportedError):  # horovod.torch.elastic
            return _unsupported(exc, argv[0], api)
        missing = not_in_shim(exc)
        if missing is None:
            _uncaught(exc)
            return 1
        print(f"kftrain horovod-run: {argv[0]} imports {missing}, {not_provided(missing)}", file=sys.stderr)
        return 1
    except Exception as exc:
        api = sys.modules.get("trainer.horovod.api")
        if api is not None and isinstance(exc, api.HorovodEnvironmentError):  # the environment's, not the script's
            print(f"kftrain horovod-run: hvd.init(): {exc}", file=sys.stderr)
            return 2
        if api is not None and isinstance(exc, api.ShimUnsupportedError):
            return _unsupported(exc, argv[0], api)
        if (part := _part_elsewhere(exc)) is not None:  # `horovod.run(...)`: as `from horovod import run`
            print(f"kftrain horovod-run: {argv[0]} uses {part}, {not_provided(part)}", file=sys.stderr)
            return 1
        _uncaught(exc)
        return 1
    return 0


def _part_elsewhere(exc: BaseException) -> str | None:
    """`horovod.run` (and Horovod's other parts) when `exc` is the shim package's AttributeError
    for one, else None."""
    shim = sys.modules.get("horovod")
    if not (isinstance(exc, AttributeError) and shim is not None and getattr(shim, "KFTRAIN_SHIM", False)):
        return None
    return f"horovod.{exc.name}" if exc.obj is shim and exc.name in shim.ELSEWHERE else None


def _unsupported(exc: BaseException, script: str, api: Any) -> int:
    """A feature the shim does not provide: its one line, which names the way out."""
    # One write: the line of each process of a node stays whole in their shared log.
    sys.stderr.write(f"kftrain horovod-run: {_called_at(exc, script)}: {exc}\n")
    api.ending_on_error()
    return 1


def _called_at(exc: BaseException, script: str) -> str:
    """`FILE:LINE` of the script's last frame in `exc`'s traceback (where it called the shim), else `script`."""
    ours = Path(__file__).resolve().parent
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if ours not in Path(f.filename).resolve().parents]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else script


def _uncaught(exc: BaseException) -> None:
    """End as `python script.py` does on the script's own error: its traceback from the script's
    first frame on, without this runner's and runpy's above it (a script that does not compile:
    its file, line and error alone, no "Traceback" line); and the shim, if the script started it,
    leaves at exit without waiting for the other processes."""
    report = traceback.TracebackException.from_exception(exc)
    frames = list(report.stack)
    while frames and (frames[0].filename == "<frozen runpy>" or Path(frames[0].filename).resolve() in _RUNNER_FILES):
        frames.pop(0)
    report.stack = traceback.StackSummary.from_list(frames)
    sys.stderr.write("".join(report.format()))
    api = sys.modules.get("trainer.horovod.api")
    if api is not None:
        api.ending_on_error()


if __name__ == "__main__":
    sys.exit(main())
