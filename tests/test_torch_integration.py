"""The torch integration on loopback ranks: zero-copy views, functions, buckets, optimizer, DDP hooks."""

import threading
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

import collectives as C  # noqa: E402
from collectives import (  # noqa: E402
    Communicator,
    InvalidBufferError,
    InvalidRootError,
    MismatchError,
    PeerInputError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from collectives import torch_integration as ti  # noqa: E402
from collectives.errors import CollectivesError  # noqa: E402
from collectives.torch_integration import process_group as ti_process_group  # noqa: E402
from collectives.torch_integration import tensors as ti_tensors  # noqa: E402
from collectives.transport.loopback import LoopbackTransport, LoopbackWorld  # noqa: E402

from . import training  # noqa: E402
from .conftest import run_ranks  # noqa: E402

Ranks = Callable[..., list[Any]]

DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64,
]  # fmt: skip
COMPRESSION_TOLERANCE = {"fp16": 1e-3, "bf16": 1e-2}
"""Relative error of the parameters after training.STEPS steps with compressed gradients
(measured at 1 to 5 ranks: at most 1.5e-4 for fp16, 7.1e-4 for bf16)."""


def _values(dtype: torch.dtype, rank: int, count: int = 7) -> torch.Tensor:
    # small integers: every sum, product, min and max is exact in every dtype
    return ((torch.arange(count) * 3 + rank) % 5 + 1).to(dtype)


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


# --------------------------------------------------------------------------- zero-copy views


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_host_views_share_the_tensors_memory(dtype: torch.dtype) -> None:
    tensor = _values(dtype, 0, 12).reshape(3, 4)
    view = ti_tensors.host_view(tensor)
    assert _address(view) == tensor.data_ptr()
    assert view.shape == (3, 4) and view.nbytes == tensor.numel() * tensor.element_size()
    assert np.shares_memory(view, ti_tensors.host_view(tensor))
    view[0, 0] = 42  # a write through the view lands in the tensor
    assert tensor[0, 0].item() == 42
    expected = "bfloat16" if dtype == torch.bfloat16 else str(dtype).removeprefix("torch.")
    assert view.dtype.name == expected


def test_a_tensor_that_requires_grad_is_viewed_without_a_copy() -> None:
    param = torch.nn.Parameter(torch.ones(5, dtype=torch.bfloat16))
    assert _address(ti_tensors.host_view(param)) == param.data_ptr()


def test_allreduce_in_place_hands_the_library_the_tensors_own_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int]] = []
    reduce = C.api.allreduce

    def spy(x: np.ndarray, op: str = "sum", **kwargs: Any) -> Any:
        seen.append((_address(x), _address(kwargs["out"])))
        return reduce(x, op, **kwargs)

    monkeypatch.setattr(C.api, "allreduce", spy)
    tensors = [torch.full((4, 3), float(r + 1), dtype=torch.bfloat16) for r in range(3)]
    run_ranks(3, lambda comm: ti.allreduce_(tensors[comm.rank], comm=comm))
    assert sorted(seen) == sorted((t.data_ptr(), t.data_ptr()) for t in tensors)
    assert all(torch.equal(t, torch.full((4, 3), 6.0, dtype=torch.bfloat16)) for t in tensors)


# --------------------------------------------------------------------------- the functions


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_matches_the_numpy_api_for_every_dtype_and_op(ranks: Ranks, dtype: torch.dtype) -> None:
    name = ti_tensors.torch_dtype_name(dtype)
    ops = [op.name for op in C.OPS.values() if name in op.dtypes]
    inputs = [_values(dtype, r) for r in range(3)]

    def run(comm: Communicator) -> list[tuple[torch.Tensor, np.ndarray]]:
        x = inputs[comm.rank]
        return [
            (ti.allreduce(x, op, comm=comm), C.allreduce(ti_tensors.host_view(x), op, comm=comm))
            for op in ops
        ]

    for results in ranks(3, run):
        for op, (result, expected) in zip(ops, results, strict=True):
            assert result.dtype == dtype, op
            assert ti_tensors.host_view(result).tobytes() == expected.tobytes(), op


