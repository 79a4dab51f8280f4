"""The classification task's models: the MLP it trains, and the module it exports."""

from __future__ import annotations

import torch
from torch import nn


def build_mlp(num_features: int, hidden_sizes: list[int], num_classes: int, dropout: float) -> nn.Sequential:
    """A plain MLP: Linear -> ReLU (-> Dropout) per hidden layer, then a linear head of logits."""
    layers: list[nn.Module] = []
    width = num_features
    for h in hidden_sizes:
        layers += [nn.Linear(width, h), nn.ReLU()]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


class ServingModel(nn.Module):
    """Normalisation + classifier: raw features in, logits out."""

    def __init__(self, model: nn.Module, mean: list[float], std: list[float]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.mean) / self.std)
