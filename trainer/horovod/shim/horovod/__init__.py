"""kftrain's stand-in for the `horovod` package: only `horovod.torch`, over torch.distributed.

It is on `sys.path` only inside `kftrain horovod-run` / `python -m trainer.horovod.run`.
"""

#: The Horovod API this mirrors (0.28), marked as kftrain's shim by the local version label.
__version__ = "0.28.1+kftrain.shim"
#: Lets code (and kftrain's runner) tell the shim from a real Horovod installation.
KFTRAIN_SHIM = True

#: Horovod's other parts, which its users reach as attributes of the package too (`horovod.run(fn, np=2)`).
_ELSEWHERE = frozenset({"run", "runner", "spark", "ray", "tensorflow", "keras", "mxnet"})


def __getattr__(name: str):
    """`horovod.run`, `horovod.spark`, ... looked up on the package: the ImportError their import
    gets, which kftrain's runner turns into one line saying what to use instead (was:
    AttributeError's traceback). Any other missing name is an AttributeError, as usual."""
    if name in _ELSEWHERE:
        raise ImportError(f"cannot import name '{name}' from 'horovod'", name="horovod")
    raise AttributeError(f"module 'horovod' has no attribute {name!r}")
