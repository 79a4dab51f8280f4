"""`horovod.torch.mpi_ops`: the collectives, the basics (init, rank, size, ...) and the ops, as in horovod.torch."""

from trainer.horovod.api import *  # noqa: F403
from trainer.horovod.api import __all__  # noqa: F401
