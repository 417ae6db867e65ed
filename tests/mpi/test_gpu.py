"""CuPy arrays and torch cuda tensors under mpiexec, ranks sharing a GPU: bitwise the results of numpy copies.

Run by tests/test_gpu_launch.py through host staging and through CUDA IPC
(``COLLECTIVES_CUDA_IPC``), with the path expected in ``COLLECTIVES_EXPECT_DEVICE_PATH``.
"""

import os
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import Problems, exact_input, mismatch

cupy = pytest.importorskip("cupy", reason="CuPy is not installed; the GPU tests run on a GPU host")

pytestmark = [pytest.mark.mpi, pytest.mark.gpu]


def _devices() -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


if _devices() == 0:
    pytest.skip("no CUDA device here; the GPU tests run on a GPU host", allow_module_level=True)

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "uint8", "int64"]
OPS = ["sum", "max", "min", "avg", "bxor"]
ALGORITHMS = {
    "allreduce": ["ring", "direct", "halving_doubling", "tree", "auto"],
    "reduce_scatter": ["ring", "direct", "auto"],
    "allgather": ["ring", "direct", "auto"],
}
COUNTS = [1, 7, 3001, 300_001]  # the last is 1.2 MB of float32: several segments, and IPC pieces


@pytest.fixture(scope="module")
def comm() -> collectives.Communicator:
    world = MPI.COMM_WORLD
    cupy.cuda.Device(world.rank % _devices()).use()  # ranks share the GPUs, often one
    return collectives.Communicator(world)


def _applies(dtype: str, op: str) -> bool:
    floating = dtype.startswith(("float", "bfloat"))
    return not (op == "avg" and not floating) and not (op == "bxor" and floating)


def _to_device(x: np.ndarray) -> Any:
    if x.dtype.name == "bfloat16":
        # CuPy 14 has bfloat16 through ml_dtypes; carry the bits over as uint16
        return cupy.asarray(x.view(np.uint16)).view(x.dtype)
    return cupy.asarray(x)


def _to_host(x: Any, like: np.ndarray) -> np.ndarray:
    if like.dtype.name == "bfloat16":
        return cupy.asnumpy(x.view(cupy.uint16)).view(like.dtype)
    return cupy.asnumpy(x)


@pytest.mark.parametrize("collective", sorted(ALGORITHMS))
def test_device_collectives_match_numpy(comm: collectives.Communicator, collective: str) -> None:
    problems = Problems()
    size, rank = comm.size, comm.rank
    for dtype in DTYPES:
        for op in OPS if collective != "allgather" else ["sum"]:
            if not _applies(dtype, op):
                continue
            for count in COUNTS:
                for algorithm in ALGORITHMS[collective]:
                    label = f"{collective} {algorithm} {dtype} {op} count={count}"
                    with problems.guard(label):
                        rows = count * size if collective == "reduce_scatter" else count
                        x = exact_input(op, dtype, rows, rank, size)
                        run = getattr(collectives, collective)
                        args = () if collective == "allgather" else (op,)
                        expected = run(x, *args, algorithm=algorithm, comm=comm)
                        got = run(_to_device(x), *args, algorithm=algorithm, comm=comm)
                        problems.expect(isinstance(got, cupy.ndarray), f"{label}: the result left the device")
                        problem = mismatch(_to_host(got, x), expected)
                        problems.expect(problem is None, f"{label}: {problem}")
    problems.check()


def test_in_place_and_out(comm: collectives.Communicator) -> None:
    problems = Problems()
    x = exact_input("sum", "float32", 10_000, comm.rank, comm.size)
    expected = collectives.allreduce(x, comm=comm)
    with problems.guard("in place"):
        d = cupy.asarray(x)
        problems.expect(collectives.allreduce(d, out=d, comm=comm) is d, "in place returned another array")
        problems.expect(mismatch(cupy.asnumpy(d), expected) is None, "in place differs")
    with problems.guard("out="):
        out = cupy.zeros_like(cupy.asarray(x))
        collectives.allreduce(cupy.asarray(x), out=out, comm=comm)
        problems.expect(mismatch(cupy.asnumpy(out), expected) is None, "out= differs")
    problems.check()


