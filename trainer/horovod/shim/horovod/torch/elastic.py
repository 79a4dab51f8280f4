"""`horovod.torch.elastic` is not provided: importing it says what to use instead."""

from trainer.horovod.api import ELASTIC_MESSAGE, ShimUnsupportedImportError

raise ShimUnsupportedImportError(ELASTIC_MESSAGE)
