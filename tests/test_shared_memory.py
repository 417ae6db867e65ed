"""Shared memory without MPI: the watchdog bounds its barriers; alloc without it is a plain array."""

import functools
import math
import time
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collectives
from collectives.backends.numpy_backend import NumpyBackend
from collectives.errors import CollectiveTimeout, ConfigurationError, InvalidBufferError, TransportError
from collectives.execute_shared import SharedExecutor
from collectives.ops import get_op
from collectives.transport.base import SharedMemory
from collectives.transport.loopback import LoopbackWorld
from collectives.watchdog import Watchdog
from tests.shared_threads import ThreadSharedMemory, ThreadWorld


class _OnePeerNeverComes(SharedMemory):
    """Rank 0 of two, whose peer (rank 1) never arrives."""

    def __init__(self) -> None:
        self.notes: list[tuple[int, ...]] = []
        self.waited: list[float] = []
        self.abandoned = False

    @property
    def region_bytes(self) -> int:
        return 0

    def region(self, rank: int) -> memoryview:
        return memoryview(b"")

    def arrive(self, note: Sequence[int] = ()) -> None:
        self.notes.append(tuple(note))

    def wait(self, timeout: float = math.inf) -> list[int]:
        self.waited.append(timeout)
        time.sleep(min(timeout, 0.05))
        return [1]

    def note(self, rank: int) -> tuple[int, ...]:
        return (0,) * self.NOTE_INTS

    def abandon(self) -> None:
        self.abandoned = True


def test_a_barrier_no_peer_reaches_times_out_naming_it() -> None:
    transport = LoopbackWorld(2).transport(0)
    watchdog = Watchdog(transport, timeout=0.3, stall_warning=0.1, check=False)
    shared = _OnePeerNeverComes()
    started = time.monotonic()
    stuck = r"stuck in barrier 0 waiting for rank 1"
    with (
        pytest.raises(CollectiveTimeout, match=stuck) as caught,
        watchdog.watch(watchdog.signature_of("allreduce", "shared_memory", 8)) as call,
    ):
        call.barrier(shared, (7, 8))
    assert time.monotonic() - started < 5
    assert caught.value.peers == (1,) and caught.value.step == "barrier 0"
    # one arrival, then a wait to the stall warning, then one to the deadline
    assert shared.notes == [(7, 8)] and len(shared.waited) == 2 and shared.abandoned
    with (
        pytest.raises(TransportError, match="unusable"),
        watchdog.watch(watchdog.signature_of("allreduce", "shared_memory", 8)),
    ):
        pass


def test_alloc_without_shared_memory_is_a_plain_array_that_reduces() -> None:
    world = LoopbackWorld(2)

    def body(transport: collectives.transport.base.Transport) -> np.ndarray:
        comm = collectives.Communicator(transport)
        assert "shared_memory" not in comm.features
        x = comm.alloc((3, 2), "int32")
        assert isinstance(x, np.ndarray) and x.shape == (3, 2) and x.dtype == np.int32
        assert x.flags.c_contiguous and x.flags.writeable
        x[:] = comm.rank + 1
        with pytest.raises(InvalidBufferError, match="shape of non-negative integers"):
            comm.alloc((2, -1))
        assert comm.alloc(0, np.float64).shape == (0,)
        return collectives.allreduce(x, out=x, comm=comm)

    for result in world.run(body):
        assert (result == 3).all()


