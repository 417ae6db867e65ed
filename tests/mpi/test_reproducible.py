"""Reproducible sums under mpiexec: the exact model's bits at every world size, with every algorithm."""


import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import engine, reproducible_calls
from collectives.lean import LeanAllreduce
from tests.mpi.helpers import Problems, algorithms_for, count_calls
from tests.reproducible_cases import DTYPES, contributions, model, spread

pytestmark = pytest.mark.mpi

COUNT = 1000


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_gives_the_models_bits_with_every_algorithm(dtype: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    parts = contributions(dtype, world.size, COUNT, seed=100 + world.size)  # every rank makes all of them
    expected = model(parts, dtype)
    for algorithm in ["auto", *algorithms_for("allreduce")]:
        with problems.guard(algorithm):
            result = collectives.allreduce(parts[world.rank], reproducible=True, algorithm=algorithm)
            problems.expect_equal(algorithm, result, expected)
    problems.check()


@pytest.mark.parametrize("dtype", DTYPES)
def test_twelve_contributions_dealt_to_the_ranks_give_one_processes_bits(
    dtype: str, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    parts = contributions(dtype, 12, COUNT, seed=12)
    alone = collectives.ReproducibleSum(like=parts[0])
    for part in parts:
        alone.add(part)
    for deal in ([list(range(world.rank, 12, world.size))], [spread(12, world.size, seed=5)[world.rank]]):
        with problems.guard("accumulator"):
            total = collectives.ReproducibleSum(like=parts[0])
            for index in deal[0]:
                total.add(parts[index])
            problems.expect_equal(f"dealt {deal[0]}", total.allreduce(), alone.value())
            counts = [COUNT // world.size + (r < COUNT % world.size) for r in range(world.size)]
            lo = sum(counts[: world.rank])
            share = total.reduce_scatter(counts=counts)
            problems.expect_equal("share", share, alone.value()[lo : lo + counts[world.rank]])
    problems.check()


REPEATS = 4
PAST_THE_SMALL_WINDOW = 300_007  # float32 elements (float64: half): past the one-barrier window


def _on_shared_memory(world: MPI.Intracomm) -> collectives.Communicator:
    """A communicator over ``world`` whose reproducible sums run on shared memory (the plain call with the
    op that sums every rank's raw contribution at once); skips elsewhere."""
    comm = collectives.Communicator(world)
    collectives.barrier(comm=comm)  # the first call sets up the shared memory
    if world.size == 1 or comm.watchdog.shared is None or comm.shared is None or not engine.compiled():
        comm.free()
        pytest.skip("the reproducible op's compiled calls: ranks on one node's shared memory, the engine on")
    return comm


def _repeated(comm: collectives.Communicator, dtype: str, op: str, count: int, **kw: str) -> list[np.ndarray]:
    """REPEATS reproducible in-place allreduces of new inputs (the later calls lean): their results."""
    x = np.zeros(count, dtype)
    results = []
    for call in range(REPEATS):
        x[...] = contributions(dtype, comm.size, count, seed=10 * call + count % 7)[comm.rank]
        collectives.allreduce(x, op, out=x, reproducible=True, comm=comm, **kw)
        results.append(x.copy())
    return results


def _kernels(comm: collectives.Communicator) -> tuple[int, int]:
    """The runs of the compiled small and segmented calls that ``comm``'s repeated calls made."""
    # each once: an in-place call's repeat is kept under its op's alias too (reproducible_calls.ALIASES)
    leans = list(
        {id(p.lean): p.lean for p in comm.repeats.values() if isinstance(p.lean, LeanAllreduce)}.values()
    )
    small = sum(lean._kernel.runs for lean in leans if lean._kernel is not None)
    segmented = sum(lean._segments.runs for lean in leans if lean._segments is not None)
    return small, segmented


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_repeated_calls_sum_on_shared_memory_in_the_engine_with_the_python_paths_bits(
    dtype: str, world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = Problems(world)
    compiled = _on_shared_memory(world)
    past = PAST_THE_SMALL_WINDOW // (np.dtype(dtype).itemsize // 4)
    for op in ("sum", "avg"):
        for count in (1, 7, 301, past):
            before = _kernels(compiled)
            ours: list[np.ndarray] = []
            with problems.guard(f"{op} {count} compiled"):
                ours = _repeated(compiled, dtype, op, count)
            after = _kernels(compiled)
            # the first call decides; the first lean one makes the small call (and runs the segmented)
            segmented = count == past
            taken = after[1] - before[1] if segmented else after[0] - before[0]
            lean = REPEATS - 1 if segmented else REPEATS - 2
            problems.expect(taken == lean, f"{op} {count}: the engine ran {taken} of the {REPEATS} calls")
            with monkeypatch.context() as python_only:  # the op applied by its Python calls
                python_only.setattr(reproducible_calls._RowsSum, "compiled_combine", None)
                python = collectives.Communicator(world)
                with problems.guard(f"{op} {count} python"):
                    theirs = _repeated(python, dtype, op, count)
                    for call, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
                        problems.expect_equal(f"{op} {count} call {call}", mine, reference)
                problems.expect(_kernels(python) == (0, 0), f"{op} {count}: the Python path ran the engine")
                python.free()
            if world.size > 2:  # the two collectives' route, as a named algorithm takes it
                with problems.guard(f"{op} {count} ring"):
                    ring = _repeated(compiled, dtype, op, count, algorithm="ring")
                    problems.expect_equal(f"{op} {count} against ring", ours[-1], ring[-1])
            if count <= 301 and op == "sum":
                parts = contributions(dtype, world.size, count, seed=10 * (REPEATS - 1) + count % 7)
                problems.expect_equal(f"{count}: the model", ours[-1] if ours else None, model(parts, dtype))
    compiled.free()
    problems.check()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_repeated_in_place_reproducible_call_is_one_call_from_the_api_into_the_engine(
    dtype: str, world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its first call, an in-place reproducible allreduce runs no Python layer below the API's, with
    the bits of the full path; unchecked calls (whose op needs checks) take the full path."""
    from collectives import api

    problems = Problems(world)
    comm = _on_shared_memory(world)
    full = count_calls(monkeypatch, api, "reproducibly")
    for op, count in (
        ("sum", 7),
        ("avg", 301),
        ("sum", PAST_THE_SMALL_WINDOW // (np.dtype(dtype).itemsize // 4)),
    ):
        x = np.zeros(count, dtype)
        for call in range(REPEATS * 2):
            parts = contributions(dtype, world.size, count, seed=call)
            x[...] = parts[world.rank]
            collectives.allreduce(x, op, out=x, reproducible=True, comm=comm)
            fresh = collectives.allreduce(parts[world.rank], op, reproducible=True, comm=comm)  # not in place
            problems.expect_equal(f"{op} {count} call {call}", x, fresh)
        problems.expect(
            full[0] == REPEATS * 2 + 1, f"{op} {count}: {full[0] - REPEATS * 2} in-place calls went in full"
        )
        full[0] = 0
    collectives.allreduce(x, out=x, reproducible=True, comm=comm, check=False)
    problems.expect(full[0] == 1, "an unchecked call took the engine's one call")
    comm.free()
    problems.check()


@pytest.mark.parametrize("count", [5, PAST_THE_SMALL_WINDOW])
def test_a_mismatch_of_the_reproducible_ops_in_the_engine_raises_on_every_rank(
    count: int, world: MPI.Intracomm
) -> None:
    comm = _on_shared_memory(world)
    x = np.ones(count, np.float32)
    for op in ("sum", "avg", "sum", "avg"):  # both repeated, so later calls of either take the engine
        collectives.allreduce(x, op, out=x, reproducible=True, comm=comm)
    before = _kernels(comm)
    with pytest.raises(collectives.MismatchError, match="reproducible allreduce"):
        collectives.allreduce(x, "sum" if world.rank == 0 else "avg", out=x, reproducible=True, comm=comm)
    assert _kernels(comm) != before  # found by the engine's calls
    with pytest.raises(collectives.MismatchError):  # and against the plain sum
        collectives.allreduce(x, out=x, reproducible=world.rank == 0, comm=comm)
    comm.free()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_reduce_scatter_on_shared_memory_gives_the_allreduces_share_and_rings_bits(
    dtype: str, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    comm = _on_shared_memory(world)
    for count in (world.size * 7, world.size * 100_001):  # within and past the one-barrier window
        for op in ("sum", "avg"):
            parts = contributions(dtype, world.size, count, seed=count)
            with problems.guard(f"{op} {count}"):
                share = collectives.reduce_scatter(parts[world.rank], op, reproducible=True, comm=comm)
                ring = collectives.reduce_scatter(
                    parts[world.rank], op, reproducible=True, comm=comm, algorithm="ring"
                )
                whole = collectives.allreduce(parts[world.rank], op, reproducible=True, comm=comm)
                lo = world.rank * (count // world.size)
                problems.expect_equal(f"{op} {count} against ring", share, ring)
                problems.expect_equal(f"{op} {count} against allreduce", share, whole[lo : lo + share.size])
    comm.free()
    problems.check()
