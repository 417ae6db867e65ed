"""Horovod's compressors: ``Compression.none`` sends tensors as they are, ``Compression.fp16`` as float16."""

__all__ = ["Compression"]

from typing import Any

import torch


class _NoneCompressor:
    """Gradients travel as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _FP16Compressor:
    """Floating tensors travel as float16, and come back in their own dtype."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return (tensor.to(torch.float16) if tensor.dtype.is_floating_point else tensor), tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor.to(ctx) if ctx.is_floating_point else tensor


class Compression:
    """How tensors travel: ``Compression.none`` as they are, ``Compression.fp16`` as float16."""

    none = _NoneCompressor
    fp16 = _FP16Compressor
