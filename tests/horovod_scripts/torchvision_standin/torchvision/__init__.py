"""A stand-in for the parts of torchvision that Horovod's elastic examples use: small models, fake MNIST."""

__all__ = ["datasets", "models", "transforms"]

from . import datasets, models, transforms