# the executor on threads: any rank count, regions small enough for many segments of a few elements
@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 6),
    count=st.integers(0, 700),
    segment=st.sampled_from([8, 24, 64, 1 << 18]),
    dtype=st.sampled_from(["float32", "int64", "float16"]),
    op=st.sampled_from(["sum", "max", "prod"]),
    place=st.sampled_from(["in_place", "out"]),
)
def test_the_executor_on_threads_matches_a_reference(
    size: int, count: int, segment: int, dtype: str, op: str, place: str
) -> None:
    world = ThreadWorld(size, region_bytes=2048)
    rng = np.random.default_rng(count)
    inputs = [rng.integers(-3, 4, count).astype(dtype) for _ in range(size)]
    if op == "prod":
        inputs = [np.where(x == 0, 1, x).astype(dtype) for x in inputs]
    reduce_op = get_op(op)
    expected = functools.reduce({"sum": np.add, "max": np.maximum, "prod": np.multiply}[op], inputs)
    shares = [count // size + (r < count % size) for r in range(size)]
    edges = np.cumsum([0, *shares])
    backend = NumpyBackend()

    def work(rank: int, memory: ThreadSharedMemory) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        executor = SharedExecutor(memory, rank, size, segment_bytes=segment)
        x = inputs[rank].copy()
        out = x if place == "in_place" else np.empty_like(x)
        executor.allreduce(backend, out, x, reduce_op)
        allreduced = out.copy()
        x = inputs[rank].copy()  # again, to run on a different half of the regions
        out = x[edges[rank] : edges[rank + 1]] if place == "in_place" else np.empty(shares[rank], dtype)
        executor.reduce_scatter(backend, out, x, shares, reduce_op)
        scattered = out.copy()
        gathered = np.empty(count, dtype)
        own = inputs[rank][edges[rank] : edges[rank + 1]]
        executor.allgather(backend, gathered, own, shares)
        executor.allreduce(backend, x := inputs[rank].copy(), x, reduce_op)
        return allreduced, scattered, gathered, x

    for rank, (allreduced, scattered, gathered, again) in enumerate(world.run(work)):
        np.testing.assert_array_equal(allreduced, expected)
        np.testing.assert_array_equal(scattered, expected[edges[rank] : edges[rank + 1]])
        owned = [x[edges[r] : edges[r + 1]] for r, x in enumerate(inputs)]
        np.testing.assert_array_equal(gathered, np.concatenate(owned))
        np.testing.assert_array_equal(again, expected)


def test_regions_too_small_for_the_slots_are_a_clear_error() -> None:
    world = ThreadWorld(4, region_bytes=32)
    memory = world.memory(0)
    x = np.ones(100, np.float64)
    with pytest.raises(ConfigurationError, match="too small for 5 slots of 8-byte elements"):
        SharedExecutor(memory, 0, 4).allreduce(NumpyBackend(), x, x, get_op("sum"))


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_an_allreduce_whose_inputs_together_are_small_passes_one_barrier(size: int, compiled: bool) -> None:
    """At most ``small_bytes`` a rank: one barrier; a float32 element more: segments."""
    from collectives.shared_sizes import small_bytes

    limit = small_bytes(size, compiled)
    world = ThreadWorld(size, region_bytes=4 * limit)
    small = limit // 4  # float32 elements per rank at the limit
    barriers: dict[int, list[int]] = {}

    def work(rank: int, memory: ThreadSharedMemory) -> list[np.ndarray]:
        executor = SharedExecutor(memory, rank, size, small=limit)
        results = []
        for count in (small, small + 1):
            x = np.arange(count, dtype=np.float32) + rank
            before = memory._number
            executor.allreduce(NumpyBackend(), x, x, get_op("sum"))
            barriers.setdefault(count, []).append(memory._number - before)
            results.append(x)
        return results

    for results in world.run(work):
        for x in results:
            expected = size * np.arange(x.shape[0], dtype=np.float32) + sum(range(size))
            np.testing.assert_array_equal(x, expected)
    assert barriers[small] == [1] * size
    assert all(b >= 2 for b in barriers[small + 1]), barriers[small + 1]  # two a segment


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "compiled"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_a_reduce_scatter_passes_one_barrier_within_its_own_window(size: int, compiled: bool) -> None:
    """Its ranks read a share of each input, not all of it: where the engine runs ``size`` times an
    allreduce's window a rank (``scatter_small_bytes``), on the Python path the allreduce's."""
    from collectives.shared_sizes import scatter_small_bytes, small_bytes

    scale = scatter_small_bytes(size, compiled) // small_bytes(size, compiled)
    assert scale == (size if compiled else 1)
    limit = 1024  # an allreduce's window a rank, in bytes
    world = ThreadWorld(size, region_bytes=8 * size * limit)
    small = scale * limit // 4 // size * size  # float32 elements at the reduce-scatter's limit, in shares
    barriers: dict[int, list[int]] = {}

    def work(rank: int, memory: ThreadSharedMemory) -> list[np.ndarray]:
        # (segments of 64 bytes past the window: more than one barrier)
        executor = SharedExecutor(memory, rank, size, 64, limit, scatter_small=scale * limit)
        assert executor.small(scale * limit, get_op("sum"), scatter=True)
        assert not executor.small(scale * limit + 1, get_op("sum"), scatter=True)
        results = []
        for count in (small, small + size):
            x = np.arange(count, dtype=np.float32) + rank
            share = count // size
            out = np.empty(share, np.float32)
            before = memory._number
            executor.reduce_scatter(NumpyBackend(), out, x, [share] * size, get_op("sum"))
            barriers.setdefault(count, []).append(memory._number - before)
            results.append((rank * share, out))
        return results

    for results in world.run(work):
        for lo, out in results:
            expected = size * np.arange(lo, lo + out.shape[0], dtype=np.float32) + sum(range(size))
            np.testing.assert_array_equal(out, expected)
    assert barriers[small] == [1] * size
    assert all(b >= 2 for b in barriers[small + size]), barriers[small + size]


def test_a_barrier_spins_only_where_every_rank_has_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives.transport.mpi.shared_memory import SPIN_POLLS, spin_polls

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert spin_polls(1) == spin_polls(2) == SPIN_POLLS > 0
    assert spin_polls(3) == spin_polls(4) == 0


@pytest.mark.parametrize("size", [2, 4])
def test_an_op_combining_all_parts_at_once_has_a_smaller_one_barrier_window(size: int) -> None:
    """Past ``WHOLE_SMALL_TOTAL_BYTES`` at 3 ranks or more each owner sums its share, not each rank all."""
    from collectives.reproducible_calls import _RowsSum
    from collectives.shared_sizes import SMALL_TOTAL_BYTES, WHOLE_SMALL_TOTAL_BYTES

    world = ThreadWorld(size, region_bytes=2 * SMALL_TOTAL_BYTES)
    executor = SharedExecutor(world.memory(0), 0, size)
    plain, whole = get_op("sum"), _RowsSum("float32", "sum", size)
    limit = SMALL_TOTAL_BYTES // size
    assert executor.small(limit, plain) and not executor.small(limit + 1, plain)
    whole_limit = limit if size == 2 else WHOLE_SMALL_TOTAL_BYTES // size
    assert executor.small(whole_limit, whole) and not executor.small(whole_limit + 1, whole)
    compiled = SharedExecutor(world.memory(0), 0, size, small=4 * limit)  # a window that reaches further
    pair_limit = (1 << 20) // size if size == 2 else whole_limit  # the pair op's window stays
    assert compiled.small(pair_limit, whole) and not compiled.small(pair_limit + 1, whole)
