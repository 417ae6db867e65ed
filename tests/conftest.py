"""Shared fixtures; tests/mpi runs only under mpiexec with --with-mpi (see test_mpi_launch.py)."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collectives import Communicator, selector
from collectives.calibration import CALIBRATION_ENV
from collectives.transport.loopback import LoopbackWorld


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # the MPI tests are launched by test_mpi_launch.py under mpiexec; alone they would only see one rank
    if collection_path.name == "mpi" and not config.getoption("--with-mpi", default=False):
        return True
    return None


def run_ranks(world_size: int, fn: Callable[[Communicator], Any], timeout: float = 30.0) -> list[Any]:
    """Run ``fn(comm)`` on every rank of a loopback world; the results in rank order."""
    world = LoopbackWorld(world_size, timeout=timeout)
    return world.run(lambda transport: fn(Communicator(transport)))


@pytest.fixture
def ranks() -> Callable[..., list[Any]]:
    return run_ranks


@pytest.fixture
def no_calibration_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test sees the model's defaults, whatever calibration this machine has; later tests too.

    Files whose every test wants it say ``pytestmark = pytest.mark.usefixtures("no_calibration_file")``.
    """
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "absent.json"))
    selector.default_selector.cache_clear()
    selector.selector_for.cache_clear()
    yield
    selector.default_selector.cache_clear()
    selector.selector_for.cache_clear()
