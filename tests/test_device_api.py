"""The user's API on device arrays of a numpy fake device: the device path, its choice, the results."""

import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives import backends, host_copy
from collectives.errors import CollectiveTimeout, ConfigurationError, UnsupportedDtypeError
from collectives.transport import staging
from collectives.transport.base import SharedMemory, Transport
from collectives.transport.loopback import LoopbackWorld
from tests.fake_device import DeviceArray, FakeDeviceBackend, HostOnly


class _NoSharedMemory(HostOnly):
    def shared_memory(self) -> SharedMemory | None:
        raise AssertionError("device arrays asked for the host's shared memory")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDeviceBackend]:
    # these tests are of the device paths, which a small "auto" allreduce leaves for the host
    monkeypatch.setattr(host_copy, "DEVICE_THROUGH_HOST_BYTES", 0)
    with backends.trying_first(FakeDeviceBackend()) as backend:
        yield backend


@pytest.fixture
def through_host() -> Iterator[FakeDeviceBackend]:
    with backends.trying_first(FakeDeviceBackend()) as backend:
        yield backend


def _world(size: int, fn: Any) -> list[Any]:
    def body(transport: Transport) -> Any:
        comm = C.Communicator(_NoSharedMemory(transport))
        try:
            return fn(comm)
        finally:
            comm.free()

    return LoopbackWorld(size, timeout=20).run(body)


_BIG = host_copy.DEVICE_THROUGH_HOST_BYTES // 4 + 1
"""float32 elements of an allreduce too large to run on a host copy: it takes the device path."""


def _x(rank: int, rows: int = 6) -> np.ndarray:
    return (np.arange(rows * 5, dtype=np.float32).reshape(rows, 5) % 13 + rank).astype(np.float32)


@pytest.mark.parametrize(("env", "path"), [(None, "cuda ipc"), ("0", "host staging")])
@pytest.mark.parametrize("size", [1, 2, 3])
def test_collectives_on_device_arrays_match_numpy(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch, env: str | None, path: str, size: int
) -> None:
    if env is not None:
        monkeypatch.setenv("COLLECTIVES_CUDA_IPC", env)

    def run(comm: C.Communicator) -> dict[str, Any]:
        r = comm.rank
        x = _x(r).view(DeviceArray)
        results = {}
        for algorithm in ("auto", "ring", "direct", "shared_memory"):
            for op in ("sum", "max", "avg"):
                results[f"allreduce-{algorithm}-{op}"] = C.allreduce(x, op, algorithm=algorithm, comm=comm)
            results[f"reduce_scatter-{algorithm}"] = C.reduce_scatter(x, algorithm=algorithm, comm=comm)
            results[f"allgather-{algorithm}"] = C.allgather(x, algorithm=algorithm, comm=comm)
        inplace = x.copy()
        C.allreduce(inplace, out=inplace, comm=comm)
        results["in place"] = inplace
        return {"results": results, "path": comm.device_path}

    outcomes = _world(size, run)
    xs = [_x(r) for r in range(size)]
    total = sum(xs)
    rows = 6 // size
    for rank, outcome in enumerate(outcomes):
        assert outcome["path"] == (path if size > 1 else "host staging")
        for name, value in outcome["results"].items():
            assert isinstance(value, DeviceArray), f"{name} left the device"
            if name.startswith("allreduce"):
                op = name.rsplit("-", 1)[1]
                want = {"sum": total, "max": np.maximum.reduce(xs), "avg": total / size}[op]
            elif name.startswith("reduce_scatter"):
                want = total[rank * rows : (rank + 1) * rows]
            elif name.startswith("allgather"):
                want = np.concatenate(xs)
            else:
                want = total
            np.testing.assert_allclose(value.view(np.ndarray), want, rtol=1e-6, err_msg=name)


def test_the_device_path_is_made_once_and_its_pool_does_not_grow(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "0")

    def run(comm: C.Communicator) -> list[tuple[int, int]]:
        seen = []
        for _ in range(4):
            C.allreduce(_x(comm.rank, rows=600).view(DeviceArray), comm=comm, algorithm="ring")
            path = comm._device_paths["fake-device"]
            seen.append((id(path), path.transport.pool.allocations))  # type: ignore[attr-defined]
        return seen

    for seen in _world(3, run):
        assert len(set(seen)) == 1, seen


