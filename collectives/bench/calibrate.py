"""Measuring the cost model's alpha, beta, gamma, barrier and copy on this machine, under mpiexec."""

__all__ = [
    "Timed",
    "TimedExchange",
    "calibrate",
    "fit_exchange",
    "fit_per_byte",
    "measure_allreduces",
    "measure_barrier",
    "measure_gamma",
]

import itertools
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace

import numpy as np
from mpi4py import MPI

import collectives
from collectives.backends.numpy_backend import NumpyBackend
from collectives.calibration import calibration_path, save_model
from collectives.execute import execute
from collectives.ops import get_op
from collectives.schedule import Schedule, Step, Transfer
from collectives.selector import Selector, nodes_of
from collectives.topology.cost_model import DEFAULT_MODEL, CostModel, Traffic
from collectives.transport.base import SharedMemory
from collectives.transport.mpi import MPITransport

from .collective import library_version
from .fitting import (
    Timed,
    TimedExchange,
    fit_exchange,
    fit_model,
    fit_per_byte,
    measured_corrections,
    with_terms,
)

_ITEMSIZE = 4  # float32, the default dtype
# (bytes per message, steps per schedule) of the exchanges timed; the step counts tell
# the per-step latency apart from the fixed cost of a call
_FULL_SIZES = (8, 1024, 16 * 1024, 128 * 1024, 1024**2, 4 * 1024**2)
_QUICK_SIZES = (8, 256 * 1024)
_STEPS = (1, 4)
_QUICK_STEPS = (1, 2)
_GAMMA_BYTES = 32 * 1024**2  # well past the caches, as the large reductions the selector weighs are
_QUICK_GAMMA_BYTES = 4 * 1024**2
# allreduces timed end to end to fit the model to: latency-bound sizes, sizes where bytes dominate, and
# 256 KiB, where a shared-memory allreduce at 4 ranks passes one barrier and copies little (the barrier
# was otherwise told from the copies by two sizes alone)
_FULL_ALLREDUCE_BYTES = (8, 4 * 1024, 64 * 1024, 256 * 1024, 1024**2, 4 * 1024**2, 16 * 1024**2)
# 2 KiB: the measured corrections are interpolated between sizes, and messages of a few KiB leave the
# MPI library's eager path (on 2 x 2, direct's factor went from 0.99 at 8 B to 1.43 at 32 KiB)
_QUICK_ALLREDUCE_BYTES = (8, 2 * 1024, 32 * 1024, 256 * 1024, 1024**2, 8 * 1024**2)
_COLD_BYTES = 64 * 1024**2  # past the last-level cache (32 MiB on the machine the defaults come from)
_MAX_BUFFERS = 64  # small calls reuse buffers (they stay in cache for an application's calls too)
_BATCH_BYTES = 1024**2  # calls below it are timed several at a time, as bench compare times them
_MAX_BATCH = 50
# algorithms that differ in steps, messages per step, barriers and copies, so the fit can tell the terms apart
_TIMED = ("ring", "butterfly", "direct", "halving_doubling", "shared_memory")
_TIMED_NODES = (
    "ring",
    "butterfly",
    "direct",
    "halving_doubling",
    "hierarchical",
    "hierarchical_shared_memory",
)
_TERMS = ("overhead", "step", "alpha", "barrier", "beta", "copy")
_NETWORK_TERMS = ("network_alpha", "network_beta")


