"""`horovod.torch.optimizer`: the optimizer wrapper that averages gradients across processes."""

from trainer.horovod.api import DistributedOptimizer, _DistributedOptimizer  # noqa: F401 (subclassed by libraries)

__all__ = ["DistributedOptimizer"]
