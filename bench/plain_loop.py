"""What the hand-written baseline loops of the trainer benchmarks share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def loader_steps(loader: Iterable[T], steps: int) -> Iterator[T]:
    """Exactly `steps` batches of `loader`, going through it again (a new epoch) when it runs out."""
    done = 0
    while done < steps:
        for batch in loader:
            yield batch
            done += 1
            if done == steps:
                return