def test_allreduce_returns_a_new_tensor_and_leaves_the_input(ranks: Ranks) -> None:
    inputs = [torch.arange(6.0).reshape(2, 3) * (r + 1) for r in range(3)]

    def run(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        x = inputs[comm.rank]
        scalar = ti.allreduce(torch.tensor(float(comm.rank)), "max", comm=comm)
        empty = ti.allreduce(torch.empty(0, 4), comm=comm)
        return x, ti.allreduce(x, comm=comm), scalar, empty

    for rank, (x, total, scalar, empty) in enumerate(ranks(3, run)):
        assert torch.equal(x, inputs[rank]) and x is inputs[rank]
        assert torch.equal(total, torch.arange(6.0).reshape(2, 3) * 6)
        assert total.data_ptr() != x.data_ptr()
        assert scalar.shape == () and scalar.item() == 2.0
        assert empty.shape == (0, 4)


def test_allreduce_async_returns_handles_that_complete_in_order(ranks: Ranks) -> None:
    def run(comm: Communicator) -> list[torch.Tensor]:
        tensors = [torch.full((1000,), float(i + comm.rank)) for i in range(5)]
        handles = [ti.allreduce_async_(t, "avg", comm=comm) for t in tensors]
        results = [h.wait(timeout=30) for h in reversed(handles)]
        assert all(h.done() for h in handles)
        assert all(r is t for r, t in zip(results, reversed(tensors), strict=True))
        return tensors

    for tensors in ranks(4, run):
        assert all(torch.equal(t, torch.full((1000,), i + 1.5)) for i, t in enumerate(tensors))


def test_allgather_concatenates_rows_that_differ_between_ranks(ranks: Ranks) -> None:
    def run(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = torch.full((comm.rank, 2), comm.rank, dtype=torch.bfloat16)
        scalar = torch.tensor(comm.rank, dtype=torch.int64)
        same = torch.arange(3, dtype=torch.int32) + 10 * comm.rank
        return ti.allgather(rows, comm=comm), ti.allgather(scalar, comm=comm), ti.allgather(same, comm=comm)

    for rows, scalars, same in ranks(4, run):
        assert torch.equal(
            rows, torch.tensor([[1, 1], [2, 2], [2, 2], [3, 3], [3, 3], [3, 3]], dtype=torch.bfloat16)
        )
        assert torch.equal(scalars, torch.arange(4))
        assert torch.equal(
            same, torch.tensor([0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32], dtype=torch.int32)
        )


def test_allgather_of_unlike_rows_fails_on_every_rank(ranks: Ranks) -> None:
    def run(comm: Communicator) -> str:
        with pytest.raises(InvalidBufferError, match="same dtype and trailing dimensions") as error:
            ti.allgather(torch.zeros(2, 2 + comm.rank), comm=comm)
        return str(error.value)

    assert len(set(ranks(3, run))) == 1


def test_reduce_scatter_gives_each_rank_its_rows(ranks: Ranks) -> None:
    inputs = [torch.arange(24, dtype=torch.float32).reshape(6, 4) + r for r in range(3)]
    whole = sum(inputs)
    results = ranks(3, lambda comm: ti.reduce_scatter(inputs[comm.rank], comm=comm))
    for rank, share in enumerate(results):
        assert torch.equal(share, whole[2 * rank : 2 * rank + 2])
    with pytest.raises(InvalidBufferError, match="divisible by the world size 3"):
        ranks(3, lambda comm: ti.reduce_scatter(torch.zeros(4, 2), comm=comm))


@pytest.mark.parametrize(
    ("tensor", "error", "message"),
    [
        (torch.zeros(3, dtype=torch.complex64), UnsupportedDtypeError, "unsupported dtype torch.complex64"),
        (torch.zeros(3, dtype=torch.bool), UnsupportedDtypeError, "unsupported dtype torch.bool"),
        (torch.zeros(4, 3).t(), InvalidBufferError, r"shape \(3, 4\) and strides \(1, 3\) is not contiguous"),
        (torch.zeros(3, device="meta"), InvalidBufferError, "on device meta; collectives takes cpu tensors"),
        (torch.zeros(3, 3).to_sparse(), InvalidBufferError, "layout torch.sparse_coo"),
        (np.zeros(3), InvalidBufferError, "expected a torch.Tensor, got ndarray"),
    ],
    ids=["complex", "bool", "non-contiguous", "meta", "sparse", "numpy"],
)
def test_bad_tensors_fail_on_every_rank_before_any_message(
    ranks: Ranks, tensor: Any, error: type[Exception], message: str
) -> None:
    calls = [
        lambda comm: ti.allreduce(tensor, comm=comm),
        lambda comm: ti.allreduce_(tensor, comm=comm),
        lambda comm: ti.allreduce_async_(tensor, comm=comm),
        lambda comm: ti.allgather(tensor, comm=comm),
        lambda comm: ti.reduce_scatter(tensor, comm=comm),
    ]

    def run(comm: Communicator) -> torch.Tensor:
        for call in calls:
            with pytest.raises(error, match=message):
                call(comm)
        return ti.allreduce(torch.ones(2), comm=comm)  # the communicator still works

    assert all(torch.equal(r, torch.full((2,), 2.0)) for r in ranks(2, run))
    path = ti.explain_path(tensor)
    assert path.startswith("unsupported: ") and message.split(" ")[0] in path


def test_ops_are_checked_against_the_dtype_before_any_message(ranks: Ranks) -> None:
    def run(comm: Communicator) -> None:
        with pytest.raises(UnsupportedOpError, match="op 'avg' does not apply to int32"):
            ti.allreduce_(torch.ones(3, dtype=torch.int32), "avg", comm=comm)
        with pytest.raises(UnsupportedOpError, match="unknown op 'mean'"):
            ti.allreduce(torch.ones(3), "mean", comm=comm)

    ranks(2, run)


def test_explain_names_the_path() -> None:
    assert ti.explain_path(torch.ones(3)) == "collectives: zero-copy numpy view of a cpu float32 tensor"
    assert ti.explain_path(torch.ones(3, dtype=torch.bfloat16)) == (
        "collectives: zero-copy numpy view (through int16) of a cpu bfloat16 tensor"
    )


def test_cuda_tensors_without_nccl_name_what_they_need(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeCuda:
        type = "cuda"

    monkeypatch.setattr(ti_tensors, "_nccl_initialised", lambda: False)
    tensor = torch.ones(2)
    fake = type("CudaTensor", (), {"device": FakeCuda()})()
    monkeypatch.setattr(ti_tensors, "_cupy_available", lambda: True)
    assert ti_tensors.route_of(fake, None) == "collectives-cuda"
    monkeypatch.setattr(ti_tensors, "_cupy_available", lambda: False)
    with pytest.raises(
        InvalidBufferError, match=r"need the GPU backend.*or torch.distributed initialised with NCCL"
    ):
        ti_tensors.route_of(fake, None)
    monkeypatch.setattr(ti_tensors, "_nccl_initialised", lambda: True)
    assert ti_tensors.route_of(fake, None) == "torch.distributed"
    with pytest.raises(InvalidBufferError, match="pass comm=None"):
        ti_tensors.route_of(fake, object())
    assert ti_tensors.route_of(tensor, None) == "collectives"


class _FunneledTransport(LoopbackTransport):
    thread_level = "funneled"  # type: ignore[assignment]


def test_without_thread_support_collectives_run_on_the_callers_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []
    reduce = C.api.allreduce

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return reduce(*args, **kwargs)

    monkeypatch.setattr(C.api, "allreduce", spy)
    funneled = Communicator(_FunneledTransport(LoopbackWorld(1), 0))
    handle = ti.allreduce_async_(torch.ones(3), comm=funneled)
    assert handle.done()  # it ran before returning
    threaded = Communicator(LoopbackWorld(1).transport(0))
    ti.allreduce_(torch.ones(3), comm=threaded)
    assert threads == [threading.current_thread().name, "collectives-comm"]


# --------------------------------------------------------------------------- fusion buckets


def test_fusion_buckets_take_parameters_in_reverse_up_to_the_threshold() -> None:
    params = [torch.zeros(n) for n in (10, 10, 30, 5, 5)]  # float32: 40, 40, 120, 20, 20 bytes
    assert ti.fusion_buckets(params, 64 << 20) == [[4, 3, 2, 1, 0]]
    assert ti.fusion_buckets(params, 80) == [[4, 3], [2], [1, 0]]
    assert ti.fusion_buckets(params, 40) == [[4, 3], [2], [1], [0]]
    assert ti.fusion_buckets(params, 0) == [[4], [3], [2], [1], [0]]
    assert ti.fusion_buckets([], 100) == []
    with pytest.raises(ValueError, match="non-negative"):
        ti.fusion_buckets(params, -1)


def test_fusion_buckets_hold_one_dtype() -> None:
    params = [torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.bfloat16)]
    assert ti.fusion_buckets(params, 1 << 20) == [[2, 1], [0]]


# --------------------------------------------------------------------------- DistributedOptimizer


def _sgd(net: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def _single_process(steps: int = training.STEPS) -> list[torch.Tensor]:
    net = training.model()
    return training.train(net, _sgd(net), steps=steps)


def _distributed(comm: Communicator, **options: Any) -> list[torch.Tensor]:
    net = training.model()
    optimizer = ti.DistributedOptimizer(_sgd(net), net.named_parameters(), comm=comm, **options)
    return training.train(net, optimizer, comm.rank, comm.size)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("threshold", [0, 300, 64 << 20])
def test_distributed_optimizer_trains_as_one_process_on_the_whole_batch(
    ranks: Ranks, world_size: int, threshold: int
) -> None:
    results = ranks(world_size, lambda comm: _distributed(comm, fusion_threshold_bytes=threshold))
    assert training.relative_error(results[0], _single_process()) < 1e-6
    assert all(all(torch.equal(a, b) for a, b in zip(r, results[0], strict=True)) for r in results)


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compressed_gradients_stay_within_tolerance(ranks: Ranks, compression: str) -> None:
    results = ranks(3, lambda comm: _distributed(comm, compression=compression))
    assert training.relative_error(results[0], _single_process()) < COMPRESSION_TOLERANCE[compression]
    assert all(all(torch.equal(a, b) for a, b in zip(r, results[0], strict=True)) for r in results)


def test_compression_divides_before_the_cast_so_float16_does_not_overflow(ranks: Ranks) -> None:
    def run(comm: Communicator) -> torch.Tensor:
        weight = torch.nn.Parameter(torch.zeros(4))
        optimizer = ti.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), compression="fp16", comm=comm)
        (weight * 60000.0).sum().backward()  # 4 ranks x 60000 would overflow float16's 65504
        optimizer.synchronize()
        assert weight.grad is not None
        return weight.grad

    assert all(torch.equal(g, torch.full((4,), 60000.0)) for g in ranks(4, run))


def test_sum_of_gradients(ranks: Ranks) -> None:
    def run(comm: Communicator) -> torch.Tensor:
        weight = torch.nn.Parameter(torch.zeros(3))
        optimizer = ti.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), op="sum", comm=comm)
        (weight * (comm.rank + 1)).sum().backward()
        optimizer.step()
        return weight.detach()

    assert all(torch.equal(w, torch.full((3,), -6.0)) for w in ranks(3, run))


