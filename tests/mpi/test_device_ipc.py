"""The CUDA IPC protocol over real MPI, its mailboxes in an MPI shared window standing for device memory."""

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

from collectives.algorithms import build_schedule
from collectives.backends.numpy_backend import NumpyBackend
from collectives.chunking import even_split
from collectives.execute import execute
from collectives.ops import get_op
from collectives.transport.base import SharedMemory
from collectives.transport.cuda_ipc import CudaIpcTransport
from collectives.transport.device import IPC_HANDLE_BYTES
from collectives.transport.mpi import MPITransport
from tests.fake_device import DeviceArray, FakeDevice, FakeDeviceBackend, HostOnly
from tests.mpi.helpers import Problems, exact_input, mismatch

pytestmark = pytest.mark.mpi


class WindowDevice(FakeDevice):
    """A fake device whose mailbox is this rank's region of a shared window, which peers map by rank."""

    def __init__(self, shared: SharedMemory, rank: int) -> None:
        super().__init__()
        self.shared = shared
        self.rank = rank

    def allocate(self, nbytes: int) -> Any:
        assert nbytes <= self.shared.region_bytes
        return np.frombuffer(self.shared.region(self.rank), np.uint8)[:nbytes].view(DeviceArray)

    def ipc_handle(self, buffer: Any) -> bytes:
        return self.rank.to_bytes(8, "little").ljust(IPC_HANDLE_BYTES, b"\0")

    def open_ipc(self, handle: bytes, nbytes: int) -> Any:
        peer = int.from_bytes(handle[:8], "little")
        return np.frombuffer(self.shared.region(peer), np.uint8)[:nbytes].view(DeviceArray)


@pytest.mark.parametrize("slot_bytes", [64, 4096])
def test_ipc_protocol_over_mpi_matches_the_host(slot_bytes: int) -> None:
    transport = MPITransport(MPI.COMM_WORLD)
    shared = transport.shared_memory()
    if shared is None:
        pytest.skip("the ranks do not share a node")
    size, rank = transport.size, transport.rank
    device = WindowDevice(shared, rank)
    ipc = CudaIpcTransport.connect(HostOnly(transport), device, slot_bytes=slot_bytes)
    problems = Problems()
    problems.expect(ipc is not None, "the mailboxes did not map")
    assert ipc is not None
    backend = FakeDeviceBackend(device)
    for collective in ("allreduce", "reduce_scatter", "allgather"):
        for algorithm in ("ring", "direct", "halving_doubling" if collective == "allreduce" else "ring"):
            for count in (0, 5, 3001):
                label = f"{collective} {algorithm} count={count} slot={slot_bytes}"
                with problems.guard(label):
                    schedule = build_schedule(collective, algorithm, size, count, even_split(count, size))
                    op = None if collective == "allgather" else get_op("sum")
                    host = exact_input("sum", "float32", count, rank, size)
                    on_device = host.copy().view(DeviceArray)
                    execute(schedule, transport, NumpyBackend(), host, op, segment_bytes=256)
                    execute(schedule, ipc, backend, on_device, op, segment_bytes=256)
                    problem = mismatch(on_device.view(np.ndarray), host)
                    problems.expect(problem is None, f"{label}: {problem}")
    ipc.close()
    transport.close()
    problems.check()
