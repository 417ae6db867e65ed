"""Fast link-model predictions (``predict_fast``, from rank programs) against the exact one; the sweep."""

from collections.abc import Sequence
from pathlib import Path

import pytest

import collectives
from collectives import algorithms, prediction
from collectives.algorithms import ALGORITHMS, build_schedule, hierarchical, rank_program, registry
from collectives.algorithms.base import implements, topology_program_builder
from collectives.bench.simulate import main, sweep
from collectives.errors import TopologyError
from collectives.prediction import predict_algorithm, predicts_by_sample, traffic_on
from collectives.schedule import RankProgram, Schedule
from collectives.specs import COLLECTIVES, get_spec
from collectives.topology import Device, Link, Topology, dgx1
from collectives.topology.cost_model import traffic
from collectives.topology.link_model import predict, predict_fast
from collectives.topology.presets import multi_node
from collectives.topology.programs import predict_programs
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


# --- predictions from ranks' programs (collectives.prediction), as bench simulate makes them at 4,096 ranks

BIG = multi_node(512, 8, 100)  # 4,096 ranks; only rank 0's programs are built here
ALLREDUCE = [name for name, module in ALGORITHMS.items() if implements(module, "allreduce")]


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 4), (3, 2), (4, 8)])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
def test_following_every_machine_is_the_exact_prediction(nodes: int, gpus: int, collective: str) -> None:
    topology = multi_node(nodes, gpus, 100)
    world = nodes * gpus
    for name, module in ALGORITHMS.items():
        if not implements(module, collective):
            continue
        exact = predict(build_schedule(collective, name, world, 10**5 + 3), topology, 4)
        found = predict_programs(
            lambda r, name=name: rank_program(collective, name, world, 10**5 + 3, rank=r), world, topology, 4
        )
        assert found.sampled_nodes is None
        assert found.time_s == pytest.approx(exact.time_s, rel=1e-12)
        assert [s.bandwidth_s for s in found.per_step] == pytest.approx(
            [s.bandwidth_s for s in exact.per_step]
        )
        assert found.link_bytes == exact.link_bytes


@pytest.mark.parametrize("name", ALLREDUCE)
@pytest.mark.parametrize(("nodes", "gpus"), [(8, 8), (16, 4), (4, 8)])
@pytest.mark.parametrize("count", [10**6, 2**20 + 3])
def test_the_fast_prediction_agrees_within_one_percent(name: str, nodes: int, gpus: int, count: int) -> None:
    # as at 4,096 ranks: where bench simulate samples machines there, sample them here too
    sampled = predicts_by_sample("allreduce", name, count, BIG)
    topology = multi_node(nodes, gpus, 100)
    found = predict_algorithm(
        "allreduce", name, count, 4, topology, fitted=False, budget=0 if sampled else 10**6
    )
    exact = predict(build_schedule("allreduce", name, nodes * gpus, count), topology, 4)
    if sampled and name != "direct":  # direct's root machine is unlike the others: all are followed
        assert found.sampled_nodes == (0, nodes // 2, nodes - 1)
    assert found.time_s == pytest.approx(exact.time_s, rel=0.01)


def test_at_four_thousand_ranks_the_large_schedules_are_sampled_and_the_trees_are_not() -> None:
    sampled = {name for name in ALLREDUCE if predicts_by_sample("allreduce", name, 2**24, BIG)}
    assert {"ring", "halving_doubling", "multi_ring", "hierarchical", "shared_memory"} <= sampled
    assert not {"tree", "double_tree", "butterfly"} & sampled


def test_the_fitted_hierarchical_allreduce_agrees_with_its_schedule() -> None:
    topology = multi_node(8, 4, 100)
    exact = predict(hierarchical.allreduce(32, 10**6, 4), topology, 4)
    for budget in (10**6, 0):
        found = predict_algorithm("allreduce", "hierarchical", 10**6, 4, topology, budget=budget)
        assert found.schedule == "allreduce-hierarchical(n=32,local=4)"
        assert found.time_s == pytest.approx(exact.time_s, rel=0.01)
    assert traffic_on("allreduce", "hierarchical", 10**6, topology) == (
        exact.schedule,
        traffic(hierarchical.allreduce(32, 10**6, 4)),
    )


def test_a_sample_needs_one_network_switch() -> None:
    def program(rank: int) -> RankProgram:
        return rank_program("allreduce", "ring", 2, 100, rank=rank)

    two = Topology("two", (Device("gpu0", "gpu", 0), Device("gpu1", "gpu", 1)), (Link("gpu0", "gpu1", 1e9),))
    with pytest.raises(TopologyError, match="no one network switch"):
        predict_programs(program, 2, two, 4, nodes=[0])
    with pytest.raises(TopologyError, match="no rank runs on machine 5"):
        predict_programs(program, 2, two, 4, nodes=[5])
    assert (
        predict_programs(program, 2, two, 4).time_s
        == predict(build_schedule("allreduce", "ring", 2, 100), two, 4).time_s
    )


def test_explain_on_many_machines_builds_no_large_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # 512 ranks: the ring's schedule would hold 523,264 transfers, past GLOBAL_TRANSFERS
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"built a schedule: {args[:3]}")

    for name in ("ring", "hierarchical"):
        monkeypatch.setattr(ALGORITHMS[name], "allreduce", refuse)
    monkeypatch.setattr(registry, "_cached", refuse)
    machines = multi_node(64, 8, 100)
    explanation = collectives.explain("allreduce", 2**24, world_size=512, topology=machines)
    found = {c.algorithm: c for c in explanation.candidates}
    assert found["hierarchical"].schedule == "allreduce-hierarchical(n=512,local=8)"
    assert found["ring"].traffic.steps == 2 * 511
    assert explanation.choice == "hierarchical"


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 4), (3, 2), (4, 1), (2, 3)])
def test_the_fitted_hierarchical_programs_are_the_projections_of_its_schedule(nodes: int, gpus: int) -> None:
    topology = multi_node(nodes, gpus, 100)
    world = nodes * gpus
    assert topology_program_builder(hierarchical) is hierarchical.for_topology_program
    assert topology_program_builder(ALGORITHMS["ring"]) is None
    for count in (0, 5, 1001):
        schedule = hierarchical.for_topology("allreduce", world, count, topology)
        assert schedule is not None
        for rank in range(world):
            program = hierarchical.for_topology_program("allreduce", world, count, topology, rank)
            assert program is not None and program.name == schedule.name
            assert program.steps == schedule.program(rank)
            assert program.chunk_sizes == schedule.chunk_sizes
    assert hierarchical.for_topology_program("allreduce", 8, 10, multi_node(1, 8, 100), 0) is None
    assert hierarchical.for_topology_program("broadcast", world, 10, topology, 0) is None