def test_buckets_go_out_in_order_even_when_gradients_arrive_out_of_order(ranks: Ranks) -> None:
    def run(comm: Communicator) -> tuple[list[list[str]], list[torch.Tensor]]:
        a, b, c = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
        named = [("a", a), ("b", b), ("c", c)]
        optimizer = ti.DistributedOptimizer(
            torch.optim.SGD([a, b, c], lr=1.0), named, fusion_threshold_bytes=0, comm=comm
        )
        # the gradient of a (the last bucket) is ready first, on odd ranks c's comes before b's
        (a * (comm.rank + 1)).sum().backward()
        order = (c, b) if comm.rank % 2 else (b, c)
        for param in order:
            (param * (comm.rank + 1)).sum().backward()
        optimizer.synchronize()
        return optimizer.buckets, [p.grad for p in (a, b, c)]  # type: ignore[misc]

    for buckets, grads in ranks(4, run):
        assert buckets == [["c"], ["b"], ["a"]]
        assert all(torch.equal(g, torch.full((2,), 2.5)) for g in grads)


def test_a_parameter_without_a_gradient_contributes_zeros(ranks: Ranks) -> None:
    def run(comm: Communicator) -> list[torch.Tensor]:
        used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
        optimizer = ti.DistributedOptimizer(torch.optim.SGD([used, unused], lr=1.0), comm=comm)
        if comm.rank == 0:
            (unused * 4.0).sum().backward()
        (used * 2.0).sum().backward()
        optimizer.step()
        return [used.detach(), unused.detach()]

    for used, unused in ranks(2, run):
        assert torch.equal(used, torch.full((2,), -1.0))
        assert torch.equal(unused, torch.full((3,), -1.0))  # (4 + 0) / 2


