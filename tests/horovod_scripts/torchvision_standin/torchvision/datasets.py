"""``datasets.MNIST``: a few synthetic 28x28 digits, the same on every process; nothing is downloaded.

``$TORCHVISION_STANDIN_SAMPLES`` sets the number of training images (default 48);
the test set has half as many.
"""

__all__ = ["MNIST"]

import os
from collections.abc import Callable
from typing import Any

import torch


class MNIST(torch.utils.data.Dataset[tuple[Any, int]]):
    def __init__(
        self,
        root: str,
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        download: bool = False,
    ) -> None:
        count = int(os.environ.get("TORCHVISION_STANDIN_SAMPLES", "48"))
        count = count if train else max(1, count // 2)
        generator = torch.Generator().manual_seed(1 if train else 2)
        self.targets = torch.randint(0, 10, (count,), generator=generator)
        self.data = torch.randint(0, 256, (count, 28, 28), generator=generator, dtype=torch.uint8)
        self.transform, self.target_transform = transform, target_transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        image: Any = self.data[index]
        target: Any = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
