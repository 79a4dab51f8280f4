"""The image the components run: `trainer/image.py`'s, the one setting the training replicas'
default (`job.image`) comes from too (was: a copy here, and a change to it left the replicas on
the old image)."""

from trainer.image import IMAGE

__all__ = ["IMAGE"]