def test_synchronize_before_step_reduces_once(ranks: Ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    reduce = C.api.allreduce

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return reduce(*args, **kwargs)

    monkeypatch.setattr(C.api, "allreduce", spy)

    def run(comm: Communicator) -> list[torch.Tensor]:
        net = training.model()
        optimizer = ti.DistributedOptimizer(_sgd(net), net.named_parameters(), comm=comm)

        def clip() -> None:
            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1e9)

        return training.train(net, optimizer, comm.rank, comm.size, steps=2, before_step=clip)

    results = ranks(2, run)
    assert len(calls) == 2 * 2  # one fused bucket per step, on each of the 2 ranks
    assert training.relative_error(results[0], _single_process(steps=2)) < 1e-6


def test_backward_passes_per_step_accumulates_before_reducing(ranks: Ranks) -> None:
    def micro_batches(rank: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x, y = training.batch(0)
        xs, ys = training.shard(x, rank, size), training.shard(y, rank, size)
        half = xs.shape[0] // 2
        return [(xs[:half], ys[:half]), (xs[half:], ys[half:])]

    def step(
        net: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int, size: int
    ) -> list[torch.Tensor]:
        for x, y in micro_batches(rank, size):
            torch.nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        return [p.detach() for p in net.parameters()]

    def run(comm: Communicator) -> list[torch.Tensor]:
        net = training.model()
        optimizer = ti.DistributedOptimizer(_sgd(net), backward_passes_per_step=2, comm=comm)
        return step(net, optimizer, comm.rank, comm.size)

    net = training.model()
    # one process: the i-th micro-batch is every rank's i-th micro-batch together
    whole = [micro_batches(r, 2) for r in range(2)]
    for i in range(2):
        x = torch.cat([whole[r][i][0] for r in range(2)])
        y = torch.cat([whole[r][i][1] for r in range(2)])
        torch.nn.functional.mse_loss(net(x), y).backward()
    _sgd(net).step()
    expected = [p.detach() for p in net.parameters()]
    assert training.relative_error(ranks(2, run)[0], expected) < 1e-6


def test_gradient_predivide_factor_averages_as_horovods(ranks: Ranks) -> None:
    # one DistributedOptimizer family: the engine predivides, so Horovod's face needs no hooks of its own
    def run(comm: Communicator) -> torch.Tensor:
        weight = torch.nn.Parameter(torch.zeros(3))
        optimizer = ti.DistributedOptimizer(
            torch.optim.SGD([weight], lr=1.0), gradient_predivide_factor=4.0, comm=comm
        )
        (weight * 3.0 * (comm.rank + 1)).sum().backward()  # gradients 3, 6 and 9: their average is 6
        optimizer.synchronize()
        assert weight.grad is not None
        return weight.grad

    assert all(torch.allclose(g, torch.full((3,), 6.0), rtol=1e-6) for g in ranks(3, run))
    weight = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="gradient_predivide_factor is for op 'avg'"):
        ti.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), op="sum", gradient_predivide_factor=2.0)


def test_skip_synchronize_steps_without_reducing_again(ranks: Ranks) -> None:
    def run(comm: Communicator) -> int:
        weight = torch.nn.Parameter(torch.zeros(2))
        optimizer = ti.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), comm=comm)
        (weight * float(comm.rank)).sum().backward()
        optimizer.synchronize()
        calls = []
        reduce = optimizer.synchronize
        optimizer.synchronize = lambda: calls.append(reduce())  # type: ignore[method-assign]
        with optimizer.skip_synchronize():
            optimizer.step()
        assert torch.equal(weight.detach(), torch.full((2,), -0.5))  # the average gradient is 0.5
        return len(calls)

    assert ranks(2, run) == [0, 0]


def test_sparse_gradients_travel_dense(ranks: Ranks) -> None:
    def run(comm: Communicator) -> torch.Tensor:
        torch.manual_seed(0)
        table = torch.nn.Embedding(4, 2, sparse=True)
        optimizer = ti.DistributedOptimizer(torch.optim.SGD(table.parameters(), lr=1.0), comm=comm)
        table(torch.tensor([comm.rank])).sum().backward()  # each rank touches its own row
        optimizer.synchronize()
        assert table.weight.grad is not None
        return table.weight.grad

    expected = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0]])
    assert all(torch.equal(g, expected) for g in ranks(2, run))


def test_a_second_backward_before_step_is_an_error_on_every_rank(ranks: Ranks) -> None:
    def run(comm: Communicator) -> None:
        weight = torch.nn.Parameter(torch.ones(2))
        optimizer = ti.DistributedOptimizer(
            torch.optim.SGD([weight], lr=1.0), [("weight", weight)], comm=comm
        )
        weight.sum().backward()
        with pytest.raises(
            CollectivesError, match=r"weight was accumulated 2 times.*backward_passes_per_step=2"
        ):
            weight.sum().backward()
        with pytest.raises(
            CollectivesError, match="zero_grad\\(\\) was called while gradients were being reduced"
        ):
            optimizer.zero_grad()
        optimizer.step()
        optimizer.zero_grad()

    ranks(2, run)


