"""The CuPy backend and device on a real GPU, in one process (ranks as threads over host staging)."""

from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives.transport.device import IPC_HANDLE_BYTES
from collectives.transport.loopback import LoopbackWorld


def _cupy() -> Any:
    try:
        import cupy
    except Exception:
        pytest.skip("CuPy is not installed; the GPU tests run on a GPU host")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no CUDA device here")
    except Exception as error:
        pytest.skip(f"no CUDA device here ({error})")
    return cupy


pytestmark = pytest.mark.gpu


def test_backend_takes_cupy_arrays_and_cuda_tensors_zero_copy() -> None:
    cupy = _cupy()
    from collectives.backends import adopt, backend_for

    x = cupy.arange(6, dtype=cupy.float32)
    backend = backend_for(x)
    assert backend.name == "cupy" and backend.dtype_name(x) == "float32"
    assert backend.message(x).dtype == cupy.uint8 and backend.message(x).size == 24
    torch = pytest.importorskip("torch")
    tensor = torch.arange(4.0, device="cuda", dtype=torch.bfloat16)
    view = adopt(tensor)
    assert view.data.ptr == tensor.data_ptr()
    assert backend_for(view).dtype_name(view) == "bfloat16"


def test_device_copies_pinned_memory_and_ipc_handles() -> None:
    cupy = _cupy()
    from collectives.backends.cupy_backend import CupyDevice

    device = CupyDevice()
    src = cupy.arange(256, dtype=cupy.uint8)
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
def test_threads_over_host_staging_match_numpy(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cupy = _cupy()
    import ml_dtypes  # noqa: F401 - bfloat16 for numpy

    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "0")  # CUDA IPC cannot map memory of its own process
    size = 3

    def host(rank: int) -> np.ndarray:
        return (np.arange(3000) % 17 + rank).astype(dtype)

    def run(transport: Any) -> tuple[str | None, list[np.ndarray]]:
        comm = C.Communicator(transport)
        x = cupy.asarray(host(transport.rank).view(np.uint16 if dtype == "bfloat16" else dtype))
        if dtype == "bfloat16":
            x = x.view(np.dtype("bfloat16"))
        results = [
            C.allreduce(x, comm=comm, algorithm="ring"),
            C.reduce_scatter(x, comm=comm, algorithm="ring"),
            C.allgather(x, comm=comm, algorithm="ring"),
        ]
        return comm.device_path, [cupy.asnumpy(r.view(cupy.uint8)) for r in results]

    outcomes = LoopbackWorld(size, timeout=60).run(run)
    total = sum(host(r).astype(np.float64) for r in range(size)).astype(dtype)
    for rank, (path, (allreduced, share, gathered)) in enumerate(outcomes):
        assert path == "host staging"
        assert allreduced.tobytes() == total.tobytes()
        assert share.tobytes() == total[rank * 1000 : (rank + 1) * 1000].tobytes()
        assert gathered.tobytes() == np.concatenate([host(r) for r in range(size)]).tobytes()
