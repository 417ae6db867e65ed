"""The collectives c10d backend's calls beyond allreduce, on loopback ranks (threads, no MPI)."""

import threading
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

from torch._C import _distributed_c10d as c10d  # noqa: E402

from collectives import Communicator  # noqa: E402
from collectives.errors import CollectiveTimeout, InvalidBufferError, InvalidRootError, PeerInputError  # noqa: E402
from collectives.torch_integration import process_group as ti_process_group  # noqa: E402
from collectives.torch_integration.process_group import base as ti_process_group_base  # noqa: E402
from collectives.torch_integration.worker import background_worker  # noqa: E402

Ranks = Callable[..., list[Any]]
P = 3


def _group(comm: Communicator) -> Any:
    return ti_process_group.MPIProcessGroup(Communicator(comm.transport, timeout=20.0, stall_warning=0))


def _rooted(kind: type, root: int, op: Any = None) -> Any:
    options = kind()
    options.rootRank = root
    if op is not None:
        options.reduceOp = op
    return options


def test_reduce_gather_scatter_at_every_root(ranks: Ranks) -> None:
    def run(comm: Communicator) -> list[Any]:
        group, r = _group(comm), comm.rank
        out = []
        for root in range(P):
            reduced = torch.full((2, 2), float(r + 1))
            group.reduce(
                [reduced], _rooted(c10d.ReduceOptions, root, torch.distributed.ReduceOp.PRODUCT)
            ).wait()
            gathered = [[torch.empty(3, dtype=torch.int16) for _ in range(P)]] if r == root else []
            group.gather(
                gathered, [torch.full((3,), r, dtype=torch.int16)], _rooted(c10d.GatherOptions, root)
            ).wait()
            share = torch.zeros(4, 2).t()  # strided: written through a contiguous stage
            inputs = [[torch.full((2, 4), float(10 * i + root)) for i in range(P)]] if r == root else []
            group.scatter([share], inputs, _rooted(c10d.ScatterOptions, root)).wait()
            out.append((reduced, gathered, share))
        return out

    for r, per_root in enumerate(ranks(P, run)):
        for root, (reduced, gathered, share) in enumerate(per_root):
            if r == root:
                assert torch.equal(reduced, torch.full((2, 2), 6.0))
                assert [t.tolist() for t in gathered[0]] == [[i] * 3 for i in range(P)]
            assert torch.equal(share, torch.full((2, 4), float(10 * r + root)))


def test_all_to_all_and_uneven_all_to_all_single(ranks: Ranks) -> None:
    def run(comm: Communicator) -> tuple[list[Any], Any]:
        group, r = _group(comm), comm.rank
        outputs = [torch.empty(2, dtype=torch.bool) for _ in range(P)]
        inputs = [torch.tensor([r == j, True]) for j in range(P)]
        group.alltoall(outputs, inputs, c10d.AllToAllOptions()).wait()
        sends = [r + j for j in range(P)]  # rank r sends r + j rows to rank j (none from 0 to 0)
        rows = torch.cat([torch.full((n, 3), 10.0 * r + j) for j, n in enumerate(sends)])
        received = torch.empty(sum(i + r for i in range(P)), 3)
        group.all_to_all_single(
            received, rows, [i + r for i in range(P)], sends, c10d.AllToAllOptions()
        ).wait()
        return outputs, received

    for r, (outputs, received) in enumerate(ranks(P, run)):
        assert [t.tolist() for t in outputs] == [[i == r, True] for i in range(P)]
        expected = torch.cat([torch.full((i + r, 3), 10.0 * i + r) for i in range(P)])
        assert torch.equal(received, expected)


def test_send_recv_and_recv_from_any_source(ranks: Ranks) -> None:
    def run(comm: Communicator) -> Any:
        group, r = _group(comm), comm.rank
        if r == 0:
            got = {}
            for _ in range(P - 1):
                message = torch.empty(2, 3)
                work = group.recv_anysource([message], 4)
                work.wait()
                got[work._source_rank()] = message
            exact = torch.empty(5, dtype=torch.bfloat16)
            group.recv([exact], 1, 0).wait()
            return got, exact
        group.send([torch.full((3, 2), float(r)).t()], 0, 4).wait()  # strided: sent from a copy
        if r == 1:
            group.send([torch.arange(5, dtype=torch.bfloat16)], 0, 0).wait()
        return None

    got, exact = ranks(P, run)[0]
    assert sorted(got) == list(range(1, P))
    assert all(torch.equal(message, torch.full((2, 3), float(source))) for source, message in got.items())
    assert torch.equal(exact, torch.arange(5, dtype=torch.bfloat16))


