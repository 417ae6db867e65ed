"""The transforms the MNIST example composes: ``Compose``, ``ToTensor``, ``Normalize``."""

__all__ = ["Compose", "Normalize", "ToTensor"]

from collections.abc import Callable, Sequence
from typing import Any

import torch


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, value: Any) -> Any:
        for transform in self.transforms:
            value = transform(value)
        return value


class ToTensor:
    """A 28x28 uint8 image as a 1x28x28 float tensor in [0, 1]."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32).div(255).unsqueeze(0)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return (tensor - self.mean) / self.std
