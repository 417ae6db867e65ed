"""Devices, the links between them, and the routes messages take."""

__all__ = ["DEVICE_KINDS", "Device", "Link", "LinkId", "Route", "Topology"]

import heapq
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from math import isfinite

from ..errors import TopologyError

DEVICE_KINDS = ("gpu", "cpu", "switch", "nic")
"""What a device is; every kind but ``gpu`` forwards traffic between its links."""

LinkId = tuple[str, str]
"""One direction of a link: ``(from_device, to_device)``."""

# routes minimise the time of a message of this size sent hop by hop, so a
# fast path wins over a short one unless latency dominates
_PROBE_BYTES = 2**20


@dataclass(frozen=True)
class Device:
    """A GPU, CPU, switch or NIC.

    Attributes:
        name: unique in its topology, e.g. ``gpu3``.
        kind: one of :data:`DEVICE_KINDS`.
        node: the machine the device is in; ``None`` for shared network gear.
    """

    name: str
    kind: str
    node: int | None = 0


@dataclass(frozen=True)
class Link:
    """A full-duplex link: ``bandwidth`` bytes per second in each direction at once.

    Attributes:
        a: one end's device name.
        b: the other end's.
        bandwidth: bytes per second per direction, all lanes together.
        latency: seconds a message takes to cross, however small.
        kind: the technology, e.g. ``nvlink``, ``pcie``, ``qpi``, ``network``.
        lanes: physical links bonded into this one (a DGX-1's double NVLinks are 2).
    """

    a: str
    b: str
    bandwidth: float
    latency: float = 0.0
    kind: str = "link"
    lanes: int = 1


@dataclass(frozen=True)
class Route:
    """The hops a message takes from one device to another.

    Attributes:
        hops: the directed links, in order; empty from a device to itself.
        latency: the sum of the hops' latencies.
    """

    hops: tuple[LinkId, ...]
    latency: float


