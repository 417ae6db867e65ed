"""torch under mpiexec: the DDP hook and both DistributedOptimizers reduce repeated buckets persistently."""

from typing import Any

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

import collectives  # noqa: E402
from collectives import torch_integration as ti  # noqa: E402
from collectives.communicator import communicator_of  # noqa: E402
from collectives.torch_integration.repeated import repeated_for  # noqa: E402
from collectives.torch_integration.worker import background_worker  # noqa: E402
from tests import training  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402
from tests.mpi.test_torch import COMPRESSION_TOLERANCE, _check_training, gloo  # noqa: E402, F401

pytestmark = pytest.mark.mpi


def _counts(communicator: collectives.Communicator) -> tuple[int, int]:
    repeated = repeated_for(communicator)
    return repeated.inits, repeated.starts


@pytest.mark.parametrize("compression", [None, "fp16"])
def test_distributed_optimizer_inits_each_bucket_once(world: MPI.Intracomm, compression: str | None) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        net = training.model()
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        # 300 bytes: several buckets, one of them a lone gradient (its tensor is new every step)
        optimizer = ti.DistributedOptimizer(
            sgd, net.named_parameters(), fusion_threshold_bytes=300, compression=compression
        )
        communicator = optimizer._worker.communicator
        repeated_for(communicator).clear()  # an earlier test's buckets of the same shapes would be kept
        inits, starts = _counts(communicator)
        params = training.train(net, optimizer, world.rank, world.size)
        buckets = len(optimizer.buckets)
        inits, starts = (a - b for a, b in zip(_counts(communicator), (inits, starts), strict=True))
        problems.expect(buckets > 1, f"{buckets} bucket: the test wants several")
        problems.expect(inits == buckets, f"{inits} inits for {buckets} buckets")
        problems.expect(starts == buckets * training.STEPS, f"{starts} starts: {buckets} x {training.STEPS}")
        _check_training(problems, f"compression={compression}", params, COMPRESSION_TOLERANCE[compression])
    problems.check()


def test_horovod_distributed_optimizer_inits_each_bucket_once(world: MPI.Intracomm) -> None:
    import collectives.horovod as hvd

    problems = Problems(world)
    hvd.init()
    with problems.guard("training"):
        net = training.model()
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        optimizer: Any = hvd.DistributedOptimizer(sgd, net.named_parameters())
        engine = optimizer._hvd_engine
        communicator = engine._worker.communicator
        repeated_for(communicator).clear()
        inits, starts = _counts(communicator)
        params = training.train(net, optimizer, world.rank, world.size)
        inits, starts = (a - b for a, b in zip(_counts(communicator), (inits, starts), strict=True))
        buckets = len(engine.buckets)
        problems.expect(inits == buckets, f"{inits} inits for {buckets} buckets")
        problems.expect(starts == buckets * training.STEPS, f"{starts} starts: {buckets} x {training.STEPS}")
        _check_training(problems, "horovod", params, COMPRESSION_TOLERANCE[None])
    problems.check()


@pytest.mark.parametrize(
    ("hook", "compression"), [(ti.allreduce_hook, None), (ti.allreduce_fp16_hook, "fp16")]
)
@pytest.mark.usefixtures("gloo")
def test_ddp_hook_inits_each_bucket_once(hook: Any, compression: str | None, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        net = training.model()
        model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.001)
        model.register_comm_hook(None, hook)
        communicator = background_worker(communicator_of(None)).communicator  # where the hook's jobs run
        repeated_for(communicator).clear()
        inits, starts = _counts(communicator)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        params = training.train(model, optimizer, world.rank, world.size)
        inits, starts = (a - b for a, b in zip(_counts(communicator), (inits, starts), strict=True))
        # DDP rebuilds its buckets once, after the first step: at most twice as many inits as buckets
        buckets = starts // training.STEPS
        problems.expect(buckets >= 1, f"{starts} reductions in {training.STEPS} steps")
        problems.expect(0 < inits <= 2 * buckets, f"{inits} inits for {buckets} buckets")
        _check_training(problems, f"hook {hook.__name__}", params, COMPRESSION_TOLERANCE[compression])
        # once the buckets are settled, a step makes none
        before = _counts(communicator)
        x, y = training.batch(0)
        mine = training.shard(x, world.rank, world.size)
        torch.nn.functional.mse_loss(model(mine), training.shard(y, world.rank, world.size)).backward()
        after = _counts(communicator)
        problems.expect(after[0] == before[0], f"a settled step made {after[0] - before[0]} inits")
        problems.expect(after[1] - before[1] == buckets, f"a step made {after[1] - before[1]} reductions")
    problems.check()
