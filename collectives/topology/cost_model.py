"""The closed cost model: a schedule's time from alpha-beta-gamma constants.

It and the link model weigh a schedule step by step, as every step waits for the one before.
The closed model (:class:`CostModel`) knows no machine: it counts each step's
critical-path traffic (:func:`traffic`), the most messages, bytes moved and bytes
reduced by any one rank, and charges ``alpha`` per message, ``beta`` per byte
moved and ``gamma`` per byte reduced; its constants come from ``bench calibrate``
(:mod:`collectives.calibration`) or :data:`DEFAULT_MODEL`. The link model
(:mod:`collectives.topology.link_model`) knows the machine and no software: it routes each
transfer over a :class:`~collectives.topology.Topology` and finds the links transfers share.
The selector weighs transfers by the link model where it is given a topology, by
the closed model otherwise, and reductions always by ``gamma``.
"""

__all__ = ["DEFAULT_MODEL", "NETWORK_ALPHA", "CostModel", "Traffic", "traffic"]

import itertools
import math
from dataclasses import dataclass, field

from ..schedule import Schedule

_DEFAULT_BARRIER = 5e-6  # see DEFAULT_MODEL
_DEFAULT_COPY = 0.1e-9
_DEFAULT_OVERHEAD = 7e-6
_DEFAULT_STEP = 3e-6


# --- the closed model: alpha, beta and gamma per rank on the critical path


@dataclass(frozen=True)
class Traffic:
    """A schedule's work on its critical path, step by step, as the cost model weighs it.

    Every field sums, over the steps, the most any one rank does in that step;
    transfers of empty chunks are skipped, as the executor skips them.

    Attributes:
        steps: steps that move any data.
        messages: per step, the most messages a rank sends or receives.
        elements: per step, the most elements a rank sends or receives.
        reduced: per step, the most elements a rank reduces.
        barriers: barriers every rank passes (the shared-memory execution's
            synchronisation, in place of messages); none for a schedule of messages.
        copied: elements a rank copies through shared memory (into its region and
            out of the others'), in place of sending them; none for a schedule of messages.
        network_messages: of ``messages``, those of steps that cross between nodes
            (counted where the ranks span several nodes, see :func:`traffic`).
        network_elements: of ``elements``, those of steps that cross between nodes.
        shared_steps: of ``steps``, those through shared memory (a barrier, no
            messages), which cost no step of messages; none for a schedule of messages.
    """

    steps: int
    messages: int
    elements: int
    reduced: int
    barriers: int = 0
    copied: int = 0
    network_messages: int = 0
    network_elements: int = 0
    shared_steps: int = 0

    @property
    def message_steps(self) -> int:
        """Steps that send messages: posted together, then waited for once."""
        return self.steps - self.shared_steps


