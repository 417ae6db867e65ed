"""The collectives torch.distributed backend under mpiexec: sizes checked, resizable tensors, PREMUL_SUM."""

import re
from collections.abc import Callable

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")
dist = torch.distributed

import collectives.torch_integration  # noqa: E402, F401 - registers the backend and mpi://
from collectives.errors import MismatchError, UnsupportedOpError  # noqa: E402
from tests.mpi.helpers import Problems  # noqa: E402

pytestmark = pytest.mark.mpi
# the names torch 2.13 gives all_gather_into_tensor and reduce_scatter_tensor (the old ones warn there)
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _raises(problems: Problems, label: str, call: Callable[[], object], *patterns: str) -> None:
    """Record a problem unless ``call`` raises MismatchError whose message matches every pattern."""
    try:
        call()
    except MismatchError as error:
        for pattern in patterns:
            problems.expect(
                re.search(pattern, str(error)) is not None, f"{label}: {pattern!r} not in {error}"
            )
        return
    except Exception as error:
        problems.expect(False, f"{label}: raised {type(error).__name__}: {error}, not MismatchError")
        return
    problems.expect(False, f"{label}: no error")


def test_tensors_stay_resizable_after_every_collective(group: int, world: MPI.Intracomm) -> None:
    p, r = group, world.rank
    problems = Problems(world)
    calls: dict[str, Callable[[], list[torch.Tensor]]] = {}

    def call(name: str) -> Callable[[Callable[[], list[torch.Tensor]]], None]:
        def register(body: Callable[[], list[torch.Tensor]]) -> None:
            calls[name] = body

        return register

    @call("all_reduce")
    def _() -> list[torch.Tensor]:
        t = torch.ones(4)
        dist.all_reduce(t)
        return [t]

    @call("all_reduce async")
    def _() -> list[torch.Tensor]:
        t, flags = torch.ones(4, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bool)
        works = [dist.all_reduce(t, async_op=True), dist.all_reduce(flags, async_op=True)]
        for work in works:
            work.wait()
        return [t, flags]

    @call("all_reduce_coalesced")
    def _() -> list[torch.Tensor]:
        ts = [torch.ones(3), torch.ones(2, dtype=torch.int64)]
        with dist._coalescing_manager():
            for t in ts:
                dist.all_reduce(t)
        return ts

    @call("broadcast")
    def _() -> list[torch.Tensor]:
        t = torch.full((4,), float(r))
        dist.broadcast(t, src=0)
        return [t]

    @call("reduce")
    def _() -> list[torch.Tensor]:
        t = torch.ones(4)
        dist.reduce(t, dst=0)
        return [t]

    @call("all_gather")
    def _() -> list[torch.Tensor]:
        mine, outputs = torch.ones(2), [torch.empty(2) for _ in range(p)]
        dist.all_gather(outputs, mine)
        return [mine, *outputs]

    @call("all_gather_single")
    def _() -> list[torch.Tensor]:
        mine, out = torch.ones(2), torch.empty(2 * p)
        all_gather_single(out, mine)
        return [mine, out]

    @call("reduce_scatter")
    def _() -> list[torch.Tensor]:
        inputs, out = [torch.ones(2) for _ in range(p)], torch.empty(2)
        dist.reduce_scatter(out, inputs)
        return [out, *inputs]

    @call("reduce_scatter_single")
    def _() -> list[torch.Tensor]:
        whole, out = torch.ones(2 * p), torch.empty(2)
        reduce_scatter_single(out, whole)
        return [out, whole]

    @call("gather and scatter")
    def _() -> list[torch.Tensor]:
        mine, outputs = torch.ones(2), [torch.empty(2) for _ in range(p)] if r == 0 else None
        dist.gather(mine, outputs, dst=0)
        share, inputs = torch.empty(2), [torch.ones(2) for _ in range(p)] if r == 0 else None
        dist.scatter(share, inputs, src=0)
        return [mine, share, *(outputs or []), *(inputs or [])]

    @call("all_to_all and all_to_all_single")
    def _() -> list[torch.Tensor]:
        ins, outs = [torch.ones(2) for _ in range(p)], [torch.empty(2) for _ in range(p)]
        dist.all_to_all(outs, ins)
        whole, out = torch.ones(2 * p), torch.empty(2 * p)
        dist.all_to_all_single(out, whole)
        # every rank sends two rows to rank 0 and one to each other rank
        rows, got = torch.ones(p + 1), torch.empty(2 * p if r == 0 else p)
        dist.all_to_all_single(got, rows, [2 if r == 0 else 1] * p, [2] + [1] * (p - 1))
        return [*ins, *outs, whole, out, rows, got]

    @call("send and recv")
    def _() -> list[torch.Tensor]:
        if p == 1:
            return []
        sent, got = torch.ones(3), torch.empty(3)
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, sent, (r + 1) % p), dist.P2POp(dist.irecv, got, (r - 1) % p)]
        )
        for work in works:
            work.wait()
        return [sent, got]

    for name, body in calls.items():
        with problems.guard(name):
            for i, tensor in enumerate(body()):
                try:
                    tensor.resize_(tensor.numel() + 8)
                except RuntimeError as error:
                    problems.expect(False, f"{name}: tensor {i}: {error}")
    problems.check()


