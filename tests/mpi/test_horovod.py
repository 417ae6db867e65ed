"""collectives.horovod under mpiexec: Horovod's documented results for every collective, at 1 to 5 ranks."""

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="collectives.horovod needs torch (pip install torch==2.13.0)")

import collectives.horovod as hvd  # noqa: E402
from collectives.errors import InvalidBufferError, PeerInputError  # noqa: E402
from collectives.torch_integration.adasum import adasum_tree  # noqa: E402
from tests import training  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def initialised() -> None:
    hvd.init()


def _close(problems: Problems, label: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    ok = (
        actual.shape == expected.shape and actual.dtype == expected.dtype and torch.allclose(actual, expected)
    )
    problems.expect(ok, f"{label}: got {actual.tolist()}, expected {expected.tolist()}")


def test_allreduce_averages_by_default_and_takes_every_op_and_scaling(world: MPI.Intracomm) -> None:
    problems, r, n = Problems(world), world.rank, world.size
    ranks = torch.arange(n, dtype=torch.float64) + 1  # rank i contributes i + 1
    mine = torch.tensor([r + 1.0, 2.0 * (r + 1)], dtype=torch.float64)
    with problems.guard("allreduce"):
        _close(
            problems, "default (Average)", hvd.allreduce(mine), torch.stack([ranks.mean(), 2 * ranks.mean()])
        )
        _close(problems, "Sum", hvd.allreduce(mine, op=hvd.Sum), torch.stack([ranks.sum(), 2 * ranks.sum()]))
        with pytest.warns(DeprecationWarning):
            summed = hvd.allreduce_(mine.clone(), average=False)
        _close(problems, "average=False", summed, hvd.allreduce(mine, op=hvd.Sum))
        _close(
            problems, "Min", hvd.allreduce(mine, op=hvd.Min), torch.tensor([1.0, 2.0], dtype=torch.float64)
        )
        _close(
            problems, "Max", hvd.allreduce(mine, op=hvd.Max), torch.tensor([n, 2.0 * n], dtype=torch.float64)
        )
        _close(problems, "Product", hvd.allreduce(mine, op=hvd.Product)[:1], ranks.prod().reshape(1))
        scaled = hvd.allreduce(mine, op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5)
        _close(problems, "prescale/postscale", scaled, 1.5 * hvd.allreduce(mine))
        ints = hvd.allreduce(torch.tensor([r + 1, 7], dtype=torch.int32))  # Average of integers truncates
        _close(problems, "int Average", ints, torch.tensor([int(ranks.sum()) // n, 7], dtype=torch.int32))
        grouped = hvd.grouped_allreduce([mine, torch.full((3,), float(r))], op=hvd.Sum)
        _close(problems, "grouped", grouped[1], torch.full((3,), float(n * (n - 1) / 2)))
        before = mine.clone()
        handle = hvd.allreduce_async(mine, name="metric")
        out = hvd.synchronize(handle)
        problems.expect(torch.equal(mine, before), "allreduce_async changed its input")
        _close(problems, "async", out, hvd.allreduce(before))
        in_place = before.clone()
        handle = hvd.allreduce_async_(in_place, op=hvd.Sum)
        while not hvd.poll(handle):
            pass
        problems.expect(hvd.synchronize(handle) is in_place, "allreduce_async_ returned another tensor")
        _close(problems, "async_", in_place, hvd.allreduce(before, op=hvd.Sum))
    problems.check()


def test_ranks_nodes_in_place_groups_and_optimizer_state(world: MPI.Intracomm) -> None:
    problems, r, n = Problems(world), world.rank, world.size
    with problems.guard("ranks, groups, optimizer state"):
        same_host = len(set(world.allgather(MPI.Get_processor_name()))) == 1
        if same_host:  # the test runs on one machine
            seen = (
                hvd.rank(),
                hvd.size(),
                hvd.local_rank(),
                hvd.local_size(),
                hvd.cross_rank(),
                hvd.cross_size(),
            )
            problems.expect(seen == (r, n, r, n, 0, 1), f"rank, size, local and cross: {seen}")
        group = [torch.full((2,), float(r)), torch.full((3,), 2.0 * r)]
        returned = hvd.grouped_allreduce_(group)
        problems.expect(all(a is b for a, b in zip(returned, group, strict=True)), "not in place")
        _close(problems, "grouped_allreduce_", group[1], torch.full((3,), float(n - 1)))
        net = torch.nn.Linear(2, 1)
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        net(torch.full((1, 2), float(r))).sum().backward()
        sgd.step()  # momentum buffers now differ between ranks
        hvd.broadcast_optimizer_state(sgd, root_rank=0)
        buffer = sgd.state_dict()["state"][0]["momentum_buffer"]
        _close(problems, "momentum after broadcast", buffer, hvd.broadcast(buffer, root_rank=0))
    problems.check()


def test_names_match_collectives_started_in_other_orders(world: MPI.Intracomm) -> None:
    problems, r, n = Problems(world), world.rank, world.size
    names = ["w", "x", "y", "z"]
    order = names[r % 4 :] + names[: r % 4]  # each rank its own order
    with problems.guard("named"):
        tensors = {name: torch.full((2,), float(r * 10 + i)) for i, name in enumerate(names)}
        handles = {name: hvd.allreduce_async(tensors[name], name=name, op=hvd.Sum) for name in order}
        for i, name in enumerate(reversed(names)):
            expected = float(sum(q * 10 + (3 - i) for q in range(n)))
            _close(problems, name, hvd.synchronize(handles[name]), torch.full((2,), expected))
    problems.check()


def test_gather_broadcast_alltoall_reducescatter_objects(world: MPI.Intracomm) -> None:
    problems, r, n = Problems(world), world.rank, world.size
    with problems.guard("the other collectives"):
        gathered = hvd.allgather(torch.full((r + 1, 2), float(r)))  # rows differ between ranks
        expected = torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)])
        _close(problems, "allgather", gathered, expected)
        root = n - 1
        _close(
            problems, "broadcast", hvd.broadcast(torch.tensor([float(r)]), root), torch.tensor([float(root)])
        )
        mine = torch.tensor([float(r)])
        hvd.broadcast_(mine, 0)
        _close(problems, "broadcast_", mine, torch.tensor([0.0]))
        # rank r sends j + 1 rows to rank j, each row r * 100 + j
        rows = torch.cat([torch.full((j + 1,), float(r * 100 + j)) for j in range(n)])
        out, received = hvd.alltoall(rows, splits=[j + 1 for j in range(n)])
        _close(
            problems, "alltoall", out, torch.cat([torch.full((r + 1,), float(q * 100 + r)) for q in range(n)])
        )
        problems.expect(received.tolist() == [r + 1] * n, f"alltoall received splits {received.tolist()}")
        even = hvd.alltoall(torch.arange(n, dtype=torch.float32) + 10 * r)
        _close(problems, "alltoall even", even, torch.tensor([10.0 * q + r for q in range(n)]))
        total = 2 * n + 1  # uneven: the first rank gets a row more
        share = hvd.reducescatter(torch.arange(total, dtype=torch.float32) * (r + 1))  # Average by default
        mean = sum(q + 1 for q in range(n)) / n
        start = sum(total // n + (q < total % n) for q in range(r))
        rows_here = total // n + (r < total % n)
        _close(
            problems,
            "reducescatter",
            share,
            torch.arange(start, start + rows_here, dtype=torch.float32) * mean,
        )
        problems.expect(
            hvd.broadcast_object({"from": r}, root_rank=root) == {"from": root}, "broadcast_object"
        )
        problems.expect(hvd.allgather_object((r, "x")) == [(q, "x") for q in range(n)], "allgather_object")
        if n > 1:
            with pytest.raises(InvalidBufferError, match="only the first dimension may differ"):
                hvd.allgather(torch.ones(1, 2 + r % 2))  # every rank raises
        hvd.barrier()
        last = hvd.join()
        problems.expect(0 <= last < n and last == world.bcast(last), f"join gave {last}")
    problems.check()


def test_gradients_flow_as_horovod_defines_them(world: MPI.Intracomm) -> None:
    problems, r, n = Problems(world), world.rank, world.size
    with problems.guard("autograd"):
        x = torch.full((2,), float(r + 1), requires_grad=True)
        hvd.allreduce(x, op=hvd.Sum).sum().backward()  # backward: the gradients summed too
        _close(problems, "allreduce grad", x.grad, torch.full((2,), float(n)))
        rows = torch.ones(r + 1, 2, requires_grad=True)
        weights = torch.arange(2.0 * sum(q + 1 for q in range(n))).reshape(-1, 2)
        (hvd.allgather(rows) * weights).sum().backward()  # backward: the average, then this rank's rows
        start = sum(q + 1 for q in range(r))
        _close(problems, "allgather grad", rows.grad, weights[start : start + r + 1])
        b = torch.ones(3, requires_grad=True)
        (hvd.broadcast(b, root_rank=0) * (r + 1)).sum().backward()  # backward: the average, on the root
        mean = sum(q + 1 for q in range(n)) / n
        _close(problems, "broadcast grad", b.grad, torch.full((3,), mean if r == 0 else 0.0))
    problems.check()


def test_adasum_is_its_formula_on_powers_of_two_and_refused_elsewhere(world: MPI.Intracomm) -> None:
    problems, r, n = Problems(world), world.rank, world.size
    inputs = [
        torch.randn(6, generator=torch.Generator().manual_seed(q), dtype=torch.float64) for q in range(n)
    ]
    with problems.guard("Adasum"):
        if n & (n - 1):
            with pytest.raises(NotImplementedError, match="power of 2"):
                hvd.allreduce(inputs[r], op=hvd.Adasum)
        else:
            _close(problems, "Adasum", hvd.allreduce(inputs[r], op=hvd.Adasum), adasum_tree(inputs))
    problems.check()


def _single_process_sgd() -> list[torch.Tensor]:
    net = training.model()
    return training.train(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))


@pytest.mark.parametrize(("predivide", "passes"), [(1.0, 1), (4.0, 2)])
def test_distributed_optimizer_trains_as_one_process_on_the_whole_batch(
    predivide: float, passes: int, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        net = training.model(seed=world.rank)  # unlike until broadcast
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        hvd.broadcast_parameters(net.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(sgd, root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            sgd,
            named_parameters=net.named_parameters(),
            gradient_predivide_factor=predivide,
            backward_passes_per_step=passes,  # one pass per step here: step() reduces what is there
        )
        problems.expect(isinstance(optimizer, torch.optim.SGD), f"{type(optimizer).__mro__}")
        params = training.train(net, optimizer, world.rank, world.size)
        error = training.relative_error(params, _single_process_sgd())
        problems.expect(error < 1e-5, f"relative error {error:.3g} against one process")
        flat = torch.cat([p.reshape(-1) for p in params]).numpy()
        problems.expect(bool(np.array_equal(flat, world.bcast(flat))), "parameters differ between ranks")
    problems.check()


def test_adasum_optimizer_combines_the_ranks_steps_by_the_formula(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    if world.size & (world.size - 1):
        with pytest.raises(NotImplementedError, match="power of 2"):
            hvd.DistributedOptimizer(torch.optim.SGD(training.model().parameters(), lr=0.1), op=hvd.Adasum)
        return
    with problems.guard("Adasum optimizer"):
        net = training.model()
        start = [p.detach().clone() for p in net.parameters()]
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=net.named_parameters(), op=hvd.Adasum
        )
        x, y = training.batch(0)
        x, y = training.shard(x, world.rank, world.size), training.shard(y, world.rank, world.size)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        grads = hvd.allgather_object([p.grad.clone() for p in net.parameters()])
        optimizer.step()
        for i, (param, before) in enumerate(zip(net.parameters(), start, strict=True)):
            expected = before.double() + adasum_tree([-0.1 * grads[r][i].double() for r in range(world.size)])
            _close(problems, f"parameter {i}", param.detach(), expected.float())
    problems.check()


def test_sync_batch_norm_is_batch_norm_over_the_whole_batch(world: MPI.Intracomm) -> None:
    problems, r, n = Problems(world), world.rank, world.size
    whole = torch.randn(4 * n, 3, 5, generator=torch.Generator().manual_seed(7))
    with problems.guard("SyncBatchNorm"):
        sync, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
        mine = whole[4 * r : 4 * (r + 1)].clone().requires_grad_(True)
        out = sync(mine)
        out.pow(2).sum().backward()
        everything = whole.clone().requires_grad_(True)
        expected = plain(everything)
        expected.pow(2).sum().backward()
        _close(problems, "output", out.detach(), expected.detach()[4 * r : 4 * (r + 1)])
        problems.expect(
            torch.allclose(mine.grad, everything.grad[4 * r : 4 * (r + 1)], atol=1e-5), "input gradient"
        )
        _close(problems, "running mean", sync.running_mean, plain.running_mean)
        _close(problems, "running var", sync.running_var, plain.running_var)
    problems.check()


def test_a_bad_tensor_on_one_rank_is_an_error_on_every_rank(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("needs another rank to tell")
    problems = Problems(world)
    tensor = torch.ones(4, 4)
    bad = tensor.t()[:2] if world.rank == 0 else tensor[:2].clone()  # rank 0's is not contiguous
    expected = ValueError if world.rank == 0 else PeerInputError
    try:
        hvd.allreduce_(bad, name="bad")
    except expected:
        pass
    except Exception as error:
        problems.expect(False, f"raised {type(error).__name__}: {error}")
    else:
        problems.expect(False, "no error")
    with problems.guard("a collective after"):
        _close(problems, "after", hvd.allreduce(torch.ones(1)), torch.ones(1))
    problems.check()


def test_a_name_in_flight_reused_on_one_rank_is_refused_there_and_later_calls_go_on(
    world: MPI.Intracomm,
) -> None:
    # rank 0 starts "reused" twice before synchronizing: the second is refused at once, on rank 0 alone
    # and before anything is sent, so the other ranks' calls and every later call pair up as before
    from collectives.errors import ConfigurationError

    problems = Problems(world)
    mine = torch.full((3,), float(world.rank + 1))
    with problems.guard("a reused name"):
        handle = hvd.allreduce_async(mine, name="reused", op=hvd.Sum)
        if world.rank == 0:
            with pytest.raises(ConfigurationError, match="named 'reused' is in flight"):
                hvd.allreduce_async(mine, name="reused", op=hvd.Sum)
        total = float(sum(range(1, world.size + 1)))
        _close(problems, "the first", hvd.synchronize(handle), torch.full((3,), total))
        _close(
            problems,
            "reused once done",
            hvd.allreduce(mine, name="reused", op=hvd.Sum),
            torch.full((3,), total),
        )
        _close(
            problems,
            "an unrelated call",
            hvd.allreduce(mine, name="other", op=hvd.Max),
            torch.full((3,), float(world.size)),
        )
    problems.check()
