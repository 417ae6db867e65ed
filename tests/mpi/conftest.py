"""Fixtures for the MPI tests."""

import pytest
from mpi4py import MPI


@pytest.fixture
def world() -> MPI.Intracomm:
    """MPI.COMM_WORLD, the communicator the tests compare the library against."""
    return MPI.COMM_WORLD
