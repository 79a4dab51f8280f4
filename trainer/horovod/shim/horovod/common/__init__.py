"""`horovod.common`: the framework-independent parts a PyTorch script imports (exceptions, process sets)."""
