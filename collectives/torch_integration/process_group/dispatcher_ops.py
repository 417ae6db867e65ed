"""c10d's dispatcher ops that a Python process group cannot override, routed to the collectives backend."""

__all__: list[str] = []

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ReduceScatterOptions

# torch's trampoline for process groups written in Python forwards most collectives to the Python
# methods, but not all_gather_single and reduce_scatter_single: C++ callers of those (functional
# collectives, DTensor) reach c10d's dispatcher ops, whose cpu kernels ask the group for a C++
# backend it does not have. A kernel at the autograd key, which runs before the cpu one, takes the
# calls on this backend's groups and passes every other group's on to c10d's own kernel.
_LIBRARY: torch.library.Library | None = None


def _below_autograd(op: Any, *args: Any) -> Any:
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def _ours(process_group: Any, kind: type) -> Any:
    group = dist.ProcessGroup.unbox(process_group)
    return group if isinstance(group, kind) else None


def _allgather_base(kind: type) -> Callable[..., Any]:
    op = torch.ops.c10d._allgather_base_.default

    def kernel(output: torch.Tensor, tensor: torch.Tensor, process_group: Any, *rest: Any) -> Any:
        group = _ours(process_group, kind)
        if group is None:
            return _below_autograd(op, output, tensor, process_group, *rest)
        return output, group.all_gather_single(output, tensor).boxed()

    return kernel


def _reduce_scatter_base(kind: type) -> Callable[..., Any]:
    op = torch.ops.c10d._reduce_scatter_base_.default

    def kernel(
        output: torch.Tensor, tensor: torch.Tensor, process_group: Any, reduce_op: Any, *rest: Any
    ) -> Any:
        group = _ours(process_group, kind)
        if group is None:
            return _below_autograd(op, output, tensor, process_group, reduce_op, *rest)
        options = ReduceScatterOptions()
        options.reduceOp = reduce_op
        return output, group.reduce_scatter_single(output, tensor, options).boxed()

    return kernel


def route_to(kind: type) -> None:
    """Send c10d's all_gather_single and reduce_scatter_single ops on groups of ``kind`` to their methods."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library("c10d", "IMPL")  # type: ignore[no-untyped-call]
    library.impl("_allgather_base_", _allgather_base(kind), "AutogradCPU")  # type: ignore[no-untyped-call]
    library.impl("_reduce_scatter_base_", _reduce_scatter_base(kind), "AutogradCPU")  # type: ignore[no-untyped-call]
    _LIBRARY = library
