"""Subgroups of the collectives torch.distributed backend under mpiexec: collectives and DDP in a group."""

from collections.abc import Iterator
from typing import Any

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")
dist = torch.distributed

from collectives import torch_integration as ti  # noqa: E402
from collectives.errors import ConfigurationError  # noqa: E402
from tests import autograd_cases, training  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(params=["collectives", "gloo"])
def default_group(request: pytest.FixtureRequest, world: MPI.Intracomm) -> Iterator[str]:
    """torch.distributed's default group on either backend, rank and world size from MPI."""
    if world.size < 2:
        pytest.skip("a subgroup needs at least two ranks")
    dist.init_process_group(request.param, init_method="mpi://")
    try:
        yield request.param
    finally:
        dist.destroy_process_group()


def _groups(size: int) -> dict[str, list[int]]:
    """At 4 ranks: [0, 2], [1, 3] and [0, 1, 2]."""
    return {
        "even": list(range(0, size, 2)),
        "odd": list(range(1, size, 2)),
        "first": list(range(size - 1)),
    }


def test_collectives_within_subgroups(default_group: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    rank = world.rank
    with problems.guard("subgroups"):
        members = _groups(world.size)
        # every rank creates every group, in the same order, as torch asks
        groups = {name: dist.new_group(ranks, backend="collectives") for name, ranks in members.items()}
        for name, ranks in members.items():
            group = groups[name]
            if rank not in ranks:
                problems.expect(
                    group is dist.GroupMember.NON_GROUP_MEMBER, f"{name}: a non-member got {group}"
                )
                untouched = torch.full((3,), float(rank))
                with pytest.warns(UserWarning, match="does not belong to the given group"):
                    problems.expect(
                        dist.all_reduce(untouched, group=group) is None, f"{name}: non-member work"
                    )
                problems.expect(
                    torch.equal(untouched, torch.full((3,), float(rank))), f"{name}: non-member data"
                )
                continue
            label = f"{name} {ranks}"
            problems.expect(dist.get_backend(group) == "collectives", f"{label}: {dist.get_backend(group)}")
            where = (dist.get_rank(group), dist.get_world_size(group))
            problems.expect(where == (ranks.index(rank), len(ranks)), f"{label}: rank, size {where}")
            total = torch.full((3,), float(rank))
            dist.all_reduce(total, group=group)
            problems.expect(
                torch.equal(total, torch.full((3,), float(sum(ranks)))), f"{label}: all_reduce {total}"
            )
            largest = torch.full((2,), rank, dtype=torch.int64)
            dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
            problems.expect(torch.equal(largest, torch.full((2,), max(ranks))), f"{label}: max {largest}")
            sent = torch.full((2,), float(rank))
            dist.broadcast(sent, src=ranks[-1], group=group)  # src is a global rank
            problems.expect(
                torch.equal(sent, torch.full((2,), float(ranks[-1]))), f"{label}: broadcast {sent}"
            )
            gathered = [torch.empty(2, dtype=torch.int32) for _ in ranks]
            dist.all_gather(gathered, torch.full((2,), rank, dtype=torch.int32), group=group)
            problems.expect(
                all(
                    torch.equal(g, torch.full((2,), r, dtype=torch.int32))
                    for r, g in zip(ranks, gathered, strict=True)
                ),
                f"{label}: all_gather {gathered}",
            )
            dist.barrier(group=group)
        # the default group still works after, and beside, the subgroups
        total = torch.ones(2)
        dist.all_reduce(total)
        problems.expect(torch.equal(total, torch.full((2,), float(world.size))), f"default group {total}")
    problems.check()


def _single_process(seed: int) -> list[Any]:
    net = training.model(seed)
    return training.train(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))


@pytest.mark.parametrize("split", ["even-odd", "first"])
def test_ddp_trains_within_a_subgroup(split: str, default_group: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with problems.guard("training"):
        members = _groups(world.size)
        groups = {name: dist.new_group(ranks, backend="collectives") for name, ranks in members.items()}
        mine = "first" if split == "first" else "even" if world.rank % 2 == 0 else "odd"
        ranks, group = members[mine], groups[mine]
        if world.rank in ranks:
            net = training.model(seed=world.rank)  # unlike until DDP broadcasts the group's first rank's
            model = torch.nn.parallel.DistributedDataParallel(net, process_group=group, bucket_cap_mb=0.001)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            params = training.train(model, optimizer, ranks.index(world.rank), len(ranks))
            error = training.relative_error(params, _single_process(seed=ranks[0]))
            problems.expect(error <= 1e-6, f"group {ranks}: relative error {error:.3g}")
            flat = torch.cat([p.reshape(-1) for p in params])
            first = flat.clone()
            dist.broadcast(first, src=ranks[0], group=group)
            problems.expect(
                torch.equal(flat, first), f"group {ranks}: parameters differ from its first rank's"
            )
    problems.check()


def test_the_functions_take_a_group_as_their_communicator(default_group: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    members = _groups(world.size)
    groups = {name: dist.new_group(ranks, backend="collectives") for name, ranks in members.items()}
    mine = "even" if world.rank % 2 == 0 else "odd"
    ranks, group = members[mine], groups[mine]
    with problems.guard("functions"):
        where = (ti.rank(group), ti.size(group))
        problems.expect(where == (ranks.index(world.rank), len(ranks)), f"rank, size {where}")
        total = ti.allreduce(torch.full((3,), float(world.rank)), comm=group)
        problems.expect(torch.equal(total, torch.full((3,), float(sum(ranks)))), f"allreduce {total}")
        rows = ti.allgather(torch.full((1, 2), world.rank), comm=group)
        problems.expect(torch.equal(rows[:, 0], torch.tensor(ranks)), f"allgather {rows}")
        for case in autograd_cases.CASES:
            x = autograd_cases.input_of(case, ti.rank(group), len(ranks))
            actual = autograd_cases.distributed_gradient(case, x, ti.rank(group), len(ranks), group)
            expected = autograd_cases.reference_gradients(case, len(ranks))[ti.rank(group)]
            close = torch.allclose(actual, expected, rtol=1e-6, atol=0)
            problems.expect(close, f"{case}: {actual.tolist()} != {expected.tolist()}")
    wrong = {"NON_GROUP_MEMBER": dist.GroupMember.NON_GROUP_MEMBER}
    if default_group == "gloo":
        wrong["'gloo' backend"] = dist.group.WORLD
    for match, comm in wrong.items():
        try:
            ti.allreduce(torch.ones(2), comm=comm)
        except ConfigurationError as error:
            problems.expect(match in str(error), f"{match}: {error}")
        else:
            problems.expect(False, f"{match}: no error")
    if default_group == "collectives":
        with problems.guard("the default group"):
            everyone = ti.allreduce(torch.ones(2), comm=dist.group.WORLD)
            problems.expect(torch.equal(everyone, torch.full((2,), float(world.size))), f"world {everyone}")
    problems.check()
