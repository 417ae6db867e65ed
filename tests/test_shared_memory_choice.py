"""The cost model's choice of the shared-memory broadcast, reduce and barrier on one node, and its counts."""

import pytest

from collectives.algorithms import shared_memory
from collectives.selector import DEFAULT_MODEL, Selector, Traffic

ONE_NODE = frozenset({"shared_memory"})
FEATURES = [ONE_NODE, ONE_NODE | {"compiled"}, ONE_NODE | {"oversubscribed"}]
COUNTS = [1, 1001, 1 << 17, (1 << 17) + 1, 1 << 22]  # one segment, its edge, several segments


@pytest.mark.parametrize("features", FEATURES, ids=lambda f: "+".join(sorted(f)))
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_auto_takes_shared_memory_on_one_node_at_every_size(
    collective: str, world_size: int, features: frozenset[str]
) -> None:
    selector = Selector(DEFAULT_MODEL)
    for count in COUNTS:
        assert selector.choose(collective, world_size, count, 4, features) == "shared_memory", count


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_auto_takes_the_shared_memory_barrier_on_one_node(world_size: int) -> None:
    selector = Selector(DEFAULT_MODEL)
    assert selector.choose("barrier", world_size, 0, 1, ONE_NODE) == "shared_memory"
    explained = selector.explain("barrier", 0, "uint8", world_size=world_size, features=ONE_NODE)
    best, *others = explained.candidates
    # only the call's own cost: the barrier its signature is agreed through is the whole call
    assert best.algorithm == "shared_memory" and best.time == DEFAULT_MODEL.overhead
    assert all(other.time > best.time for other in others)


@pytest.mark.parametrize("collective", ["broadcast", "reduce", "barrier"])
def test_without_shared_memory_it_is_no_candidate_and_explain_says_why(collective: str) -> None:
    selector = Selector(DEFAULT_MODEL)
    count = 0 if collective == "barrier" else 1000
    assert selector.choose(collective, 4, count, 4) != "shared_memory"
    for features in (frozenset(), frozenset({"shared_memory_nodes", "ranks_per_node=2"})):
        explained = selector.explain(collective, count, world_size=4, features=features)
        rejected = {r.algorithm: r.reasons for r in explained.rejected}
        assert "needs a transport with shared memory" in rejected["shared_memory"][0]
    explained = selector.explain(collective, count, world_size=4, features=ONE_NODE)
    assert explained.choice == "shared_memory"
    assert "shared_memory" in str(explained)


def test_the_counts_follow_the_segments_of_the_window() -> None:
    segment = shared_memory.SEGMENT_ELEMENTS
    count = 3 * segment + 1  # four segments: three barriers besides the signature's
    assert shared_memory.traffic("broadcast", 4, count, ONE_NODE) == (4, 0, 0, 0, 3, segment + count)
    assert shared_memory.traffic("reduce", 4, count, ONE_NODE) == (4, 0, 0, 3 * count, 3, segment)
    assert shared_memory.traffic("reduce", 4, 5, ONE_NODE) == (1, 0, 0, 15, 0, 5)
    crowded_segment = shared_memory.OVERSUBSCRIBED_ROOTED_SEGMENT_ELEMENTS
    crowded = ONE_NODE | {"oversubscribed"}
    pieces = -(-count // crowded_segment)
    crowded_traffic = shared_memory.traffic("broadcast", 4, count, crowded)
    assert crowded_traffic == (pieces, 0, 0, 0, pieces - 1, crowded_segment + count)
    for nothing in (("barrier", 4, 0), ("broadcast", 1, 100), ("reduce", 4, 0)):
        assert shared_memory.traffic(*nothing, ONE_NODE) == (0, 0, 0, 0, 0, 0)
    # as the model weighs them: barriers and copies, no steps of messages
    counted = Traffic(*shared_memory.traffic("broadcast", 2, count, ONE_NODE), shared_steps=4)
    assert counted.message_steps == 0
    expected = DEFAULT_MODEL.overhead + 3 * DEFAULT_MODEL.barrier + DEFAULT_MODEL.copy * 4 * (segment + count)
    assert DEFAULT_MODEL.time(counted, 4, 2) == pytest.approx(expected)
