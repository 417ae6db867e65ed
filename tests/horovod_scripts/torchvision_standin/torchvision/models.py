"""Any model name (``models.resnet50()``) gives a small classifier of 3x224x224 images into 1000 classes."""

__all__: list[str] = []  # every name is a model: see __getattr__

from typing import Any

import torch


def _small_classifier(**kwargs: Any) -> torch.nn.Module:
    # pooled to 4x4 first so that a batch of full-size images costs little on a shared CPU
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, 1000))


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    return _small_classifier
