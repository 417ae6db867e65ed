"""torch's own clients on the collectives backend at 2 ranks: FSDP2, DTensor, tensor parallel, DDP's hooks.

Each trains or redistributes as it does on gloo (bit for bit, both process groups in one job) and,
where a single process can compute the same, as one process does.
"""

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")
dist = torch.distributed

import collectives.torch_integration  # noqa: E402, F401 - registers the backend and mpi://
from tests.mpi.helpers import Problems  # noqa: E402

# importing DTensor and FSDP costs seconds a process, and these clients do not depend on the world size
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(MPI.COMM_WORLD.size != 2, reason="runs at 2 ranks, the MPI suite's others skip it"),
]

ONE_PROCESS_TOLERANCE = 1e-6
"""Largest gap from one process's parameters (float32 sums in another order)."""


@pytest.fixture
def gloo(group: int) -> Iterator["dist.ProcessGroup"]:
    """A gloo group of every rank beside the default collectives one, to train the same model on."""
    gloo_group = dist.new_group(list(range(group)), backend="gloo")
    try:
        yield gloo_group
    finally:
        dist.destroy_process_group(gloo_group)


def _expect_same(problems: Problems, label: str, ours: list[Any], theirs: list[Any]) -> None:
    for i, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
        gap = (mine - other).abs().max().item()
        problems.expect(torch.equal(mine, other), f"{label}: parameter {i} differs from gloo's by {gap:.3g}")


def _expect_close(problems: Problems, label: str, ours: list[Any], expected: list[Any]) -> None:
    for i, (mine, other) in enumerate(zip(ours, expected, strict=True)):
        gap = (mine - other).abs().max().item()
        problems.expect(gap <= ONE_PROCESS_TOLERANCE, f"{label}: parameter {i} is {gap:.3g} from one process")


VOCABULARY, WIDTH, STEPS, LR = 32, 16, 3, 0.1


class _TinyLanguageModel(torch.nn.Module):
    """An embedding, two encoder layers (no dropout) and a head over every position's features."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, WIDTH)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(WIDTH, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
            for _ in range(2)
        )
        self.head = torch.nn.Linear(WIDTH, VOCABULARY)

    def forward(self, tokens: "torch.Tensor") -> "torch.Tensor":
        features = self.embedding(tokens)
        for layer in self.layers:
            features = layer(features)
        return self.head(features.reshape(-1, WIDTH))  # 2-D, so not a view (FSDP2 warns of one)


def _transformer() -> _TinyLanguageModel:
    torch.manual_seed(0)
    return _TinyLanguageModel()


def _language_loss(model: "torch.nn.Module", rank: int, step: int) -> "torch.Tensor":
    """Next-token loss on a batch of its own for each rank and step."""
    tokens = torch.randint(VOCABULARY, (2, 9), generator=torch.Generator().manual_seed(100 * rank + step))
    return torch.nn.functional.cross_entropy(model(tokens[:, :-1]), tokens[:, 1:].reshape(-1))


def _one_process(ranks: int, divide: float) -> list[Any]:
    """The transformer trained on every rank's batch in one process: the gradients summed, then divided."""
    model = _transformer()
    for step in range(STEPS):
        grads = [torch.zeros_like(param) for param in model.parameters()]
        for rank in range(ranks):
            model.zero_grad()
            _language_loss(model, rank, step).backward()
            for grad, param in zip(grads, model.parameters(), strict=True):
                grad += param.grad
        with torch.no_grad():
            for grad, param in zip(grads, model.parameters(), strict=True):
                param -= LR * grad / divide
    return [param.detach() for param in model.parameters()]


def _fsdp2(process_group: "dist.ProcessGroup", rank: int, factor: float | None) -> list[Any]:
    """The transformer trained with FSDP2 (each encoder layer sharded, then the root) on the group."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(process_group, "cpu")
    model = _transformer()
    for module in (*model.layers, model):
        fully_shard(module, mesh=mesh)
        if factor is not None:
            module.set_gradient_divide_factor(factor)  # type: ignore[operator]
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        _language_loss(model, rank, step).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [param.full_tensor().detach() for param in model.parameters()]  # type: ignore[attr-defined]


def test_fsdp2_trains_a_transformer_as_gloo_and_one_process_do(
    group: int, gloo: "dist.ProcessGroup", world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    with problems.guard("FSDP2 on both backends"):
        ours = _fsdp2(dist.group.WORLD, world.rank, None)
        theirs = _fsdp2(gloo, world.rank, None)
        _expect_same(problems, "FSDP2", ours, theirs)
        _expect_close(problems, "FSDP2", ours, _one_process(group, group))
    problems.check()


def test_fsdp2_with_a_gradient_divide_factor_trains_as_one_process_does(
    group: int, world: MPI.Intracomm
) -> None:
    # FSDP2 reduces with PREMUL_SUM(1 / factor), which gloo refuses: one process is the reference
    factor = 4.0  # not the world size, which FSDP2 would turn into an average
    problems = Problems(world)
    with problems.guard("FSDP2 with set_gradient_divide_factor"):
        _expect_close(
            problems, "divided", _fsdp2(dist.group.WORLD, world.rank, factor), _one_process(group, factor)
        )
    problems.check()


def _bf16_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16_compress_hook under another name: DDP refuses that name unless NCCL runs it."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(state, bucket)


def _hooks() -> dict[str, Callable[["dist.ProcessGroup"], tuple[Any, Callable[..., Any]]]]:
    """Each DDP hook by name: from the process group, the hook's state and the hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    def power_sgd(process_group: "dist.ProcessGroup") -> tuple[Any, Callable[..., Any]]:
        # compressed from the third step on; the first two are plain allreduces
        state = powersgd.PowerSGDState(process_group=process_group, start_powerSGD_iter=2)
        return state, powersgd.powerSGD_hook

    return {
        "fp16": lambda process_group: (process_group, default_hooks.fp16_compress_hook),
        "bf16": lambda process_group: (process_group, _bf16_hook),
        "PowerSGD": lambda process_group: power_sgd(process_group),
    }


