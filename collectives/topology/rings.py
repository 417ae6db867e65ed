"""Rings through every GPU over direct links, and packing several so their bandwidths add up.

A ring is a Hamiltonian cycle of the graph of direct links among a set of
devices (NVLinks, not routes through switches). Packing rings gives each a
bandwidth, its share of every link it uses, and takes those shares out of
the links, so that rings run at once never oversubscribe a link:
:func:`pack_rings` searches greedily for the widest ring left (the one whose
narrowest link is widest), gives it that narrowest bandwidth, and repeats.

A ring run one way uses one direction of each of its links; the packing counts
a link's bandwidth once, as the seeds do, which leaves the other direction for
running every ring the opposite way too (the bidirectional variant of
:mod:`collectives.algorithms.multi_ring`), doubling the total.

On :func:`~collectives.topology.presets.dgx1` the search finds the ring of the
eight double NVLinks at 36 GB/s, then the ring of the eight single ones at
18 GB/s: 54 GB/s, the most possible, since each GPU has 6 links of 18 GB/s and
a ring takes two of a GPU's links (``bound``). Greedy is not optimal in
general: on 4 fully connected GPUs it finds one ring of 18 GB/s, where three
rings at 9 GB/s each would give 27.
"""

__all__ = ["Ring", "RingPacking", "find_rings", "pack_rings"]

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from ..errors import TopologyError
from .graph import Topology

Ring = tuple[str, ...]
"""Device names in ring order; the last sends to the first."""

_SEARCH_BUDGET = 200_000  # partial rings tried per search before giving up
_EMPTY = 1.0  # bytes per second below which a link's remaining share counts as none

_Pair = frozenset[str]


@dataclass(frozen=True)
class RingPacking:
    """Rings found by :func:`pack_rings`, each with the bandwidth it may use.

    Attributes:
        devices: the devices the rings pass through, in rank order by default.
        rings: the rings, each starting at ``devices[0]``.
        bandwidths: bytes per second each ring may send one way round.
        bound: the most the rings together could have: the narrowest device's
            direct bandwidth, halved since a ring takes two of its links.
    """

    devices: tuple[str, ...]
    rings: tuple[Ring, ...]
    bandwidths: tuple[float, ...]
    bound: float

    @property
    def total(self) -> float:
        """Bytes per second of all the rings together, one way round."""
        return sum(self.bandwidths)

    def rank_rings(self, placement: Sequence[str] | None = None) -> tuple[tuple[int, ...], ...]:
        """The rings as rank orders, rank ``r`` on device ``placement[r]`` (``devices`` by default)."""
        placement = self.devices if placement is None else tuple(placement)
        rank_of = {device: rank for rank, device in enumerate(placement)}
        missing = sorted({d for ring in self.rings for d in ring} - rank_of.keys())
        if missing:
            raise TopologyError(f"no rank is placed on {', '.join(missing)}")
        return tuple(tuple(rank_of[d] for d in ring) for ring in self.rings)

    def describe(self) -> str:
        """Words for the rings, e.g. ``gpu0-gpu3-... at 36 GB/s; ...``."""
        rings = "; ".join(
            f"{'-'.join(ring)} at {width / 1e9:g} GB/s"
            for ring, width in zip(self.rings, self.bandwidths, strict=True)
        )
        return f"{rings or 'no ring'}: {self.total / 1e9:g} of at most {self.bound / 1e9:g} GB/s"


def find_rings(topology: Topology, devices: Sequence[str] | None = None) -> Iterator[Ring]:
    """Every ring through all ``devices`` (the GPUs by default) over direct links, each once.

    A ring starts at the first device and, of its two directions, is given the
    one whose second device comes first in ``devices``. Widest links are
    tried first. The search gives up after a fixed number of partial rings.
    """
    order = _order(topology, devices)
    capacity = _capacities(topology, order)
    yield from _cycles(order, capacity, level=_EMPTY)


def pack_rings(
    topology: Topology, devices: Sequence[str] | None = None, *, max_rings: int = 8
) -> RingPacking:
    """Rings through all ``devices`` (the GPUs by default) whose bandwidths together are as high as found.

    Greedy: take the widest ring left, give it the bandwidth of its narrowest
    link, take that from each of its links, and repeat until no ring is left
    or ``max_rings`` are found.
    """
    order = _order(topology, devices)
    capacity = _capacities(topology, order)
    bound = _bound(order, capacity)
    rings: list[Ring] = []
    widths: list[float] = []
    while len(rings) < max_rings:
        found = _widest(order, capacity)
        if found is None:
            break
        ring, width = found
        for pair in _pairs(ring):
            capacity[pair] -= width
        rings.append(ring)
        widths.append(width)
    return RingPacking(order, tuple(rings), tuple(widths), bound)


def _order(topology: Topology, devices: Sequence[str] | None) -> tuple[str, ...]:
    order = topology.gpus if devices is None else tuple(devices)
    for name in order:
        topology.device(name)
    if len(set(order)) != len(order):
        raise TopologyError(f"devices {order} name a device twice")
    return order


def _capacities(topology: Topology, order: tuple[str, ...]) -> dict[_Pair, float]:
    chosen = set(order)
    return {
        frozenset((link.a, link.b)): link.bandwidth
        for link in topology.links
        if link.a in chosen and link.b in chosen
    }


def _pairs(ring: Ring) -> set[_Pair]:
    # a ring of two devices uses its one link both ways, counted once like the rest
    return {frozenset(hop) for hop in pairwise((*ring, ring[0]))}


def _bound(order: tuple[str, ...], capacity: Mapping[_Pair, float]) -> float:
    if len(order) < 2:
        return 0.0
    if len(order) == 2:
        return capacity.get(frozenset(order), 0.0)
    return min(sum(c for pair, c in capacity.items() if d in pair) for d in order) / 2


def _widest(order: tuple[str, ...], capacity: Mapping[_Pair, float]) -> tuple[Ring, float] | None:
    for level in sorted({c for c in capacity.values() if c >= _EMPTY}, reverse=True):
        ring = next(_cycles(order, capacity, level), None)
        if ring is not None:
            return ring, min(capacity[pair] for pair in _pairs(ring))
    return None


def _cycles(order: tuple[str, ...], capacity: Mapping[_Pair, float], level: float) -> Iterator[Ring]:
    """Rings whose every link has at least ``level`` left, depth first, widest links first."""
    n = len(order)
    if n < 2:
        return
    index = {d: i for i, d in enumerate(order)}

    def width(a: str, b: str) -> float:
        return capacity.get(frozenset((a, b)), 0.0)

    near = {
        d: sorted(
            (e for e in order if e != d and width(d, e) >= level), key=lambda e: (-width(d, e), index[e])
        )
        for d in order
    }
    if n == 2:
        if order[1] in near[order[0]]:
            yield order
        return
    if any(len(options) < 2 for options in near.values()):
        return
    start = order[0]
    path = [start]
    used = {start}
    budget = [_SEARCH_BUDGET]

    def extend() -> Iterator[Ring]:
        budget[0] -= 1
        if budget[0] < 0:
            return
        here = path[-1]
        if len(path) == n:
            if start in near[here] and index[path[1]] < index[here]:
                yield tuple(path)
            return
        for step in near[here]:
            if step not in used:
                path.append(step)
                used.add(step)
                yield from extend()
                used.discard(step)
                path.pop()

    yield from extend()