def test_the_expected_device_path_was_taken(comm: collectives.Communicator) -> None:
    collectives.allreduce(cupy.ones(4, cupy.float32), comm=comm)
    expected = os.environ.get("COLLECTIVES_EXPECT_DEVICE_PATH")
    if comm.size == 1:
        expected = "host staging"  # one rank sends nothing, so it never maps a peer
    problems = Problems()
    problems.expect(
        expected is None or comm.device_path == expected, f"took {comm.device_path}, not {expected}"
    )
    problems.check()


@pytest.mark.parametrize("piece_bytes", [1 << 16, None])  # many pieces a message, and the default 4 MiB
def test_host_staging_in_pieces_matches_numpy(
    comm: collectives.Communicator, monkeypatch: pytest.MonkeyPatch, piece_bytes: int | None
) -> None:
    if os.environ.get("COLLECTIVES_EXPECT_DEVICE_PATH") != "host staging" and comm.size > 1:
        pytest.skip("runs over host staging (COLLECTIVES_CUDA_IPC=0 COLLECTIVES_CUDA_AWARE=0)")
    from collectives.transport import staging

    if piece_bytes is not None:
        monkeypatch.setattr(staging, "PIECE_BYTES", piece_bytes)
    pieces = staging.PIECE_BYTES
    fresh = collectives.Communicator(MPI.COMM_WORLD)  # its device path is made with this piece size
    problems = Problems()
    size, rank = fresh.size, fresh.rank
    for collective, algorithms in ALGORITHMS.items():
        for count in (3001, 300_001, 3_000_001):  # 12 KB to 12 MB of float32: 1 to 3 default pieces
            for algorithm in algorithms:
                label = f"pieces of {pieces} B: {collective} {algorithm} count={count}"
                with problems.guard(label):
                    rows = count * size if collective == "reduce_scatter" else count
                    x = exact_input("sum", "float32", rows, rank, size)
                    run = getattr(collectives, collective)
                    args = () if collective == "allgather" else ("sum",)
                    expected = run(x, *args, algorithm=algorithm, comm=fresh)
                    got = run(cupy.asarray(x), *args, algorithm=algorithm, comm=fresh)
                    problem = mismatch(cupy.asnumpy(got), expected)
                    problems.expect(problem is None, f"{label}: {problem}")
    path = next(iter(fresh._device_paths.values()))
    problems.expect(path.name == "host staging", f"took {path.name}")
    if isinstance(path.transport, staging.StagingTransport):
        pool, bound = path.transport.pool, 2 * staging.PIECES_IN_FLIGHT * max(size - 1, 1)
        problems.expect(path.transport.piece_bytes == pieces, f"pieces of {path.transport.piece_bytes} B")
        problems.expect(pool.most_lent <= bound, f"{pool.most_lent} pinned buffers lent at once, not {bound}")
        problems.expect(pool.lent == 0, f"{pool.lent} pinned buffers still lent")
    route = collectives.explain("allreduce", 10, comm=fresh).device or ""
    problems.expect(route.startswith("host staging through pinned host buffers"), f"explain says {route!r}")
    fresh.free()
    problems.check()


def test_torch_cuda_tensors_go_through_cupy_in_place(comm: collectives.Communicator) -> None:
    torch = pytest.importorskip("torch")
    from collectives import torch_integration as ti

    problems = Problems()
    size, rank = comm.size, comm.rank
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        label = str(dtype)
        with problems.guard(label):
            host = torch.arange(6 * size, dtype=torch.float32).reshape(2 * size, 3).to(dtype) + rank
            tensor = host.cuda()
            problems.expect(ti.explain_path(tensor, comm).startswith("collectives: zero-copy CuPy"), label)
            pointer = tensor.data_ptr()
            result = ti.allreduce_(tensor, comm=comm)
            problems.expect(result is tensor and tensor.data_ptr() == pointer, f"{label}: not in place")
            expected = sum(host - rank + r for r in range(size))
            problems.expect(torch.equal(tensor.cpu(), expected), f"{label} allreduce_: {tensor.cpu()}")
            gathered = ti.allgather(host.cuda(), comm=comm)
            problems.expect(gathered.is_cuda, f"{label}: allgather left the device")
            whole = torch.cat([host - rank + r for r in range(size)])
            problems.expect(torch.equal(gathered.cpu(), whole), f"{label} allgather")
            share = ti.reduce_scatter(host.cuda(), comm=comm)
            problems.expect(
                torch.equal(share.cpu(), expected[2 * rank : 2 * rank + 2]), f"{label} reduce_scatter"
            )
    problems.check()