def traffic(schedule: Schedule, ranks_per_node: int | None = None) -> Traffic:
    """Count ``schedule``'s critical-path traffic (see :class:`Traffic`).

    With ``ranks_per_node``, rank r runs on node r // ranks_per_node (as MPI places a
    job's ranks node by node), and a step with any transfer between nodes is a network
    step: it waits for its slowest link, so all its messages and bytes count as the network's.
    """
    sizes = schedule.chunk_sizes
    steps = messages = elements = reduced = 0
    network_messages = network_elements = 0
    g = ranks_per_node
    for step in schedule.steps:
        sends: dict[int, int] = {}
        recvs: dict[int, int] = {}
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        reducing: dict[int, int] = {}
        for t in step.transfers:
            n = sizes[t.chunk]
            if n == 0:
                continue
            sends[t.src] = sends.get(t.src, 0) + 1
            recvs[t.dst] = recvs.get(t.dst, 0) + 1
            sent[t.src] = sent.get(t.src, 0) + n
            received[t.dst] = received.get(t.dst, 0) + n
            if t.reduce:
                reducing[t.dst] = reducing.get(t.dst, 0) + n
        if not sends:
            continue
        steps += 1
        # links are full duplex: a rank's sends and receives overlap, its messages to
        # different peers do not (they share its one CPU and network port)
        step_messages = max(*sends.values(), *recvs.values())
        step_elements = max(*sent.values(), *received.values())
        messages += step_messages
        elements += step_elements
        reduced += max(reducing.values(), default=0)
        if g and any(t.src // g != t.dst // g for t in step.transfers if sizes[t.chunk]):
            network_messages += step_messages
            network_elements += step_elements
    return Traffic(steps, messages, elements, reduced, 0, 0, network_messages, network_elements)


NETWORK_ALPHA = 20e-6
"""Seconds per message between nodes without a calibration of the job's shape (``network_alpha``).

MPI over a cluster network takes a few microseconds a message on the wire, more
through the software of each side; 20 us is a round figure of that. Per byte the
network is taken to be as fast as memory (``network_beta`` defaults to ``beta``)
until ``bench calibrate`` measures both on a job that spans nodes.
"""


@dataclass(frozen=True)
class CostModel:
    """Time of a schedule: per step, alpha per message, beta per byte moved, gamma per byte reduced.

    A step's time is ``step + alpha * m + beta * b + gamma * r``, where ``m``, ``b`` and
    ``r`` are the most messages, bytes moved and bytes reduced by any rank in the
    step (see :class:`Traffic`); the executor reduces after a step's transfers
    complete, so the terms add. ``step`` is what a step of messages costs whatever it moves (the
    executor posts its messages together and waits for them once, so a step of three
    messages costs little more than a step of one), and every call pays ``overhead``
    once (its checks, the agreement on its signature, the copy of nothing), the same
    for every algorithm. There are two classes of link: within a node
    (shared memory; ``alpha``, ``beta``) and between nodes (the network;
    ``network_alpha``, ``network_beta``); a step that crosses between nodes is
    charged at the network's constants. A schedule's time is the sum over its steps. An
    execution through shared memory synchronises by barriers instead of messages,
    each costing ``barrier * (P - 1)``: a rank waits for the arrival of each of the
    P - 1 others, and on a busy node for each of them to be scheduled; and it copies
    bytes once, at ``copy`` per byte, where a message over MPI's shared memory
    copies them twice (into a shared cell and out) and pays MPI's software besides.

    Attributes:
        alpha: seconds per message (latency and per-message software overhead).
        beta: seconds per byte a rank sends or receives (the inverse bandwidth).
        gamma: seconds per byte a rank reduces.
        barrier: seconds per shared-memory barrier and per peer it waits for.
        copy: seconds per byte a rank copies through shared memory.
        network_alpha: seconds per message between nodes.
        network_beta: seconds per byte between nodes; ``None``: as ``beta``.
        overhead: seconds per call, whatever the algorithm.
        step: seconds per step of messages, whatever it moves.
        corrections: per algorithm, ``(bytes, measured / predicted)`` at the sizes
            ``bench calibrate`` timed it, ascending: what the constants alone miss of
            that algorithm on this job (see :meth:`correction`); empty uncalibrated.
        source: where the constants came from, for explanations.
    """

    alpha: float
    beta: float
    gamma: float
    barrier: float = _DEFAULT_BARRIER
    copy: float = _DEFAULT_COPY
    network_alpha: float = NETWORK_ALPHA
    network_beta: float | None = None
    overhead: float = 0.0
    step: float = 0.0
    corrections: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    source: str = field(default="given", compare=False)

    def correction(self, algorithm: str, nbytes: int) -> float:
        """The factor ``algorithm``'s prediction for a buffer of ``nbytes`` is multiplied by (1.0: none).

        At a size the calibration timed, its measured time over the constants'
        prediction; between two, interpolated geometrically in the logarithm of the
        size; beyond the first or last, that one's. An algorithm the calibration did
        not time has none.
        """
        points = next((p for name, p in self.corrections if name == algorithm), None)
        if not points:
            return 1.0
        if nbytes <= points[0][0]:
            return points[0][1]
        for (low, below), (high, above) in itertools.pairwise(points):
            if nbytes <= high:
                share = math.log(nbytes / low) / math.log(high / low)
                return float(below * (above / below) ** share)
        return points[-1][1]

    @property
    def between_beta(self) -> float:
        """Seconds per byte between nodes: ``network_beta``, or ``beta`` where it is not known."""
        return self.beta if self.network_beta is None else self.network_beta

    def barrier_time(self, world_size: int) -> float:
        """Seconds of one shared-memory barrier over ``world_size`` ranks."""
        return self.barrier * max(world_size - 1, 0)

    def time(self, counted: Traffic, itemsize: int, world_size: int) -> float:
        """Predicted seconds of ``counted`` traffic, ``itemsize``-byte elements, over ``world_size`` ranks."""
        return sum(self.terms(counted, itemsize, world_size))

    def terms(
        self, counted: Traffic, itemsize: int, world_size: int, *, ranks_per_node: int | None = None
    ) -> tuple[float, float, float]:
        """Seconds of ``counted``: latency (call, steps, alpha, barriers), transfer (beta, copy), reduction.

        With ``ranks_per_node``, the ranks span several nodes of that many: the
        messages and bytes of steps that cross between nodes (``counted.network_*``)
        are charged at the network's constants, the rest at the node's, and a
        barrier is a node's.
        """
        barrier_ranks = world_size
        messages, elements = counted.messages, counted.elements
        between = 0.0, 0.0
        if ranks_per_node is not None:
            barrier_ranks = ranks_per_node
            messages -= counted.network_messages
            elements -= counted.network_elements
            between = (
                self.network_alpha * counted.network_messages,
                self.between_beta * counted.network_elements * itemsize,
            )
        latency = (
            self.overhead
            + self.step * counted.message_steps
            + self.alpha * messages
            + between[0]
            + self.barrier_time(barrier_ranks) * counted.barriers
        )
        transfer = self.beta * elements * itemsize + between[1] + self.copy * counted.copied * itemsize
        return latency, transfer, self.gamma * counted.reduced * itemsize

    def predict(self, schedule: Schedule, itemsize: int) -> float:
        """Predicted seconds of ``schedule`` for elements of ``itemsize`` bytes."""
        return self.time(traffic(schedule), itemsize, schedule.world_size)

    def describe(self) -> str:
        """One line with the constants in readable units and their source."""
        bandwidth = f"{1e-9 / self.beta:.2f} GB/s" if self.beta > 0 else "unbounded"
        return (
            f"alpha {self.alpha * 1e6:.2f} us/message, beta {self.beta * 1e9:.4f} ns/byte ({bandwidth}), "
            f"gamma {self.gamma * 1e9:.4f} ns/byte, barrier {self.barrier * 1e6:.2f} us/peer, "
            f"copy {self.copy * 1e9:.4f} ns/byte, step {self.step * 1e6:.2f} us, "
            f"call {self.overhead * 1e6:.2f} us"
            + (f", measured corrections for {len(self.corrections)} algorithms" if self.corrections else "")
            + f"; {self.source}"
        )

    def link_classes(self, nodes: int | None = None) -> list[str]:
        """One line per class of link of a job on ``nodes`` nodes: within a node, and between nodes."""
        inside = f"alpha {self.alpha * 1e6:.2f} us, beta {self.beta * 1e9:.4f} ns/byte"
        lines = [f"within a node (shared memory): {inside}"]
        if nodes is not None and nodes > 1:
            lines.append(
                f"between {nodes} nodes (network): alpha {self.network_alpha * 1e6:.2f} us, "
                f"beta {self.between_beta * 1e9:.4f} ns/byte"
            )
        return lines


DEFAULT_MODEL = CostModel(
    alpha=3e-6,
    beta=0.24e-9,
    gamma=0.07e-9,
    barrier=_DEFAULT_BARRIER,
    copy=_DEFAULT_COPY,
    overhead=_DEFAULT_OVERHEAD,
    step=_DEFAULT_STEP,
    source="defaults",
)
"""The constants without a calibration file: alpha 3 us, beta 0.24 ns/byte, gamma 0.07 ns/byte,
barrier 5 us, copy 0.1 ns/byte, a step of messages 3 us, a call 7 us.

The per-call, per-step and per-byte constants (overhead, step + alpha, beta, copy)
are :func:`bench.fitting.fit_model`'s fit to ``python -m bench compare`` at 2 ranks on
the quiet 2-core VM (``bench/compare-2ranks.json``: ring, butterfly and shared_memory,
8 B to 16 MiB), which predicts every one of those 24 calls within 30% (medians 2-5%):
7 us a call, 6 us a step of one message (at 2 ranks a step is one message, so the
fit cannot split step from alpha: half each), 0.24 ns/byte sent, 0.10 ns/byte copied
through shared memory. Before, the model had no per-call or per-step cost and
predicted about half the measured time, with beta 0.1 and copy 0.03 ns/byte
chosen so that its choices were those measured; the fitted constants keep those
choices on one node (shared_memory at every size at 2 and 4 ranks) and, across
nodes, no longer make the shared-memory hierarchy's copies look 3 times cheaper
than the bytes its rivals send (it was chosen at 2 MiB on 2 x 2 and ran 1.5x the fastest).
The earlier history of these constants:

Measured with ``python -m bench calibrate -n 100`` under ``mpiexec -n 2`` on a
2-core Linux VM (MPICH 5.0 over shared memory, numpy 2.4 float32 sums, each case
timed by its least disturbed iteration), six runs while other jobs loaded the
cores: alpha ranged 3.6 to 13 us, beta 0.065 to 0.16 ns/byte, gamma 0.061 to 0.089
ns/byte; these are their medians, rounded. alpha is mostly the Python cost of
posting and waiting on a step's messages. The barrier measured 1.6 us per peer at
2 ranks on the quiet machine and 2 to 14 us at 2 and 4 ranks on a loaded one; 5 us
is between. The copy through shared memory measured 0.074 ns/byte by ``bench
calibrate`` (4 MiB in the executor's segments, barriers taken off), but with that
figure the model prefers ring at every size, where ``python -m bench compare``
measured the shared-memory allreduce 20-40% faster than ring from 4 MiB at 2 ranks
and as fast at 4 ranks: the exchanges beta comes from are timed warm in cache,
the collectives are not. 0.03 ns/byte makes the model's choices those measured.
``bench calibrate`` now fits beta and copy to ring and shared-memory allreduces
timed end to end on cold buffers (medians), so a calibration makes the same
choices (2 ranks: beta 0.27, copy 0.10 ns/byte). Run it on your own machine for
choices made for it.
"""
