"""`horovod.torch` for Horovod scripts run by kftrain: every name comes from trainer.horovod.api."""

from trainer.horovod.api import *  # noqa: F403
from trainer.horovod.api import __all__  # noqa: F401