@dataclass(frozen=True)
class Topology:
    """Devices and the links between them.

    A message between devices that are not adjacent is routed through devices
    that forward (switches, CPUs, NICs, never GPUs), along the path that moves
    a 1 MiB message fastest hop by hop; ties go to the path whose device names
    sort first, so routes are deterministic.

    Attributes:
        name: what the topology is, e.g. ``dgx1``.
        devices: every device; GPUs in this order are ranks 0, 1, ... by default.
        links: at most one per pair of devices (bond parallel links with ``lanes``).
        description: a line for reports.
    """

    name: str
    devices: tuple[Device, ...]
    links: tuple[Link, ...]
    description: str = ""
    _routes: dict[LinkId, Route] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "links", tuple(self.links))
        self._check()

    @cached_property
    def gpus(self) -> tuple[str, ...]:
        """The GPUs' names, in device order."""
        return tuple(d.name for d in self.devices if d.kind == "gpu")

    @cached_property
    def nodes(self) -> tuple[tuple[str, ...], ...]:
        """The GPUs of each machine, machines in order of their first GPU."""
        groups: dict[int | None, list[str]] = {}
        for name in self.gpus:
            groups.setdefault(self.device(name).node, []).append(name)
        return tuple(tuple(group) for group in groups.values())

    def device(self, name: str) -> Device:
        """The device called ``name``."""
        try:
            return self._devices[name]
        except KeyError:
            raise TopologyError(f"{self.name} has no device {name!r}") from None

    def link(self, a: str, b: str) -> Link | None:
        """The link joining ``a`` and ``b``, either way round; ``None`` if they are not adjacent."""
        return self._links.get((a, b))

    def bandwidth(self, hop: LinkId) -> float:
        """Bytes per second in the direction of ``hop``."""
        link = self.link(*hop)
        if link is None:
            raise TopologyError(f"{self.name} has no link {hop[0]}->{hop[1]}")
        return link.bandwidth

    def neighbours(self, name: str) -> tuple[str, ...]:
        """The devices linked directly to ``name``, in device order."""
        self.device(name)
        return self._adjacent.get(name, ())

    def route(self, src: str, dst: str) -> Route:
        """The route from ``src`` to ``dst`` (memoized)."""
        route = self._routes.get((src, dst))
        if route is None:
            route = self._shortest(src, dst)
            self._routes[(src, dst)] = route
        return route

    def describe(self, hop: LinkId) -> str:
        """Words for one direction of a link, e.g. ``gpu0->gpu3 (2x nvlink, 36 GB/s)``."""
        link = self.link(*hop)
        if link is None:
            raise TopologyError(f"{self.name} has no link {hop[0]}->{hop[1]}")
        lanes = f"{link.lanes}x " if link.lanes > 1 else ""
        return f"{hop[0]}->{hop[1]} ({lanes}{link.kind}, {link.bandwidth / 1e9:g} GB/s)"

    @cached_property
    def _devices(self) -> dict[str, Device]:
        return {d.name: d for d in self.devices}

    @cached_property
    def _links(self) -> dict[LinkId, Link]:
        table: dict[LinkId, Link] = {}
        for link in self.links:
            table[(link.a, link.b)] = table[(link.b, link.a)] = link
        return table

    @cached_property
    def _adjacent(self) -> dict[str, tuple[str, ...]]:
        order = {d.name: i for i, d in enumerate(self.devices)}
        near: dict[str, set[str]] = {}
        for link in self.links:
            near.setdefault(link.a, set()).add(link.b)
            near.setdefault(link.b, set()).add(link.a)
        return {name: tuple(sorted(names, key=order.__getitem__)) for name, names in near.items()}

    def _shortest(self, src: str, dst: str) -> Route:
        self.device(src)
        self.device(dst)
        # Dijkstra over (cost, path); comparing paths breaks ties by device names
        queue: list[tuple[float, tuple[str, ...]]] = [(0.0, (src,))]
        done: set[str] = set()
        while queue:
            cost, path = heapq.heappop(queue)
            here = path[-1]
            if here == dst:
                hops = tuple(pairwise(path))
                return Route(hops, sum(self._links[hop].latency for hop in hops))
            if here in done:
                continue
            done.add(here)
            if here != src and self._devices[here].kind == "gpu":
                continue  # a GPU ends a route; it does not forward
            for near in self._adjacent.get(here, ()):
                if near not in done:
                    link = self._links[(here, near)]
                    step = link.latency + _PROBE_BYTES / link.bandwidth
                    heapq.heappush(queue, (cost + step, (*path, near)))
        raise TopologyError(f"{self.name}: no route from {src} to {dst}")

    def _check(self) -> None:
        names: set[str] = set()
        for device in self.devices:
            if device.kind not in DEVICE_KINDS:
                raise TopologyError(
                    f"{self.name}: device {device.name!r} has kind {device.kind!r}; "
                    f"known: {', '.join(DEVICE_KINDS)}"
                )
            if device.name in names:
                raise TopologyError(f"{self.name}: two devices are called {device.name!r}")
            names.add(device.name)
        pairs: set[frozenset[str]] = set()
        for link in self.links:
            for end in (link.a, link.b):
                if end not in names:
                    raise TopologyError(f"{self.name}: link {link.a}-{link.b} names no device {end!r}")
            if link.a == link.b:
                raise TopologyError(f"{self.name}: link joins {link.a} to itself")
            pair = frozenset((link.a, link.b))
            if pair in pairs:
                raise TopologyError(
                    f"{self.name}: two links join {link.a} and {link.b}; bond them with lanes"
                )
            pairs.add(pair)
            if not (isfinite(link.bandwidth) and link.bandwidth > 0):
                raise TopologyError(f"{self.name}: link {link.a}-{link.b} has bandwidth {link.bandwidth}")
            if not (isfinite(link.latency) and link.latency >= 0) or link.lanes < 1:
                raise TopologyError(
                    f"{self.name}: link {link.a}-{link.b} has latency {link.latency} and lanes {link.lanes}"
                )
