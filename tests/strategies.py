"""Hypothesis strategies for world sizes, counts and shares."""

from hypothesis import strategies as st

WORLD_SIZES = (*range(1, 17), 24, 32, 33)
"""World sizes every algorithm is verified for."""


def edge_counts(world_size: int) -> tuple[int, ...]:
    """Counts that stress chunking: 0, 1, fewer than P, P - 1, P, P + 1, and not divisible by P."""
    p = world_size
    return tuple(sorted({0, 1, max(p // 2, 0), max(p - 1, 0), p, p + 1, 3 * p + 2, 7 * p - 1}))


world_sizes = st.sampled_from(WORLD_SIZES)
counts = st.integers(min_value=0, max_value=4096)


@st.composite
def shares(draw: st.DrawFn, max_world: int = 33, max_share: int = 50) -> tuple[int, ...]:
    """Per-rank element counts, zeros included, for a drawn world size."""
    size = draw(st.integers(min_value=1, max_value=max_world))
    return tuple(draw(st.lists(st.integers(0, max_share), min_size=size, max_size=size)))