@pytest.mark.parametrize("collective", [c for c in COLLECTIVES if c != "barrier"])
def test_a_forced_sample_agrees_within_one_percent_for_every_collective(collective: str) -> None:
    # machines 0, 4 and 7 of 8 stand for all where they are alike; where not, every machine is followed
    topology = multi_node(8, 8, 100)
    count = 2**20 * (64 if collective == "alltoall" else 1)
    followed = set()
    for name, module in ALGORITHMS.items():
        if not implements(module, collective):
            continue
        exact = predict(build_schedule(collective, name, 64, count), topology, 4)
        found = predict_algorithm(collective, name, count, 4, topology, fitted=False, budget=0)
        assert found.sampled_nodes in (None, (0, 4, 7))
        followed.add(found.sampled_nodes)
        assert found.time_s == pytest.approx(exact.time_s, rel=0.01), name
    # a rooted collective's root machine is unlike the others; elsewhere the ring's machines are alike
    assert ((0, 4, 7) in followed) == (not get_spec(collective).rooted)


def test_machines_unlike_the_others_are_not_sampled() -> None:
    # a tree's machines differ, and so do the machines of a rooted collective
    topology = multi_node(8, 8, 100)
    for collective, name in [("allreduce", "tree"), ("broadcast", "ring"), ("reduce", "direct")]:
        exact = predict(build_schedule(collective, name, 64, 2**20), topology, 4)
        found = predict_algorithm(collective, name, 2**20, 4, topology, fitted=False, budget=0)
        assert found.sampled_nodes is None
        assert found.time_s == pytest.approx(exact.time_s, rel=1e-12)


def test_a_rank_given_quadratic_work_is_refused_before_it_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    # direct's reduce-scatter gives rank 0 P squared transfers: foreseen from P/8 and P/4 ranks
    monkeypatch.setattr(prediction, "PROGRAM_ENTRIES", 200_000)
    machines = multi_node(128, 8, 100)
    built: list[int] = []
    real = algorithms.rank_program

    def spy(*args: object, **kwargs: object) -> object:
        built.append(int(str(args[2])))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(algorithms, "rank_program", spy)
    with pytest.raises(ValueError, match=r"gives rank 0 about 1,04\d,\d{3} transfers at 1024 ranks"):
        predict_algorithm("reduce_scatter", "direct", 2**20, 4, machines)
    assert built == [128, 256]  # never at 1,024
    found = predict_algorithm("reduce_scatter", "ring", 2**20, 4, machines)
    assert found.time_s > 0