def test_all_to_all_whose_split_sizes_disagree_raises_naming_both_sizes(
    group: int, world: MPI.Intracomm
) -> None:
    p, r = group, world.rank
    if p < 2:
        pytest.skip("a share between two ranks needs two ranks")
    problems = Problems(world)
    last = p - 1

    def uneven() -> None:
        # every rank sends one row to each rank but the last, which expects two from rank 0
        sends = [1] * p
        receives = [2 if r == last else 1] + [1] * (p - 1)
        dist.all_to_all_single(torch.empty(sum(receives)), torch.ones(p), receives, sends)

    _raises(problems, "all_to_all_single", uneven, f"rank 0 sends 1 elements to rank {last}, which expects 2")

    def listed() -> None:
        # rank 0 sends three elements to the last rank, which has room for two
        ins = [torch.ones(3 if (r, j) == (0, last) else 2) for j in range(p)]
        dist.all_to_all([torch.empty(2) for _ in range(p)], ins)

    _raises(problems, "all_to_all", listed, f"rank 0 sends 3 elements to rank {last}, which expects 2")
    with problems.guard("an all_to_all after them"):
        outs = [torch.empty(2) for _ in range(p)]
        dist.all_to_all(outs, [torch.full((2,), float(10 * r + j)) for j in range(p)])
        for i, out in enumerate(outs):
            problems.expect(torch.equal(out, torch.full((2,), float(10 * i + r))), f"from {i}: {out}")
    problems.check()


def test_recv_into_a_tensor_of_another_size_or_dtype_raises(group: int, world: MPI.Intracomm) -> None:
    p, r = group, world.rank
    if p < 2:
        pytest.skip("messages need two ranks")
    problems = Problems(world)
    # rank 0 sends, rank 1 receives into a tensor that does not fit; then a message that does
    wrong = {
        "shorter": (torch.arange(3.0), torch.zeros(5), "sent 12 bytes of torch.float32.*has 20 bytes"),
        "longer": (torch.arange(5.0), torch.zeros(3), "sent 20 bytes of torch.float32.*has 12 bytes"),
        "another dtype": (
            torch.arange(4, dtype=torch.int32),
            torch.zeros(4),
            "sent 16 bytes of torch.int32.*has 16 bytes of torch.float32",
        ),
    }
    for name, (sent, room, pattern) in wrong.items():
        with problems.guard(name):
            if r == 0:
                dist.send(sent, 1, tag=3)
                dist.send(torch.arange(2.0), 1, tag=3)
            elif r == 1:
                _raises(problems, f"{name}: recv", lambda room=room: dist.recv(room, 0, tag=3), pattern)
                after = torch.zeros(2)
                dist.recv(after, 0, tag=3)
                problems.expect(torch.equal(after, torch.arange(2.0)), f"{name}: the next message: {after}")
    with problems.guard("from any source"):
        if r == 0:
            dist.send(torch.arange(3, dtype=torch.float64), 1, tag=4)
        elif r == 1:
            room, pattern = torch.zeros(3), "rank 0 sent 24 bytes of torch.float64"
            _raises(problems, "any source", lambda: dist.recv(room, tag=4), pattern)
    problems.check()


def test_premul_sum_scales_each_rank_then_sums_in_every_reduction(group: int, world: MPI.Intracomm) -> None:
    p, r = group, world.rank
    problems = Problems(world)
    premul = dist._make_nccl_premul_sum
    # rank i's factor is i + 1 (a tensor) or 0.5 (a number): exact sums of small integers
    factors = {
        "number": (premul(0.5), [0.5] * p),
        "tensor": (premul(torch.tensor([r + 1.0])), range(1, p + 1)),
    }
    for kind, (op, every) in factors.items():
        total = sum(f * (i + 1) for i, f in enumerate(every))  # rank i's values are i + 1
        with problems.guard(f"all_reduce, {kind} factor"):
            t = torch.full((5,), r + 1.0, dtype=torch.float64)
            dist.all_reduce(t, op=op)
            problems.expect(torch.equal(t, torch.full((5,), total, dtype=torch.float64)), f"all_reduce {t}")
            halves = [torch.full((3,), r + 1.0, dtype=torch.bfloat16), torch.full((2, 3), r + 1.0).t()]
            dist.all_reduce(halves[0], op=op, async_op=True).wait()
            with dist._coalescing_manager():
                dist.all_reduce(halves[1], op=op)
            for t in halves:
                problems.expect(torch.equal(t, torch.full_like(t, total)), f"all_reduce {t}")
        with problems.guard(f"reduce, {kind} factor"):
            t = torch.full((4,), r + 1.0)
            dist.reduce(t, dst=p - 1, op=op)
            expected = total if r == p - 1 else r + 1.0  # a rank that is not the root keeps its tensor
            problems.expect(torch.equal(t, torch.full((4,), expected)), f"reduce {t}")
        with problems.guard(f"reduce_scatter, {kind} factor"):
            inputs = [torch.full((2,), r + 1.0) for _ in range(p)]
            out = torch.empty(2)
            dist.reduce_scatter(out, inputs, op=op)
            problems.expect(torch.equal(out, torch.full((2,), total)), f"reduce_scatter {out}")
            whole = torch.full((3 * p,), r + 1.0)
            reduce_scatter_single(out := torch.empty(3), whole, op=op)
            problems.expect(torch.equal(out, torch.full((3,), total)), f"reduce_scatter_single {out}")
            problems.expect(torch.equal(whole, torch.full((3 * p,), r + 1.0)), f"its input changed: {whole}")
            outs = [torch.empty(1), torch.empty(2)]
            with dist._coalescing_manager():
                for out in outs:
                    reduce_scatter_single(out, torch.full((out.numel() * p,), r + 1.0), op=op)
            for out in outs:
                problems.expect(torch.equal(out, torch.full_like(out, total)), f"coalesced {out}")
    refused = "'premul_sum' scales floating tensors, not torch.int32 ones"
    with problems.guard("an integer tensor"), pytest.raises(UnsupportedOpError, match=re.escape(refused)):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=premul(2.0))
    problems.check()
