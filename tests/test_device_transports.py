"""Host staging and CUDA IPC on a numpy fake device: the same results as host runs, pieces, pools, order."""

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from collectives.algorithms import ALGORITHMS, build_schedule
from collectives.backends.numpy_backend import NumpyBackend
from collectives.chunking import even_split
from collectives.errors import CollectivesError, TransportError
from collectives.execute import Scratch, execute
from collectives.ops import get_op
from collectives.transport.base import Transport
from collectives.transport.cuda_ipc import CudaIpcTransport
from collectives.transport.device_path import SynchronizedTransport
from collectives.transport.loopback import LoopbackWorld
from collectives.transport.staging import PinnedPool, StagingTransport, pieces
from tests.fake_device import DeviceArray, FakeDevice, FakeDeviceBackend, HostOnly

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")
CASES = [(c, name) for c in COLLECTIVES for name, module in ALGORITHMS.items() if hasattr(module, c)]

Wrap = Callable[[Transport, FakeDevice], Transport]


def _staging(piece_bytes: int | None = None, pieces_in_flight: int | None = None) -> Wrap:
    def wrap(inner: Transport, device: FakeDevice) -> Transport:
        return StagingTransport(
            HostOnly(inner), device, piece_bytes=piece_bytes, pieces_in_flight=pieces_in_flight
        )

    return wrap


def _ipc(slot_bytes: int, slots: int = 2) -> Wrap:
    def wrap(inner: Transport, device: FakeDevice) -> Transport:
        ipc = CudaIpcTransport.connect(HostOnly(inner), device, slot_bytes=slot_bytes, slots=slots)
        assert ipc is not None
        return ipc

    return wrap


PATHS: dict[str, Wrap] = {
    "staging": _staging(),
    "staging-pieces": _staging(piece_bytes=12),  # most messages in several pieces, the last one short
    "staging-one-in-flight": _staging(piece_bytes=5, pieces_in_flight=1),  # pieces cut inside elements
    "ipc-pieces": _ipc(slot_bytes=24),  # most messages in several pieces
    "ipc-one-slot": _ipc(slot_bytes=40, slots=1),
    "ipc-whole": _ipc(slot_bytes=1 << 16),
}


def _input(rank: int, count: int) -> np.ndarray:
    # integer-valued, so every order of summation gives the same bits
    return (np.arange(count, dtype=np.float64) * (rank + 3) % 11 + rank).astype(np.float32)


