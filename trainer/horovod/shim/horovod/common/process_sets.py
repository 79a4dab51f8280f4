"""`horovod.common.process_sets`: subsets of the processes that run collectives among themselves."""

from trainer.horovod.api import ProcessSet, add_process_set, global_process_set, remove_process_set

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
