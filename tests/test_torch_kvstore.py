"""KVStoreOptimizer on loopback ranks: sync trains as one process, async and ssp converge, bad input fails."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

from collectives import Communicator  # noqa: E402
from collectives import torch_integration as ti  # noqa: E402
from collectives.errors import ConfigurationError  # noqa: E402
from collectives.kvstore import SGD, Adam, KVStore, create  # noqa: E402
from collectives.transport.loopback import LoopbackWorld  # noqa: E402

from . import training  # noqa: E402


def run_store(size: int, body: Callable[[KVStore, Communicator], Any], **options: Any) -> list[Any]:
    """``body(kv, comm)`` on every rank of a colocated store over ``size`` loopback ranks."""
    world = LoopbackWorld(size, timeout=60)

    def one(transport: Any) -> Any:
        comm = Communicator(transport, timeout=20)
        with create(comm=comm, partition_bytes=256, **options) as kv:
            return body(kv, comm)

    return world.run(one)


def _train(make: Callable[[Any], torch.optim.Optimizer], mode: str = "sync", **options: Any) -> Callable:
    def body(kv: KVStore, comm: Communicator) -> list[torch.Tensor]:
        net = training.model()
        optimizer = ti.KVStoreOptimizer(make(net.parameters()), kv, net.named_parameters(), **options)
        return training.train(net, optimizer, comm.rank, comm.size)

    return body


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adam(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.01)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("make", [_sgd, _adam], ids=["sgd", "adam"])
@pytest.mark.parametrize("collective", [True, False], ids=["collectives", "messages"])
def test_sync_trains_as_one_process_on_the_whole_batch(
    world_size: int, make: Callable[[Any], torch.optim.Optimizer], collective: bool
) -> None:
    net = training.model()
    expected = training.train(net, make(net.parameters()))
    results = run_store(world_size, _train(make), collective=collective)
    assert training.relative_error(results[0], expected) < 1e-6
    assert all(all(torch.equal(a, b) for a, b in zip(r, results[0], strict=True)) for r in results)


def test_the_first_workers_parameters_win_and_pulls_land_in_the_parameters_memory() -> None:
    def body(kv: KVStore, comm: Communicator) -> tuple[bool, bool, list[str]]:
        weight = torch.nn.Parameter(torch.full((3, 2), float(comm.rank + 1)))
        address = weight.data_ptr()
        optimizer = ti.KVStoreOptimizer([weight], kv, [("w", weight)], server_optimizer=SGD(lr=1.0))
        started = torch.equal(weight.detach(), torch.ones(3, 2))
        (weight * (comm.rank + 1)).sum().backward()
        optimizer.step()  # mean gradient (1 + 2 + 3) / 3 = 2
        same_memory = weight.data_ptr() == address
        assert torch.equal(weight.detach(), torch.full((3, 2), -1.0)), weight
        return started, same_memory, optimizer.keys

    for started, same_memory, keys in run_store(3, body):
        assert started and same_memory and keys == ["w"]


@pytest.mark.parametrize(("mode", "staleness"), [("async", 0), ("ssp", 0), ("ssp", 2)])
def test_async_and_ssp_converge(mode: str, staleness: int) -> None:
    target = torch.arange(6, dtype=torch.float32)

    def body(kv: KVStore, comm: Communicator) -> np.ndarray:
        weight = torch.nn.Parameter(torch.zeros(6))
        optimizer = ti.KVStoreOptimizer(torch.optim.SGD([weight], lr=0.2), kv)
        for _ in range(60):
            optimizer.zero_grad()
            ((weight - target) ** 2).sum().backward()
            optimizer.step()
        kv.barrier()
        return kv.pull("param0")

    results = run_store(2, body, mode=mode, staleness=staleness)
    for final in results:
        np.testing.assert_allclose(final, target.numpy(), atol=1e-3)


def test_server_optimizer_of_maps_sgd_and_adam_and_refuses_the_rest() -> None:
    weight = torch.nn.Parameter(torch.zeros(2))
    sgd = ti.server_optimizer_of(torch.optim.SGD([weight], lr=0.5, momentum=0.9, weight_decay=0.01))
    assert isinstance(sgd, SGD) and sgd.options == {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.01}
    adam = ti.server_optimizer_of(torch.optim.Adam([weight], lr=0.1, betas=(0.8, 0.99), eps=1e-6))
    assert isinstance(adam, Adam) and adam.options == {"lr": 0.1, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6}
    refused = [
        torch.optim.SGD([weight], lr=0.1, momentum=0.9, nesterov=True),
        torch.optim.Adam([weight], amsgrad=True),
        torch.optim.Adam([weight], weight_decay=0.1),
        torch.optim.RMSprop([weight]),
        torch.optim.SGD([{"params": [weight]}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 9.0}]),
    ]
    for optimizer in refused:
        with pytest.raises(ConfigurationError):
            ti.server_optimizer_of(optimizer)


def test_bare_parameters_need_a_server_optimizer() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        with pytest.raises(ConfigurationError, match="server_optimizer"):
            ti.KVStoreOptimizer([torch.nn.Parameter(torch.zeros(2))], kv)
        return "ok"

    assert run_store(1, body) == ["ok"]


def test_state_dicts_go_through_the_wrapped_optimizer_which_stays_shared() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        weight = torch.nn.Parameter(torch.zeros(2))
        inner = torch.optim.SGD([weight], lr=0.1)
        optimizer = ti.KVStoreOptimizer(inner, kv)
        saved = optimizer.state_dict()
        assert saved == inner.state_dict()
        saved["param_groups"][0]["lr"] = 0.5
        optimizer.load_state_dict(saved)
        assert optimizer.param_groups is inner.param_groups and optimizer.state is inner.state
        assert inner.param_groups[0]["lr"] == 0.5  # loaded into the wrapped optimizer
        return "ok"

    assert run_store(1, body) == ["ok"]
