"""The ``collectives`` c10d backend's rooted collectives (reduce, gather, scatter) and all-to-all."""

__all__: list[str] = []

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllToAllOptions, GatherOptions, ReduceOptions, ScatterOptions

from ... import api
from ...errors import InvalidBufferError, MismatchError
from ..tensors import host_view
from .base import (
    GroupBase,
    Staged,
    c10d_op,
    checked_args,
    host_tensors,
    op_for,
    premul_factor,
    premultiplied,
    root_of,
    staged_tensors,
    tensor_like,
    write_back,
)


def _one(tensors: list[torch.Tensor], collective: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise InvalidBufferError(f"{collective} takes one tensor per rank, got {len(tensors)}")
    return tensors[0]


class RootedCollectives(GroupBase):
    """c10d's ``reduce``, ``gather``, ``scatter``, ``alltoall`` and ``all_to_all_single`` (with splits)."""

    def reduce(  # type: ignore[override]
        self, tensors: list[torch.Tensor], opts: ReduceOptions | None = None
    ) -> dist.Work:
        root = 0 if opts is None else opts.rootRank

        def check() -> tuple[str, float | None, Staged]:
            op = c10d_op(opts)
            root_of(root, self.size())
            return op, premul_factor(opts), Staged(checked_args(_one(tensors, "reduce"), op))

        op, factor, stage = self._checks("reduce", check)

        def job(communicator: api.Communicator) -> None:
            # a premul_sum scales the root's tensor in place (the result replaces it), the others' a copy
            scaled = premultiplied(stage.stage, factor, in_place=communicator.rank == root)
            view = stage.view if scaled is stage.stage else host_view(scaled).reshape(-1)
            api.reduce(view, op_for(op, stage.tensor), root, out=view, comm=communicator)
            if communicator.rank == root:
                stage.finish()

        return self._run(job, tensors)

    def gather(  # type: ignore[override]
        self,
        output_lists: list[list[torch.Tensor]],
        tensors: list[torch.Tensor],
        opts: GatherOptions | None = None,
    ) -> dist.Work:
        root = 0 if opts is None else opts.rootRank

        def check() -> Staged:
            root_of(root, self.size())
            mine = checked_args(_one(tensors, "gather"))
            if self.rank() == root:
                outputs = host_tensors(_one(output_lists, "gather"))  # type: ignore[arg-type]
                tensor_like(outputs, self.size(), mine, "gather needs {} outputs of shape {}, {} at the root")
            elif output_lists and any(output_lists):
                raise InvalidBufferError("gather takes outputs at the root only")
            return Staged(mine)

        stage = self._checks("gather", check)

        def job(communicator: api.Communicator) -> None:
            whole = api.gather(stage.view, root, comm=communicator)
            if communicator.rank == root:
                for output, piece in zip(
                    output_lists[0], np.split(whole.reshape(-1), communicator.size), strict=True
                ):
                    write_back(output, piece)

        return self._run(job, output_lists)

    def scatter(  # type: ignore[override]
        self,
        tensors: list[torch.Tensor],
        input_lists: list[list[torch.Tensor]],
        opts: ScatterOptions | None = None,
    ) -> dist.Work:
        root = 0 if opts is None else opts.rootRank

        def check() -> tuple[Staged, Staged | None]:
            root_of(root, self.size())
            out = Staged(checked_args(_one(tensors, "scatter")), read=False)
            if self.rank() == root:
                inputs = host_tensors(_one(input_lists, "scatter"))  # type: ignore[arg-type]
                tensor_like(
                    inputs, self.size(), out.tensor, "scatter needs {} inputs of shape {}, {} at the root"
                )
                return out, Staged(torch.cat([t.reshape(-1) for t in inputs]))
            if input_lists and any(input_lists):
                raise InvalidBufferError("scatter takes inputs at the root only")
            return out, None

        out, whole = self._checks("scatter", check)

        def job(communicator: api.Communicator) -> None:
            source = whole.view if whole is not None else None
            api.scatter(
                source, root, counts=[out.tensor.numel()] * communicator.size, out=out.view, comm=communicator
            )
            out.finish()

        return self._run(job, tensors)

    def alltoall(  # type: ignore[override]
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllToAllOptions | None = None
    ) -> dist.Work:
        """c10d's ``all_to_all``: input ``j`` goes to rank ``j``; output ``i`` comes from rank ``i``."""

        def check() -> tuple[list[Staged], list[int], list[int]]:
            ins, outs = host_tensors(inputs), host_tensors(outputs)
            if len(ins) != self.size() or len(outs) != self.size():
                raise InvalidBufferError(f"all_to_all needs {self.size()} inputs and outputs")
            if len({t.dtype for t in ins + outs}) > 1:
                raise InvalidBufferError("all_to_all needs every input and output of one dtype")
            return staged_tensors(ins), [t.numel() for t in ins], [t.numel() for t in outs]

        staged, sends, receives = self._checks("alltoall", check)

        def job(communicator: api.Communicator) -> None:
            whole = np.concatenate([stage.view for stage in staged]) if staged else np.empty(0)
            pieces = _exchange(whole, sends, receives, communicator)
            for output, piece in zip(outputs, pieces, strict=True):
                write_back(output, piece)

        return self._run(job, outputs)

    def all_to_all_single(  # type: ignore[override]
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: AllToAllOptions | None = None,
    ) -> dist.Work:
        """c10d's ``all_to_all_single``: equal shares along dim 0, or the rows ``input_splits`` says."""

        def check() -> tuple[Staged, list[int], list[int]]:
            out, whole = host_tensors([output, tensor])
            if out.dtype != whole.dtype:
                raise InvalidBufferError(
                    f"all_to_all_single's output is {out.dtype}, its input {whole.dtype}"
                )
            return (
                Staged(whole),
                _splits(whole, input_splits, self.size()),
                _splits(out, output_splits, self.size()),
            )

        stage, sends, receives = self._checks("alltoall", check)
        # without splits every rank's shares are equal (and alike, which the call's checks confirm);
        # with them the ranks agree on every rank's splits first
        equal = not input_splits and not output_splits and sends == receives

        def job(communicator: api.Communicator) -> None:
            if equal:
                write_back(output, api.alltoall(stage.view, comm=communicator))
                return
            pieces = _exchange(stage.view, sends, receives, communicator)
            write_back(output, np.concatenate(pieces) if pieces else stage.view[:0])

        return self._run(job, [output])

    alltoall_base = all_to_all_single  # type: ignore[assignment]


def _splits(tensor: torch.Tensor, splits: list[int], size: int) -> list[int]:
    """Elements of each rank's share of ``tensor``: its rows ``splits`` says, or equal shares without."""
    row = tensor[0].numel() if tensor.dim() and tensor.shape[0] else 1
    if not splits:
        rows = tensor.shape[0] if tensor.dim() else 1
        if rows % size:
            raise InvalidBufferError(f"all_to_all_single splits {rows} rows into {size} equal shares")
        return [rows // size * row] * size
    if (
        len(splits) != size
        or any(s < 0 for s in splits)
        or sum(splits) != (tensor.shape[0] if tensor.dim() else 1)
    ):
        raise InvalidBufferError(f"splits {list(splits)} do not cut {tuple(tensor.shape)} into {size} shares")
    return [s * row for s in splits]


def _exchange(
    whole: np.ndarray, sends: list[int], receives: list[int], communicator: api.Communicator
) -> list[np.ndarray]:
    """Send share ``j`` of ``whole`` (``sends[j]`` elements) to rank ``j``; get ``receives[i]`` from ``i``.

    The ranks agree on every rank's sends and receives first, and raise
    :class:`~collectives.MismatchError` where a share's size differs between its
    sender and its receiver. Shares of one size are then one ``alltoall``; of
    several, every share is padded to the largest one, then cut back.
    """
    size = communicator.size
    mine = np.array(sends + receives, np.int64)
    every = np.asarray(api.allgather(mine, comm=communicator)).reshape(size, 2, size)
    _agreed(every[:, 0], every[:, 1])
    width = int(every.max(initial=0))
    if width == 0:
        return [whole[:0]] * size
    if all(n == width for n in sends + receives):
        return list(np.split(api.alltoall(whole, comm=communicator), size))
    padded = np.zeros(size * width, whole.dtype)
    offsets = np.cumsum([0, *sends])
    for j in range(size):
        padded[j * width : j * width + sends[j]] = whole[offsets[j] : offsets[j] + sends[j]]
    result = api.alltoall(padded, comm=communicator)
    return [result[i * width : i * width + receives[i]] for i in range(size)]


def _agreed(sends: np.ndarray, receives: np.ndarray) -> None:
    """Raise unless what each rank ``i`` sends rank ``j``, ``sends[i, j]``, is what ``j`` expects of ``i``.

    ``receives[j, i]`` is that; every rank has the same matrices, so raises alike.
    """
    differ = np.argwhere(sends != receives.T)
    if not len(differ):
        return
    clauses: list[str] = []
    fields: dict[str, dict[str, tuple[int, ...]]] = {}
    for i, j in differ[:4].tolist():
        sent, expected = int(sends[i, j]), int(receives[j, i])
        clauses.append(f"rank {i} sends {sent} elements to rank {j}, which expects {expected}")
        fields[f"share from rank {i} to rank {j}"] = {f"{sent} sent": (i,), f"{expected} expected": (j,)}
    more = f" (and {len(differ) - 4} more shares)" if len(differ) > 4 else ""
    raise MismatchError(f"all_to_all: the ranks' split sizes disagree: {'; '.join(clauses)}{more}", fields)
