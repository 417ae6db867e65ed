"""The differentiable collectives under mpiexec: gradients equal one process's on the concatenated data."""

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

from collectives.errors import UnsupportedOpError  # noqa: E402
from collectives.torch_integration import functional  # noqa: E402
from tests import autograd_cases  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_equal_one_process_on_all_the_data(dtype: torch.dtype, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    for case in autograd_cases.CASES:
        with problems.guard(case):
            x = autograd_cases.input_of(case, world.rank, world.size, dtype)
            actual = autograd_cases.distributed_gradient(case, x, world.rank, world.size)
            expected = autograd_cases.reference_gradients(case, world.size, dtype)[world.rank]
            if case in autograd_cases.EXACT:
                problems.expect(
                    torch.equal(actual, expected), f"{case}: {actual.tolist()} != {expected.tolist()}"
                )
            else:
                error = float((actual - expected).norm() / expected.norm())
                problems.expect(error <= 1e-6, f"{case}: relative error {error:.3g}")
    problems.check()


def test_gradcheck_at_one_rank(world: MPI.Intracomm) -> None:
    if world.size != 1:
        pytest.skip("gradcheck perturbs one rank's input at a time, which holds only at one rank")
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    for call in (
        lambda t: functional.allreduce(t, "avg"),
        lambda t: functional.allreduce(t, "min"),
        functional.allgather,
        functional.reduce_scatter,
        functional.broadcast,
    ):
        assert torch.autograd.gradcheck(call, (x,))


def test_a_non_differentiable_op_fails_on_every_rank_and_the_next_collective_works(
    world: MPI.Intracomm,
) -> None:
    problems = Problems(world)
    x = torch.ones(3, requires_grad=True)
    try:
        functional.allreduce(x, "prod")
    except UnsupportedOpError as error:
        problems.expect("no gradient" in str(error), f"message: {error}")
    else:
        problems.expect(False, "prod: no error")
    with problems.guard("the next allreduce"):
        y = functional.allreduce(x)
        y.sum().backward()
        problems.expect(torch.equal(x.grad, torch.full((3,), float(world.size))), f"grad {x.grad}")
    problems.check()


def test_a_bad_tensor_on_one_rank_fails_every_rank_at_once(world: MPI.Intracomm) -> None:
    import time

    import collectives
    from collectives import InvalidBufferError, PeerInputError

    if world.size == 1:
        pytest.skip("needs a good rank beside the bad one")
    problems = Problems(world)
    last = world.size - 1
    comm = collectives.Communicator(world, timeout=20.0, check=True)
    # not contiguous on the last rank only
    x = torch.ones(3, 4).t() if world.rank == last else torch.ones(4, 3)
    started = time.monotonic()
    try:
        functional.allreduce(x.requires_grad_(), comm=comm)
        problems.expect(False, "allreduce of a bad tensor on one rank did not raise")
    except PeerInputError as error:
        problems.expect(world.rank != last and list(error.problems) == [last], str(error))
    except InvalidBufferError as error:
        problems.expect(world.rank == last and "not contiguous" in str(error), str(error))
    took = time.monotonic() - started
    problems.expect(took < 10, f"took {took:.1f} s to raise")
    with problems.guard("allreduce after the bad one"):
        after = functional.allreduce(torch.ones(2), comm=comm)
        problems.expect(after.tolist() == [world.size] * 2, f"got {after.tolist()}")
    problems.check()
