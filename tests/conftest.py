"""Shared fixtures; tests/mpi runs only under mpiexec with --with-mpi (see test_mpi_launch.py)."""

import ast
import importlib.util
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


def _torch_absent() -> bool:
    try:
        return importlib.util.find_spec("torch") is None
    except ValueError:  # sys.modules["torch"] is None: torch is blocked
        return True


def _test_functions(path: Path) -> int:
    """The test functions in the file at ``path`` (before parametrization)."""
    tree = ast.parse(path.read_text())
    bodies = [tree.body] + [
        c.body for c in tree.body if isinstance(c, ast.ClassDef) and c.name.startswith("Test")
    ]
    return sum(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
        for body in bodies
        for node in body
    )


def _needs_torch(path: Path) -> bool:
    """Whether the file at ``path`` skips as a whole where torch is absent."""
    return any(
        isinstance(node, ast.Assign | ast.Expr)
        and 'importorskip("torch"' in ast.unparse(node).replace("'", '"')
        for node in ast.parse(path.read_text()).body
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    # torch is an optional extra: where it is absent, say how much of the suite did not run for it
    if not _torch_absent():
        return
    here = 0
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "torch" not in reason:
            continue
        # a module that skips as a whole is one report for all its tests
        path = config.rootpath / report.nodeid.split("::")[0]
        here += _test_functions(path) if report.when == "collect" and path.is_file() else 1
    launched = any(
        report.nodeid.startswith("tests/test_mpi_launch.py")
        for reports in terminalreporter.stats.values()
        for report in reports
        if hasattr(report, "nodeid")
    )
    under_mpi = (
        sum(
            _test_functions(p)
            for p in sorted(Path(__file__).parent.joinpath("mpi").glob("test_*.py"))
            if _needs_torch(p)
        )
        if launched
        else 0
    )
    if here or under_mpi:
        more = f", and {under_mpi} in tests/mpi at each world size" if under_mpi else ""
        terminalreporter.write_line(
            f"torch is not installed: {here} torch tests did not run{more}; "
            "pip install torch==2.13.0 (or 2.14.1) to run them"
        )


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