def test_the_wrapper_shares_groups_and_state_with_schedulers_and_checkpoints(ranks: Ranks) -> None:
    def run(comm: Communicator) -> None:
        net = training.model()
        inner = torch.optim.Adam(net.parameters(), lr=0.01)
        optimizer = ti.DistributedOptimizer(inner, net.named_parameters(), comm=comm)
        assert isinstance(optimizer, torch.optim.Optimizer)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        training.train(net, optimizer, comm.rank, comm.size, steps=1)
        scheduler.step()
        assert inner.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == 0.005
        saved = optimizer.state_dict()
        assert saved == inner.state_dict() and len(saved["state"]) == 4
        optimizer.load_state_dict(saved)
        assert optimizer.param_groups is inner.param_groups and optimizer.state is inner.state
        with pytest.raises(CollectivesError, match="cannot take new parameter groups"):
            optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})

    ranks(2, run)


def test_the_optimizer_checks_its_parameters() -> None:
    comm = Communicator(LoopbackWorld(1).transport(0))
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    meta = torch.nn.Parameter(torch.ones(2, device="meta"))
    with pytest.raises(InvalidBufferError, match=r"several devices \(cpu, meta\)"):
        ti.DistributedOptimizer(torch.optim.SGD([a, meta], lr=1.0), comm=comm)
    with pytest.raises(InvalidBufferError, match="on device meta, not the cpu"):
        ti.DistributedOptimizer(torch.optim.SGD([meta], lr=1.0), comm=comm)
    with pytest.raises(
        InvalidBufferError, match="1 of the optimizer's parameters are not in named_parameters"
    ):
        ti.DistributedOptimizer(torch.optim.SGD([a, b], lr=1.0), [("a", a)], comm=comm)
    with pytest.raises(InvalidBufferError, match=r"repeats the names \['a'\]"):
        ti.DistributedOptimizer(torch.optim.SGD([a, b], lr=1.0), [("a", a), ("a", b)], comm=comm)
    with pytest.raises(UnsupportedDtypeError, match="unknown compression 'int8'"):
        ti.DistributedOptimizer(torch.optim.SGD([a], lr=1.0), compression="int8", comm=comm)
    with pytest.raises(UnsupportedOpError, match="takes op 'avg' or 'sum', not 'max'"):
        ti.DistributedOptimizer(torch.optim.SGD([a], lr=1.0), op="max", comm=comm)
    with pytest.raises(ValueError, match="backward_passes_per_step must be at least 1"):
        ti.DistributedOptimizer(torch.optim.SGD([a], lr=1.0), backward_passes_per_step=0, comm=comm)


# --------------------------------------------------------------------------- DDP communication hooks


