"""torch under mpiexec: the DDP hook and both DistributedOptimizers repeat their buckets' allreduces.

A bucket's allreduce goes through the call path's one repeat room (collectives.repeats), or where the
compiled engine runs, an in-place one through its one call (repeat_in_place): the first call of each
bucket's shape and dtype takes the full path, every later one runs ready.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

import collectives  # noqa: E402
from collectives import dispatch, engine  # noqa: E402
from collectives import torch_integration as ti  # noqa: E402
from collectives.communicator import communicator_of  # noqa: E402
from collectives.torch_integration.worker import background_worker  # noqa: E402
from tests import training  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402
from tests.mpi.test_torch import COMPRESSION_TOLERANCE, _check_training, gloo  # noqa: E402, F401

pytestmark = pytest.mark.mpi


class _Calls:
    """The allreduces run on one communicator: all of them, those that ran ready, their shapes and dtypes."""

    def __init__(self) -> None:
        self.calls = 0
        self.ready = 0
        self.kinds: set[tuple[Any, ...]] = set()

    @property
    def first(self) -> int:
        """The calls that took the full path."""
        return self.calls - self.ready


@contextmanager
def _counted(
    monkeypatch: pytest.MonkeyPatch, communicator: collectives.Communicator, *, afresh: bool = True
) -> Iterator[_Calls]:
    """Count the allreduces run on ``communicator`` while the block runs; ``afresh``: none kept before."""
    if afresh:  # an earlier test's buckets of the same shapes would be kept (cleared on every rank alike)
        communicator.repeats.clear()
    counts = _Calls()
    find_repeat = dispatch.find_repeat

    def finding(group: Any, collective: str, x: Any, out: Any, *args: Any) -> Any:
        repeat = find_repeat(group, collective, x, out, *args)
        if group is communicator and collective == "allreduce":
            counts.calls += 1
            counts.ready += repeat is not None and repeat.fits(x, out)
            counts.kinds.add((x.shape, x.dtype))
        return repeat

    compiled = engine.COMPILED
    entering = None if compiled is None else compiled.repeat_in_place

    def entered(kept: Any, x: Any, *args: Any) -> Any:  # the engine's one call for an in-place repeat
        assert entering is not None
        done = entering(kept, x, *args)
        if kept is communicator.repeats and done is not None:  # taken: ready (else the full path counts it)
            counts.calls += 1
            counts.ready += 1
            counts.kinds.add((x.shape, x.dtype))
        return done

    with monkeypatch.context() as patch:
        patch.setattr(dispatch, "find_repeat", finding)
        if compiled is not None:
            patch.setattr(compiled, "repeat_in_place", entered)
        yield counts


def _expect_repeats(problems: Problems, counts: _Calls, buckets: int) -> None:
    """Every bucket reduced once a step; only the first call of each shape and dtype took the full path.

    Buckets of one shape and dtype share their decisions. A communicator's first ``"auto"`` call also
    agrees on the selector, which sends no data with its signature: not one to repeat, so its key's
    next call takes the full path once more.
    """
    kinds = len(counts.kinds)
    problems.expect(kinds <= counts.first <= kinds + 1, f"{counts.first} first calls for {kinds} kinds")
    problems.expect(counts.calls == buckets * training.STEPS, f"{counts.calls} calls, {buckets} buckets")


@pytest.mark.parametrize("compression", [None, "fp16"])
def test_distributed_optimizer_repeats_each_buckets_allreduce(
    world: MPI.Intracomm, compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        net = training.model()
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        # 300 bytes: several buckets, one of them a lone gradient (its tensor is new every step)
        optimizer = ti.DistributedOptimizer(
            sgd, net.named_parameters(), fusion_threshold_bytes=300, compression=compression
        )
        with _counted(monkeypatch, optimizer._worker.communicator) as counts:
            params = training.train(net, optimizer, world.rank, world.size)
        buckets = len(optimizer.buckets)
        problems.expect(buckets > 1, f"{buckets} bucket: the test wants several")
        _expect_repeats(problems, counts, buckets)
        _check_training(problems, f"compression={compression}", params, COMPRESSION_TOLERANCE[compression])
    problems.check()


def test_horovod_distributed_optimizer_repeats_each_buckets_allreduce(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    import collectives.horovod as hvd

    problems = Problems(world)
    hvd.init()
    with problems.guard("training"):
        net = training.model()
        sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        optimizer: Any = hvd.DistributedOptimizer(sgd, net.named_parameters())
        engine = optimizer._hvd_engine
        with _counted(monkeypatch, engine._worker.communicator) as counts:
            params = training.train(net, optimizer, world.rank, world.size)
        _expect_repeats(problems, counts, len(engine.buckets))
        _check_training(problems, "horovod", params, COMPRESSION_TOLERANCE[None])
    problems.check()


@pytest.mark.parametrize(
    ("hook", "compression"), [(ti.allreduce_hook, None), (ti.allreduce_fp16_hook, "fp16")]
)
@pytest.mark.usefixtures("gloo")
def test_ddp_hook_repeats_each_buckets_allreduce(
    hook: Any, compression: str | None, world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        net = training.model()
        model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.001)
        model.register_comm_hook(None, hook)
        communicator = background_worker(communicator_of(None)).communicator  # where the hook's jobs run
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with _counted(monkeypatch, communicator) as counts:
            params = training.train(model, optimizer, world.rank, world.size)
        # DDP rebuilds its buckets once, after the first step: at most twice as many first calls as kinds
        buckets, kinds = counts.calls // training.STEPS, len(counts.kinds)
        problems.expect(buckets >= 1, f"{counts.calls} reductions in {training.STEPS} steps")
        problems.expect(0 < counts.first <= 2 * kinds, f"{counts.first} first calls for {kinds} kinds")
        _check_training(problems, f"hook {hook.__name__}", params, COMPRESSION_TOLERANCE[compression])
        # once the buckets are settled, a step runs every bucket's allreduce ready
        with _counted(monkeypatch, communicator, afresh=False) as settled:
            x, y = training.batch(0)
            mine = training.shard(x, world.rank, world.size)
            torch.nn.functional.mse_loss(model(mine), training.shard(y, world.rank, world.size)).backward()
            model.zero_grad()  # waits for the hook's jobs, as a step would
        problems.expect(settled.first == 0, f"a settled step made {settled.first} first calls")
        problems.expect(settled.calls == buckets, f"a step made {settled.calls} reductions, not {buckets}")
    problems.check()