@pytest.mark.parametrize("size", [2, 3])
def test_host_staging_in_small_pieces_gives_the_host_results(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "0")
    monkeypatch.setattr(staging, "PIECE_BYTES", 1000)  # messages of 2-12 KB: several pieces each

    def run(comm: C.Communicator) -> dict[str, Any]:
        x = _x(comm.rank, rows=600).view(DeviceArray)
        got: dict[str, Any] = {}
        for algorithm in ("ring", "direct", "auto"):
            got[f"allreduce-{algorithm}"] = C.allreduce(x, algorithm=algorithm, comm=comm)
            got[f"reduce_scatter-{algorithm}"] = C.reduce_scatter(x, algorithm=algorithm, comm=comm)
            got[f"allgather-{algorithm}"] = C.allgather(x, algorithm=algorithm, comm=comm)
        transport = comm._device_paths["fake-device"].transport
        assert isinstance(transport, staging.StagingTransport)
        got["pieces"] = (transport.piece_bytes, transport.pool.most_lent)
        return got

    xs = [_x(r, rows=600) for r in range(size)]
    total, rows = sum(xs), 600 // size  # small integers: exact in any order
    for rank, outcome in enumerate(_world(size, run)):
        piece_bytes, most_lent = outcome.pop("pieces")
        assert piece_bytes == 1000
        assert most_lent <= 2 * 2 * (size - 1), most_lent  # two a peer and direction, at most
        for name, value in outcome.items():
            assert isinstance(value, DeviceArray), f"{name} left the device"
            want = {
                "allreduce": total,
                "reduce_scatter": total[rank * rows : (rank + 1) * rows],
                "allgather": np.concatenate(xs),
            }[name.split("-")[0]]
            np.testing.assert_array_equal(value.view(np.ndarray), want, err_msg=name)


def test_a_timeout_while_staging_names_the_peer_and_keeps_the_pinned_buffers(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "0")
    monkeypatch.setattr(staging, "PIECE_BYTES", 256)

    def body(transport: Transport) -> Any:
        if transport.rank == 1:
            return None  # never joins
        comm = C.Communicator(HostOnly(transport), timeout=0.3)
        started = time.monotonic()
        with pytest.raises(CollectiveTimeout) as caught:
            C.allreduce(_x(0, rows=600).view(DeviceArray), algorithm="ring", comm=comm, check=False)
        pool = comm._device_paths["fake-device"].transport.pool  # type: ignore[attr-defined]
        return caught.value, time.monotonic() - started, pool.lent, pool.free_buffers, pool.allocations

    error, waited, lent, free, allocations = LoopbackWorld(2, timeout=20).run(body)[0]
    assert (error.step, error.peers) == (0, (1,)) and waited < 5
    # the two receives in flight from rank 1 keep their buffers: the pool never lends them again
    assert lent == 0 and allocations - free == 2, (allocations, free)


def test_host_arrays_on_the_same_communicator_stay_on_the_host(fake: FakeDeviceBackend) -> None:
    def run(comm: C.Communicator) -> tuple[str | None, Any]:
        host = C.allreduce(_x(comm.rank), comm=comm, algorithm="ring")
        return comm.device_path, host

    for path, host in _world(2, run):
        assert path is None and type(host) is np.ndarray
        np.testing.assert_array_equal(host, _x(0) + _x(1))


def test_forcing_cuda_ipc_across_nodes_is_an_error(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "1")

    class Apart(HostOnly):
        def node_local(self) -> bool:
            return False

    def body(transport: Transport) -> None:
        comm = C.Communicator(Apart(transport))
        with pytest.raises(ConfigurationError, match="not all on one node"):
            C.allreduce(_x(comm.rank).view(DeviceArray), comm=comm)

    LoopbackWorld(2, timeout=10).run(body)


def test_a_bad_cuda_ipc_setting_is_named(fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "maybe")
    with pytest.raises(ConfigurationError, match="COLLECTIVES_CUDA_IPC='maybe'"):
        _world(1, lambda comm: C.allreduce(_x(0).view(DeviceArray), comm=comm))


