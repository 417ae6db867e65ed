"""Adasum, Horovod's adaptive summation of gradients: its pairwise formula, its tree, and its allreduce.

Two vectors combine as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient stays 1 where its vector's squared norm is below the square root
of the smallest normal double): the sum of orthogonal vectors, the average of
equal ones. P ranks (a power of two) combine in a binary tree: at level
``l = 1, 2, 4, ...`` the partial results of ranks ``r`` and ``r ^ l`` combine,
the lower rank's as ``a``. Dot products and norms are taken in float64, per
tensor, as Horovod does for each tensor of a fused buffer.

Here every rank gathers every rank's tensors (one allgather, ``(P-1) S`` bytes
in per rank) and computes the same tree, so all ranks get the same bits;
Horovod's vector-halving exchange moves fewer bytes at large P for the same
result.
"""

__all__ = ["adasum", "adasum_allreduce_", "adasum_tree"]

import math
import sys
from collections.abc import Sequence

import numpy as np
import torch

from .. import api
from ..errors import UnsupportedDtypeError

_TINY = math.sqrt(sys.float_info.min)  # below this a squared norm counts as zero


def adasum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two tensors of one shape, in float64."""
    a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
    dot = float(torch.dot(a64, b64))
    a_norm, b_norm = float(torch.dot(a64, a64)), float(torch.dot(b64, b64))
    a_coeff = 1.0 - dot / a_norm * 0.5 if a_norm >= _TINY else 1.0
    b_coeff = 1.0 - dot / b_norm * 0.5 if b_norm >= _TINY else 1.0
    return (a_coeff * a64 + b_coeff * b64).reshape(a.shape)


def adasum_tree(rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """Adasum of every rank's tensor (``rows[r]`` is rank r's), in float64, as Horovod's tree pairs them.

    Raises:
        ValueError: the number of tensors is not a power of two.
    """
    count = len(rows)
    if count < 1 or count & (count - 1):
        raise ValueError(f"Adasum combines a power of two of tensors, got {count}")
    level = [row.double() for row in rows]
    while len(level) > 1:
        level = [adasum(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def adasum_allreduce_(tensors: Sequence[torch.Tensor], communicator: api.Communicator) -> None:
    """Replace each tensor by the Adasum over the ranks of that tensor; on the communication thread.

    Raises:
        UnsupportedDtypeError: a tensor is not of a floating type.
        NotImplementedError: the world size is not a power of two (as Horovod).
    """
    for tensor in tensors:
        if not tensor.dtype.is_floating_point:
            raise UnsupportedDtypeError(f"Adasum reduces floating tensors, not {tensor.dtype}")
    size = communicator.size
    if size & (size - 1):
        raise NotImplementedError(f"Adasum needs a power of two of ranks, not {size}")
    if size == 1 or not tensors:
        return
    # float64 on the wire: every rank then computes the tree from the same values
    flat = torch.cat([t.detach().reshape(-1).double().cpu() for t in tensors])
    every = torch.from_numpy(np.asarray(api.allgather(flat.numpy(), comm=communicator)).reshape(size, -1))
    start = 0
    for tensor in tensors:
        n = tensor.numel()
        combined = adasum_tree([every[r, start : start + n] for r in range(size)])
        tensor.copy_(combined.reshape(tensor.shape))
        start += n