@pytest.mark.parametrize("hook", ["fp16", "bf16", "PowerSGD"])
def test_ddp_with_torchs_hooks_trains_as_it_does_on_gloo(
    hook: str, group: int, gloo: "dist.ProcessGroup", world: MPI.Intracomm
) -> None:
    # PowerSGD starts a collective, and waits for it, inside a callback of another's future
    problems = Problems(world)
    with problems.guard(f"DDP with the {hook} hook on both backends"):
        trained = []
        for process_group in (dist.group.WORLD, gloo):
            torch.manual_seed(0)
            net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
            model = torch.nn.parallel.DistributedDataParallel(net, process_group=process_group)
            model.register_comm_hook(*_hooks()[hook](process_group))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            data = torch.Generator().manual_seed(world.rank)
            for _ in range(5):
                model(torch.randn(5, 8, generator=data)).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            trained.append([param.detach().clone() for param in model.parameters()])
        _expect_same(problems, hook, *trained)
    problems.check()


def test_dtensor_redistributes_between_placements_on_a_device_mesh(group: int, world: MPI.Intracomm) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    p, r = group, world.rank
    # whole numbers, so every sum is exact; rows that do not split evenly
    full = torch.arange(float((2 * p + 1) * 2 * p)).reshape(2 * p + 1, 2 * p)
    problems = Problems(world)
    with problems.guard("a 2-D mesh and its slice"):
        mesh = init_device_mesh("cpu", (1, p), mesh_dim_names=("dp", "tp"))["tp"]
        problems.expect(mesh.size() == p and mesh.get_local_rank() == r, f"the tp slice: {mesh}")
    moves = [
        ("all_gather", [Shard(0)], [Replicate()]),
        ("all_to_all", [Shard(0)], [Shard(1)]),
        ("all_to_all back", [Shard(1)], [Shard(0)]),
        ("local chunk", [Replicate()], [Shard(1)]),
    ]
    for label, start, end in moves:
        with problems.guard(label):
            moved = distribute_tensor(full, mesh, start).redistribute(mesh, end)
            expected = full if end == [Replicate()] else full.tensor_split(p, dim=end[0].dim)[r]  # type: ignore[attr-defined]
            problems.expect(torch.equal(moved.to_local(), expected), f"{label}: {moved.to_local()}")
            problems.expect(torch.equal(moved.full_tensor(), full), f"{label}: full {moved.full_tensor()}")
    partial_moves = [
        ("all_reduce", Partial(), [Replicate()], full * sum(range(1, p + 1))),
        ("reduce_scatter", Partial(), [Shard(0)], (full * sum(range(1, p + 1))).tensor_split(p)[r]),
        ("max", Partial("max"), [Replicate()], full * p),
    ]
    for label, partial, end, expected in partial_moves:
        with problems.guard(label):
            mine = DTensor.from_local(full * (r + 1), mesh, [partial], run_check=False)
            moved = mine.redistribute(mesh, end).to_local()
            problems.expect(torch.equal(moved, expected), f"{label}: {moved}")
    with problems.guard("matmul of shards"):
        left = distribute_tensor(full, mesh, [Shard(1)])
        right = distribute_tensor(full.t().contiguous(), mesh, [Shard(0)])
        product = (left @ right).full_tensor()  # partial sums, then an all_reduce
        problems.expect(torch.equal(product, full @ full.t()), f"matmul: {product}")
    problems.check()


def _mlp() -> "torch.nn.Sequential":
    from collections import OrderedDict

    torch.manual_seed(0)
    layers = [("up", torch.nn.Linear(8, 16)), ("act", torch.nn.ReLU()), ("down", torch.nn.Linear(16, 8))]
    return torch.nn.Sequential(OrderedDict(layers))


def _train_mlp(model: "torch.nn.Module") -> list[Any]:
    """Steps on the same batch at every rank, as tensor parallelism takes a replicated input."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        model(torch.randn(4, 8, generator=torch.Generator().manual_seed(step))).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [getattr(param, "full_tensor", param.clone)().detach() for param in model.parameters()]


def test_tensor_parallel_mlp_trains_as_gloo_and_one_process_do(
    group: int, gloo: "dist.ProcessGroup", world: MPI.Intracomm
) -> None:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    problems = Problems(world)
    with problems.guard("Colwise/Rowwise MLP on both backends"):
        trained = []
        for process_group in (dist.group.WORLD, gloo):
            mesh = DeviceMesh.from_group(process_group, "cpu")
            plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
            trained.append(_train_mlp(parallelize_module(_mlp(), mesh, plan)))
        _expect_same(problems, "tensor parallel", *trained)
        _expect_close(problems, "tensor parallel", trained[0], _train_mlp(_mlp()))
    problems.check()