class _CudaArrayLike:
    """Looks like a CUDA array to the library, without any GPU library."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (3,), "typestr": "<f4", "data": (0, False), "version": 3}


class _DlpackCuda:
    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def test_device_arrays_are_recognised_without_importing_a_gpu_library() -> None:
    assert backends.looks_like_device_array(_CudaArrayLike())
    assert backends.looks_like_device_array(_DlpackCuda())
    assert not backends.looks_like_device_array(np.zeros(3))
    assert not backends.looks_like_device_array([1.0])


@pytest.mark.skipif("cupy" in sys.modules, reason="CuPy is importable here")
def test_a_device_array_without_cupy_gets_a_clear_error() -> None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("CuPy is installed")
    with pytest.raises(UnsupportedDtypeError, match="device arrays need CuPy"):
        backends.backend_for(_CudaArrayLike())


STAGED = "host staging through pinned host buffers in 4 MiB pieces, 2 in flight per peer and direction"
FIRST = "chosen on the first call on device arrays"


def test_explain_names_the_device_path_once_chosen(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "0")

    def run(comm: C.Communicator) -> tuple[str | None, str | None, str]:
        before = C.explain("allreduce", 100, comm=comm).device  # host arrays, no device path yet
        foreseen = C.explain("allreduce", 100, comm=comm, device=True).device
        C.allreduce(_x(comm.rank).view(DeviceArray), comm=comm)
        return before, foreseen, str(C.explain("allreduce", 100, comm=comm))

    for before, foreseen, after in _world(2, run):
        assert before is None
        assert foreseen == (f"{STAGED} (COLLECTIVES_CUDA_IPC=0; MPI library not CUDA-aware; {FIRST})")
        assert f"device buffers: {STAGED} (COLLECTIVES_CUDA_IPC=0; MPI library not CUDA-aware)\n" in after


def test_explain_names_cuda_ipc_and_the_choices_before_the_first_device_call(
    fake: FakeDeviceBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLLECTIVES_CUDA_IPC", raising=False)
    monkeypatch.setattr(staging, "PIECE_BYTES", 1 << 16)

    def run(comm: C.Communicator) -> tuple[str | None, str | None]:
        foreseen = C.explain("allgather", 100, comm=comm, device=True).device
        C.allgather(_x(comm.rank).view(DeviceArray), comm=comm)
        return foreseen, C.explain("allgather", 100, comm=comm).device

    for foreseen, chosen in _world(3, run):
        assert foreseen == (
            "chosen on the first call on device arrays: cuda ipc where every rank is on one node, else "
            "cuda-aware mpi where the MPI library is, else host staging through pinned host buffers in "
            "64 KiB pieces, 2 in flight per peer and direction"
        )
        assert chosen == (
            "cuda ipc: device-to-device copies into each peer's mailbox in 4 MiB pieces, 2 slots per sender "
            "(every rank on one node)"
        )


def test_explain_for_device_arrays_of_one_rank_or_a_cuda_aware_mpi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLECTIVES_CUDA_IPC", "0")

    class Aware(HostOnly):
        def cuda_aware(self) -> bool:
            return True

    def aware(transport: Transport) -> str | None:
        comm = C.Communicator(Aware(transport))
        return C.explain("allreduce", _BIG, comm=comm, device=True).device

    assert (
        LoopbackWorld(2).run(aware)
        == [f"cuda-aware mpi (COLLECTIVES_CUDA_IPC=0; MPI library CUDA-aware; {FIRST})"] * 2
    )
    one = LoopbackWorld(1).run(
        lambda t: C.explain("allreduce", _BIG, comm=C.Communicator(t), device=True).device
    )
    assert one == [f"{STAGED} (one rank: nothing to send; MPI library not CUDA-aware; {FIRST})"]
    # no communicator: only what is known everywhere
    generic = C.explain("allreduce", _BIG, world_size=4, device=True).device
    assert generic is not None and generic.startswith(FIRST + ": cuda ipc where")
    assert "device buffers" not in str(C.explain("allreduce", 8, world_size=4))


def test_explain_for_device_arrays_leaves_out_the_hosts_shared_memory() -> None:
    def run(transport: Transport) -> tuple[set[str], set[str]]:
        comm = C.Communicator(transport)
        comm._features = frozenset({"shared_memory"})  # as a host call on one node would have found
        host = C.explain("allreduce", _BIG, comm=comm)
        device = C.explain("allreduce", _BIG, comm=comm, device=True)
        return {c.algorithm for c in host.candidates}, {c.algorithm for c in device.candidates}

    for host, device in LoopbackWorld(2).run(run):
        assert "shared_memory" in host and "shared_memory" not in device


@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_small_auto_allreduce_of_device_arrays_runs_on_a_host_copy(
    through_host: FakeDeviceBackend, size: int
) -> None:
    log = through_host.fake.log

    def run(comm: C.Communicator) -> dict[str, Any]:
        x = _x(comm.rank).view(DeviceArray)
        before = len(log)
        got = {op: C.allreduce(x, op, comm=comm) for op in ("sum", "max", "avg")}
        inplace = x.copy()
        C.allreduce(inplace, out=inplace, comm=comm)
        got["in place"] = inplace
        empty = C.allreduce(np.zeros(0, np.float32).view(DeviceArray), comm=comm)
        route = C.explain("allreduce", x.size, comm=comm, device=True).device
        assert route is not None and route.startswith("a pinned host copy"), route
        return {"got": got, "path": comm.device_path, "copies": len(log) - before, "empty": empty}

    # one log for the whole world's fake device: each rank's call copies in once and out once
    outcomes = LoopbackWorld(size, timeout=20).run(lambda t: _run_on(t, run))
    xs = [_x(r) for r in range(size)]
    for outcome in outcomes:
        assert outcome["path"] is None, "the device path was set up for calls that run on the host"
        for op, value in outcome["got"].items():
            assert isinstance(value, DeviceArray), f"{op} left the device"
            want = {"max": np.maximum.reduce(xs), "avg": sum(xs) / size}.get(op, sum(xs))
            np.testing.assert_allclose(value.view(np.ndarray), want, rtol=1e-6, err_msg=op)
        assert isinstance(outcome["empty"], DeviceArray) and outcome["empty"].size == 0
    kinds = {kind for kind, _ in log}
    assert kinds == {"to_host", "to_device"}, kinds
    # one pinned buffer a rank for each size (here the arrays' and the empty one's), kept between calls
    assert through_host.fake.pinned_allocations == 2 * size
    assert sum(kind == "to_host" for kind, _ in log) == 4 * size
    assert not through_host.reduced, "the device reduced what the host was to reduce"


def test_a_small_auto_persistent_allreduce_of_device_arrays_starts_on_a_host_copy(
    through_host: FakeDeviceBackend,
) -> None:
    def run(comm: C.Communicator) -> list[np.ndarray]:
        x = _x(comm.rank).view(DeviceArray)
        persistent = C.allreduce_init(x, comm=comm)
        return [persistent().view(np.ndarray).copy() for _ in range(3)]

    for starts in LoopbackWorld(2, timeout=20).run(lambda t: _run_on(t, run)):
        for got in starts:
            np.testing.assert_array_equal(got, _x(0) + _x(1))
    assert not through_host.reduced, "a start reduced on the device what the plain call reduces on the host"


def _run_on(transport: Transport, fn: Any) -> Any:
    comm = C.Communicator(transport)
    try:
        return fn(comm)
    finally:
        comm.free()


@pytest.mark.parametrize(
    ("call", "want"),
    [
        (lambda x, comm: C.allreduce(x[:4], algorithm="ring", comm=comm), [2.0] * 4),
        (lambda x, comm: C.allgather(x[:2], comm=comm), [1.0] * 4),
        (lambda x, comm: C.allreduce(x, comm=comm)[-4:], [2.0] * 4),
    ],
    ids=["named algorithm", "allgather", "over the threshold"],
)
def test_other_device_calls_keep_the_device_path(
    through_host: FakeDeviceBackend, call: Any, want: Any
) -> None:
    def run(comm: C.Communicator) -> tuple[Any, str | None]:
        got = call(np.ones(_BIG, np.float32).view(DeviceArray), comm)
        return got.view(np.ndarray).tolist(), comm.device_path

    for got, path in _world(2, run):
        assert got == want
        assert path == "cuda ipc"