def _run(
    collective: str, algorithm: str, size: int, count: int, wrap: Wrap | None, segment_bytes: int
) -> list[np.ndarray]:
    """Each rank's result of running the schedule, on the fake device through ``wrap`` or on the host."""
    shares = even_split(count, size)
    try:
        schedule = build_schedule(collective, algorithm, size, count, shares)
    except CollectivesError:
        pytest.skip(f"{algorithm} does not build {collective} at {size} ranks")
    world = LoopbackWorld(size, timeout=20)

    def body(transport: Transport) -> np.ndarray:
        rank = transport.rank
        lo = sum(shares[:rank])
        if collective == "allgather":
            data = np.zeros(count, np.float32)
            data[lo : lo + shares[rank]] = _input(rank, count)[lo : lo + shares[rank]]
        else:
            data = _input(rank, count)
        op = get_op("sum") if collective != "allgather" else None
        if wrap is None:
            execute(schedule, transport, NumpyBackend(), data, op, segment_bytes=segment_bytes)
            result = data
        else:
            backend = FakeDeviceBackend()
            buffer = data.view(DeviceArray)
            device_transport = wrap(transport, backend.fake)
            execute(schedule, device_transport, backend, buffer, op, segment_bytes=segment_bytes)
            device_transport.close()
            result = buffer.view(np.ndarray)
        return result[lo : lo + shares[rank]] if collective == "reduce_scatter" else result

    return world.run(body)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize(("collective", "algorithm"), CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_device_paths_give_the_host_results(path: str, collective: str, algorithm: str, size: int) -> None:
    for count in (0, 1, size + 1, 37):
        for segment_bytes in (8, 1 << 18):  # segments of two elements, and whole messages
            host = _run(collective, algorithm, size, count, None, segment_bytes)
            device = _run(collective, algorithm, size, count, PATHS[path], segment_bytes)
            for rank in range(size):
                np.testing.assert_array_equal(
                    device[rank], host[rank], err_msg=f"rank {rank}, count {count}, segment {segment_bytes}"
                )
            if collective == "allreduce" and count:
                expected = sum(_input(r, count) for r in range(size))
                np.testing.assert_array_equal(host[0], expected)


def test_staging_copies_each_received_segment_to_the_device_before_reducing_it() -> None:
    # two ranks, one ring allreduce of 16 float32 in segments of 2 elements: every reduction
    # must read bytes that were received, never the garbage of an uncopied landing area
    size, count = 2, 16
    schedule = build_schedule("allreduce", "ring", size, count)
    world = LoopbackWorld(size, timeout=20)

    def body(transport: Transport) -> tuple[list[bytes], list[tuple[str, int]]]:
        backend = FakeDeviceBackend()
        buffer = _input(transport.rank, count).view(DeviceArray)
        staging = StagingTransport(HostOnly(transport), backend.fake)
        execute(schedule, staging, backend, buffer, get_op("sum"), segment_bytes=8)
        return backend.reduced, backend.fake.log

    for rank, (reduced, log) in enumerate(world.run(body)):
        peer = _input(1 - rank, count).tobytes()
        assert reduced, "the ring reduced nothing"
        for operand in reduced:
            assert operand in peer, f"rank {rank} reduced bytes its peer never sent: {operand.hex()}"
        # the k-th reduction follows the k-th copy to the device (later segments may come up sooner)
        events = [event for event in log if event[0] in ("to_device", "reduce")]
        reductions = [i for i, (kind, _) in enumerate(events) if kind == "reduce"]
        assert len(reductions) == len(reduced)
        for k, i in enumerate(reductions):
            copies = [event for event in events[:i] if event[0] == "to_device"]
            assert len(copies) > k and copies[k] == ("to_device", 8), f"rank {rank}: {events[: i + 1]}"


def test_the_pool_does_not_grow_over_repeated_calls() -> None:
    size, count = 3, 1000
    schedule = build_schedule("allreduce", "ring", size, count)
    world = LoopbackWorld(size, timeout=20)

    def body(transport: Transport) -> list[tuple[int, int, int]]:
        backend = FakeDeviceBackend()
        staging = StagingTransport(HostOnly(transport), backend.fake)
        scratch = Scratch()
        seen = []
        for _ in range(5):
            buffer = _input(transport.rank, count).view(DeviceArray)
            execute(schedule, staging, backend, buffer, get_op("sum"), scratch, segment_bytes=256)
            pool = staging.pool
            seen.append((pool.allocations, pool.allocated_bytes, pool.free_buffers))
        return seen

    for seen in world.run(body):
        assert seen[0][0] > 0
        assert len(set(seen)) == 1, f"the pool changed between calls: {seen}"
        assert seen[0][2] == seen[0][0], "every buffer is back in the pool after a call"


def test_a_message_is_cut_from_its_size_alone() -> None:
    assert pieces(0, 4) == [(0, 0)]
    assert pieces(3, 4) == [(0, 3)]
    assert pieces(8, 4) == [(0, 4), (4, 8)]
    assert pieces(10, 4) == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match="piece_bytes and pieces_in_flight must be positive"):
        StagingTransport(LoopbackWorld(1).transport(0), FakeDevice(), piece_bytes=0)


def test_staging_sends_a_big_message_as_pieces_through_two_pinned_buffers_a_side() -> None:
    world = LoopbackWorld(2, timeout=10)
    nbytes, piece = 1000, 64

    def body(transport: Transport) -> tuple[bytes, list[int], list[tuple[str, int]], PinnedPool]:
        device = FakeDevice()
        host = HostOnly(transport)
        staging = StagingTransport(host, device, piece_bytes=piece)
        peer = 1 - transport.rank
        out = np.arange(nbytes, dtype=np.uint8).view(DeviceArray) + transport.rank
        into = np.zeros(nbytes, np.uint8).view(DeviceArray)
        staging.waitall([staging.irecv(into, peer, 7), staging.isend(out, peer, 7)])
        return into.tobytes(), host.sent_bytes, device.log, staging.pool

    cut = [64] * 15 + [40]
    for rank, (received, sent, log, pool) in enumerate(world.run(body)):
        assert received == (np.arange(nbytes, dtype=np.uint8) + (1 - rank)).astype(np.uint8).tobytes()
        assert sent == cut
        assert [n for kind, n in log if kind == "to_host"] == cut
        assert [n for kind, n in log if kind == "to_device"] == cut
        # one peer, both directions, two pieces in flight each: never more buffers than that
        assert pool.most_lent <= 4 and pool.allocations <= 4, (pool.most_lent, pool.allocations)
        assert pool.lent == 0 and pool.free_buffers == pool.allocations


