"""Fake device arrays over real MPI: host staging; the CUDA-aware setting; finding the ranks on one node."""

from collections.abc import Iterator

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import backends
from collectives.errors import ConfigurationError
from collectives.transport import staging
from collectives.transport.mpi import MPITransport
from tests.fake_device import DeviceArray, FakeDeviceBackend
from tests.mpi.helpers import Problems, exact_input, mismatch

pytestmark = pytest.mark.mpi


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDeviceBackend]:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "0")  # the fake's IPC handles do not cross processes
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "0")
    with backends.trying_first(FakeDeviceBackend()) as backend:
        yield backend


@pytest.mark.parametrize("piece_bytes", [None, 1000])  # the default, and every message in several pieces
def test_fake_device_arrays_over_mpi_staging_match_numpy(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch, piece_bytes: int | None
) -> None:
    if piece_bytes is not None:
        monkeypatch.setattr(staging, "PIECE_BYTES", piece_bytes)
    comm = collectives.Communicator(MPI.COMM_WORLD)
    problems = Problems()
    size, rank = comm.size, comm.rank
    for collective, algorithms in {
        "allreduce": ["ring", "direct", "halving_doubling", "auto"],
        "reduce_scatter": ["ring", "direct"],
        "allgather": ["ring", "direct"],
    }.items():
        for algorithm in algorithms:
            for count in (1, 1001, 70_001):
                label = f"{collective} {algorithm} count={count}"
                with problems.guard(label):
                    rows = count * size if collective == "reduce_scatter" else count
                    x = exact_input("sum", "float32", rows, rank, size)
                    run = getattr(collectives, collective)
                    args = () if collective == "allgather" else ("sum",)
                    expected = run(x, *args, algorithm=algorithm, comm=comm)
                    got = run(x.copy().view(DeviceArray), *args, algorithm=algorithm, comm=comm)
                    problems.expect(isinstance(got, DeviceArray), f"{label}: left the device")
                    problem = mismatch(got.view(np.ndarray), expected)
                    problems.expect(problem is None, f"{label}: {problem}")
    problems.expect(comm.device_path == "host staging", f"took {comm.device_path}")
    transport = comm._device_paths["fake-device"].transport
    if isinstance(transport, staging.StagingTransport):
        pool, bound = transport.pool, 2 * staging.PIECES_IN_FLIGHT * max(size - 1, 1)
        problems.expect(pool.most_lent <= bound, f"{pool.most_lent} pinned buffers lent at once, not {bound}")
        problems.expect(pool.lent == 0, f"{pool.lent} pinned buffers still lent after the calls")
    route = collectives.explain("allreduce", 10, comm=comm).device or ""
    why = "one rank: nothing to send" if size == 1 else "COLLECTIVES_CUDA_IPC=0"
    problems.expect(
        route.startswith("host staging through pinned host buffers in ")
        and route.endswith(f"({why}; MPI library not CUDA-aware)"),
        f"explain says {route!r}",
    )
    comm.free()
    problems.check()


def test_small_auto_allreduces_of_device_arrays_repeat_on_the_lean_host_path(fake: FakeDeviceBackend) -> None:
    comm = collectives.Communicator(MPI.COMM_WORLD)
    problems = Problems()
    size, rank = comm.size, comm.rank
    for count in (1, 1001):
        for call in range(4):
            x = exact_input("sum", "float32", count, rank, size) + call
            expected = collectives.allreduce(x, comm=comm)
            got = collectives.allreduce(x.copy().view(DeviceArray), comm=comm)
            problems.expect(isinstance(got, DeviceArray), f"count={count}: left the device")
            problem = mismatch(got.view(np.ndarray), expected)
            problems.expect(problem is None, f"count={count} call {call}: {problem}")
    problems.expect(comm.device_path is None, f"took the device path {comm.device_path}")
    if size > 1 and comm.shared is not None:
        # the host copies' calls are in place (the host references above make new arrays)
        lean = [key for key, p in comm.repeats.items() if p.lean is not None and "in place" in key]
        problems.expect(len(lean) == 2, f"{len(lean)} lean entries: the host copies' repeats are not lean")
    comm.free()
    problems.check()


def test_cuda_aware_setting_and_node_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = MPITransport(MPI.COMM_WORLD)
    problems = Problems()
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "1")
    problems.expect(transport.cuda_aware(), "COLLECTIVES_CUDA_AWARE=1 was not taken")
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "0")
    problems.expect(not transport.cuda_aware(), "COLLECTIVES_CUDA_AWARE=0 was not taken")
    monkeypatch.setenv("COLLECTIVES_CUDA_AWARE", "perhaps")
    with pytest.raises(ConfigurationError, match="COLLECTIVES_CUDA_AWARE"):
        transport.cuda_aware()
    monkeypatch.delenv("COLLECTIVES_CUDA_AWARE")
    problems.expect(isinstance(transport.cuda_aware(), bool), "the library's answer is not a bool")
    # mpiexec here starts every rank on this one node
    problems.expect(transport.node_local(), "the ranks of one node were not found together")
    transport.close()
    problems.check()
