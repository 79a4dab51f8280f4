"""Horovod's PyTorch API over torch.distributed, so Horovod scripts run unchanged.

`trainer.horovod.api` is the `horovod.torch` surface; `trainer.horovod.run` runs a script with
`import horovod.torch` resolving to it (the `shim/` directory holds the `horovod` package that the
runner puts first on `sys.path`, in that process only).
"""