@pytest.mark.parametrize(("algorithm", "size"), [("ring", 3), ("direct", 4)])
def test_the_pool_is_bounded_by_pieces_not_by_the_message_size(algorithm: str, size: int) -> None:
    count, piece, in_flight = 30_000, 4096, 2  # messages of 30-40 KB: ten pieces each
    schedule = build_schedule("allreduce", algorithm, size, count)
    channels = 2 if algorithm == "ring" else 2 * (size - 1)  # (peer, direction) pairs of a step
    bound = channels * in_flight
    world = LoopbackWorld(size, timeout=20)

    def body(transport: Transport) -> list[tuple[int, int, int]]:
        backend = FakeDeviceBackend()
        staging = StagingTransport(
            HostOnly(transport), backend.fake, piece_bytes=piece, pieces_in_flight=in_flight
        )
        scratch = Scratch()
        seen = []
        for _ in range(6):
            buffer = _input(transport.rank, count).view(DeviceArray)
            execute(schedule, staging, backend, buffer, get_op("sum"), scratch, segment_bytes=1 << 22)
            expected = sum(_input(r, count) for r in range(size))
            np.testing.assert_array_equal(buffer.view(np.ndarray), expected)
            pool = staging.pool
            seen.append((pool.allocations, pool.allocated_bytes, pool.most_lent))
        return seen

    for seen in world.run(body):
        allocations, allocated_bytes, most_lent = seen[-1]
        assert allocations <= most_lent <= bound, seen  # pieces of one capacity: one buffer each lent
        assert allocated_bytes <= bound * PinnedPool.capacity(piece), seen
        # whole messages staged at once would have needed far more
        assert allocated_bytes < channels * (count * 4 // size) // 2
        assert len(set(seen[1:])) == 1, f"the pool grew after the first call: {seen}"


def test_messages_of_one_peer_match_in_order_whatever_their_pieces_and_tags() -> None:
    world = LoopbackWorld(2, timeout=10)
    sizes = {"a": 300, "b": 100, "c": 200}

    def data(name: str) -> np.ndarray:
        return (np.arange(sizes[name]) * (ord(name) - 90) % 251).astype(np.uint8)

    def body(transport: Transport) -> dict[str, bytes]:
        staging = StagingTransport(HostOnly(transport), FakeDevice(), piece_bytes=64, pieces_in_flight=1)
        if transport.rank == 0:
            # device a, host h and device b under tag 7, then device c under tag 8
            requests = [
                staging.isend(data("a").view(DeviceArray), 1, 7),
                staging.isend(bytearray(b"host in between"), 1, 7),
                staging.isend(data("b").view(DeviceArray), 1, 7),
                staging.isend(data("c").view(DeviceArray), 1, 8),
            ]
            staging.waitall(requests)
            return {}
        into = {name: np.zeros(n, np.uint8).view(DeviceArray) for name, n in sizes.items()}
        host = bytearray(len(b"host in between"))
        # tag 8 first: a different tag may be received in a different order
        requests = [staging.irecv(into["c"], 0, 8), staging.irecv(into["a"], 0, 7)]
        requests += [staging.irecv(host, 0, 7), staging.irecv(into["b"], 0, 7)]
        staging.waitall(requests[::-1])
        return {"h": bytes(host), **{name: array.tobytes() for name, array in into.items()}}

    got = world.run(body)[1]
    assert got.pop("h") == b"host in between"
    assert got == {name: data(name).tobytes() for name in sizes}


def test_a_staged_receive_that_times_out_keeps_its_pinned_buffers_out_of_the_pool() -> None:
    world = LoopbackWorld(2, timeout=10)

    def body(transport: Transport) -> Any:
        staging = StagingTransport(HostOnly(transport), FakeDevice(), piece_bytes=64)
        if transport.rank == 1:
            # only the first piece of the message ever comes
            transport.isend(np.full(64, 9, np.uint8), 0, 7)
            return None
        into = np.zeros(1000, np.uint8).view(DeviceArray)
        request = staging.irecv(into, 1, 7)
        started = time.monotonic()
        assert staging.wait_for([request], 0.2) == [0]
        waited = time.monotonic() - started
        assert 0.2 <= waited < 5, waited
        assert not request.done
        # the piece that came is on the device; the next two are posted in its place
        assert into[:64].tolist() == [9] * 64 and not into[64:].any()
        pool = staging.pool
        assert (pool.lent, pool.allocations) == (2, 2)
        staging.abandon([request], [])
        assert (pool.lent, pool.free_buffers) == (0, 0)
        assert staging.wait_for([], 0.0) == []
        return None

    world.run(body)


def test_pool_lends_by_power_of_two_capacity_and_reuses() -> None:
    device = FakeDevice()
    pool = PinnedPool(device)
    a = pool.acquire(5000)
    assert len(a) == 8192 and PinnedPool.capacity(1) == 4096 and PinnedPool.capacity(0) == 4096
    pool.release(a)
    b = pool.acquire(8000)
    assert b is a and pool.allocations == 1
    c = pool.acquire(100)
    assert len(c) == 4096 and pool.allocations == 2 and pool.allocated_bytes == 8192 + 4096
    pool.release(b)
    pool.release(c)
    assert pool.free_buffers == 2
    pool.clear()
    assert pool.free_buffers == 0


def test_host_messages_pass_through_the_device_transports() -> None:
    world = LoopbackWorld(2, timeout=10)

    def body(transport: Transport) -> list[bytes]:
        device = FakeDevice()
        got = []
        for wrapped in (
            StagingTransport(HostOnly(transport), device),
            CudaIpcTransport.connect(HostOnly(transport), device, slot_bytes=8),
            SynchronizedTransport(transport, device),
        ):
            assert wrapped is not None
            mine = bytearray(f"from {transport.rank}".encode())
            theirs = bytearray(len(mine))
            peer = 1 - transport.rank
            requests = [wrapped.irecv(theirs, peer, 3), wrapped.isend(mine, peer, 3)]
            wrapped.waitall(requests)
            got.append(bytes(theirs))
            wrapped.close()
        assert device.pinned_allocations == 0
        return got

    assert world.run(body) == [[b"from 1"] * 3, [b"from 0"] * 3]


def test_ipc_moves_big_messages_in_pieces_through_the_peer_mailbox_only() -> None:
    world = LoopbackWorld(2, timeout=10)
    nbytes, slot = 1000, 64

    def body(transport: Transport) -> tuple[bytes, list[int], int]:
        device = FakeDevice()
        host = HostOnly(transport)
        ipc = CudaIpcTransport.connect(host, device, slot_bytes=slot)
        assert ipc is not None
        peer = 1 - transport.rank
        out = np.full(nbytes, transport.rank + 1, np.uint8).view(DeviceArray)
        into = np.zeros(nbytes, np.uint8).view(DeviceArray)
        sends_before = len(host.sent_bytes)
        ipc.waitall([ipc.irecv(into, peer, 7), ipc.isend(out, peer, 7)])
        control = host.sent_bytes[sends_before:]
        ipc.close()
        return into.tobytes(), control, device.closed

    results = world.run(body)
    for rank, (received, control, closed) in enumerate(results):
        assert received == bytes([2 - rank]) * nbytes
        # only 8-byte lengths and credits went over the host transport: a length and a credit a piece
        pieces = -(-nbytes // slot)
        assert control == [8] * (2 * pieces)
        assert closed == 1


def test_ipc_rejects_a_piece_longer_than_the_receive() -> None:
    world = LoopbackWorld(2, timeout=5)

    def body(transport: Transport) -> None:
        ipc = CudaIpcTransport.connect(transport, FakeDevice(), slot_bytes=64)
        assert ipc is not None
        if transport.rank == 0:
            ipc.waitall([ipc.isend(np.zeros(16, np.uint8).view(DeviceArray), 1, 7)])
        else:
            with pytest.raises(TransportError, match="expected 8 more bytes from rank 0"):
                ipc.waitall([ipc.irecv(np.zeros(8, np.uint8).view(DeviceArray), 0, 7)])

    world.run(body)


def test_ipc_falls_back_on_every_rank_when_one_cannot_map_a_peer() -> None:
    class Refusing(FakeDevice):
        def open_ipc(self, handle: bytes, nbytes: int) -> Any:
            raise RuntimeError("cudaErrorMapBufferObjectFailed")

    world = LoopbackWorld(3, timeout=10)
    results = world.run(
        lambda t: CudaIpcTransport.connect(t, Refusing() if t.rank == 1 else FakeDevice(), slot_bytes=8)
    )
    assert results == [None, None, None]


def test_cuda_aware_path_synchronizes_before_device_buffers_reach_the_transport() -> None:
    world = LoopbackWorld(2, timeout=5)

    def body(transport: Transport) -> list[tuple[str, int]]:
        device = FakeDevice()
        synced = SynchronizedTransport(transport, device)
        peer = 1 - transport.rank
        buffer = np.arange(4, dtype=np.uint8).view(DeviceArray)
        into = np.zeros(4, np.uint8).view(DeviceArray)
        synced.waitall([synced.irecv(into, peer, 7), synced.isend(buffer, peer, 7)])
        synced.waitall([synced.isend(bytearray(1), peer, 8), synced.irecv(bytearray(1), peer, 8)])
        assert into.tolist() == [0, 1, 2, 3]
        return device.log

    assert world.run(body) == [[("synchronize", 0)] * 2] * 2
