"""``bench simulate --parameter-servers``: the seeds' O(m) and O(m / n) as predicted rounds; no MPI."""

from functools import partial
from pathlib import Path

import pytest

from collectives.bench.parameter_servers import parameter_server_sweep
from collectives.bench.simulate import main
from collectives.schedule import RankProgram, Schedule, Step
from collectives.topology import multi_node, predict
from collectives.topology.programs import predict_programs
from collectives.topology.strategies import server_program, split_star, split_star_program

SIZE = 4 * 10**6  # bytes: the bandwidth terms dwarf the microseconds of latency


def _global(programs: list[RankProgram]) -> Schedule:
    """The schedule whose projections the programs are: each step, every rank's sends."""
    first = programs[0]
    steps = tuple(Step(t for p in programs for t in p.steps[i].sends) for i in range(len(first.steps)))
    return Schedule(first.name, first.collective, first.world_size, first.chunk_sizes, steps)


def test_the_server_programs_pair_up_and_predict_as_their_schedule() -> None:
    topology = multi_node(3, 2, 100)  # two workers' machines, one server's
    programs = [server_program(4, 2, 1001, rank) for rank in range(6)]
    schedule = _global(programs)
    for rank, program in enumerate(programs):  # every receive is some rank's send, and only that
        assert schedule.program(rank) == program.steps
    placement = (*topology.gpus[:4], "cpu2", "cpu1")
    exact = predict(schedule, topology, 4, placement)
    found = predict_programs(partial(server_program, 4, 2, 1001), 6, topology, 4, placement)
    assert found.time_s == pytest.approx(exact.time_s, rel=1e-12)
    assert found.link_bytes == exact.link_bytes


def test_the_colocated_servers_are_the_split_aggregation() -> None:
    for rank in range(5):
        assert split_star_program(5, 17, rank).steps == split_star(5, 17).program(rank)


@pytest.mark.parametrize("bad", [(2, 0, 10, 0), (0, 1, 10, 0), (2, 1, 10, 3), (2, 1, 10, -1)])
def test_a_rank_outside_the_store_is_refused(bad: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        server_program(*bad)


def test_one_server_is_o_of_m_and_n_servers_o_of_m_over_n() -> None:
    found = parameter_server_sweep(SIZE, 4, gpus_per_node=2, nic_gbps=100, max_machines=8, servers=2)
    assert found.ranks == (1, 2, 4, 8) and found.axis == "machines"
    central = found.times["central server"]
    sharded = found.times["2 sharded servers"]
    colocated = found.times["colocated (every rank a server)"]
    assert all(t is not None for t in (*central, *sharded, *colocated))
    # a round is two steps through the server's NIC of 12.5 GB/s, 2 m G S / B, and two routes of 9 us
    latency = 2 * 9e-6
    for m, seconds in zip(found.ranks, central, strict=True):
        assert seconds == pytest.approx(2 * m * 2 * SIZE / 12.5e9 + latency, rel=1e-9)
    for m, one, two in zip(found.ranks, central, sharded, strict=True):
        assert one is not None and two is not None
        # half the load on each server's NIC, until the workers' own NIC binds (one machine)
        assert two - latency == pytest.approx((one - latency) / (2 if m >= 2 else 1), rel=1e-9)
    # colocated: every machine's NIC carries (W - G) / W of its GPUs' buffers each way, bounded by 2 G S / B
    assert colocated[-1] is not None and colocated[-1] < 2 * 2 * SIZE / 12.5e9
    assert colocated[-1] < central[-1] / 4


def test_the_command_prints_and_plots_the_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "ps.png"
    argv = ["--topology", "multi_node:4,2,100", "--size", "4MB", "--parameter-servers", "--servers", "2"]
    assert main([*argv, "--plot", str(picture)]) == 0
    out = capsys.readouterr().out
    assert "central server" in out and "2 sharded servers" in out and "predicted ms against machines" in out
    assert [line.split()[0] for line in out.splitlines() if not line.startswith("#")] == ["1", "2", "4"]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_servers_must_be_some() -> None:
    with pytest.raises(SystemExit):
        main(["--topology", "multi_node:2,2,100", "--parameter-servers", "--servers", "0"])
