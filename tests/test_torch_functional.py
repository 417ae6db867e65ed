"""The differentiable collectives on loopback ranks: gradients equal one process's on all the data."""

import time
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

from collectives import Communicator, InvalidBufferError, UnsupportedDtypeError, UnsupportedOpError  # noqa: E402
from collectives import torch_integration as ti  # noqa: E402
from collectives.torch_integration import functional  # noqa: E402
from collectives.torch_integration import tensors as ti_tensors  # noqa: E402

from . import autograd_cases  # noqa: E402

Ranks = Callable[..., list[Any]]


@pytest.mark.parametrize("case", autograd_cases.CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_gradients_equal_one_process_on_all_the_data(ranks: Ranks, case: str, size: int) -> None:
    def run(comm: Communicator) -> torch.Tensor:
        x = autograd_cases.input_of(case, comm.rank, comm.size)
        return autograd_cases.distributed_gradient(case, x, comm.rank, comm.size, comm)

    expected = autograd_cases.reference_gradients(case, size)
    for rank, (actual, wanted) in enumerate(zip(ranks(size, run), expected, strict=True)):
        if case in autograd_cases.EXACT:
            assert torch.equal(actual, wanted), f"rank {rank}: {actual} != {wanted}"
        else:
            torch.testing.assert_close(actual, wanted, rtol=1e-6, atol=0, msg=f"rank {rank}")


def test_outputs_are_new_tensors_and_the_inputs_are_left_alone(ranks: Ranks) -> None:
    def run(comm: Communicator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        outs = []
        for call in (
            lambda x: functional.allreduce(x, comm=comm),
            lambda x: functional.allgather(x, comm=comm),
            lambda x: functional.reduce_scatter(x, comm=comm),
            lambda x: functional.broadcast(x, 0, comm=comm),
        ):
            x = torch.full((4, 2), float(comm.rank + 1), requires_grad=True)
            y = call(x)
            outs.append((x.detach(), y))
        return outs

    for rank, outs in enumerate(ranks(2, run)):
        for x, y in outs:
            assert torch.equal(x, torch.full((4, 2), float(rank + 1)))
            assert y.requires_grad and y.grad_fn is not None
            assert y.data_ptr() != x.data_ptr()


@pytest.mark.parametrize(
    "call",
    [
        lambda x, comm: functional.allreduce(x, "sum", comm=comm),
        lambda x, comm: functional.allreduce(x, "avg", comm=comm),
        lambda x, comm: functional.allreduce(x, "max", comm=comm),
        lambda x, comm: functional.allgather(x, comm=comm),
        lambda x, comm: functional.reduce_scatter(x, "avg", comm=comm),
        lambda x, comm: functional.broadcast(x, 0, comm=comm),
    ],
    ids=["allreduce-sum", "allreduce-avg", "allreduce-max", "allgather", "reduce_scatter-avg", "broadcast"],
)
def test_gradcheck_at_one_rank(
    ranks: Ranks, call: Callable[[torch.Tensor, Communicator], torch.Tensor]
) -> None:
    def run(comm: Communicator) -> bool:
        x = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        ok: bool = torch.autograd.gradcheck(lambda t: call(t, comm), (x.requires_grad_(),))
        return ok

    assert ranks(1, run) == [True]


def test_ops_without_a_gradient_are_refused_on_every_rank_before_any_message(ranks: Ranks) -> None:
    def run(comm: Communicator) -> list[str]:
        errors = []
        x = torch.ones(4, requires_grad=True)
        for call in (
            lambda: functional.allreduce(x, "prod", comm=comm),
            lambda: functional.allreduce(x.detach().long(), "band", comm=comm),
            lambda: functional.reduce_scatter(x, "max", comm=comm),
        ):
            with pytest.raises(UnsupportedOpError, match="no gradient") as raised:
                call()
            errors.append(str(raised.value))
        # the ranks are still in step
        errors.append(str(functional.allreduce(x, comm=comm).tolist()))
        return errors

    for errors in ranks(2, run):
        assert "'prod'" in errors[0] and "sum, avg, max, min" in errors[0]
        assert errors[-1] == "[2.0, 2.0, 2.0, 2.0]"


@pytest.mark.parametrize(
    ("tensor", "error"),
    [
        (torch.zeros(4, 3).t(), InvalidBufferError),
        (torch.zeros(3, dtype=torch.complex64), UnsupportedDtypeError),
        (torch.zeros(3, device="meta"), InvalidBufferError),
    ],
    ids=["non-contiguous", "complex", "meta"],
)
def test_bad_tensors_fail_on_every_rank_and_the_next_collective_works(
    ranks: Ranks, tensor: torch.Tensor, error: type[Exception]
) -> None:
    def run(comm: Communicator) -> torch.Tensor:
        for call in (
            lambda: functional.allreduce(tensor, comm=comm),
            lambda: functional.allgather(tensor, comm=comm),
            lambda: functional.reduce_scatter(tensor, comm=comm),
            lambda: functional.broadcast(tensor, 0, comm=comm),
        ):
            with pytest.raises(error):
                call()
        return functional.allreduce(torch.ones(2), comm=comm)

    for result in ranks(3, run):
        assert torch.equal(result, torch.full((2,), 3.0))


# --------------------------------------------------------------------------- cuda (on a GPU host)


@pytest.fixture
def nccl(tmp_path: Any) -> Any:
    """torch.distributed over NCCL with one rank: the path cuda tensors take."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here; the GPU paths run on a GPU host")
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    torch.distributed.init_process_group(
        "nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "call",
    [
        lambda x: functional.allreduce(x, "sum"),
        lambda x: functional.allreduce(x, "max"),
        functional.allgather,
        lambda x: functional.reduce_scatter(x, "avg"),
        functional.broadcast,
    ],
    ids=["allreduce-sum", "allreduce-max", "allgather", "reduce_scatter-avg", "broadcast"],
)
@pytest.mark.parametrize("path", ["nccl", "cupy"])
def test_gradcheck_on_cuda_through_nccl(
    nccl: None, call: Callable[[torch.Tensor], torch.Tensor], path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cuda tensors go through CuPy where it imports, else through NCCL
    if path == "cupy":
        pytest.importorskip("cupy", reason="CuPy is not installed")
    else:
        monkeypatch.setattr(ti_tensors, "_cupy_available", lambda: False)
    x = torch.randn(4, 3, dtype=torch.float64, device="cuda", requires_grad=True)
    assert call(x).device == x.device
    assert torch.autograd.gradcheck(call, (x,))


@pytest.mark.parametrize(
    ("collective", "bad"),
    [
        ("allreduce", lambda c: functional.allreduce(torch.ones(3, 4).t().requires_grad_(), comm=c)),
        ("allreduce", lambda c: functional.allreduce(torch.ones(4, 3, requires_grad=True), "prod", comm=c)),
        ("reduce_scatter", lambda c: functional.reduce_scatter(torch.ones(4, 3), "max", comm=c)),
        ("allgather", lambda c: functional.allgather(torch.ones(4, 3, dtype=torch.complex64), comm=c)),
        ("broadcast", lambda c: functional.broadcast(torch.ones(3, 4).t(), comm=c)),
    ],
)  # fmt: skip
def test_a_bad_tensor_on_one_rank_fails_the_others_at_once(ranks: Ranks, collective: str, bad: Any) -> None:
    from collectives import CollectiveTimeout, MismatchError, PeerInputError

    good = {
        "allreduce": lambda c: functional.allreduce(torch.ones(4, 3, requires_grad=True), comm=c),
        "reduce_scatter": lambda c: functional.reduce_scatter(torch.ones(4, 3, requires_grad=True), comm=c),
        "allgather": lambda c: functional.allgather(torch.ones(4, 3), comm=c),
        "broadcast": lambda c: functional.broadcast(torch.ones(4, 3), comm=c),
    }[collective]

    def run(comm: Communicator) -> tuple[str, float, Any]:
        # a timeout long enough that waiting for it would show
        bounded = Communicator(comm.transport, timeout=20.0, stall_warning=0)
        started = time.monotonic()
        try:
            (bad if comm.rank == 1 else good)(bounded)
            kind = "no error"
        except (
            InvalidBufferError,
            UnsupportedOpError,
            UnsupportedDtypeError,
            MismatchError,
            CollectiveTimeout,
        ) as error:
            kind = type(error).__name__
            if isinstance(error, PeerInputError):
                assert list(error.problems) == [1] and f"{collective} #0" in str(error), error
        took = time.monotonic() - started
        # the ranks are still in step
        return kind, took, ti.allreduce(torch.ones(2), comm=bounded).tolist()

    results = ranks(2, run, timeout=40.0)
    assert results[0][0] == "PeerInputError" and results[1][0] != "PeerInputError", results
    assert all(took < 10 and after == [2.0, 2.0] for _, took, after in results), results
