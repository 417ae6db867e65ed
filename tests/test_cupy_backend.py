"""The CuPy backend and device in one process (ranks as threads): on a GPU, and on the CPU's stand-in.

Each test runs on a GPU through CuPy (marked ``gpu``; skipped where there is none) and through
tests/host_cuda.py, which stands in for CuPy with host memory and the host build of the kernels
(skipped only where there is no C++ compiler): the backend's own code runs either way.
"""

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives.ops import OPS
from collectives.transport.device import IPC_HANDLE_BYTES
from collectives.transport.loopback import LoopbackWorld
from tests import host_cuda
from tests.fake_device import HostOnly


@pytest.fixture(params=host_cuda.KINDS)
def cupy(request: pytest.FixtureRequest) -> Iterator[Any]:
    """CuPy on a GPU, or the stand-in installed as ``cupy`` for the backend."""
    with host_cuda.cupy_for(request.param) as module:
        yield module


def on_host(cupy: Any) -> bool:
    return getattr(cupy, "host_emulation", False)


def test_backend_takes_cupy_arrays_and_cuda_tensors_zero_copy(cupy: Any) -> None:
    from collectives.backends import adopt, backend_for

    x = cupy.asarray(np.arange(6, dtype=np.float32))
    backend = backend_for(x)
    assert backend.name == "cupy" and backend.dtype_name(x) == "float32"
    assert backend.message(x).dtype == cupy.uint8 and backend.message(x).size == 24
    if on_host(cupy):
        pytest.skip("torch CUDA tensors need a GPU")
    torch = pytest.importorskip("torch")
    tensor = torch.arange(4.0, device="cuda", dtype=torch.bfloat16)
    view = adopt(tensor)
    assert view.data.ptr == tensor.data_ptr()
    assert backend_for(view).dtype_name(view) == "bfloat16"


def test_backend_views_copies_and_reductions(cupy: Any) -> None:
    import ml_dtypes

    from collectives.backends import backend_for

    grid = cupy.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    backend = backend_for(grid)
    flat = backend.flat_view(grid)
    assert flat.shape == (12,) and flat.data.ptr == grid.data.ptr
    assert backend.flat_view(grid[:, ::2]) is None
    work = backend.empty(12, grid)
    backend.copy(work, grid)  # shapes differ: copied through a reshape
    assert cupy.asnumpy(work).tolist() == list(range(12))
    assert backend.shares_memory(flat, grid) and not backend.shares_memory(work, grid)
    halves = cupy.asarray((np.arange(12) + 0.5).astype(ml_dtypes.bfloat16).view(np.uint16))
    halves = halves.view(np.dtype(ml_dtypes.bfloat16))
    assert backend.dtype_name(halves) == "bfloat16"
    backend.combine(OPS["sum"], halves, halves)  # bfloat16 reaches the kernels as its bits
    backend.divide(halves, 4)
    expected = ((np.arange(12) + 0.5) * 2 / 4).astype(ml_dtypes.bfloat16)
    assert cupy.asnumpy(halves.view(cupy.uint16)).tobytes() == expected.tobytes()
    backend.reduce_into(OPS["max"], work, flat, cupy.asarray(np.full(12, 5, dtype=np.float32)))
    assert cupy.asnumpy(work).tolist() == [5.0] * 6 + list(range(6, 12))


def test_device_copies_pinned_memory_and_ipc_handles(cupy: Any) -> None:
    from collectives.backends.cupy_backend import CupyDevice

    device = CupyDevice()
    src = cupy.asarray(np.arange(256, dtype=np.uint8))
    host = device.pinned(256)
    device.to_host(host, src)
    assert host.tolist() == list(range(256))
    dst = device.allocate(256)
    device.to_device(dst, host[::-1].copy())
    device.copy(dst[:128], src[128:])
    device.synchronize()
    assert cupy.asnumpy(dst[:128]).tolist() == list(range(128, 256))
    assert len(device.ipc_handle(dst)) == IPC_HANDLE_BYTES


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bfloat16"])
@pytest.mark.parametrize("path", ["host staging", "cuda ipc"])
def test_threads_match_numpy(cupy: Any, path: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import ml_dtypes  # noqa: F401 - bfloat16 for numpy

    if path == "cuda ipc" and not on_host(cupy):
        pytest.skip("CUDA IPC cannot map memory of its own process: tests/mpi/test_gpu.py runs it")
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "1" if path == "cuda ipc" else "0")
    size = 3
    averages = dtype != "int64"

    def host(rank: int) -> np.ndarray:
        return (np.arange(3000) % 17 + rank).astype(dtype)

    def run(loopback: Any) -> tuple[str | None, list[np.ndarray]]:
        # threads of one process share a node; device memory reaching the host transport fails it
        transport = HostOnly(loopback)
        comm = C.Communicator(transport)
        x = cupy.asarray(host(transport.rank).view(np.uint16 if dtype == "bfloat16" else dtype))
        if dtype == "bfloat16":
            x = x.view(np.dtype("bfloat16"))
        results = [
            C.allreduce(x, comm=comm, algorithm="ring"),
            C.reduce_scatter(x, comm=comm, algorithm="ring"),
            C.allgather(x, comm=comm, algorithm="ring"),
            C.allreduce(x, "avg" if averages else "max", comm=comm, algorithm="ring"),
        ]
        return comm.device_path, [cupy.asnumpy(r.view(cupy.uint8)) for r in results]

    outcomes = LoopbackWorld(size, timeout=60).run(run)
    total = sum(host(r).astype(np.float64) for r in range(size)).astype(dtype)
    with np.errstate(all="ignore"):
        second = np.true_divide(total, size) if averages else host(size - 1)
    for rank, (taken, (allreduced, share, gathered, other)) in enumerate(outcomes):
        assert taken == path
        assert other.tobytes() == second.astype(dtype).tobytes()
        assert allreduced.tobytes() == total.tobytes()
        assert share.tobytes() == total[rank * 1000 : (rank + 1) * 1000].tobytes()
        assert gathered.tobytes() == np.concatenate([host(r) for r in range(size)]).tobytes()
