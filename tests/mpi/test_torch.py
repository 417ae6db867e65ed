"""torch under mpiexec: data-parallel training through collectives equals one process on the whole batch."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")
dist = torch.distributed

import collectives  # noqa: E402
from collectives import torch_integration as ti  # noqa: E402
from collectives.errors import CollectivesError  # noqa: E402
from tests import training  # noqa: E402
from tests.mpi.helpers import Problems, exact_input, mpi_reference  # noqa: E402

pytestmark = pytest.mark.mpi

COMPRESSION_TOLERANCE = {None: 1e-6, "fp16": 1e-3, "bf16": 1e-2}
"""Relative error of the parameters after training.STEPS steps: float32 gradients within 1e-6;
compressed ones measured at 1 to 5 ranks at most 1.5e-4 (fp16) and 7.1e-4 (bf16)."""


def _single_process() -> list[Any]:
    net = training.model()
    return training.train(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))


def _check_training(problems: Problems, label: str, params: list[Any], tolerance: float) -> None:
    """Close to one process on the whole batch, and bitwise equal on every rank."""
    error = training.relative_error(params, _single_process())
    problems.expect(error <= tolerance, f"{label}: relative error {error:.3g} > {tolerance:g}")
    flat = torch.cat([p.reshape(-1) for p in params]).numpy()
    problems.expect_equal(
        f"{label}: parameters differ from rank 0's", flat, problems.comm.bcast(flat, root=0)
    )


@pytest.mark.parametrize(
    ("compression", "threshold"),
    [(None, 0), (None, 64 << 20), ("fp16", 300), ("bf16", 64 << 20)],
)
def test_distributed_optimizer(compression: str | None, threshold: int, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        net = training.model(seed=world.rank)  # unlike until rank 0's weights are broadcast
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        ti.broadcast_parameters(net.state_dict(), root_rank=0)
        ti.broadcast_optimizer_state(sgd, root_rank=0)
        optimizer = ti.DistributedOptimizer(
            sgd, net.named_parameters(), fusion_threshold_bytes=threshold, compression=compression
        )
        params = training.train(net, optimizer, world.rank, world.size)
        _check_training(problems, f"compression={compression}", params, COMPRESSION_TOLERANCE[compression])
    problems.check()


def test_the_users_calls_between_backward_and_synchronize_never_meet_the_optimizers(
    world: MPI.Intracomm,
) -> None:
    """A Horovod-style metric: the main thread's allreduce on the default communicator while
    DistributedOptimizer's thread reduces buckets; the buckets go over a communicator of their own."""
    problems = Problems(world)
    metric = np.full(100_000, world.rank + 1, np.float32)  # the shared-memory path, long enough to overlap
    expected = world.size * (world.size + 1) / 2
    with problems.guard("training with a metric"):
        net = training.model()
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        optimizer = ti.DistributedOptimizer(sgd, net.named_parameters(), fusion_threshold_bytes=0)

        def reduce_a_metric() -> None:
            # the communication thread is busy for certain: a large reduction on the default communicator
            busy = ti.allreduce_async_(torch.ones(4_000_000))
            for _ in range(3):
                result = collectives.allreduce(metric)
                problems.expect(bool((result == expected).all()), f"the metric's sum is {result[:4]}")
            busy.wait()
            optimizer.synchronize()

        params = training.train(net, optimizer, world.rank, world.size, before_step=reduce_a_metric)
        _check_training(problems, "with a metric", params, COMPRESSION_TOLERANCE[None])
    problems.check()


@contextmanager
def _process_group(backend: str) -> Iterator[None]:
    """torch.distributed's default group on ``backend``, rank and world size from MPI (``mpi://``)."""
    dist.init_process_group(backend, init_method="mpi://")
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def gloo() -> Iterator[None]:
    """A gloo group, as DDP needs one for its own setup even where a hook averages the gradients."""
    with _process_group("gloo"):
        yield