def _shift(world_size: int, steps: int, count: int, per_node: int = 0, between: bool = False) -> Schedule:
    """``steps`` steps in which every rank sends ``count`` elements to the next rank round a ring.

    With ``per_node`` (ranks r // per_node share a node): the ring of each node's
    ranks, or with ``between`` the ring of the ranks of the same local rank on
    every node, so that the exchanges time one class of link alone.
    """
    if not per_node:
        peer = [(r + 1) % world_size for r in range(world_size)]
    elif between:
        peer = [(r + per_node) % world_size for r in range(world_size)]
    else:
        peer = [r - r % per_node + (r % per_node + 1) % per_node for r in range(world_size)]
    # chunk 0 lands in the neighbour's chunk 1, so no chunk is both read and overwritten in a step
    step = Step(Transfer(r, peer[r], 0, dst_chunk=1) for r in range(world_size))
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
    shared: SharedMemory | None = transport.shared_memory()
    ranks = world.size
    if shared is None:
        split = transport.node_split()  # on several nodes, a barrier is a node's
        if split is None:
            return None
        shared, ranks = split.shared, len(split.node_ranks)
    if ranks < 2:
        return None
    node = shared
    run = 16  # barriers per timed call, so the clock's own cost is small beside them

    def barriers() -> None:
        for _ in range(run):
            node.barrier()

    return _fastest(world, barriers, iters, warmup) / run / (ranks - 1)


