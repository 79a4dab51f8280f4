"""`horovod.common.exceptions`: the error a failed or mismatched collective raises."""

from trainer.horovod.api import HorovodInternalError

__all__ = ["HorovodInternalError"]
