"""`horovod.torch.sync_batch_norm`: batch norm over the global batch."""

from trainer.horovod.api import SyncBatchNorm

__all__ = ["SyncBatchNorm"]