def test_bool_reductions_are_logic_and_sparse_tensors_are_summed(ranks: Ranks) -> None:
    ReduceOp = torch.distributed.ReduceOp

    def run(comm: Communicator) -> dict[str, Any]:
        group, r = _group(comm), comm.rank
        out = {}
        for name, op in (("sum", ReduceOp.SUM), ("product", ReduceOp.PRODUCT), ("max", ReduceOp.MAX)):
            flags = torch.tensor([r == 0, True, False])
            options = c10d.AllreduceOptions()
            options.reduceOp = op
            group.allreduce([flags], options).wait()
            out[name] = flags.tolist()
        sparse = torch.sparse_coo_tensor([[r, P]], [1.0, float(r)], (P + 1,), check_invariants=True)
        group.allreduce([sparse], c10d.AllreduceOptions()).wait()
        out["sparse"] = sparse.to_dense().tolist()
        return out

    for out in ranks(P, run):
        assert out["sum"] == out["max"] == [True, True, False]
        assert out["product"] == [False, True, False]
        assert out["sparse"] == [1.0] * P + [float(sum(range(P)))]


BAD_CALLS: list[tuple[str, Callable[[Any, int], Any], type, str]] = [
    ("reduce", lambda g, r: g.reduce([torch.ones(2)], _rooted(c10d.ReduceOptions, P if r == 1 else 0)),
     InvalidRootError, "root 3 is not a rank"),
    ("scatter", lambda g, r: g.scatter([torch.ones(2)], [[torch.ones(3)] * P] if r == 0 else [],
                                       _rooted(c10d.ScatterOptions, 0)),
     InvalidBufferError, "scatter needs 3 inputs of shape"),
    ("alltoall", lambda g, r: g.all_to_all_single(torch.empty(3), torch.ones(3), [1, 1, 1],
                                                  [1, 1, 1] if r != 1 else [2, 1, 1], c10d.AllToAllOptions()),
     InvalidBufferError, "do not cut"),
]  # fmt: skip


@pytest.mark.parametrize(("collective", "call", "kind", "message"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_a_bad_call_on_one_rank_fails_every_rank(
    ranks: Ranks, collective: str, call: Callable[[Any, int], Any], kind: type, message: str
) -> None:
    def run(comm: Communicator) -> tuple[str, str]:
        group = _group(comm)
        try:
            call(group, comm.rank).wait()
        except Exception as error:
            return type(error).__name__, str(error)
        return "no error", ""

    results = ranks(P, run, timeout=40.0)
    bad = [r for r, (kind_, _) in enumerate(results) if kind_ == kind.__name__]
    assert bad, results
    assert all(message in results[r][1] for r in bad), results
    for r, (kind_, text) in enumerate(results):
        if r not in bad:
            assert kind_ == PeerInputError.__name__ and collective in text, (r, kind_, text)


def test_a_message_with_a_negative_tag_or_two_tensors_is_refused(ranks: Ranks) -> None:
    def run(comm: Communicator) -> None:
        group = _group(comm)
        with pytest.raises(InvalidBufferError, match="non-negative"):
            group.send([torch.ones(1)], 0, -1)
        with pytest.raises(InvalidBufferError, match="one tensor"):
            group.recv([torch.ones(1), torch.ones(1)], 0, 0)
        with pytest.raises(InvalidRootError, match="destination 5"):
            group.send([torch.ones(1)], 5, 0)

    ranks(1, run)


def _gated_group(comm: Communicator) -> tuple[Any, threading.Event]:
    """A group whose thread waits for the event first, so the calls after finish on that thread."""
    communicator = Communicator(comm.transport, timeout=20.0, stall_warning=0)
    gate = threading.Event()
    background_worker(communicator).submit(gate.wait)
    return ti_process_group.MPIProcessGroup(communicator), gate


def test_a_callback_on_the_groups_thread_starts_calls_and_waits_for_them(ranks: Ranks) -> None:
    # as DDP's PowerSGD hook does: its callbacks run on the thread that must run what they wait for
    def run(comm: Communicator) -> list[list[float]]:
        group, gate = _gated_group(comm)
        first, second, queued = torch.ones(2), torch.ones(3), torch.ones(1)
        later = group.allreduce([queued])  # submitted before the callback runs, after the first call

        def then(done: Any) -> Any:
            group.allreduce([second]).get_future().wait()
            later.wait()
            return done.value()

        chained = group.allreduce([first]).get_future().then(then)
        gate.set()
        chained.wait()
        group.barrier().wait()
        return [first.tolist(), second.tolist(), queued.tolist()]

    for out in ranks(2, run, timeout=40.0):
        assert out == [[2.0, 2.0], [2.0, 2.0, 2.0], [2.0]]


def test_a_wait_that_could_never_end_raises_after_the_timeout(ranks: Ranks) -> None:
    def run(comm: Communicator) -> None:
        worker = background_worker(Communicator(comm.transport, timeout=1.0, stall_warning=0))
        gate, later = threading.Event(), []

        def first() -> None:  # waits on its own thread for a job queued after it
            gate.wait()
            ti_process_group_base.GroupWork(later[0], None).wait()

        earlier = worker.submit(first)
        later.append(worker.submit(lambda: None))
        gate.set()
        with pytest.raises(CollectiveTimeout, match="ran no job for 1 s"):
            ti_process_group_base.GroupWork(earlier, None).wait()

    ranks(1, run, timeout=20.0)
