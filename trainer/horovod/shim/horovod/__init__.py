"""kftrain's stand-in for the `horovod` package: only `horovod.torch`, over torch.distributed.

It is on `sys.path` only inside `kftrain horovod-run` / `python -m trainer.horovod.run`.
"""

#: The Horovod API this mirrors (0.28), marked as kftrain's shim by the local version label.
__version__ = "0.28.1+kftrain.shim"
#: Lets code (and kftrain's runner) tell the shim from a real Horovod installation.
KFTRAIN_SHIM = True
