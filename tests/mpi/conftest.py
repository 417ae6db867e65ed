"""Fixtures for the MPI tests."""

from collections.abc import Iterator
from datetime import timedelta

import pytest
from mpi4py import MPI


@pytest.fixture
def world() -> MPI.Intracomm:
    """MPI.COMM_WORLD, the communicator the tests compare the library against."""
    return MPI.COMM_WORLD


@pytest.fixture
def group(world: MPI.Intracomm) -> Iterator[int]:
    """The default torch group on the collectives backend (for torch's tests); yields the world size."""
    import torch.distributed as dist

    import collectives.torch_integration  # noqa: F401 - registers the backend and mpi://

    dist.init_process_group("collectives", init_method="mpi://", timeout=timedelta(seconds=60))
    try:
        yield world.size
    finally:
        dist.destroy_process_group()
