"""Each rank's part built from its rank number equals the projection of the global schedule."""

import random

import pytest

from collectives.algorithms import ALGORITHMS, base, build_schedule, rank_program
from collectives.chunking import even_split
from collectives.errors import ScheduleError
from collectives.schedule import RankProgram, Transfer
from collectives.specs import COLLECTIVES, get_spec

from .strategies import WORLD_SIZES, edge_counts

REGISTERED = [
    (name, c) for name, module in ALGORITHMS.items() for c in COLLECTIVES if base.implements(module, c)
]

DIRECT = {name for name, module in ALGORITHMS.items() if base.rank_program_builder(module) is not None}
"""The algorithms that build a rank's part directly; every registered one."""


PIPELINED = (1 << 22) + 3
"""A count the trees cut into 8 chunks."""


def _cases(collective: str, world_size: int) -> list[tuple[int, tuple[int, ...] | None]]:
    """(count, shares) pairs: the suite's edge counts, and uneven shares for the shared collectives."""
    spec = get_spec(collective)
    if not spec.carries_data:
        return [(0, None)]
    counts = edge_counts(world_size)
    if collective == "alltoall":
        counts = tuple(c for c in counts if c % world_size == 0)
    if collective != "alltoall":
        counts = (*counts, PIPELINED)
    cases: list[tuple[int, tuple[int, ...] | None]] = [(count, None) for count in counts]
    if spec.shared:
        uneven = tuple((7 * r + 3) % 5 for r in range(world_size))  # zeros included
        cases.append((sum(uneven), uneven))
    return cases


def test_every_registered_algorithm_builds_rank_programs_directly() -> None:
    assert set(ALGORITHMS) == DIRECT


@pytest.mark.parametrize(("algorithm", "collective"), REGISTERED)
def test_rank_programs_equal_the_projections_of_the_schedule(algorithm: str, collective: str) -> None:
    build = base.rank_program_builder(ALGORITHMS[algorithm])
    assert build is not None
    rooted = get_spec(collective).rooted
    for world_size in WORLD_SIZES:
        for count, shares in _cases(collective, world_size):
            for root in sorted({0, world_size - 1, world_size // 2}) if rooted else [0]:
                schedule = build_schedule(collective, algorithm, world_size, count, shares, root=root)
                layout = tuple(shares) if shares is not None else even_split(count, world_size)
                for rank in range(world_size):
                    direct = build(collective, layout, root if rooted else None, rank)
                    assert direct == schedule.rank_program(rank), (
                        algorithm,
                        collective,
                        world_size,
                        count,
                        rank,
                    )


def test_the_entry_point_gives_the_hooks_program_and_checks_its_arguments() -> None:
    program = rank_program("allreduce", "ring", 4, 10, rank=1)
    assert isinstance(program, RankProgram)
    assert program.steps == build_schedule("allreduce", "ring", 4, 10).program(1)
    assert program.count == 10 and program.chunk_bounds == (0, 3, 6, 8, 10)
    with pytest.raises(ScheduleError):
        rank_program("allreduce", "ring", 4, 10, rank=4)
    with pytest.raises(ValueError):
        rank_program("barrier", "direct", 4, 3, rank=0)


def _pairs_up(collective: str, algorithm: str, world_size: int, count: int, ranks: list[int]) -> int:
    """Check every sampled rank's sends and receives against its peers'; the number of sends checked."""
    programs: dict[int, RankProgram] = {}

    def of(rank: int) -> RankProgram:
        if rank not in programs:
            programs[rank] = rank_program(collective, algorithm, world_size, count, rank=rank)
        return programs[rank]

    checked = 0
    for rank in ranks:
        mine = of(rank)
        assert len(mine.steps) == len(of(0).steps)
        for index, step in enumerate(mine.steps):
            assert all(t.src == rank for t in step.sends) and all(t.dst == rank for t in step.recvs)
            for peer in {t.dst for t in step.sends}:
                sent = {t for t in step.sends if t.dst == peer}
                assert sent <= set(of(peer).steps[index].recvs), (algorithm, world_size, rank, index, peer)
                checked += len(sent)
            for peer in {t.src for t in step.recvs}:
                got = {t for t in step.recvs if t.src == peer}
                assert got <= set(of(peer).steps[index].sends), (algorithm, world_size, rank, index, peer)
    return checked


@pytest.mark.parametrize("world_size", [1024, 4096])
@pytest.mark.parametrize(
    "algorithm", ["ring", "tree", "double_tree", "butterfly", "halving_doubling", "hierarchical"]
)
def test_sampled_rank_programs_pair_up_at_thousands_of_ranks(algorithm: str, world_size: int) -> None:
    sampler = random.Random(world_size)
    ranks = [0, 1, world_size - 1, *sampler.sample(range(world_size), 3)]
    assert _pairs_up("allreduce", algorithm, world_size, 2**22 + 3, ranks) > 0


def test_a_send_missing_its_receive_is_caught() -> None:
    # the pairing check can fail: a program whose send names the wrong chunk has no matching receive
    real = rank_program("allreduce", "ring", 8, 64, rank=3).steps[0].sends[0]
    wrong = Transfer(real.src, real.dst, (real.chunk + 1) % 8, real.reduce)
    peer = rank_program("allreduce", "ring", 8, 64, rank=real.dst).steps[0]
    assert real in peer.recvs and wrong not in peer.recvs