class _Bucket:
    """What the hooks use of DDP's GradBucket."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def index(self) -> int:
        return 0


@pytest.mark.parametrize(
    ("hook", "tolerance"),
    [(ti.allreduce_hook, 1e-6), (ti.allreduce_fp16_hook, 1e-3), (ti.allreduce_bf16_hook, 1e-2)],
    ids=["plain", "fp16", "bf16"],
)
def test_comm_hooks_average_the_bucket_in_place(ranks: Ranks, hook: Any, tolerance: float) -> None:
    inputs = [torch.linspace(-3.0, 3.0, 101) * (r + 1) for r in range(3)]
    expected = sum(inputs) / 3

    def run(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        buffer = inputs[comm.rank].clone()
        future = hook(comm, _Bucket(buffer))
        return buffer, future.wait()

    for buffer, result in ranks(3, run):
        assert result is buffer
        assert float((result - expected).abs().max()) <= tolerance * float(expected.abs().max())


def test_rank_and_size_are_the_communicators(ranks: Ranks) -> None:
    assert ranks(3, lambda comm: (ti.rank(comm), ti.size(comm))) == [(0, 3), (1, 3), (2, 3)]


# --------------------------------------------------------------------------- broadcast


@pytest.mark.parametrize("root", [0, 2])
def test_broadcast_copies_the_roots_tensor_in_place(
    ranks: Ranks, root: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    send = C.api.broadcast

    def spy(x: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        seen.append(_address(x))
        return send(x, *args, **kwargs)

    monkeypatch.setattr(C.api, "broadcast", spy)
    tensors = [torch.full((2, 5), float(r), dtype=torch.bfloat16) for r in range(3)]

    def run(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        tensor = tensors[comm.rank]
        handle = ti.broadcast_async_(torch.arange(4) * (comm.rank + 1), root, comm=comm)
        return ti.broadcast_(tensor, root, comm=comm), handle.wait()

    for rank, (result, counted) in enumerate(ranks(3, run)):
        assert result is tensors[rank]
        assert torch.equal(result, torch.full((2, 5), float(root), dtype=torch.bfloat16))
        assert torch.equal(counted, torch.arange(4) * (root + 1))
    assert {t.data_ptr() for t in tensors} <= set(seen)  # the tensors' own memory, no copies


def _different_model(rank: int) -> torch.nn.Module:
    net = training.model(seed=rank)
    net.register_buffer("steps", torch.tensor(rank))
    return net


def test_broadcast_parameters_takes_a_state_dict_named_parameters_or_tensors(ranks: Ranks) -> None:
    def run(comm: Communicator) -> list[dict[str, torch.Tensor]]:
        results = []
        for form in ("state_dict", "named_parameters", "tensors"):
            net = _different_model(comm.rank)
            if form == "state_dict":
                ti.broadcast_parameters(net.state_dict(), root_rank=1, comm=comm)
            elif form == "named_parameters":
                ti.broadcast_parameters(net.named_parameters(), root_rank=1, comm=comm)
            else:
                ti.broadcast_parameters(list(net.parameters()), root_rank=1, comm=comm)
            results.append({name: t.clone() for name, t in net.state_dict().items()})
        return results

    expected = _different_model(1).state_dict()
    for rank, results in enumerate(ranks(3, run)):
        for form, result in zip(("state_dict", "named_parameters", "tensors"), results, strict=True):
            for name, value in result.items():
                # the buffer is in the state dict only, not among the parameters
                wanted = torch.tensor(rank) if name == "steps" and form != "state_dict" else expected[name]
                assert torch.equal(value, wanted), (rank, form, name)


def test_broadcast_parameters_refuses_what_is_not_a_tensor() -> None:
    comm = Communicator(LoopbackWorld(1).transport(0))
    with pytest.raises(InvalidBufferError, match="takes tensors; extra is int"):
        ti.broadcast_parameters({"weight": torch.ones(2), "extra": 3}, comm=comm)  # type: ignore[dict-item]


def test_broadcast_optimizer_state_gives_every_rank_the_roots(ranks: Ranks) -> None:
    def run(comm: Communicator) -> dict[str, Any]:
        net = training.model()
        adam = torch.optim.Adam(net.parameters(), lr=0.01 * (comm.rank + 1))
        optimizer = ti.DistributedOptimizer(adam, comm=comm)
        if comm.rank == 0:  # only the root has taken a step, so only it has moments
            for param in net.parameters():
                param.grad = torch.ones_like(param)
            optimizer.optimizer.step()
        ti.broadcast_optimizer_state(optimizer, root_rank=0, comm=comm)
        return optimizer.state_dict()

    states = ranks(3, run)
    for state in states[1:]:
        assert state["param_groups"] == states[0]["param_groups"]
        assert state["param_groups"][0]["lr"] == 0.01
        for key, values in states[0]["state"].items():
            assert all(torch.equal(values[k], state["state"][key][k]) for k in values)


# --------------------------------------------------------------------------- the process group


def test_the_process_group_runs_c10d_collectives(ranks: Ranks) -> None:
    from torch._C._distributed_c10d import (
        AllgatherOptions,
        AllreduceOptions,
        BroadcastOptions,
        ReduceScatterOptions,
    )

    def run(comm: Communicator) -> dict[str, Any]:
        group = ti_process_group.MPIProcessGroup(comm)
        p, r = comm.size, comm.rank
        out: dict[str, Any] = {"name": group.getBackendName(), "rank": group.rank(), "size": group.size()}
        tensors = [torch.full((3,), float(r)), torch.arange(4) + r]
        options = AllreduceOptions()
        options.reduceOp = torch.distributed.ReduceOp.MAX
        group.allreduce(tensors, options).wait()
        out["allreduce"] = tensors
        broadcast = BroadcastOptions()
        broadcast.rootRank = 1
        out["broadcast"] = torch.full((2,), float(r))
        group.broadcast([out["broadcast"]], broadcast).wait()
        out["allgather"] = [[torch.empty(2, dtype=torch.int32) for _ in range(p)]]
        group.allgather(out["allgather"], [torch.full((2,), r, dtype=torch.int32)], AllgatherOptions()).wait()
        out["all_gather_single"] = torch.empty(2 * p)
        mine = torch.full((2,), float(r))
        group.all_gather_single(out["all_gather_single"], mine, AllgatherOptions()).wait()
        out["reduce_scatter"] = torch.empty(2)
        pieces = [[torch.full((2,), float(i + r)) for i in range(p)]]
        group.reduce_scatter([out["reduce_scatter"]], pieces, ReduceScatterOptions()).wait()
        out["reduce_scatter_single"] = torch.empty(2)
        whole = torch.arange(2.0 * p)
        group.reduce_scatter_single(out["reduce_scatter_single"], whole, ReduceScatterOptions()).wait()
        group.barrier().wait()
        premul = types.SimpleNamespace(reduceOp=torch.distributed._make_nccl_premul_sum(2.0))
        with pytest.raises(
            UnsupportedOpError, match=r"'premul_sum' scales floating tensors, not torch\.int64"
        ):
            group.allreduce([torch.ones(1, dtype=torch.int64)], premul)
        out["premul_sum"] = torch.full((2,), float(r))
        group.allreduce([out["premul_sum"]], premul).wait()
        out["strided"] = torch.arange(6.0).reshape(2, 3).t()  # through a contiguous copy, as gloo takes it
        group.allreduce([out["strided"]], AllreduceOptions()).wait()
        return out

    p = 3
    for r, out in enumerate(ranks(p, run)):
        assert (out["name"], out["rank"], out["size"]) == ("collectives", r, p)
        assert torch.equal(out["allreduce"][0], torch.full((3,), 2.0))
        assert torch.equal(out["allreduce"][1], torch.arange(4) + 2)
        assert torch.equal(out["broadcast"], torch.full((2,), 1.0))
        gathered = out["allgather"][0]
        assert all(torch.equal(t, torch.full((2,), i, dtype=torch.int32)) for i, t in enumerate(gathered))
        assert torch.equal(out["all_gather_single"], torch.arange(float(p)).repeat_interleave(2))
        assert torch.equal(out["reduce_scatter"], torch.full((2,), float(3 * r + 3)))
        assert torch.equal(out["reduce_scatter_single"], torch.arange(2.0 * r, 2.0 * r + 2) * p)
        assert torch.equal(out["premul_sum"], torch.full((2,), 2.0 * sum(range(p))))
        assert torch.equal(out["strided"], torch.arange(6.0).reshape(2, 3).t() * p)


def _options(kind: str, op: Any = None, root: int = 0) -> Any:
    """c10d's options of a collective; ``op`` a torch ReduceOp, ``root`` a group rank."""
    from torch._C import _distributed_c10d as c10d

    options = {
        "allreduce": c10d.AllreduceOptions,
        "coalesced": c10d.AllreduceCoalescedOptions,
        "reduce_scatter": c10d.ReduceScatterOptions,
        "broadcast": c10d.BroadcastOptions,
        "allgather": c10d.AllgatherOptions,
    }[kind]()
    if op is not None:
        options.reduceOp = op
    if kind == "broadcast":
        options.rootRank = root
    return options


