"""The fast link-model prediction (``predict_fast``) against the exact one, and the bench's rank sweep."""

from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.simulate import main, sweep
from collectives.algorithms import ALGORITHMS, build_schedule, hierarchical
from collectives.algorithms.base import implements
from collectives.schedule import Schedule
from collectives.specs import COLLECTIVES
from collectives.topology import Topology, dgx1
from collectives.topology.cost_model import predict, predict_fast
from collectives.topology.presets import multi_node
from collectives.topology.strategies import aggregate_on, split_aggregation

SHAPES = [(2, 1), (2, 4), (3, 2), (4, 8), (8, 8), (5, 3), (16, 4)]
COUNTS = [0, 1, 7, 1001, 2**20 + 3]


def _agree(schedule: Schedule, topology: Topology, placement: Sequence[str] | None = None) -> None:
    exact = predict(schedule, topology, 4, placement)
    fast = predict_fast(schedule, topology, 4, placement)
    # the same routes summed the same way: equal link by link, within 1% a fortiori
    assert fast == exact
    assert fast.time_s == pytest.approx(exact.time_s, rel=0.01)


@pytest.mark.parametrize(("nodes", "gpus"), SHAPES)
@pytest.mark.parametrize("count", COUNTS)
def test_every_algorithm_agrees_with_the_exact_prediction(nodes: int, gpus: int, count: int) -> None:
    topology = multi_node(nodes, gpus, 100)
    world = nodes * gpus
    for collective in COLLECTIVES:
        for name, module in ALGORITHMS.items():
            if not implements(module, collective):
                continue
            # alltoall takes whole rows per rank, the barrier no data
            elements = 0 if collective == "barrier" else count * world if collective == "alltoall" else count
            schedule = build_schedule(collective, name, world, elements)
            _agree(schedule, topology)


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 4), (4, 8), (8, 8)])
def test_the_strategies_agree_with_the_exact_prediction(nodes: int, gpus: int) -> None:
    topology = multi_node(nodes, gpus, 100)
    for device in (topology.gpus[0], "cpu0"):
        strategy = aggregate_on(topology, device, 1000)
        _agree(strategy.schedule, topology, strategy.placement)
    split = split_aggregation(topology, 1001)
    _agree(split.schedule, topology, split.placement)


def test_a_topology_without_one_network_switch_is_predicted_exactly() -> None:
    schedule = build_schedule("allreduce", "ring", 8, 1000)
    assert predict_fast(schedule, dgx1(), 4) == predict(schedule, dgx1(), 4)


def test_the_sweep_predicts_every_algorithm_as_the_exact_model_does() -> None:
    found = sweep("allreduce", 4000, 4, gpus_per_node=4, nic_gbps=100, max_ranks=16)
    assert found.ranks == (2, 4, 8, 16)
    registered = [n for n, m in ALGORITHMS.items() if implements(m, "allreduce")]
    assert list(found.times) == [*registered, "hierarchical (nodes)"]
    for p, column in zip(found.ranks, zip(*found.times.values(), strict=True), strict=True):
        topology = multi_node(max(p // 4, 1), min(p, 4), 100)
        for name, time_s in zip(registered, column[:-1], strict=True):
            schedule = build_schedule("allreduce", name, p, 1000)
            assert time_s == pytest.approx(predict(schedule, topology, 4).time_s, rel=1e-9)
        fitted = hierarchical.for_topology("allreduce", p, 1000, topology)
        assert column[-1] == (None if fitted is None else pytest.approx(predict(fitted, topology, 4).time_s))
    assert found.stopped == {}


def test_sweep_ranks_prints_the_curve_and_plots_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "sweep.png"
    argv = [
        "--topology",
        "multi_node:2,4,100",
        "--size",
        "1MB",
        "--sweep-ranks",
        "16",
        "--plot",
        str(picture),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "on multi_node(P/4, 4, 100), predicted ms against ranks" in out
    assert [line.split()[0] for line in out.splitlines() if not line.startswith("#")] == ["2", "4", "8", "16"]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_ranks_needs_a_multi_node_topology() -> None:
    with pytest.raises(SystemExit):
        main(["--topology", "dgx1", "--sweep-ranks", "16"])
