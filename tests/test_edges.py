"""Edges of the API (issue 19, item 7): float16 averages, the debug file, parameter names, booleans."""

from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives.errors import ConfigurationError, InvalidBufferError, InvalidRootError, MismatchError
from collectives.transport.loopback import LoopbackWorld
from tests.conftest import run_ranks


@pytest.mark.parametrize("algorithm", ["ring", "tree", "butterfly", "direct", "halving_doubling"])
def test_float16_avg_whose_sum_overflows_is_finite(algorithm: str) -> None:
    x = np.full(10, 40_000, np.float16)  # three of them sum past float16's largest, 65504
    results = run_ranks(3, lambda comm: C.allreduce(x, "avg", algorithm=algorithm, comm=comm))
    assert all(np.isfinite(r).all() and np.allclose(r, 40_000, rtol=1e-3) for r in results), results
    shares = run_ranks(3, lambda comm: C.reduce_scatter(np.full(9, 40_000, np.float16), "avg", comm=comm))
    assert all(np.isfinite(s).all() for s in shares), shares
    reduced = run_ranks(3, lambda comm: C.reduce(x, "avg", root=1, comm=comm))
    assert np.isfinite(reduced[1]).all(), reduced


def test_float16_avg_is_the_float32_average_rounded_once_also_in_place() -> None:
    def call(comm: C.Communicator) -> Any:
        x = np.full(4, 40_000, np.float16)
        C.allreduce(x, "avg", out=x, comm=comm)
        y = np.full(3, (1, 2, 2)[comm.rank], np.float16)
        return x, C.allreduce(y, "avg", comm=comm), C.reduce_scatter(np.tile(y, 3), "avg", comm=comm)

    once = np.float16(np.float32(5) / np.float32(3))  # dividing first gives 1.666, not 1.667
    for x, y, share in run_ranks(3, call):
        assert np.array_equal(x, np.full(4, 40_000, np.float16)), x
        assert y.dtype == share.dtype == np.float16 and (y == once).all() and (share == once).all(), (
            y,
            share,
        )


def test_a_debug_file_in_a_missing_folder_is_refused_at_setup(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTIVES_DEBUG", "1")
    monkeypatch.setenv("COLLECTIVES_DEBUG_FILE", str(tmp_path / "missing" / "log-{rank}.txt"))
    with pytest.raises(ConfigurationError, match="missing"):
        C.Communicator(LoopbackWorld(1).transport(0))
    monkeypatch.setenv("COLLECTIVES_DEBUG_FILE", str(tmp_path / "log-{rank}.txt"))
    comm = C.Communicator(LoopbackWorld(1).transport(0))
    assert C.allreduce(np.ones(3), comm=comm).tolist() == [1, 1, 1]
    assert (tmp_path / "log-0.txt").exists()


@pytest.mark.parametrize("root", [False, True, 1.0, "0"])
def test_a_bool_or_other_non_integer_root_is_refused(root: Any) -> None:
    comm = C.Communicator(LoopbackWorld(1).transport(0))
    with pytest.raises(InvalidRootError, match="integer"):
        C.broadcast(np.ones(2), root=root, comm=comm)
    with pytest.raises(InvalidRootError, match="integer"):
        C.reduce(np.ones(2), root=root, comm=comm)


@pytest.mark.parametrize("counts", [[True], [1.0], ["1"]])
def test_bool_or_other_non_integer_counts_are_refused(counts: Any) -> None:
    comm = C.Communicator(LoopbackWorld(1).transport(0))
    with pytest.raises(InvalidBufferError, match="integers"):
        C.reduce_scatter(np.ones(1), counts=counts, comm=comm)
    with pytest.raises(InvalidBufferError, match="integers"):
        C.allgather(np.ones(1), counts=counts, comm=comm)


def _torch_integration() -> tuple[Any, Any]:
    """torch and collectives.torch_integration, or a skip where torch is not installed."""
    torch = pytest.importorskip(
        "torch", reason="the torch integration needs torch (pip install torch==2.13.0)"
    )
    import collectives.torch_integration as ti

    return torch, ti


def test_broadcast_parameters_matches_names_not_order() -> None:
    torch, ti = _torch_integration()

    def run(comm: C.Communicator) -> dict[str, Any]:
        params = {"a": torch.full((2,), 1.0 + comm.rank), "b": torch.full((2,), 10.0 + comm.rank)}
        if comm.rank == 1:
            params = dict(reversed(list(params.items())))
        ti.broadcast_parameters(params, root_rank=0, comm=comm)
        return params

    for params in run_ranks(2, run):
        assert params["a"].tolist() == [1.0, 1.0] and params["b"].tolist() == [10.0, 10.0], params


def test_broadcast_parameters_with_other_names_raises_on_every_rank() -> None:
    torch, ti = _torch_integration()

    def run(comm: C.Communicator) -> str:
        params = {"a": torch.zeros(2), ("b" if comm.rank == 0 else "c"): torch.zeros(2)}
        try:
            ti.broadcast_parameters(params, comm=comm)
        except MismatchError as error:
            return str(error)
        return "passed"

    assert all("ranks [1]" in r for r in run_ranks(2, run))
