"""Gradients summed reproducibly: the DDP hook, the optimizer's option, ReproducibleGradients, the example."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

import collectives as C  # noqa: E402
from collectives import torch_integration as ti  # noqa: E402

from .conftest import run_ranks  # noqa: E402
from .mpirun import mpiexec, run_mpi  # noqa: E402
from .reproducible_cases import contributions, model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 240  # one mpiexec run of the example; measured about 6 s on 2 shared cores


def _example() -> Any:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import reproducible_train

        return reproducible_train
    finally:
        sys.path.remove(str(ROOT / "examples"))


class _Bucket:
    """What a DDP hook uses of DDP's GradBucket."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return 0


def test_the_hook_averages_with_the_models_bits_whatever_the_algorithm() -> None:
    parts = contributions("float32", 3, 500, seed=21, specials=False)
    expected = model(parts, "float32", divide_by=3)

    def run(comm: C.Communicator) -> torch.Tensor:
        buffer = torch.from_numpy(parts[comm.rank].copy())
        result = ti.reproducible_allreduce_hook(comm, _Bucket(buffer)).wait()
        assert result is buffer
        return result

    for result in run_ranks(3, run):
        assert result.numpy().tobytes() == expected.tobytes()


def test_the_optimizers_option_sums_the_buckets_reproducibly() -> None:
    parts = contributions("float32", 3, 64, seed=22, specials=False)

    def run(comm: C.Communicator, threshold: int) -> np.ndarray:
        weight = torch.nn.Parameter(torch.zeros(64))
        optimizer = ti.DistributedOptimizer(
            torch.optim.SGD([weight], lr=1.0), op="sum", reproducible=True, fusion_threshold_bytes=threshold,
            comm=comm,
        )  # fmt: skip
        (weight * torch.from_numpy(parts[comm.rank])).sum().backward()
        optimizer.synchronize()
        assert weight.grad is not None
        return weight.grad.numpy().copy()

    expected = model(parts, "float32")
    for threshold in (0, 1 << 20):
        for grad in run_ranks(3, lambda comm, t=threshold: run(comm, t)):
            assert grad.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_micro_batches_dealt_to_1_2_3_4_and_6_ranks_give_the_same_gradients(dtype: torch.dtype) -> None:
    grads = [
        torch.randn(2, 5, generator=torch.Generator().manual_seed(i)).to(dtype) * 10.0**i for i in range(12)
    ]

    def run(comm: C.Communicator) -> torch.Tensor:
        weight = torch.nn.Parameter(torch.zeros(2, 5, dtype=dtype))
        bias = torch.nn.Parameter(torch.zeros(3, dtype=dtype))
        summed = ti.ReproducibleGradients([weight, bias], comm=comm)
        for index in range(comm.rank, 12, comm.size):
            (weight * grads[index]).sum().backward()  # bias gets no gradient: zeros
            summed.add()
            assert weight.grad is not None and not weight.grad.any()
        summed.allreduce(average=True)
        assert summed.count == 0 and bias.grad is not None and not bias.grad.any()
        assert weight.grad is not None
        return weight.grad.clone()

    results = [g for size in (1, 2, 3, 4, 6) for g in run_ranks(size, run)]
    assert all(torch.equal(r.view(torch.int8), results[0].view(torch.int8)) for r in results)
    exact = sum(g.double() for g in grads) / 12
    assert torch.allclose(results[0].double(), exact, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)


def test_the_example_ends_with_the_same_parameters_on_1_to_4_loopback_ranks() -> None:
    train = _example().train
    digests = {size: run_ranks(size, lambda comm: train(comm), timeout=120) for size in (1, 2, 3, 4)}
    assert all(len(set(found)) == 1 for found in digests.values()), digests  # every rank alike
    assert len({found[0] for found in digests.values()}) == 1, digests
    plain = {
        size: run_ranks(size, lambda comm: train(comm, steps=10, reproducible=False))[0] for size in (1, 3)
    }
    assert plain[1] != plain[3]  # so the comparison above can fail


def _digest(ranks: int, *options: str) -> str:
    try:
        finished = run_mpi(ranks, ["examples/reproducible_train.py", *options], timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"examples/reproducible_train.py hung at {ranks} ranks; output so far:\n{expired.output}")
    assert finished.returncode == 0, finished.stdout
    found = re.search(rf"{ranks} ranks, 50 steps: parameters sha256 ([0-9a-f]{{64}})", finished.stdout)
    assert found, finished.stdout
    return found.group(1)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_the_example_prints_the_same_digest_on_1_and_2_ranks_and_another_without_it() -> None:
    assert _digest(1) == _digest(2)
    assert _digest(1, "--plain") != _digest(2, "--plain")
