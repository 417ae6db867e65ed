"""The compiled engine under mpiexec: the same bits as the Python path, for every dtype and op it takes."""

import itertools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import engine
from collectives.ops import OPS
from tests.mpi.helpers import DTYPE_OPS, Problems, count_calls
from tests.test_special_bits import special_inputs

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not engine.compiled(), reason=f"the compiled engine does not run: {engine.why()}"),
]

REPEATS = 4
COUNTS = (1, 7, 301)


def _lean_communicator(world: MPI.Intracomm, **options: Any) -> collectives.Communicator:
    """A communicator over ``world`` on one node's shared memory, set up (its first call); skips elsewhere."""
    comm = collectives.Communicator(world, **options)
    collectives.barrier(comm=comm)  # the first call sets up the shared memory
    if world.size == 1 or comm.watchdog.shared is None:
        comm.free()
        pytest.skip("one rank, or ranks without shared memory: no lean path")
    return comm


def _inputs(dtype: str, count: int, rank: int, size: int, call: int) -> np.ndarray:
    """This rank's input: random values of the dtype's range, and for floats +0, -0 and one rank's NaNs."""
    rng = np.random.default_rng(1000 * call + 17 * rank + count)
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        exponents = (
            rng.integers(-3, 3, count) if dtype in ("float16", "bfloat16") else rng.integers(-30, 30, count)
        )
        values = rng.standard_normal(count) * 10.0**exponents
        special = special_inputs(dtype, size, count, nan_ranks=1)[rank]
        return np.where(rng.random(count) < 0.3, special, values.astype(special.dtype))
    if dtype.startswith("complex"):
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
    if dtype == "bool":
        return rng.random(count) < 0.5
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)


