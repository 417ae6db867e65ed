"""The collectives torch.distributed backend's calls beyond allreduce, under mpiexec, with exact answers."""

from datetime import timedelta

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")
dist = torch.distributed

import collectives.torch_integration  # noqa: E402, F401 - registers the backend and mpi://
from collectives.errors import CollectiveTimeout, InvalidBufferError  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402

pytestmark = pytest.mark.mpi

# importing DTensor and FSDP costs seconds a process, and they do not depend on the world size
at_two_ranks = pytest.mark.skipif(
    MPI.COMM_WORLD.size != 2, reason="runs at 2 ranks, the MPI suite's others skip it"
)


def _same(problems: Problems, label: str, actual: "torch.Tensor", expected: "torch.Tensor") -> None:
    problems.expect(
        actual.dtype == expected.dtype and torch.equal(actual, expected), f"{label}: {actual} != {expected}"
    )


def test_rooted_collectives(group: int, world: MPI.Intracomm) -> None:
    p, r = group, world.rank
    problems = Problems(world)
    for root in {0, p - 1}:
        with problems.guard(f"reduce root {root}"):
            mine = torch.full((5,), float(r + 1))
            dist.reduce(mine, root, op=dist.ReduceOp.MAX)
            if r == root:
                _same(problems, "reduce", mine, torch.full((5,), float(p)))
        with problems.guard(f"gather root {root}"):
            outputs = [torch.empty(2, 3, dtype=torch.int32) for _ in range(p)] if r == root else None
            dist.gather(torch.full((2, 3), r, dtype=torch.int32), outputs, dst=root)
            for i, output in enumerate(outputs or []):
                _same(problems, f"gather from {i}", output, torch.full((2, 3), i, dtype=torch.int32))
        with problems.guard(f"scatter root {root}"):
            shares = [torch.arange(4.0) + 10 * i for i in range(p)] if r == root else None
            share = torch.empty(4)
            dist.scatter(share, shares, src=root)
            _same(problems, "scatter", share, torch.arange(4.0) + 10 * r)
        with problems.guard(f"objects root {root}"):
            found = [None] * p if r == root else None
            dist.gather_object({"rank": r, "word": "x" * r}, found, dst=root)
            if r == root:
                problems.expect(
                    found == [{"rank": i, "word": "x" * i} for i in range(p)], f"gather_object {found}"
                )
            got: list[object] = [None]
            dist.scatter_object_list(got, [("to", i) for i in range(p)] if r == root else None, src=root)
            problems.expect(got == [("to", r)], f"scatter_object_list {got}")
    problems.check()


def test_all_to_all_with_equal_and_uneven_shares(group: int, world: MPI.Intracomm) -> None:
    p, r = group, world.rank
    problems = Problems(world)
    with problems.guard("all_to_all"):
        outputs = [torch.empty(3) for _ in range(p)]
        dist.all_to_all(outputs, [torch.full((3,), float(10 * r + j)) for j in range(p)])
        for i, output in enumerate(outputs):
            _same(problems, f"all_to_all from {i}", output, torch.full((3,), float(10 * i + r)))
    with problems.guard("all_to_all_single, equal"):
        output = torch.empty(2 * p, 2)
        dist.all_to_all_single(output, (torch.arange(4.0 * p) + 100 * r).reshape(2 * p, 2))
        expected = torch.cat([(torch.arange(4.0) + 4 * r + 100 * i) for i in range(p)]).reshape(2 * p, 2)
        _same(problems, "all_to_all_single", output, expected)
    with problems.guard("all_to_all_single, uneven"):
        # rank i sends i + j + 1 rows to rank j, each row filled with 100 * i + j
        sends = [r + j + 1 for j in range(p)]
        receives = [i + r + 1 for i in range(p)]
        rows = torch.cat([torch.full((n, 2), 100.0 * r + j) for j, n in enumerate(sends)])
        output = torch.empty(sum(receives), 2)
        dist.all_to_all_single(output, rows, receives, sends)
        expected = torch.cat([torch.full((n, 2), 100.0 * i + r) for i, n in enumerate(receives)])
        _same(problems, "uneven all_to_all_single", output, expected)
    problems.check()


