"""torch under mpiexec: data-parallel training through collectives equals one process on the whole batch."""

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")
dist = torch.distributed

import collectives  # noqa: E402
from collectives import torch_integration as ti  # noqa: E402
from tests import training  # noqa: E402
from tests.mpi.helpers import Problems, exact_input, mpi_reference  # noqa: E402

pytestmark = pytest.mark.mpi

COMPRESSION_TOLERANCE = {None: 1e-6, "fp16": 1e-3, "bf16": 1e-2}
"""Relative error of the parameters after training.STEPS steps: float32 gradients within 1e-6;
compressed ones measured below 2e-4 (fp16) and 2e-3 (bf16)."""


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
        net = training.model()
        optimizer = ti.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
            net.named_parameters(),
            fusion_threshold_bytes=threshold,
            compression=compression,
        )
        params = training.train(net, optimizer, world.rank, world.size)
        _check_training(problems, f"compression={compression}", params, COMPRESSION_TOLERANCE[compression])
    problems.check()


@pytest.fixture(scope="module")
def gloo() -> Iterator[None]:
    """A gloo process group over a file store (no ports), as DDP needs one for its own setup."""
    world = MPI.COMM_WORLD
    folder = world.bcast(tempfile.mkdtemp(prefix="collectives-gloo-") if world.rank == 0 else None, root=0)
    dist.init_process_group(
        "gloo", init_method=f"file://{Path(folder) / 'store'}", rank=world.rank, world_size=world.size
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
        world.Barrier()
        if world.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


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
