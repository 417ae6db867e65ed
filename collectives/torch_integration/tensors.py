"""Tensors as the library takes them: dtypes, checks, the path each takes, zero-copy views."""

__all__ = ["Comm", "explain_path"]

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
import torch
import torch.distributed as dist

from .. import api
from ..errors import CollectivesError, InvalidBufferError, UnsupportedDtypeError

if TYPE_CHECKING:
    from mpi4py import MPI

    Comm = api.Communicator | MPI.Comm | dist.ProcessGroup | None
else:
    Comm = Any

TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
}
_NO_GPU_BACKEND = (
    "cuda tensors need the GPU backend, which needs CuPy (pip install cupy-cuda12x or cupy-cuda13x), "
    "or torch.distributed initialised with NCCL (torch.distributed.init_process_group('nccl'))"
)
_HOST = "collectives"
_DEVICE = "collectives-cuda"
FALLBACK = "torch.distributed"

# torch.distributed's op for each of ours, for the NCCL fallback and the c10d backend
TORCH_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


def torch_dtype_name(dtype: torch.dtype) -> str:
    name = TORCH_DTYPES.get(dtype)
    if name is None:
        supported = ", ".join(str(d).removeprefix("torch.") for d in TORCH_DTYPES)
        raise UnsupportedDtypeError(f"unsupported dtype {dtype}; supported dtypes are {supported}")
    return name


def dense_tensor(tensor: object) -> torch.Tensor:
    """``tensor``; raises unless it is a dense (strided) torch tensor: every tensor check starts here."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidBufferError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise InvalidBufferError(f"tensor has layout {tensor.layout}; only dense (strided) tensors are taken")
    return tensor


def check_tensor(tensor: torch.Tensor) -> str:
    """Raise unless ``tensor`` is dense, contiguous and of a dtype the library moves; its dtype name."""
    name = torch_dtype_name(dense_tensor(tensor).dtype)
    if not tensor.is_contiguous():
        raise InvalidBufferError(
            f"tensor of shape {tuple(tensor.shape)} and strides {tensor.stride()} is not contiguous; "
            "pass tensor.contiguous()"
        )
    return name


def _nccl_initialised() -> bool:
    return dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend())


def _cupy_available() -> bool:
    """Whether CuPy imports (asked only for cuda tensors, so cpu-only programs never import it)."""
    try:
        import cupy  # noqa: F401
    except Exception:  # a CuPy built for another CUDA fails with errors of its own
        return False
    return True


def route_of(tensor: torch.Tensor, comm: Comm) -> str:
    """``_HOST`` for a cpu tensor; for a cuda one ``_DEVICE`` with CuPy, else ``FALLBACK`` with NCCL.

    Raises for any other.
    """
    if tensor.device.type == "cpu":
        return _HOST
    if tensor.device.type == "cuda":
        if _cupy_available():
            return _DEVICE
        if not _nccl_initialised():
            raise InvalidBufferError(_NO_GPU_BACKEND)
        if comm is not None:
            raise InvalidBufferError("cuda tensors use torch.distributed's default group; pass comm=None")
        return FALLBACK
    raise InvalidBufferError(f"tensor is on device {tensor.device}; collectives takes cpu tensors")


def cuda_without_cupy(tensor: object) -> bool:
    """Whether ``tensor`` is a cuda tensor on a host without CuPy: its collectives go through NCCL."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda" and not _cupy_available()


def explain_path(tensor: torch.Tensor, comm: Comm = None) -> str:
    """Which path a collective on ``tensor`` takes, or why it cannot take any.

    Returns:
        One line: ``"collectives: ..."`` (a zero-copy numpy view of a cpu
        tensor, or a zero-copy CuPy view of a cuda one, named with the
        communicator's device path once known), ``"torch.distributed: ..."`` (a
        cuda tensor through the NCCL process group, where CuPy is missing), or
        ``"unsupported: <the error the collective raises>"``.
    """
    try:
        name = check_tensor(tensor)
        route = route_of(tensor, comm)
    except CollectivesError as error:
        return f"unsupported: {error}"
    if route == _HOST:
        through = " (through int16)" if tensor.dtype == torch.bfloat16 else ""
        return f"collectives: zero-copy numpy view{through} of a cpu {name} tensor"
    if route == _DEVICE:
        known = comm.device_path if isinstance(comm, api.Communicator) else None
        path = known or "cuda ipc on one node, else cuda-aware mpi or host staging"
        return f"collectives: zero-copy CuPy view (DLPack) of a {name} tensor on {tensor.device}, over {path}"
    return f"torch.distributed: {name} tensor on {tensor.device} through the default NCCL process group"


# numpy's type of each dtype whose bits numpy reads as torch does; bfloat16 goes through int16
_NUMPY_TYPES: dict[torch.dtype, np.dtype[Any]] = {
    **{dtype: np.dtype(name) for dtype, name in TORCH_DTYPES.items() if dtype != torch.bfloat16},
    torch.bfloat16: np.dtype(np.int16),
    torch.bool: np.dtype(np.bool_),
}


class _Memory:
    """A cpu tensor's memory as numpy's array interface describes it; holds the tensor while viewed."""

    __slots__ = ("__array_interface__", "tensor")

    def __init__(self, tensor: torch.Tensor, kind: np.dtype[Any]) -> None:
        self.tensor = tensor
        self.__array_interface__ = {
            "data": (tensor.data_ptr(), False),
            "shape": tuple(tensor.shape),
            "strides": tuple(s * kind.itemsize for s in tensor.stride()),
            "typestr": kind.str,
            "version": 3,
        }


def host_view(tensor: torch.Tensor) -> np.ndarray:
    """A numpy array over a cpu ``tensor``'s memory: no copy (bfloat16 through ml_dtypes).

    Made from the tensor's address rather than ``Tensor.numpy()``, which marks the
    storage as never resizable again (gloo leaves it resizable, and PowerSGD resizes).
    """
    kind = _NUMPY_TYPES.get(tensor.dtype)
    if kind is None:
        raise UnsupportedDtypeError(f"no numpy view of a {tensor.dtype} tensor")
    if tensor.device.type != "cpu":
        raise InvalidBufferError(f"a numpy view needs a cpu tensor, not a {tensor.device} one")
    view = np.asarray(_Memory(tensor, kind))
    # the same bits through int16 are ml_dtypes' bfloat16, which torch has no numpy type to give
    return view.view(ml_dtypes.bfloat16) if tensor.dtype == torch.bfloat16 else view


def array_view(tensor: torch.Tensor) -> Any:
    """A zero-copy array over ``tensor``: numpy for a cpu tensor, CuPy (DLPack) for a cuda one."""
    if tensor.device.type != "cuda":
        return host_view(tensor)
    from ..backends import adopt

    return adopt(tensor.detach())


@contextlib.contextmanager
def device_of(*tensors: torch.Tensor) -> Iterator[None]:
    """Run CuPy work on the tensors' device, and finish it before torch's next kernels read them.

    The collectives' kernels and copies run on CuPy's current stream, on the thread
    the job runs on; synchronising it at the end orders them before whatever torch
    queues next on its own stream.
    """
    device = tensors[0].device
    if device.type != "cuda":
        yield
        return
    import cupy

    with cupy.cuda.Device(device.index if device.index is not None else torch.cuda.current_device()):
        yield
        cupy.cuda.get_current_stream().synchronize()


def reduce_in_place(tensor: torch.Tensor, op: str, communicator: api.Communicator) -> torch.Tensor:
    with device_of(tensor):
        view = array_view(tensor)
        api.allreduce(view, op, out=view, comm=communicator)
    return tensor
