"""collectives.horovod in one process: Horovod's names and rules, Adasum on loopback ranks."""

import ast
import math
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="collectives.horovod needs torch (pip install torch==2.13.0)")

import collectives.horovod as hvd  # noqa: E402
from collectives import Communicator  # noqa: E402
from collectives.errors import CollectivesError  # noqa: E402
from collectives.torch_integration.adasum import adasum, adasum_allreduce_, adasum_tree  # noqa: E402
from collectives.torch_integration.collective_jobs import reducescatter_shares  # noqa: E402
from collectives.torch_integration.horovod import basics as horovod_basics  # noqa: E402
from collectives.torch_integration.named import NamedOps  # noqa: E402
from tests.conftest import run_ranks  # noqa: E402

HOROVOD_NAMES = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "Average",
    "Sum",
    "Min",
    "Max",
    "Product",
    "Adasum",
    "Compression",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather",
    "allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "poll",
    "synchronize",
    "join",
    "barrier",
    "broadcast_object",
    "allgather_object",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "DistributedOptimizer",
    "SyncBatchNorm",
    "HorovodInternalError",
    "nccl_built",
    "mpi_built",
]
"""The names issue 20 lists, with a few more that Horovod's examples call."""


def test_every_listed_horovod_name_is_there_and_exported() -> None:
    missing = [name for name in HOROVOD_NAMES if not hasattr(hvd, name)]
    assert not missing
    assert set(HOROVOD_NAMES) <= set(hvd.__all__)
    assert hvd.Compression.none.compress(torch.ones(2))[0].dtype == torch.float32
    assert len({hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product}) == 6


