"""`horovod.torch.compression`: gradient compression for allreduce."""

from trainer.horovod.api import Compression

NoneCompressor = Compression.none
FP16Compressor = Compression.fp16

__all__ = ["Compression", "FP16Compressor", "NoneCompressor"]
