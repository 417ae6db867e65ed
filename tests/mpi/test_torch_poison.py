"""Under mpiexec: a c10d call of the collectives backend that is bad on one rank fails every rank at once."""

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")
dist = torch.distributed

from collectives import (  # noqa: E402
    InvalidBufferError,
    MismatchError,
    PeerInputError,
    UnsupportedDtypeError,
    UnsupportedOpError,
    torch_integration,  # noqa: F401 - registers the backend and mpi://
)
from collectives.watchdog import TIMEOUT_ENV  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402

pytestmark = pytest.mark.mpi

TIMEOUT_S = 20.0
"""The group's communicator timeout: a rank left waiting raises CollectiveTimeout after this."""

Call = Callable[[int], Any]  # the world size to a call through torch.distributed
ReduceOp = dist.ReduceOp


@pytest.fixture(scope="module")
def group(request: pytest.FixtureRequest) -> Iterator[None]:
    """The default group on the collectives backend, its communicator bounded by ``TIMEOUT_S``."""
    if MPI.COMM_WORLD.size == 1:
        pytest.skip("needs a good rank beside the bad one")
    saved = os.environ.get(TIMEOUT_ENV)
    os.environ[TIMEOUT_ENV] = str(TIMEOUT_S)  # read when the group's communicator is made
    try:
        dist.init_process_group("collectives", init_method="mpi://")
    finally:
        if saved is None:
            del os.environ[TIMEOUT_ENV]
        else:
            os.environ[TIMEOUT_ENV] = saved
    try:
        yield
    finally:
        dist.destroy_process_group()


def _all_reduce(tensor: Any, op: Any = ReduceOp.SUM) -> Call:
    return lambda size: dist.all_reduce(tensor, op=op)


# (collective, call on a good rank, call on the bad rank, the bad rank's error)
CASES: list[tuple[str, Call, Call, type]] = [
    ("allreduce", _all_reduce(torch.ones(4)), _all_reduce(torch.ones(4, dtype=torch.float8_e4m3fn)),
     UnsupportedDtypeError),
    ("allreduce", _all_reduce(torch.ones(4)), _all_reduce(torch.ones(2, device="meta")), InvalidBufferError),
    ("allreduce", _all_reduce(torch.ones(4)), _all_reduce(torch.ones(4), ReduceOp.BAND), UnsupportedOpError),
    ("allreduce", _all_reduce(torch.ones(4, dtype=torch.int32), ReduceOp.MAX),
     _all_reduce(torch.ones(4, dtype=torch.int32), ReduceOp.AVG), UnsupportedOpError),
    ("allreduce", _all_reduce(torch.ones(4, dtype=torch.int32)),
     _all_reduce(torch.ones(4, dtype=torch.int32), dist._make_nccl_premul_sum(2.0)), UnsupportedOpError),
    ("allreduce", lambda size: dist.all_reduce(torch.ones(4), async_op=True).wait(),
     _all_reduce(torch.ones(4, dtype=torch.float8_e4m3fn)), UnsupportedDtypeError),
    ("broadcast", lambda size: dist.broadcast(torch.ones(4), src=0),
     lambda size: dist.broadcast(torch.ones(4, dtype=torch.float8_e4m3fn), src=0), UnsupportedDtypeError),
    ("allgather", lambda size: dist.all_gather([torch.empty(2) for _ in range(size)], torch.ones(2)),
     lambda size: dist.all_gather([torch.empty(2) for _ in range(size + 1)], torch.ones(2)),
     InvalidBufferError),
    ("allgather", lambda size: dist.all_gather_single(torch.empty(2 * size), torch.ones(2)),
     lambda size: dist.all_gather_single(torch.empty(2 * size + 1), torch.ones(2)), InvalidBufferError),
    ("reduce_scatter", lambda size: dist.reduce_scatter(torch.empty(2), [torch.ones(2)] * size),
     lambda size: dist.reduce_scatter(torch.empty(2), [torch.ones(2)] * (size - 1)), InvalidBufferError),
    ("reduce_scatter", lambda size: dist.reduce_scatter_single(torch.empty(2), torch.ones(2 * size)),
     lambda size: dist.reduce_scatter_single(torch.empty(2), torch.ones(2 * size, dtype=torch.float64)),
     InvalidBufferError),
]  # fmt: skip