Group = Any
SUM, AVG, BAND = (
    torch.distributed.ReduceOp.SUM,
    torch.distributed.ReduceOp.AVG,
    torch.distributed.ReduceOp.BAND,
)

# (collective, the call on a good rank, on the bad rank, the bad rank's error); each returns a Work
C10D_CASES: list[tuple[str, Callable[[Group], Any], Callable[[Group], Any], type]] = [
    ("allreduce", lambda g: g.allreduce([torch.ones(4)], _options("allreduce", SUM)),
     lambda g: g.allreduce([torch.ones(4, dtype=torch.complex64)], _options("allreduce", SUM)),
     UnsupportedDtypeError),
    ("allreduce", lambda g: g.allreduce([torch.ones(4), torch.ones(2)], _options("allreduce", SUM)),
     lambda g: g.allreduce([torch.ones(4), torch.ones(2, device="meta")], _options("allreduce", SUM)),
     InvalidBufferError),
    ("allreduce", lambda g: g.allreduce([torch.ones(4)], _options("allreduce", SUM)),
     lambda g: g.allreduce([torch.ones(4)], _options("allreduce", BAND)), UnsupportedOpError),
    ("allreduce", lambda g: g.allreduce([torch.ones(4, dtype=torch.int32)], _options("allreduce", SUM)),
     lambda g: g.allreduce([torch.ones(4, dtype=torch.int32)], types.SimpleNamespace(
         reduceOp=torch.distributed._make_nccl_premul_sum(2.0))), UnsupportedOpError),
    ("allreduce",
     lambda g: g.allreduce_coalesced([torch.ones(4, dtype=torch.int32)], _options("coalesced", SUM)),
     lambda g: g.allreduce_coalesced([torch.ones(4, dtype=torch.int32)], _options("coalesced", AVG)),
     UnsupportedOpError),
    ("broadcast", lambda g: g.broadcast([torch.ones(4)], _options("broadcast", root=0)),
     lambda g: g.broadcast([torch.ones(4)], _options("broadcast", root=g.size())), InvalidRootError),
    ("broadcast", lambda g: g.broadcast([torch.ones(4)], _options("broadcast")),
     lambda g: g.broadcast([torch.ones(4, device="meta")], _options("broadcast")), InvalidBufferError),
    ("allgather", lambda g: g.allgather([[torch.empty(2) for _ in range(g.size())]], [torch.ones(2)],
                                        _options("allgather")),
     lambda g: g.allgather([[torch.empty(2) for _ in range(g.size() + 1)]], [torch.ones(2)],
                           _options("allgather")), InvalidBufferError),
    ("allgather", lambda g: g.allgather([[torch.empty(2) for _ in range(g.size())]], [torch.ones(2)],
                                        _options("allgather")),
     lambda g: g.allgather([], [torch.ones(2)], _options("allgather")), InvalidBufferError),
    ("allgather",
     lambda g: g.all_gather_single(torch.empty(2 * g.size()), torch.ones(2), _options("allgather")),
     lambda g: g.all_gather_single(torch.empty(2 * g.size() + 1), torch.ones(2), _options("allgather")),
     InvalidBufferError),
    ("reduce_scatter", lambda g: g.reduce_scatter([torch.empty(2)], [[torch.ones(2)] * g.size()],
                                                  _options("reduce_scatter", SUM)),
     lambda g: g.reduce_scatter([torch.empty(2)], [[torch.ones(2)] * (g.size() - 1)],
                                _options("reduce_scatter", SUM)), InvalidBufferError),
    ("reduce_scatter", lambda g: g.reduce_scatter_single(torch.empty(2), torch.ones(2 * g.size()),
                                                         _options("reduce_scatter", SUM)),
     lambda g: g.reduce_scatter_single(torch.empty(2), torch.ones(2 * g.size(), dtype=torch.float64),
                                       _options("reduce_scatter", SUM)), InvalidBufferError),
]  # fmt: skip


C10D_IDS = [
    "allreduce-complex", "allreduce-meta", "allreduce-band-float", "allreduce-premul-sum-int",
    "allreduce_coalesced-avg-int", "broadcast-root", "broadcast-meta", "allgather-outputs",
    "allgather-output-lists", "all_gather_single-size", "reduce_scatter-inputs",
    "reduce_scatter_single-dtype",
]  # fmt: skip


