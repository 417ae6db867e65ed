"""Measuring the cost model's alpha, beta, gamma, barrier and copy on this machine, under mpiexec."""

__all__ = ["Measurement", "calibrate", "fit_exchange", "measure_barrier", "measure_copy", "measure_gamma"]

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from mpi4py import MPI

from collectives.backends.numpy_backend import NumpyBackend
from collectives.execute import execute
from collectives.execute_shared import SEGMENT_BYTES
from collectives.ops import get_op
from collectives.schedule import Schedule, Step, Transfer
from collectives.selector import DEFAULT_MODEL, CostModel, calibration_path, save_model
from collectives.transport.mpi import MPITransport

from .collective import library_version

_ITEMSIZE = 4  # float32, the default dtype
# (bytes per message, steps per schedule) of the exchanges timed; the step counts tell
# the per-step latency apart from the fixed cost of a call
_FULL_SIZES = (8, 1024, 16 * 1024, 128 * 1024, 1024**2, 4 * 1024**2)
_QUICK_SIZES = (8, 256 * 1024)
_STEPS = (1, 4)
_QUICK_STEPS = (1, 2)
_GAMMA_BYTES = 32 * 1024**2  # well past the caches, as the large reductions the selector weighs are
_QUICK_GAMMA_BYTES = 4 * 1024**2


@dataclass(frozen=True)
class Measurement:
    """One timed exchange: ``steps`` steps, in each of which every rank sends ``nbytes`` to its neighbour."""

    steps: int
    nbytes: int
    seconds: float


def _shift(world_size: int, steps: int, count: int) -> Schedule:
    """``steps`` steps in which every rank sends ``count`` elements to the next rank round the ring."""
    # chunk 0 lands in the neighbour's chunk 1, so no chunk is both read and overwritten in a step
    step = Step(Transfer(r, (r + 1) % world_size, 0, dst_chunk=1) for r in range(world_size))
    return Schedule(
        name=f"calibrate-shift(n={world_size},steps={steps})",
        collective="allgather",
        world_size=world_size,
        chunk_sizes=(count, count),
        steps=(step,) * steps,
    )


def _fastest(world: MPI.Intracomm, call: Callable[[], object], iters: int, warmup: int) -> float:
    """The least over iterations of the slowest rank's seconds for ``call()``.

    Other processes on the machine only ever add time, and on a busy machine they
    add a lot (the median of a 1 MiB exchange on a loaded 2-core machine was 30
    times its minimum), so the least disturbed iteration is the best estimate of
    what the hardware and library cost.
    """
    for _ in range(warmup):
        call()
    times = np.empty(iters)
    world.Barrier()
    for i in range(iters):
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return float(times.min())


def fit_exchange(measurements: list[Measurement]) -> tuple[float, float, float]:
    """``(alpha, beta, overhead)`` from ``seconds = overhead + steps * (alpha + beta * nbytes)``.

    Least squares on relative errors, so that microsecond and millisecond
    timings weigh alike; negative estimates (noise) become zero.
    """
    rows = np.array([[1.0, m.steps, m.steps * m.nbytes] for m in measurements])
    seconds = np.array([m.seconds for m in measurements])
    weights = 1.0 / seconds
    solution, *_ = np.linalg.lstsq(rows * weights[:, None], seconds * weights, rcond=None)
    overhead, alpha, beta = (max(float(v), 0.0) for v in solution)
    return alpha, beta, overhead


