"""kftrain's stand-in for the `horovod` package: only `horovod.torch`, over torch.distributed.

It is on `sys.path` only inside `kftrain horovod-run` / `python -m trainer.horovod.run`.
"""

#: The Horovod API this mirrors (0.28), marked as kftrain's shim by the local version label.
__version__ = "0.28.1+kftrain.shim"
#: Lets code (and kftrain's runner) tell the shim from a real Horovod installation.
KFTRAIN_SHIM = True

#: Horovod's other parts, which its users reach as attributes of the package too (`horovod.run(fn, np=2)`).
ELSEWHERE = frozenset({"run", "runner", "spark", "ray", "tensorflow", "keras", "mxnet"})


def __getattr__(name: str):
    """A missing name is an AttributeError, as on any module (`hasattr` works); one of Horovod's
    other parts carries the package, which kftrain's runner turns into one line saying what to use
    instead (was: AttributeError's traceback for `horovod.run(fn, np=2)`)."""
    import sys

    raise AttributeError(f"module 'horovod' has no attribute {name!r}", name=name, obj=sys.modules[__name__])