@pytest.mark.parametrize(
    ("hook", "compression"),
    [(ti.allreduce_hook, None), (ti.allreduce_fp16_hook, "fp16"), (ti.allreduce_bf16_hook, "bf16")],
    ids=["allreduce", "fp16", "bf16"],
)
def test_ddp_comm_hook(
    hook: Callable[..., Any], compression: str | None, gloo: None, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        net = training.model()
        model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.001)  # several buckets
        model.register_comm_hook(None, hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        params = training.train(model, optimizer, world.rank, world.size)
        _check_training(problems, f"hook {hook.__name__}", params, COMPRESSION_TOLERANCE[compression])
    problems.check()


def test_ddp_on_the_collectives_backend(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    try:
        dist.init_process_group(
            "collectives", init_method="mpi://", rank=world.rank, world_size=world.size + 1
        )
    except CollectivesError as error:
        problems.expect("MPI says" in str(error), f"a wrong world size: {error}")
    else:
        problems.expect(False, "a wrong world size: no error")
    with problems.guard("the backend"), _process_group("collectives"):
        problems.expect(dist.get_backend() == "collectives", f"backend {dist.get_backend()}")
        problems.expect((dist.get_rank(), dist.get_world_size()) == (world.rank, world.size), "rank, size")
        net = training.model()
        model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.001)  # as with any backend
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        params = training.train(model, optimizer, world.rank, world.size)
        _check_training(problems, "DDP on collectives", params, COMPRESSION_TOLERANCE[None])
        # what other common code calls on the default group
        total = torch.full((3,), float(world.rank))
        dist.all_reduce(total)
        problems.expect(torch.equal(total, torch.full((3,), world.size * (world.size - 1) / 2)), "all_reduce")
        last = torch.full((2,), float(world.rank))
        dist.broadcast(last, src=world.size - 1)
        problems.expect(torch.equal(last, torch.full((2,), world.size - 1.0)), "broadcast")
        gathered = [torch.empty(2, dtype=torch.int64) for _ in range(world.size)]
        dist.all_gather(gathered, torch.full((2,), world.rank))
        problems.expect(
            all(torch.equal(g, torch.full((2,), r)) for r, g in enumerate(gathered)), "all_gather"
        )
        objects: list[Any] = [None] * world.size
        dist.all_gather_object(objects, {"rank": world.rank})
        problems.expect(objects == [{"rank": r} for r in range(world.size)], f"all_gather_object {objects}")
        dist.barrier()
    problems.check()


def test_functions_equal_mpi(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    x = torch.from_numpy(exact_input("sum", "float32", 1001, world.rank, world.size))
    expected = mpi_reference("allreduce", x.numpy(), "sum", world)
    with problems.guard("allreduce"):
        problems.expect_equal("allreduce", ti.allreduce(x).numpy(), expected)
        tensors = [x.clone() for _ in range(4)]
        handles = [ti.allreduce_async_(t) for t in tensors]
        for i, handle in enumerate(handles):
            problems.expect_equal(f"allreduce_async_ {i}", handle.wait(timeout=60).numpy(), expected)
    with problems.guard("broadcast_"):
        root = world.size - 1
        sent = torch.from_numpy(exact_input("max", "int16", 77, world.rank, world.size))
        expected = world.bcast(sent.numpy(), root=root)
        problems.expect_equal("broadcast_", ti.broadcast_(sent, root).numpy(), expected)
    with problems.guard("allgather"):
        rows = torch.full((world.rank + 1, 2), world.rank, dtype=torch.int16)
        gathered = np.concatenate(world.allgather(rows.numpy()))
        problems.expect_equal("allgather", ti.allgather(rows).numpy(), gathered)
    problems.check()


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(3, dtype=torch.complex64),
        torch.zeros(3, dtype=torch.bool),
        torch.zeros(4, 3).t(),
        torch.zeros(3, device="meta"),
    ],
    ids=["complex", "bool", "non-contiguous", "meta"],
)
def test_bad_tensors_fail_on_every_rank_and_the_next_collective_works(
    tensor: Any, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    for name, call in [("allreduce_", ti.allreduce_), ("allgather", ti.allgather)]:
        try:
            call(tensor)
        except (TypeError, ValueError) as error:
            problems.expect(str(error) != "", f"{name}: an empty message")
        else:
            problems.expect(False, f"{name}: no error")
    with problems.guard("the next allreduce"):
        problems.expect_equal(
            "the next allreduce", ti.allreduce(torch.ones(3)).numpy(), np.full(3, world.size, np.float32)
        )
    problems.check()


def test_the_transport_reports_mpis_thread_level(world: MPI.Intracomm) -> None:
    levels = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    communicator = collectives.Communicator(world)
    try:
        problems = Problems(world)
        level = communicator.transport.thread_level
        problems.expect(level == levels[MPI.Query_thread()], f"thread level {level}")
        problems.check()
    finally:
        communicator.free()