def measure_gamma(world: MPI.Intracomm, nbytes: int, iters: int, warmup: int) -> float:
    """Seconds per byte of the numpy backend summing float32 buffers of ``nbytes``, every rank at once."""
    backend = NumpyBackend()
    target = np.ones(nbytes // _ITEMSIZE, np.float32)
    incoming = np.ones_like(target)
    op = get_op("sum")
    seconds = _fastest(world, lambda: backend.combine(op, target, incoming), iters, warmup)
    return seconds / target.nbytes


def measure_barrier(world: MPI.Intracomm, transport: MPITransport, iters: int, warmup: int) -> float | None:
    """Seconds per peer of one shared-memory barrier over ``world``; ``None`` if its ranks share no memory.

    Timed as a run of barriers, each call's slowest rank, least disturbed
    iteration (as :func:`_fastest`), divided by the P - 1 peers each rank waits for.
    """
    shared = transport.shared_memory()
    if shared is None or world.size < 2:
        return None
    run = 16  # barriers per timed call, so the clock's own cost is small beside them

    def barriers() -> None:
        for _ in range(run):
            shared.barrier()

    return _fastest(world, barriers, iters, warmup) / run / (world.size - 1)


def measure_copy(
    world: MPI.Intracomm, transport: MPITransport, nbytes: int, iters: int, warmup: int, barrier: float
) -> float | None:
    """Seconds per byte a rank copies through shared memory; ``None`` if its ranks share no memory.

    As the shared-memory executor copies: every rank at once, in segments of
    :data:`~collectives.execute_shared.SEGMENT_BYTES`, ``nbytes`` of its own into
    its region, then (after a barrier) as many out of the next rank's region. Timed
    as :func:`_fastest`, less its barriers at ``barrier`` seconds per peer, divided
    by the ``2 * nbytes`` copied.
    """
    shared = transport.shared_memory()
    if shared is None or world.size < 2:
        return None
    piece = min(SEGMENT_BYTES, shared.region_bytes) // _ITEMSIZE
    source = np.ones(nbytes // _ITEMSIZE, np.float32)
    target = np.empty_like(source)
    mine = np.frombuffer(shared.region(world.rank), np.float32)[:piece]
    theirs = np.frombuffer(shared.region((world.rank + 1) % world.size), np.float32)[:piece]

    def copies() -> None:
        for lo in range(0, source.size, piece):
            hi = min(lo + piece, source.size)
            np.copyto(mine[: hi - lo], source[lo:hi])
            shared.barrier()
            np.copyto(target[lo:hi], theirs[: hi - lo])
            shared.barrier()

    barriers = 2 * -(-source.size // piece)
    seconds = _fastest(world, copies, iters, warmup)
    return max(seconds - barriers * barrier * (world.size - 1), 0.0) / (2 * source.nbytes)


def calibrate(
    world: MPI.Intracomm,
    emit: Callable[[str], None],
    *,
    quick: bool = False,
    iters: int = 20,
    warmup: int = 3,
) -> CostModel:
    """Measure the constants over ``world`` (collective); rank 0 saves them where the selector reads them.

    alpha and beta come from timed exchanges through the library's own executor and
    MPI transport, ``steps`` ring steps of one message of each size, fitted by
    :func:`fit_exchange`; gamma from the numpy backend's sum of large buffers; the
    barrier and copy from :func:`measure_barrier` and :func:`measure_copy` where the
    ranks share a node (else the defaults).

    Args:
        world: at least two ranks.
        emit: called with each line of the report.
        quick: time fewer, smaller cases (seconds rather than a minute; rougher).
        iters: timed calls per case.
        warmup: untimed calls before them.

    Returns:
        The measured model, the same on every rank.
    """
    transport = MPITransport(world)
    backend = NumpyBackend()
    measurements = []
    emit(f"# calibrating over {world.size} ranks ({'quick' if quick else 'full'}); {library_version()}")
    emit(f"# {'steps':>5} {'bytes':>10} {'time(us)':>12}")
    try:
        for steps in _QUICK_STEPS if quick else _STEPS:
            for nbytes in _QUICK_SIZES if quick else _FULL_SIZES:
                count = nbytes // _ITEMSIZE
                schedule = _shift(world.size, steps, count)
                buffer = np.zeros(2 * count, np.float32)

                def run(schedule: Schedule = schedule, buffer: np.ndarray = buffer) -> None:
                    execute(schedule, transport, backend, buffer)

                seconds = _fastest(world, run, iters, warmup)
                measurements.append(Measurement(steps, count * _ITEMSIZE, seconds))
                emit(f"  {steps:>5} {count * _ITEMSIZE:>10} {seconds * 1e6:>12.2f}")
        barrier = measure_barrier(world, transport, iters, warmup)
        nbytes = _QUICK_SIZES[-1] if quick else _FULL_SIZES[-1]  # as the exchanges beta comes from
        copy = measure_copy(world, transport, nbytes, iters, warmup, barrier or 0.0)
    finally:
        transport.close()
    alpha, beta, overhead = fit_exchange(measurements)
    gamma = measure_gamma(world, _QUICK_GAMMA_BYTES if quick else _GAMMA_BYTES, iters, warmup)
    if barrier is None:
        emit("# barrier: the ranks share no memory; the default is kept")
        barrier = DEFAULT_MODEL.barrier
    if copy is None:
        emit("# copy: the ranks share no memory; the default is kept")
        copy = DEFAULT_MODEL.copy
    model = CostModel(alpha, beta, gamma, barrier, copy, source="measured")
    emit(f"# fixed cost per call: {overhead * 1e6:.2f} us (the same for every algorithm; not in the model)")
    emit(f"# {model.describe()}")
    if world.rank == 0:
        path = save_model(
            model,
            calibration_path(),
            world_size=world.size,
            quick=quick,
            overhead=overhead,
            mpi_library=library_version(),
            host=platform.node(),
            measured=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            exchanges=[asdict(m) for m in measurements],
        )
        emit(f"# saved to {path}")
    return model
