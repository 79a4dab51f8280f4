"""The built-in classification task: an MLP over a normalised table (the demo: digits).

The task owns its code: `task` (the :class:`~trainer.tasks.base.Task`), `data` (the table's
two-pass data prep and the split reader), `model` (the MLP and its serving wrapper) and `report`
(the test-split report). Importing the package imports no torch: the up-front checks read a CSV's
header with `data` alone (:func:`trainer.data_rules.check_source`), in steps that never train.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # `trainer.tasks.classification:ClassificationTask` (a task spec) names the class here.
    if name == "ClassificationTask":
        from trainer.tasks.classification.task import ClassificationTask

        return ClassificationTask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
