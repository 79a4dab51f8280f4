"""`horovod.torch.functions`: broadcasting model and optimizer state, and Python objects."""

from trainer.horovod.api import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]