IDS = [
    "all_reduce-float8", "all_reduce-meta", "all_reduce-band-float", "all_reduce-avg-int",
    "all_reduce-premul-sum-int", "all_reduce-async", "broadcast-float8", "all_gather-outputs",
    "all_gather_single-size", "reduce_scatter-inputs", "reduce_scatter_single-dtype",
]  # fmt: skip


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("collective", "good", "bad", "kind"), CASES, ids=IDS)
def test_a_bad_c10d_call_on_one_rank_fails_on_every_rank_at_once(
    world: MPI.Intracomm, collective: str, good: Call, bad: Call, kind: type
) -> None:
    problems = Problems(world)
    last = world.size - 1
    started = time.monotonic()
    try:
        (bad if world.rank == last else good)(world.size)
        problems.expect(False, f"{collective} with a bad call on rank {last} did not raise")
    except PeerInputError as error:
        problems.expect(world.rank != last, f"the bad rank raised PeerInputError: {error}")
        problems.expect(list(error.problems) == [last], f"problems {error.problems}")
        problems.expect(
            f"the call failed its checks on rank {last} ({kind.__name__}: " in str(error)
            and str(error).startswith(f"{collective} #"),
            str(error),
        )
    except Exception as error:
        problems.expect(type(error) is kind and world.rank == last, f"raised {type(error).__name__}: {error}")
    took = time.monotonic() - started
    problems.expect(took < TIMEOUT_S / 4, f"took {took:.1f} s to raise")
    # the sequence numbers stayed in step: the next call agrees and runs
    with problems.guard(f"all_reduce after the bad {collective}"):
        after = torch.ones(3)
        dist.all_reduce(after)
        problems.expect(torch.equal(after, torch.full((3,), float(world.size))), f"got {after}")
    problems.check()


@pytest.mark.usefixtures("group")
def test_unlike_sizes_are_a_mismatch_on_every_rank(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    try:
        dist.all_reduce(torch.ones(3 + world.rank))
        problems.expect(False, "all_reduce of unlike sizes did not raise")
    except MismatchError as error:
        problems.expect(not isinstance(error, PeerInputError), f"raised {type(error).__name__}: {error}")
        problems.expect(set(error.fields) == {"count"}, f"fields {error.fields}")
    with problems.guard("all_reduce after the mismatch"):
        after = torch.ones(3)
        dist.all_reduce(after)
        problems.expect(torch.equal(after, torch.full((3,), float(world.size))), f"got {after}")
    problems.check()


@pytest.mark.usefixtures("group")
def test_the_good_ranks_future_fails_naming_the_bad_rank(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    last = world.size - 1
    queued = torch.full((1000,), float(world.rank))
    before = dist.all_reduce(queued, async_op=True)  # still queued when the bad rank's checks fail
    try:
        if world.rank == last:
            dist.all_reduce(torch.ones(4, dtype=torch.float8_e4m3fn), async_op=True)
        else:
            work = dist.all_reduce(torch.ones(4), async_op=True)
            work.get_future().wait()
        problems.expect(False, "no error")
    except UnsupportedDtypeError:
        problems.expect(world.rank == last, "a good rank raised the bad rank's error")
    except RuntimeError as error:  # torch's futures carry an error as a RuntimeError with its text
        problems.expect(
            world.rank != last
            and "PeerInputError: allreduce #" in str(error)
            and f"rank {last}" in str(error),
            f"raised {type(error).__name__}: {error}",
        )
    with problems.guard("the queued all_reduce"):
        before.wait()
        problems.expect(torch.equal(queued, torch.full((1000,), float(sum(range(world.size))))), "its sum")
    problems.check()