def _formula(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Horovod's documented Adasum of two vectors, written out."""
    dot = float(a @ b)
    return (1 - dot / (2 * float(a @ a))) * a + (1 - dot / (2 * float(b @ b))) * b


def test_adasum_of_two_is_the_formula_sum_when_orthogonal_average_when_equal() -> None:
    a, b = (
        torch.tensor([3.0, 1.0, -2.0], dtype=torch.float64),
        torch.tensor([1.0, 4.0, 0.5], dtype=torch.float64),
    )
    assert torch.allclose(adasum(a, b), _formula(a, b))
    x, y = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    assert torch.equal(adasum(x, y), torch.tensor([1.0, 2.0], dtype=torch.float64))  # orthogonal: the sum
    assert torch.equal(adasum(a, a), a)  # equal: the average
    zero = torch.zeros(3, dtype=torch.float64)
    assert torch.equal(adasum(zero, a), a)  # a zero vector's coefficient stays 1


@pytest.mark.parametrize("size", [2, 4, 8])
def test_adasum_allreduce_on_loopback_ranks_is_the_tree_of_pairs(size: int) -> None:
    inputs = [
        torch.randn(5, generator=torch.Generator().manual_seed(r), dtype=torch.float64) for r in range(size)
    ]
    other = [torch.randn(2, 3, generator=torch.Generator().manual_seed(50 + r)) for r in range(size)]

    def body(comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
        mine, second = inputs[comm.rank].clone(), other[comm.rank].clone()
        adasum_allreduce_([mine, second], comm)
        return mine, second

    results = run_ranks(size, body)
    level = list(inputs)
    while len(level) > 1:  # pairs (0,1), (2,3), ... then their results, as Horovod's rank ^ level
        level = [_formula(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    second = adasum_tree([t.reshape(-1) for t in other]).reshape(2, 3).float()
    for mine, theirs in results:
        assert torch.allclose(mine, level[0], rtol=1e-12)
        assert torch.allclose(theirs, second)  # each tensor combined by its own dot products
        assert torch.equal(mine, results[0][0])


def test_adasum_needs_a_power_of_two_of_ranks_and_floats() -> None:
    with pytest.raises(ValueError, match="power of two"):
        adasum_tree([torch.ones(2)] * 3)
    errors = run_ranks(3, lambda comm: _error_of(lambda: adasum_allreduce_([torch.ones(2)], comm)))
    assert all(isinstance(e, NotImplementedError) for e in errors)
    errors = run_ranks(
        2, lambda comm: _error_of(lambda: adasum_allreduce_([torch.ones(2, dtype=torch.int32)], comm))
    )
    assert all("floating" in str(e) for e in errors)


def _error_of(call: object) -> BaseException | None:
    try:
        call()  # type: ignore[operator]
    except BaseException as error:
        return error
    return None


def test_reducescatter_splits_rows_as_horovod() -> None:
    assert reducescatter_shares(5, 2) == [3, 2]
    assert reducescatter_shares(7, 4) == [2, 2, 2, 1]
    assert reducescatter_shares(1, 3) == [1, 0, 0]


def test_named_collectives_run_whatever_order_each_rank_starts_them() -> None:
    """Rank r starts names in its own order; every rank gets every result, matched by name."""
    size, names = 3, ["a", "b", "c", "d"]

    def body(comm: Communicator) -> dict[str, float]:
        queue = NamedOps(comm)
        order = names[comm.rank :] + names[: comm.rank]  # a different order on every rank
        values = {name: torch.full((3,), float(comm.rank + i)) for i, name in enumerate(names)}
        futures = {}
        for name in order:
            tensor = values[name]
            futures[name] = queue.submit(name, lambda c, t=tensor: _sum_into(t, c))
        return {name: float(futures[name].result(timeout=30)[0]) for name in names}

    results = run_ranks(size, body)
    expected = {name: float(sum(r + i for r in range(size))) for i, name in enumerate(names)}
    assert results == [expected] * size


def _sum_into(tensor: torch.Tensor, comm: Communicator) -> torch.Tensor:
    from collectives import allreduce

    allreduce(tensor.numpy(), out=tensor.numpy(), comm=comm)
    return tensor


def test_a_name_twice_in_flight_is_refused() -> None:
    def body(comm: Communicator) -> str:
        queue = NamedOps(comm)
        started = threading.Event()
        first = queue.submit("x", lambda c: started.wait(5))
        try:
            queue.submit("x", lambda c: None)
        except ValueError as error:
            message = str(error)
        else:
            message = ""
        started.set()
        first.result(timeout=30)
        return message

    assert all("already in flight" in m for m in run_ranks(1, body))


def test_the_facade_only_hands_names_on() -> None:
    # as Horovod's horovod/torch/__init__.py: the basics, ops and functions live in torch_integration
    tree = ast.parse(Path(hvd.__file__).read_text())
    assert ast.get_docstring(tree) and ast.unparse(tree.body[1]).startswith("__all__ = ")
    kinds = {type(node).__name__ for node in tree.body[2:]}
    assert kinds == {"ImportFrom"}, f"collectives/horovod.py does more than import: {kinds}"
    objects = {name: getattr(hvd, name) for name in hvd.__all__}
    homes = {  # HorovodInternalError is the library's own error, at home in collectives.errors
        name: obj.__module__
        for name, obj in objects.items()
        if callable(obj) and name != "HorovodInternalError"
    }
    elsewhere = {
        name: home for name, home in homes.items() if not home.startswith("collectives.torch_integration")
    }
    assert not elsewhere, f"defined outside torch_integration: {elsewhere}"


def test_one_autograd_function_serves_horovod_and_functional() -> None:
    from collectives.torch_integration import functional

    hvd.init()
    x = torch.ones(2, requires_grad=True)
    pairs = [
        (hvd.allreduce(x, name="one autograd"), functional.allreduce(x, "avg")),
        (hvd.allgather(x), functional.allgather(x)),
        (hvd.broadcast(x, 0), functional.broadcast(x, 0)),
    ]
    for horovods, functionals in pairs:
        assert type(horovods.grad_fn) is type(functionals.grad_fn), (horovods.grad_fn, functionals.grad_fn)


def test_op_and_average_follow_horovods_rule() -> None:
    assert horovod_basics.op_of(None, None) == hvd.Average  # averages by default
    assert horovod_basics.op_of(hvd.Max, None) == hvd.Max
    with pytest.warns(DeprecationWarning):
        assert horovod_basics.op_of(None, False) == hvd.Sum
    with pytest.raises(ValueError, match="supersedes"):
        horovod_basics.op_of(hvd.Sum, True)


def test_calls_before_init_say_so() -> None:
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"hvd\.init\(\)"):
        hvd.rank()


def test_one_rank_api_and_the_optimizer_is_the_wrapped_class() -> None:
    hvd.init()
    assert hvd.is_initialized() and (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (
        0,
        1,
        0,
        1,
    )
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    t = torch.tensor([2.0, 4.0])
    assert torch.equal(hvd.allreduce(t, prescale_factor=3.0, postscale_factor=0.5), torch.tensor([3.0, 6.0]))
    handle = hvd.allreduce_async(t, name="one")
    assert isinstance(handle, int)
    assert torch.equal(hvd.synchronize(handle), t)
    assert hvd.synchronize(handle) is None  # a handle is synchronized once
    with pytest.raises(ValueError, match="unknown handle"):
        hvd.poll(handle)
    half = hvd.allreduce(t, compression=hvd.Compression.fp16)
    assert half.dtype == torch.float32 and torch.equal(half, t)
    net = torch.nn.Linear(3, 2)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(sgd, named_parameters=net.named_parameters())
    assert isinstance(optimizer, torch.optim.SGD) and type(optimizer).__name__ == "SGD"
    before = [p.detach().clone() for p in net.parameters()]
    net(torch.ones(4, 3)).sum().backward()
    optimizer.synchronize()
    optimizer.zero_grad()  # fine after synchronize; an error between backward and it
    net(torch.ones(4, 3)).sum().backward()
    with pytest.raises(CollectivesError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.synchronize()
    with optimizer.skip_synchronize():
        optimizer.step()
    assert all(not torch.equal(a, b.detach()) for a, b in zip(before, net.parameters(), strict=True))
    assert optimizer.state_dict()["param_groups"][0]["lr"] == 0.1
    with pytest.raises(ValueError, match="Average"):
        hvd.DistributedOptimizer(sgd, gradient_predivide_factor=2.0, op=hvd.Sum)
    assert math.isclose(float(hvd.allreduce(torch.tensor(2.0), op=hvd.Adasum)), 2.0)


def test_optimizer_groups_are_checked_and_num_groups_taken() -> None:
    from collectives.errors import InvalidBufferError

    hvd.init()
    for grouping in ("num_groups", "groups", "explicit"):
        net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))  # its own hooks each time
        params = list(net.parameters())
        chosen = {"num_groups": {"num_groups": 2}, "groups": {"groups": 2}}.get(grouping)
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(params, lr=0.1), **(chosen or {"groups": [params[:2], params[2:]]})
        )
        net(torch.ones(2, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with pytest.raises(InvalidBufferError, match="not one of the optimizer's parameters"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), groups=[[torch.zeros(1)]])
    with pytest.raises(InvalidBufferError, match="twice"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), groups=[params[:1], params[:1]])


def test_sync_batch_norm_alone_is_batch_norm() -> None:
    hvd.init()
    sync, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm2d(3)
    x = torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(sync(x), plain(x))
    assert torch.allclose(sync.running_var, plain.running_var)
    with pytest.raises(ValueError, match="2D"):
        sync(torch.ones(3))


def test_names_no_other_rank_starts_fail_on_every_rank_after_the_timeout() -> None:
    from collectives.errors import MismatchError
    from collectives.transport.loopback import LoopbackWorld

    def body(comm: Communicator) -> BaseException | None:
        queue = NamedOps(comm)
        future = queue.submit(f"only-on-rank-{comm.rank}", lambda c: None)
        return future.exception(timeout=30)

    errors = LoopbackWorld(2, timeout=30).run(lambda transport: body(Communicator(transport, timeout=0.5)))
    assert all(isinstance(e, MismatchError) and "no named collective could run" in str(e) for e in errors)