@pytest.mark.parametrize(("collective", "good", "bad", "kind"), C10D_CASES, ids=C10D_IDS)
def test_a_bad_c10d_call_on_one_rank_fails_every_rank_at_once(
    ranks: Ranks, collective: str, good: Callable[[Group], Any], bad: Callable[[Group], Any], kind: type
) -> None:
    p, last = 3, 2

    def run(comm: Communicator) -> tuple[str, str, float, list[float]]:
        bounded = Communicator(comm.transport, timeout=20.0, stall_warning=0)  # waiting for it would show
        group = ti_process_group.MPIProcessGroup(bounded)
        # a collective still queued when the bad rank's checks fail: the poison goes after it
        before = torch.full((1000,), float(comm.rank))
        queued = group.allreduce([before], _options("allreduce", SUM))
        started = time.monotonic()
        try:
            (bad if comm.rank == last else good)(group).wait()
            kind_, message = "no error", ""
        except CollectivesError as error:
            kind_, message = type(error).__name__, str(error)
            if isinstance(error, PeerInputError):
                assert list(error.problems) == [last], error.problems
        took = time.monotonic() - started
        queued.wait()
        assert torch.equal(before, torch.full((1000,), float(sum(range(p))))), "the queued allreduce"
        after = torch.ones(2)
        group.allreduce([after], _options("allreduce", SUM)).wait()  # the ranks are still in step
        return kind_, message, took, after.tolist()

    results = ranks(p, run, timeout=40.0)
    assert results[last][0] == kind.__name__, results[last]
    for rank, (kind_, message, took, after) in enumerate(results):
        if rank != last:
            assert kind_ == "PeerInputError", (rank, kind_, message)
            assert f"{collective} #1: the call failed its checks on rank {last} ({kind.__name__}: " in message
        assert took < 10 and after == [float(p)] * 2, (rank, took, after)


def test_c10d_work_fails_in_wait_and_in_its_future(ranks: Ranks) -> None:
    """A failed collective's Work raises from wait(), and its future fails (c10d's would succeed)."""

    def run(comm: Communicator) -> tuple[str, str, bool]:
        group = ti_process_group.MPIProcessGroup(Communicator(comm.transport, timeout=20.0, stall_warning=0))
        # another count on rank 1: a mismatch every rank finds in the job, on the communicator's thread
        work = group.allreduce([torch.ones(3 + comm.rank)], _options("allreduce", SUM))
        with pytest.raises(MismatchError, match=r"allreduce #0: .*count: 3 on rank 0; 4 on rank 1") as raised:
            work.wait()
        assert work.is_completed()
        with pytest.raises(RuntimeError, match="MismatchError: allreduce #0") as failed:
            work.get_future().wait()
        done = torch.ones(2)
        follow = group.allreduce([done], _options("allreduce", SUM))
        assert follow.get_future().wait() == [done] and follow.result() == [done]
        return str(raised.value), str(failed.value), bool(torch.equal(done, torch.full((2,), 2.0)))

    for _, _, reduced in ranks(2, run, timeout=40.0):
        assert reduced


# --------------------------------------------------------------------------- cuda (on a GPU host)

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here; the GPU paths run on a GPU host"
)


@pytest.fixture
def nccl(tmp_path: Any) -> Any:
    """torch.distributed over NCCL with one rank: the fallback cuda tensors take."""
    if not torch.distributed.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    store = f"file://{tmp_path / 'store'}"
    torch.distributed.init_process_group("nccl", init_method=store, rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a host without CuPy: cuda tensors then take NCCL, or fail."""
    monkeypatch.setattr(ti_tensors, "_cupy_available", lambda: False)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.usefixtures("nccl", "no_cupy")
def test_cuda_tensors_go_through_nccl() -> None:
    tensor = torch.arange(6.0, device="cuda").reshape(2, 3)
    assert ti.explain_path(tensor).startswith("torch.distributed: float32 tensor on cuda")
    assert torch.equal(ti.allreduce(tensor, "avg"), tensor)
    assert ti.allreduce_(tensor) is tensor
    assert torch.equal(tensor.cpu(), torch.arange(6.0).reshape(2, 3))
    assert ti.allreduce_async_(tensor, "max").wait() is tensor
    assert ti.broadcast_(tensor, 0) is tensor
    assert torch.equal(ti.allgather(tensor), tensor)
    assert torch.equal(ti.reduce_scatter(tensor), tensor)
    with pytest.raises(InvalidBufferError, match="pass comm=None"):
        ti.allreduce_(tensor, comm=Communicator(LoopbackWorld(1).transport(0)))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.usefixtures("nccl", "no_cupy")
def test_ddp_hooks_on_cuda_average_through_nccl() -> None:
    net = training.model().cuda()
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(None, ti.allreduce_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = [p.cpu() for p in training.train(model, optimizer)]
    assert training.relative_error(params, _single_process()) < 1e-5


@pytest.mark.gpu
@needs_cuda
@pytest.mark.usefixtures("no_cupy")
def test_cuda_tensors_without_nccl_name_the_missing_gpu_backend() -> None:
    tensor = torch.ones(3, device="cuda")
    with pytest.raises(InvalidBufferError, match="need the GPU backend"):
        ti.allreduce_(tensor)
    assert ti.explain_path(tensor).startswith("unsupported: cuda tensors need the GPU backend")
    with pytest.raises(InvalidBufferError, match="DistributedOptimizer reduces cpu parameters"):
        ti.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(tensor)], lr=1.0))


@pytest.fixture
def gloo_as_the_fallback(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """cpu tensors routed as cuda ones without CuPy are, over one-rank gloo: the fallback runs on CI."""
    from collectives.torch_integration import mpi_ops

    store = f"file://{tmp_path / 'store'}"
    torch.distributed.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    monkeypatch.setattr(mpi_ops, "route_of", lambda tensor, comm: ti_tensors.FALLBACK)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.usefixtures("gloo_as_the_fallback")
def test_the_fallback_calls_torch_distributed_by_its_own_names() -> None:
    # the cuda tests run these through NCCL on a GPU host; here the same calls go to gloo
    tensor = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(ti.allreduce(tensor, "sum"), tensor)
    assert ti.broadcast_(tensor, 0) is tensor
    assert torch.equal(ti.allgather(tensor), tensor)
    assert torch.equal(ti.allgather(torch.tensor(5.0)), torch.tensor([5.0]))
    assert torch.equal(ti.reduce_scatter(tensor), tensor)