def test_send_recv_isend_irecv_any_source_and_batches(group: int, world: MPI.Intracomm) -> None:
    p, r = group, world.rank
    if p < 2:
        pytest.skip("messages need two ranks")
    problems = Problems(world)
    right, left = (r + 1) % p, (r - 1) % p
    with problems.guard("isend/irecv around the ring"):
        got = torch.empty(3, 2, dtype=torch.float64)
        receive = dist.irecv(got, left, tag=5)
        send = dist.isend(torch.full((3, 2), float(r), dtype=torch.float64), right, tag=5)
        send.wait()
        receive.wait()
        _same(problems, "irecv", got, torch.full((3, 2), float(left), dtype=torch.float64))
    with problems.guard("recv from any source"):
        if r == 0:
            sources = set()
            for _ in range(p - 1):
                got = torch.empty(2, dtype=torch.int64)
                source = dist.recv(got, tag=7)
                sources.add(source)
                _same(problems, f"recv from {source}", got, torch.full((2,), source, dtype=torch.int64))
            problems.expect(sources == set(range(1, p)), f"sources {sources}")
        else:
            dist.send(torch.full((2,), r, dtype=torch.int64), 0, tag=7)
    with problems.guard("batch_isend_irecv"):
        got = torch.empty(4)
        ops = [
            dist.P2POp(dist.isend, torch.arange(4.0) * (r + 1), right),
            dist.P2POp(dist.irecv, got, left),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        _same(problems, "batch_isend_irecv", got, torch.arange(4.0) * (left + 1))
    with problems.guard("strided and bool messages"):
        got = torch.zeros(3, 4).t()  # received through a contiguous stage
        request = dist.irecv(got, left, tag=3)
        dist.send(torch.arange(12.0).reshape(3, 4).t() * (r + 1), right, tag=3)
        request.wait()
        _same(problems, "strided message", got, torch.arange(12.0).reshape(3, 4).t() * (left + 1))
        flags = torch.zeros(3, dtype=torch.bool)
        request = dist.irecv(flags, left, tag=2)
        dist.send(torch.tensor([True, r % 2 == 0, False]), right, tag=2)
        request.wait()
        _same(problems, "bool message", flags, torch.tensor([True, left % 2 == 0, False]))
    problems.check()


def test_bool_strided_and_sparse_tensors_as_gloo_takes_them(group: int, world: MPI.Intracomm) -> None:
    p, r = group, world.rank
    problems = Problems(world)
    with problems.guard("bool allreduce"):
        flags = torch.tensor([r == 0, False, True])
        dist.all_reduce(flags)  # gloo sums bools as "or"
        _same(problems, "bool sum", flags, torch.tensor([True, False, True]))
        every = torch.tensor([r == 0, True])
        dist.all_reduce(every, op=dist.ReduceOp.MIN)
        _same(problems, "bool min", every, torch.tensor([p == 1, True]))
    with problems.guard("strided allreduce and broadcast"):
        strided = (torch.arange(6.0).reshape(2, 3) * (r + 1)).t()
        dist.all_reduce(strided)
        _same(problems, "strided", strided, (torch.arange(6.0).reshape(2, 3) * sum(range(1, p + 1))).t())
        column = torch.full((4, 2), float(r))[:, 1]
        dist.broadcast(column, src=p - 1)
        _same(problems, "strided broadcast", column, torch.full((4,), float(p - 1)))
    with problems.guard("strided all_gather"):
        outputs = [torch.zeros(2, 3).t() for _ in range(p)]
        dist.all_gather(outputs, torch.full((3, 2), float(r)))
        for i, output in enumerate(outputs):
            _same(problems, f"all_gather {i}", output, torch.full((3, 2), float(i)))
    with problems.guard("sparse allreduce"):
        sparse = torch.sparse_coo_tensor([[r, p]], [1.0, 2.0], (p + 1,), check_invariants=True)
        dist.all_reduce(sparse)
        expected = torch.cat([torch.ones(p), torch.tensor([2.0 * p])])
        _same(problems, "sparse", sparse.to_dense(), expected)
    with problems.guard("barrier with device ids"):
        dist.barrier(device_ids=[0])  # names a GPU for NCCL; a cpu group has none to sync
    with problems.guard("bad and unsupported calls name what is wrong or missing"):
        default = dist.distributed_c10d._get_default_group()
        with pytest.raises(InvalidBufferError, match="one tensor per rank"):
            default.reduce([torch.ones(1), torch.ones(1)]).wait()
        with pytest.raises(NotImplementedError, match="collectives backend cannot split_group"):
            default.split_group([0])
    problems.check()


@at_two_ranks
def test_groups_have_names_for_functional_collectives_dtensor_and_destroy(
    group: int, world: MPI.Intracomm
) -> None:
    import torch.distributed._functional_collectives as functional
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    p, r = group, world.rank
    problems = Problems(world)
    with problems.guard("names"):
        sub = dist.new_group(list(range(p)))
        problems.expect(bool(sub.group_name) and sub.group_name != dist.group.WORLD.group_name, "no name")
        dist.destroy_process_group(sub)
    with problems.guard("functional collectives"):
        world_group = dist.group.WORLD
        total = functional.all_reduce(torch.full((3,), float(r)), "sum", world_group)
        _same(
            problems,
            "functional all_reduce",
            torch.as_tensor(total.wait()),
            torch.full((3,), float(sum(range(p)))),
        )
        gathered = functional.all_gather_single(torch.full((2,), float(r)), 0, world_group)
        expected = torch.arange(float(p)).repeat_interleave(2)
        _same(problems, "functional all_gather", torch.as_tensor(gathered.wait()), expected)
        scattered = functional.reduce_scatter_single(torch.arange(2.0 * p), "sum", 0, world_group)
        _same(
            problems,
            "functional reduce_scatter",
            torch.as_tensor(scattered.wait()),
            torch.arange(2.0 * r, 2.0 * r + 2) * p,
        )
    with problems.guard("DTensor"):
        mesh = init_device_mesh("cpu", (p,))
        sharded = distribute_tensor(torch.arange(4.0 * p), mesh, [Shard(0)])
        _same(problems, "full_tensor", sharded.full_tensor(), torch.arange(4.0 * p))
        _same(
            problems,
            "redistribute",
            (sharded * 2).redistribute(mesh, [Replicate()]).to_local(),
            torch.arange(4.0 * p) * 2,
        )
    problems.check()


@at_two_ranks
def test_a_group_times_out_by_its_timeout_and_a_new_group_works(world: MPI.Intracomm) -> None:
    if world.size < 2:
        pytest.skip("a timeout needs a rank that does not come")
    dist.init_process_group("collectives", init_method="mpi://", timeout=timedelta(seconds=60))
    problems = Problems(world)
    try:
        with problems.guard("a group of 1 s"):
            hasty = dist.new_group(list(range(world.size)), timeout=timedelta(seconds=1))
            if world.rank == 0:  # the others never call it: rank 0's times out after the group's second
                with pytest.raises(CollectiveTimeout, match="timed out after 1"):
                    dist.all_reduce(torch.ones(2), group=hasty)
            world.Barrier()
            # its unreceived messages must not reach the next group made (MPI would reuse its context)
            dist.destroy_process_group(hasty)
        with problems.guard("a new group after the timeout"):
            fresh = dist.new_group(list(range(world.size)))
            total = torch.ones(2)
            dist.all_reduce(total, group=fresh)
            _same(problems, "after the timeout", total, torch.full((2,), float(world.size)))
    finally:
        dist.destroy_process_group()
    problems.check()
