"""Under mpiexec: the key-value store gives exact sums in every mode, with colocated and dedicated servers."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.errors import KVStoreTimeout
from collectives.kvstore import KVStore, create
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi

PARTS = 256  # bytes: the tests' values span several partitions on every server


def _push(rank: int, t: int, n: int) -> np.ndarray:
    return ((np.arange(n) * (rank + 1) + 7 * t + rank) % 23).astype(np.float32)


def _layouts(size: int) -> list[int | None]:
    """Colocated servers, and every count of dedicated ones that leaves a worker."""
    return [None, *range(1, size)]


def _store(world: MPI.Intracomm, mode: str, servers: int | None, **options: object) -> KVStore:
    return create(mode, comm=world, servers=servers, partition_bytes=PARTS, **options)  # type: ignore[arg-type]


def test_sync_rounds_are_exact_and_bitwise_equal_everywhere(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    rounds, n = 5, 300
    for servers in _layouts(world.size):
        workers = world.size - (servers or 0)
        with problems.guard(f"servers={servers}"):
            kv = _store(world, "sync", servers)
            pulled = np.zeros(0, np.float32)
            if kv.role == "worker":
                own = collectives.Communicator(world) if servers is None else None
                kv.init("w", np.zeros(n, np.float32))
                for t in range(rounds):
                    kv.push("w", _push(kv.rank, t, n))
                    pulled = kv.pull("w")
                    expected = sum(_push(r, t, n) for r in range(workers))
                    problems.expect_equal(f"servers={servers} round {t}", pulled, expected)
                    if own is not None:
                        reference = collectives.allreduce(_push(kv.rank, t, n), comm=own)
                        problems.expect_equal(f"round {t} against allreduce", pulled, reference)
                kv.close()
                if own is not None:
                    own.free()
            every = world.allgather(pulled.tobytes() if kv.role == "worker" else None)
            first = next(b for b in every if b is not None)
            problems.expect(all(b in (None, first) for b in every), f"servers={servers}: ranks differ")
    problems.check()


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_async_and_ssp_sum_every_push_exactly(world: MPI.Intracomm, mode: str) -> None:
    problems = Problems(world)
    rounds, n = 20, 200
    start = np.arange(n, dtype=np.float64)
    for servers in _layouts(world.size):
        workers = world.size - (servers or 0)
        with problems.guard(f"{mode} servers={servers}"):
            kv = _store(world, mode, servers, staleness=1 if mode == "ssp" else 0)
            if kv.role == "worker":
                kv.init("w", start if kv.rank == 0 else np.zeros(n))
                for t in range(rounds):
                    kv.push("w", _push(kv.rank, t, n).astype(np.float64))
                    kv.pull("w")
                    kv.clock()
                kv.barrier()
                expected = start + sum(_push(r, t, n) for r in range(workers) for t in range(rounds))
                problems.expect_equal(f"{mode} servers={servers}", kv.pull("w"), expected)
                kv.close()
    problems.check()


def test_ssp_bound_holds_with_a_slow_worker(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    staleness, clocks = 1, 12
    with problems.guard("ssp"):
        kv = _store(world, "ssp", None, staleness=staleness)
        kv.init("w", np.zeros(700))
        for c in range(clocks):
            if kv.rank == 0:
                time.sleep(0.02)
            got = kv.pull("w", report=True)
            bound = c - staleness - 1
            problems.expect(min(got.included) >= bound, f"clock {c}: includes {got.included}")
            problems.expect(
                bool((got.value >= world.size * (bound + 1)).all()), f"clock {c}: {got.value[:3]}"
            )
            kv.push("w", np.ones(700))
            kv.clock()
        kv.close()
    problems.check()


def test_a_worker_that_stops_pushing_is_named(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("needs a second worker to stay away")
    problems = Problems(world)
    last = world.size - 1
    kv = _store(world, "sync", None, timeout=1.0, collective=False)  # messages: the others carry on
    kv.init("w", np.zeros(4))
    if world.rank == last:
        time.sleep(2.0)
    else:
        kv.push("w", np.ones(4))
        started = time.monotonic()
        try:
            kv.pull("w")
            problems.expect(False, "the pull did not time out")
        except KVStoreTimeout as error:
            took = time.monotonic() - started
            problems.expect(error.workers == (last,), str(error))
            problems.expect(f"no push from worker {last}" in str(error), str(error))
            problems.expect(0.9 <= took < 5, f"took {took:.1f} s")
    kv.close()
    problems.check()


@pytest.mark.parametrize("collective", [True, False])
def test_sync_pushpull_of_a_large_key_equals_an_allreduce(world: MPI.Intracomm, collective: bool) -> None:
    problems = Problems(world)
    n = (1 << 20) + 3  # 4 MiB of float32 in 64 KiB partitions, and a small key on one server
    with problems.guard(f"collective={collective}"):
        kv = create("sync", comm=world, partition_bytes=1 << 16, collective=collective)
        own = collectives.Communicator(world)
        kv.init(["big", "small"], [np.zeros(n, np.float32), np.zeros(5, np.float32)])
        for t in range(3):
            x = _push(world.rank, t, n)
            big, small = kv.pushpull(["big", "small"], [x, x[:5]])
            reference = collectives.allreduce(x, comm=own)
            problems.expect_equal(f"round {t} big", big, reference)
            problems.expect_equal(f"round {t} small", small, reference[:5])
        kv.close()
        own.free()
    problems.check()


def test_the_mpi_transport_probes_any_source(world: MPI.Intracomm) -> None:
    from collectives.transport.mpi import MPITransport

    problems = Problems(world)
    transport = MPITransport(world)
    tag = 77
    problems.expect(transport.probe(tag, 0.01) is None, "a probe found a message nobody sent")
    payload = np.arange(world.rank + 1, dtype=np.int64)
    send = transport.isend(payload, 0, tag)
    if world.rank == 0:
        seen = {}
        for _ in range(world.size):
            found = transport.probe(tag, 10.0)
            if found is None:
                problems.expect(False, "a probe timed out")
                break
            src, nbytes = found
            buffer = bytearray(nbytes)
            transport.waitall([transport.irecv(buffer, src, tag)])
            seen[src] = nbytes
        problems.expect(seen == {r: 8 * (r + 1) for r in range(world.size)}, f"probed {seen}")
    transport.waitall([send])
    world.Barrier()
    transport.close()
    problems.check()


def test_a_checkpoint_resumes_bitwise_on_another_number_of_servers(world: MPI.Intracomm) -> None:
    import shutil
    import tempfile
    from pathlib import Path

    from collectives.kvstore import SGD

    if world.size == 1:
        pytest.skip("needs a dedicated server beside a worker")
    problems = Problems(world)
    directory = Path(world.bcast(tempfile.mkdtemp(prefix="kvstore-") if world.rank == 0 else None)) / "ckpt"
    n, k, total = 5000, 3, 6

    def train(kv: KVStore, steps: range) -> np.ndarray:
        w = np.empty(n)
        for step in steps:
            w = kv.pushpull("w", np.cos(np.arange(n) * 0.1 + step + kv.rank) / 7)
        return np.asarray(w)

    expected = np.empty(0)
    with problems.guard("the first run, on one dedicated server"):
        kv = create("sync", comm=world, servers=1, partition_bytes=4096)
        if kv.role == "worker":
            kv.init("w", np.ones(n))
            kv.set_optimizer(SGD(lr=0.1, momentum=0.9))
            train(kv, range(k))
            kv.save(directory)
            expected = train(kv, range(k, total))
            kv.close()
    workers = world.Split(0 if world.rank < world.size - 1 else MPI.UNDEFINED, world.rank)
    if workers != MPI.COMM_NULL:
        with problems.guard("the resumed run, on colocated servers"):
            kv = create("sync", comm=workers, partition_bytes=1024)
            kv.load(directory)
            got = train(kv, range(k, total))
            problems.expect(got.tobytes() == expected.tobytes(), "the resumed run differs")
            kv.close()
        workers.Free()
    world.Barrier()
    if world.rank == 0:
        shutil.rmtree(directory.parent, ignore_errors=True)
    problems.check()


def test_sparse_rows_sum_exactly(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with problems.guard("rows"):
        kv = create("async", comm=world, partition_bytes=256)
        kv.init("emb", np.zeros((64, 8), np.float32))
        for t in range(10):
            ids = np.array(sorted({(7 * t + world.rank) % 64, 63, world.rank}))
            kv.push("emb", np.full((len(ids), 8), t + 1, np.float32), rows=ids)
        kv.barrier()
        expected = np.zeros((64, 8), np.float32)
        for r in range(world.size):
            for t in range(10):
                expected[sorted({(7 * t + r) % 64, 63, r})] += t + 1
        problems.expect_equal("table", kv.pull("emb"), expected)
        problems.expect_equal("rows", kv.pull("emb", rows=[63, 0]), expected[[63, 0]])
        kv.close()
    problems.check()


def test_the_mpi_transport_takes_each_message_from_any_source_whole(world: MPI.Intracomm) -> None:
    """``take`` (a matched probe and receive) gives each rank's message once, with its source and bytes."""
    from collectives.transport.mpi import MPITransport

    problems = Problems(world)
    transport = MPITransport(world)
    tag = 78
    problems.expect(transport.take(tag) is None, "a take found a message nobody sent")
    payload = np.arange(world.rank + 1, dtype=np.int64)
    send = transport.isend(payload, 0, tag)
    if world.rank == 0:
        seen: dict[int, list[int]] = {}
        deadline = time.monotonic() + 10.0
        while len(seen) < world.size and time.monotonic() < deadline:
            found = transport.take(tag)
            if found is not None:
                src, buffer = found
                problems.expect(src not in seen, f"rank {src}'s message was taken twice")
                seen[src] = np.frombuffer(buffer, np.int64).tolist()
        problems.expect(seen == {r: list(range(r + 1)) for r in range(world.size)}, f"took {seen}")
        problems.expect(transport.take(tag) is None, "a take found a message after every one was taken")
    transport.waitall([send])
    world.Barrier()
    transport.close()
    problems.check()


def test_a_save_or_load_after_close_names_the_closed_store(world: MPI.Intracomm) -> None:
    import tempfile
    from pathlib import Path

    from collectives.errors import KVStoreError

    problems = Problems(world)
    directory = Path(world.bcast(tempfile.mkdtemp(prefix="kvstore-") if world.rank == 0 else None)) / "ckpt"
    kv = _store(world, "sync", None)
    kv.init("w", np.arange(4.0))
    kv.close()
    for what in ("save", "load"):
        try:
            getattr(kv, what)(directory)
            problems.expect(False, f"{what} after close returned")
        except KVStoreError as error:  # not MPI's "Invalid communicator" of the channel closed
            problems.expect(f"{what}: the store is closed on rank {world.rank}" == str(error), str(error))
    problems.expect(not directory.exists(), "a save after close wrote")
    problems.check()