def _results(
    comm: collectives.Communicator, dtype: str, op: str, count: int, persistent: bool, in_place: bool = True
) -> list[bytes]:
    """The bits of REPEATS calls (the later ones lean), plain or persistent, in place or not, on ``comm``."""
    x = np.zeros(count, dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    out = x if in_place else np.zeros_like(x)
    start: Callable[[], Any] | None = (
        collectives.allreduce_init(x, op, out=out, comm=comm) if persistent else None
    )
    results = []
    for call in range(REPEATS):
        x[...] = _inputs(dtype, count, comm.rank, comm.size, call)
        if start is not None:
            start()
        else:
            collectives.allreduce(x, op, out=out, comm=comm)
        results.append(out.tobytes())
    return results


def _counting(monkeypatch: pytest.MonkeyPatch, shared: Any) -> list[Any]:
    """The compiled calls the shared memory makes (small_kernel's), whose runs count their calls."""
    made: list[Any] = []
    original = type(shared).small_kernel

    def small_kernel(self: Any, *args: Any) -> Any:
        kernel = original(self, *args)
        if kernel is not None:
            made.append(kernel)
        return kernel

    monkeypatch.setattr(type(shared), "small_kernel", small_kernel)
    return made


def _runs(made: list[Any]) -> int:
    return sum(kernel.runs for kernel in made)


@pytest.mark.parametrize(
    ("persistent", "in_place"),
    [(False, True), (True, True), (False, False)],
    ids=["plain", "persistent", "out"],
)
def test_the_engine_and_the_python_path_give_the_same_bits(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, persistent: bool, in_place: bool
) -> None:
    problems = Problems(world)
    compiled = _lean_communicator(world)
    made = _counting(monkeypatch, compiled.watchdog.shared)
    taken = 0
    for dtype, op in DTYPE_OPS:
        if OPS[op].custom:
            continue
        for count in COUNTS:
            before = _runs(made)
            ours: list[bytes] | None = None
            theirs: list[bytes] | None = None
            with problems.guard(f"{dtype} {op} {count} compiled"):
                ours = _results(compiled, dtype, op, count, persistent, in_place)
            took = _runs(made) > before
            taken += took
            # (others may reach it too: float16's avg sums in float32)
            if engine.reduces(dtype, OPS[op].combine):
                problems.expect(took, f"{dtype} {op} count {count}: the engine did not take the calls")
            with monkeypatch.context() as python_only:
                python_only.setattr(engine, "COMPILED", None)
                python = collectives.Communicator(world)
                with problems.guard(f"{dtype} {op} {count} python"):
                    theirs = _results(python, dtype, op, count, persistent, in_place)
                python.free()
            if ours is not None and ours != theirs:
                problems.expect(False, f"{dtype} {op} count {count}: the compiled and Python paths differ")
    problems.expect(taken > 0, "the engine took no call")
    compiled.free()
    problems.check()


def test_a_mismatch_on_the_compiled_path_is_found_on_every_rank(world: MPI.Intracomm) -> None:
    comm = _lean_communicator(world)
    x = np.ones(4, np.float32)
    for op in ("sum", "prod"):  # both keys agreed once, so later calls of either run lean
        collectives.allreduce(x, op, out=x, comm=comm)
    mine = "sum" if world.rank == 0 else "prod"  # then the ranks' calls differ
    with pytest.raises(collectives.MismatchError):
        collectives.allreduce(x, mine, out=x, comm=comm)
    comm.free()


@pytest.mark.parametrize("persistent", [False, True], ids=["plain", "persistent"])
def test_repeated_calls_are_one_call_into_the_engine(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    from collectives.lean import LeanAllreduce

    comm = _lean_communicator(world)
    x = np.ones(4, np.float32)
    start = collectives.allreduce_init(x, out=x, comm=comm) if persistent else None
    for _ in range(3):  # the first call decides, the next makes the compiled call
        start() if start is not None else collectives.allreduce(x, out=x, comm=comm)
    in_python = [0]
    original = LeanAllreduce._run_here

    def counted(self: LeanAllreduce, work: Any, source: Any) -> None:
        in_python[0] += 1
        original(self, work, source)

    monkeypatch.setattr(LeanAllreduce, "_run_here", counted)
    for _ in range(REPEATS * 5):
        x[...] = 1.0
        start() if start is not None else collectives.allreduce(x, out=x, comm=comm)
        assert (x == world.size).all()
    comm.free()
    assert in_python[0] == 0, f"{in_python[0]} of {REPEATS * 5} repeated calls ran the Python path"


SEGMENTED = (("float32", "sum"), ("float64", "prod"), ("int32", "max"), ("uint8", "bxor"), ("float32", "avg"))


def _past_the_small_window(dtype: str) -> int:
    """Elements of a rank's input past the engine's one-barrier window (by 200 KB: two segments or more)."""
    from collectives.shared_sizes import small_bytes

    return ((small_bytes(MPI.COMM_WORLD.size, compiled=True) + 200_007) // np.dtype(dtype).itemsize) | 1


def _leans(comm: collectives.Communicator) -> list[Any]:
    """The lean paths of ``comm``'s repeated allreduces (the other collectives' repeats have their own)."""
    from collectives.lean import LeanAllreduce

    return [p.lean for p in comm.repeats.values() if isinstance(p.lean, LeanAllreduce)]


def _segmented_kernels(comm: collectives.Communicator) -> list[Any]:
    return [lean._segments for lean in _leans(comm) if lean._segments is not None]


def test_calls_past_the_small_window_take_the_engine_with_the_python_paths_bits(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = Problems(world)
    compiled = _lean_communicator(world)
    # in place and not: an owner reads its own part from its input, which in place is the output
    for (dtype, op), in_place in itertools.product(SEGMENTED, (True, False)):
        count = _past_the_small_window(dtype)
        with problems.guard(f"{dtype} {op} compiled"):
            ours = _results(compiled, dtype, op, count, persistent=False, in_place=in_place)
        with monkeypatch.context() as python_only:
            python_only.setattr(engine, "COMPILED", None)
            python = collectives.Communicator(world)
            with problems.guard(f"{dtype} {op} python"):
                theirs = _results(python, dtype, op, count, persistent=False, in_place=in_place)
            python.free()
        problems.expect(
            ours == theirs, f"{dtype} {op}, in place {in_place}: the compiled and Python paths differ"
        )
    runs = sum(kernel.runs for kernel in _segmented_kernels(compiled))
    problems.expect(runs == 2 * len(SEGMENTED) * (REPEATS - 1), f"the engine ran {runs} segmented calls")
    compiled.free()
    problems.check()


def test_a_rank_on_the_python_path_meets_one_in_the_engine(world: MPI.Intracomm) -> None:
    """The engine's segments pass the executor's barriers with its notes: the paths mix within a call."""
    problems = Problems(world)
    comm = _lean_communicator(world)
    count = _past_the_small_window("float32")
    x = np.zeros(count, np.float32)
    for _ in range(2):
        collectives.allreduce(x, out=x, comm=comm)
    if world.rank == 0:  # rank 0 on the Python path from here on
        for lean in _leans(comm):
            lean._segments = None
    for call in range(REPEATS):  # whole numbers: the sums are exact in any order, so MPI's are ours
        x[...] = np.random.default_rng(call * 31 + world.rank).integers(-1000, 1000, count)
        expected = np.empty_like(x)
        world.Allreduce(x, expected)
        collectives.allreduce(x, out=x, comm=comm)
        problems.expect(np.array_equal(x, expected), f"call {call}: wrong sums")
    runs = sum(kernel.runs for kernel in _segmented_kernels(comm))
    problems.expect((runs > 0) == (world.rank != 0), f"rank {world.rank} ran {runs} calls in the engine")
    comm.free()
    problems.check()


def test_a_mismatch_or_a_late_rank_past_the_small_window(world: MPI.Intracomm) -> None:
    import time

    comm = _lean_communicator(world)
    x = np.ones(_past_the_small_window("float32"), np.float32)
    for op in ("sum", "prod", "sum", "prod"):  # both repeated once, so later calls of either take the engine
        collectives.allreduce(x, op, out=x, comm=comm)
    for _ in range(3):  # a late rank: the others wait on past the engine's spin, then go on in it
        x[...] = 1.0
        if world.rank == world.size - 1:
            time.sleep(0.05)
        collectives.allreduce(x, out=x, comm=comm)
        assert (x == world.size).all()
    assert sum(kernel.runs for kernel in _segmented_kernels(comm)) >= 3
    mine = "sum" if world.rank == 0 else "prod"
    with pytest.raises(collectives.MismatchError):
        collectives.allreduce(x, mine, out=x, comm=comm)
    comm.free()


def test_an_interrupt_in_a_segmented_calls_wait_breaks_the_communicator_everywhere(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine hands a late barrier's wait to Python: an interrupt there ends the call as any would."""
    import time

    from collectives import BrokenCommunicatorError
    from collectives.call import Call

    comm = _lean_communicator(world, timeout=20.0)
    x = np.ones(_past_the_small_window("float32"), np.float32)
    for _ in range(3):
        collectives.allreduce(x, out=x, comm=comm)
    interrupted, broken = False, []
    if world.rank == 1:

        def interrupted_wait(self: Call, *args: Any, **kwargs: Any) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(Call, "arrived", interrupted_wait)
    for call in range(4):
        if world.rank == 0 and call == 0:
            time.sleep(0.05)  # rank 1 waits past the engine's spin
        try:
            x[...] = 1.0
            collectives.allreduce(x, out=x, comm=comm)
            assert (x == world.size).all()
        except KeyboardInterrupt:
            interrupted = True
            monkeypatch.undo()
        except BrokenCommunicatorError as error:
            broken.append(str(error))
    assert interrupted == (world.rank == 1)
    assert len(broken) >= 3 and all("KeyboardInterrupt" in b for b in broken), broken
    comm.free()


@pytest.mark.parametrize("into", ["in place", "out", "new"])
def test_a_repeated_call_is_one_call_from_the_api_into_the_engine(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, into: str
) -> None:
    """Past its first calls, an allreduce of any shape, in place, into out or into a new array, runs no
    Python layer below the api's."""
    from collectives import api

    comm = _lean_communicator(world)
    x = np.ones((2, 3), np.float32)
    out = x if into == "in place" else np.empty_like(x) if into == "out" else None
    for _ in range(3):  # the first call decides, the next makes the compiled call
        collectives.allreduce(x, "max", out=out, comm=comm)
    full = count_calls(monkeypatch, api, "call_collective")
    problems = Problems(world)
    for call in range(REPEATS * 5):
        x[...] = np.arange(6).reshape(2, 3) * (world.rank + 1) + call
        result = collectives.allreduce(x, "max", out=out, comm=comm)
        problems.expect(
            result is out if out is not None else result is not x and result.base is None, "result"
        )
        problems.expect_equal(
            f"call {call}", result, np.arange(6, dtype=np.float32).reshape(2, 3) * world.size + call
        )
    problems.expect(full[0] == 0, f"{full[0]} of {REPEATS * 5} repeated calls took the full path")
    comm.free()
    problems.check()


def test_outputs_the_engines_one_call_refuses_take_the_full_path(world: MPI.Intracomm) -> None:
    """Past a repeated call into out: an output of another shape, dtype or kind, a read-only one (the full
    path names each), a strided one, or one sharing the input's memory (the full path's results)."""
    comm = _lean_communicator(world)
    x = np.ones(8, np.float32)
    out = np.empty_like(x)
    for _ in range(3):
        collectives.allreduce(x, out=out, comm=comm)
    read_only = np.empty_like(x)
    read_only.flags.writeable = False
    refused = {
        "has shape": np.empty(7, np.float32),
        "has dtype": np.empty(8, np.float64),
        "is a list": [0.0] * 8,
        "read-only": read_only,
    }
    problems = Problems(world)
    for says, bad in refused.items():
        with problems.guard(says), pytest.raises(collectives.InvalidBufferError, match=says):
            collectives.allreduce(x, out=bad, comm=comm)
    wide = np.zeros(16, np.float32)
    problems.expect(collectives.allreduce(x, out=wide[::2], comm=comm).base is wide, "strided: not out")
    problems.expect_equal("strided", wide, np.tile(np.float32([world.size, 0]), 8))
    shared = np.ones(16, np.float32)  # its first half's sums into its middle
    collectives.allreduce(shared[:8], out=shared[4:12], comm=comm)
    problems.expect_equal("overlapping", shared, np.float32([1] * 4 + [world.size] * 8 + [1] * 4))
    problems.expect_equal(
        "after", collectives.allreduce(x, out=out, comm=comm), np.full(8, world.size, np.float32)
    )
    comm.free()
    problems.check()


def test_a_late_rank_in_a_repeated_call_into_a_new_array(world: MPI.Intracomm) -> None:
    """The engine's one call hands a late rank's wait to the Python path, which returns the new array."""
    import time

    comm = _lean_communicator(world)
    x = np.full(5, world.rank + 1, np.float64)
    for _ in range(3):
        collectives.allreduce(x, comm=comm)
    problems = Problems(world)
    for call in range(3):
        if world.rank == world.size - 1:
            time.sleep(0.05)
        result = collectives.allreduce(x, comm=comm)
        problems.expect(result is not x, "the input returned")
        problems.expect_equal(f"call {call}", result, np.full(5, world.size * (world.size + 1) / 2))
    comm.free()
    problems.check()


def test_arrays_the_engines_one_call_refuses_take_the_full_path(world: MPI.Intracomm) -> None:
    """A strided or reshaped array, or one made read-only, of a repeated key: the full path decides."""
    comm = _lean_communicator(world)
    base = np.ones(8, np.float32)
    x = base[:4]
    for _ in range(3):
        x[...] = 1.0
        collectives.allreduce(x, out=x, comm=comm)
    strided = base[::2]  # the key's shape and dtype, not C-contiguous: the full path copies it
    strided[...] = world.rank + 1
    collectives.allreduce(strided, out=strided, comm=comm)
    assert (strided == world.size * (world.size + 1) // 2).all()
    x.shape = (2, 2)  # the same array reshaped in place: another key
    x[...] = 2.0
    collectives.allreduce(x, out=x, comm=comm)
    assert (x == 2.0 * world.size).all()
    x.shape = (4,)
    x.flags.writeable = False
    with pytest.raises(collectives.InvalidBufferError, match=r"read-only|writ"):
        collectives.allreduce(x, out=x, comm=comm)
    x.flags.writeable = True
    x[...] = 3.0
    collectives.allreduce(x, out=x, comm=comm)  # the communicator is whole
    assert (x == 3.0 * world.size).all()
    comm.free()


def test_a_late_rank_and_an_error_inside_the_engines_one_call(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A late rank: the call goes on in Python and gives the sums. An error inside the engine's call, its
    claim held: the call ends with it, and the claim is given back."""
    import time

    from collectives.lean import LeanAllreduce

    comm = _lean_communicator(world)
    x = np.ones(4, np.float32)
    for _ in range(3):
        collectives.allreduce(x, out=x, comm=comm)
    went_on = []
    original = LeanAllreduce.went_on

    def counted(self: LeanAllreduce, status: int, work: Any, source: Any) -> None:
        went_on.append(status)
        original(self, status, work, source)

    monkeypatch.setattr(LeanAllreduce, "went_on", counted)
    for _ in range(3):
        x[...] = 1.0
        if world.rank == world.size - 1:
            time.sleep(0.05)
        collectives.allreduce(x, out=x, comm=comm)
        assert (x == world.size).all()
    assert (engine.LATE in went_on) == (world.rank != world.size - 1), went_on

    def failing(self: LeanAllreduce, sequence: int) -> None:
        raise RuntimeError("no entry")

    collectives.barrier(comm=comm)  # another call in the flight recorder: the next repeat makes an entry
    monkeypatch.setattr(LeanAllreduce, "_new_entry", failing)
    with pytest.raises(RuntimeError, match="no entry"):
        collectives.allreduce(x, out=x, comm=comm)  # before its barrier, on every rank
    assert not comm.watchdog.claim_held()
    comm.free()


def test_the_other_collectives_repeats_the_small_call_does_not_take_pass_the_engines_signed_barrier(
    world: MPI.Intracomm,
) -> None:
    """A repeated reduce whose op the engine does not reduce (a float max: numpy's NaN rules) posts, passes
    and compares its signature in one engine call (the small calls of the others: test_engine_collectives)."""
    comm = collectives.Communicator(world)
    collectives.barrier(comm=comm)
    memory = comm.watchdog.shared
    if world.size == 1 or memory is None:
        comm.free()
        pytest.skip("one rank, or ranks without shared memory: no lean path")
    x = np.arange(5, dtype=np.float32)
    for _ in range(3):
        got = collectives.reduce(x, "max", root=world.size - 1, comm=comm)
        if world.rank == world.size - 1:
            assert np.array_equal(got, x)
    assert type(memory._signed).__name__ == "SignedBarrier"
    mine = 0 if world.rank == 0 else world.size - 1  # the ranks' calls differ: found in the engine's compare
    with pytest.raises(collectives.MismatchError):
        collectives.reduce(x, "max", root=mine, comm=comm)
    comm.free()