def measure_allreduces(
    comm: collectives.Communicator,
    world: MPI.Intracomm,
    cases: Sequence[tuple[str, int]],
    iters: int,
    warmup: int,
) -> dict[tuple[str, int], float]:
    """Median seconds of a float32 allreduce for each ``(algorithm, nbytes)`` of ``cases``, as compare times.

    In rounds: every case once per round, each call started together after a
    barrier (the order alternating round by round), its time the slowest rank's,
    so slow spells of a shared machine fall on every algorithm and size alike (the
    fit weighs sizes against each other, so a spell on the small sizes alone would
    move the per-call constants against the per-byte ones); then the median over
    rounds, as what a caller meets: a ring allreduce's least time was as little
    as 0.6 of its median, a shared-memory one's 0.9, and the least chose ring
    where the medians are 1.3-1.5x apart the other way. In place on zeros (so
    repeated sums stay finite), each call on the next of buffers that together
    exceed :data:`_COLD_BYTES`, so that it finds its buffer out of the caches, as
    an application's call does and as ``bench compare``'s interleaved contenders
    do: on one warm buffer a 4 MiB ring allreduce at 2 ranks ran 2.2 times faster
    than on cold ones, the shared-memory one 1.2 times. Calls of microseconds are
    timed several at a time, as compare times them, so that the barrier's uneven
    exit does not swamp them.
    """
    turns = {}
    for nbytes in {n for _, n in cases}:
        # filled, not just allocated: the first touch of a fresh page faults, which no caller pays twice
        kept = min(-(-_COLD_BYTES // max(nbytes, 1)) + 1, _MAX_BUFFERS)
        turns[nbytes] = itertools.cycle([np.full(nbytes // _ITEMSIZE, 0.0, np.float32) for _ in range(kept)])
    times = np.empty((len(cases), iters))
    for i in range(-warmup, iters):
        order = range(len(cases)) if i % 2 == 0 else reversed(range(len(cases)))
        for j in order:
            algorithm, nbytes = cases[j]
            batch = max(1, min(_MAX_BATCH, _BATCH_BYTES // max(nbytes, 1)))
            turn = turns[nbytes]
            world.Barrier()
            start = time.perf_counter()
            for _ in range(batch):
                x = next(turn)
                collectives.allreduce(x, "sum", out=x, algorithm=algorithm, comm=comm)
            if i >= 0:
                times[j, i] = (time.perf_counter() - start) / batch
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return {case: float(np.median(times[j])) for j, case in enumerate(cases)}


def _fit_collectives(
    world: MPI.Intracomm,
    emit: Callable[[str], None],
    model: CostModel,
    sizes: tuple[int, ...],
    iters: int,
    warmup: int,
) -> tuple[CostModel, list[Timed]]:
    """``model`` fitted to whole allreduces of several algorithms and sizes (gamma kept as measured).

    The algorithms (:data:`_TIMED`, or :data:`_TIMED_NODES` across nodes) differ in
    steps, messages per step, steps that cross between nodes, barriers and bytes
    copied, and each is timed end to end by :func:`measure_allreduces` from a few
    bytes to megabytes; :func:`~bench.fitting.fit_model` then fits the fixed cost of
    a call, the cost of a step, alpha, the barrier, beta and copy (and across
    nodes the network's alpha and beta) to all of them together, so the model
    predicts what the calls measured and ranks those algorithms as they measured.
    Constants fitted one at a time, each to one algorithm (beta to ring, copy to
    shared memory), left out the calls' fixed and per-step costs (explain predicted
    half the measured time) and took up each other's errors (auto chose the
    hierarchy across nodes where ring was 1.14x faster).
    """
    comm = collectives.Communicator(world)
    per_node = None
    wanted: tuple[str, ...] = _TIMED
    terms: tuple[str, ...] = _TERMS
    try:
        features = comm.features
        split = nodes_of(world.size, features)
        if split is not None:
            wanted, terms, per_node = _TIMED_NODES, _TERMS + _NETWORK_TERMS, split[1]
        selector = Selector(model)
        counted: dict[tuple[str, int], Traffic] = {}
        for nbytes in sizes:
            explanation = selector.explain(
                "allreduce", nbytes // _ITEMSIZE, "float32", world_size=world.size, features=features
            )
            # every candidate is timed, for its measured correction; the constants are fitted to
            # `wanted` (shared_memory is no candidate where the ranks share no memory)
            counted |= {(c.algorithm, nbytes): c.traffic for c in explanation.candidates}
        measured = measure_allreduces(comm, world, list(counted), iters, warmup)
        emit(f"# {'algorithm':>26} {'bytes':>10} {'median(us)':>12}")
        timed: list[Timed] = []
        for (algorithm, nbytes), seconds in measured.items():
            timed.append(Timed(algorithm, nbytes // _ITEMSIZE, seconds, counted[algorithm, nbytes]))
            emit(f"  {algorithm:>26} {nbytes:>10} {seconds * 1e6:>12.2f}")
    finally:
        comm.free()
    fitting = [t for t in timed if t.algorithm in wanted]
    fitted, residuals = fit_model(fitting, model, terms, _ITEMSIZE, world.size, per_node)
    emit(
        f"# fitted to the calls of {', '.join(wanted)}: "
        + ", ".join(f"{name} {error * 100:+.0f}%" for name, error in residuals.items())
        + " (each algorithm's median error of prediction)"
    )
    corrections = measured_corrections(timed, fitted, _ITEMSIZE, world.size, per_node)
    emit(
        "# measured / predicted, kept as corrections: "
        + "; ".join(
            f"{name} " + " ".join(f"{ratio:.2f}" for _, ratio in points) for name, points in corrections
        )
        + f" (at {', '.join(str(b) for b in sizes)} bytes)"
    )
    return replace(fitted, corrections=corrections, source="measured"), timed


def calibrate(
    world: MPI.Intracomm,
    emit: Callable[[str], None],
    *,
    quick: bool = False,
    iters: int = 20,
    warmup: int = 3,
) -> CostModel:
    """Measure the constants over ``world`` (collective); rank 0 saves them where the selector reads them.

    They are saved as the calibration of ``world.size`` ranks, beside those of
    other world sizes (see :func:`collectives.calibration.save_model`): on one node the
    per-byte constants grow with the ranks (on a 2-core machine beta was 0.27
    ns/byte at 2 ranks, 0.64 at 4), so each size is calibrated and read apart.

    alpha comes from timed exchanges through the library's own executor and MPI
    transport, ``steps`` ring steps of one message of each size, fitted by
    :func:`fit_exchange` (which also gives the fixed cost of a call); gamma from
    the numpy backend's sum of large buffers; the barrier from
    :func:`measure_barrier` where the ranks share a node (else the default).
    beta and copy are then fitted to end-to-end allreduces of a few megabytes by
    ring and, where the ranks share a node, shared_memory (else the default copy),
    so that the model predicts those algorithms' measured times (see
    :func:`_fit_collectives`); the exchanges' own beta is reported beside it.

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
    split = transport.node_split()  # collective; None on one node
    per_node = 0 if split is None else len(split.node_ranks)
    nodes = 1 if split is None else world.size // per_node
    # every class of link the job has: within a node (where a node has 2 ranks or more), between nodes
    classes = [("node", False)] if per_node != 1 else []
    if nodes > 1:
        classes.append(("network", True))
    measured: dict[str, list[TimedExchange]] = {}
    shape = f"{nodes} nodes x {per_node} ranks" if nodes > 1 else "one node"
    emit(
        f"# calibrating over {world.size} ranks, {shape} ({'quick' if quick else 'full'}); "
        f"{library_version()}"
    )
    emit(f"# {'link':>7} {'steps':>5} {'bytes':>10} {'time(us)':>12}")
    try:
        for link, between in classes:
            measurements = measured[link] = []
            for steps in _QUICK_STEPS if quick else _STEPS:
                for nbytes in _QUICK_SIZES if quick else _FULL_SIZES:
                    count = nbytes // _ITEMSIZE
                    schedule = _shift(world.size, steps, count, per_node if nodes > 1 else 0, between)
                    buffer = np.zeros(2 * count, np.float32)

                    def run(schedule: Schedule = schedule, buffer: np.ndarray = buffer) -> None:
                        execute(schedule, transport, backend, buffer)

                    seconds = _fastest(world, run, iters, warmup)
                    measurements.append(TimedExchange(steps, count * _ITEMSIZE, seconds))
                    emit(f"  {link:>7} {steps:>5} {count * _ITEMSIZE:>10} {seconds * 1e6:>12.2f}")
        barrier = measure_barrier(world, transport, iters, warmup)
    finally:
        transport.close()
    network = {}
    if "network" in measured:
        network_alpha, network_beta, _ = fit_exchange(measured["network"])
        network = {"network_alpha": network_alpha, "network_beta": network_beta}
        emit(
            f"# network: alpha {network_alpha * 1e6:.2f} us, "
            f"beta {network_beta * 1e9:.4f} ns/byte (exchanges)"
        )
    measurements = measured.get("node") or measured["network"]
    alpha, exchange_beta, overhead = fit_exchange(measurements)
    gamma = measure_gamma(world, _QUICK_GAMMA_BYTES if quick else _GAMMA_BYTES, iters, warmup)
    if barrier is None:
        emit("# barrier: the ranks share no memory; the default is kept")
        barrier = DEFAULT_MODEL.barrier
    exchanged = with_terms(
        CostModel(alpha, exchange_beta, gamma, barrier, DEFAULT_MODEL.copy, source="measured"), network
    )
    sizes = _QUICK_ALLREDUCE_BYTES if quick else _FULL_ALLREDUCE_BYTES
    model, timed = _fit_collectives(world, emit, exchanged, sizes, iters, warmup)
    emit(f"# fixed cost of an exchange alone: {overhead * 1e6:.2f} us (a whole call's is fitted: call)")
    emit(f"# beta of the warm exchanges alone: {exchange_beta * 1e9:.4f} ns/byte (not used)")
    emit(f"# {model.describe()}")
    if world.rank == 0:
        path = save_model(
            model,
            calibration_path(),
            world_size=world.size,
            nodes=nodes,
            quick=quick,
            exchange_overhead=overhead,
            barrier_alone=barrier,
            exchange_beta=exchange_beta,
            mpi_library=library_version(),
            host=platform.node(),
            measured=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            exchanges=[asdict(m) for m in measured.get("node", [])],  # within a node
            **(
                {"network_exchanges": [asdict(m) for m in measured["network"]]}
                if "network" in measured
                else {}
            ),
            allreduces=[
                {"algorithm": t.algorithm, "bytes": t.count * _ITEMSIZE, "seconds": t.seconds} for t in timed
            ],
        )
        emit(f"# saved to {path}")
    return model
