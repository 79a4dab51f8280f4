"""`hvd.SyncBatchNorm`: batch normalization whose batch statistics cover every process's batch.

Horovod's module computes the statistics with CUDA-only kernels; here they are plain tensor ops
over two differentiable allreduces (the sum and count, then the squared deviations), so CPU
tensors work too. The gradient is Horovod's: each rank's input gradient includes what every
rank's loss contributes through the shared statistics; the weight and bias gradients stay local
(DistributedOptimizer reduces them, as with any parameter).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from trainer.horovod import api


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batches of all processes (N-dimensional: input `(N, C, ...)`),
    with Horovod's arguments; in eval mode, or on one process, plain batch normalization."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize `input` with the statistics of every process's batch (training mode)."""
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
        if (not self.training and self.track_running_stats) or api.size() == 1:
            return F.batch_norm(
                input,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                self.training or not self.track_running_stats,
                self._factor(),
                self.eps,
            )
        return self._synced(input)

    def _factor(self) -> float:
        # torch's convention: momentum None is a cumulative average over the batches seen.
        if self.momentum is not None:
            return self.momentum
        return 1.0 / float(self.num_batches_tracked) if self.track_running_stats else 0.0

    def _synced(self, input: torch.Tensor) -> torch.Tensor:
        # Half-precision inputs: statistics (and counts past 2048) in float32, the output in theirs.
        low = input.dtype in (torch.float16, torch.bfloat16)
        x = input.float() if low else input
        dims = [d for d in range(x.dim()) if d != 1]
        shape = [1, -1] + [1] * (x.dim() - 2)
        local = torch.cat([x.sum(dims), x.new_tensor([x.numel() // x.shape[1]])])
        totals = api.allreduce(local, op=api.Sum, name="sync_batch_norm.sum")
        count = totals[-1]
        mean = totals[:-1] / count
        centered = x - mean.reshape(shape)
        var = api.allreduce((centered * centered).sum(dims), op=api.Sum, name="sync_batch_norm.var") / count
        if self.training and self.track_running_stats:
            with torch.no_grad():
                factor = self._factor()
                unbiased = var * (count / (count - 1)) if count > 1 else var
                self.running_mean.mul_(1 - factor).add_(factor * mean.to(self.running_mean.dtype))
                self.running_var.mul_(1 - factor).add_(factor * unbiased.to(self.running_var.dtype))
        out = centered * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out.to(input.dtype)
