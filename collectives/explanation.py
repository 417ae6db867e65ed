"""What the selector predicted for each algorithm, and its choice, as data and as a table."""

__all__ = ["Candidate", "Explanation", "Rejected", "ReproducibleCost", "ReproducibleStep"]

from dataclasses import dataclass

from .ops import itemsize
from .topology import Topology
from .topology.cost_model import CostModel, Traffic


@dataclass(frozen=True)
class Candidate:
    """An algorithm the selector could run, with its prediction.

    Attributes:
        algorithm: the algorithm's name.
        schedule: the schedule's name, parameters included.
        traffic: what the model counted.
        itemsize: bytes per element.
        latency: seconds of ``alpha`` and barrier terms.
        transfer: seconds of ``beta`` terms.
        reduction: seconds of ``gamma`` terms.
        correction: the calibration's measured factor the terms include (1.0: none; see
            :meth:`~collectives.topology.CostModel.correction`).
    """

    algorithm: str
    schedule: str
    traffic: Traffic
    itemsize: int
    latency: float
    transfer: float
    reduction: float
    correction: float = 1.0

    @property
    def time(self) -> float:
        """Predicted seconds in all."""
        return self.latency + self.transfer + self.reduction


@dataclass(frozen=True)
class Rejected:
    """A registered algorithm the selector ruled out, and why."""

    algorithm: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ReproducibleStep:
    """One step of a ``reproducible=True`` call, with its prediction.

    Attributes:
        name: what the step does (``"codes agreed"``, ``"words summed"`` ...).
        work: how: the collective, its element count, dtype and op, or the local pass.
        algorithm: the algorithm ``"auto"`` runs for the step's collective; ``None`` for a local pass.
        nbytes: the bytes a rank passes to the step's collective, or converts in a local pass.
        seconds: predicted time.
    """

    name: str
    work: str
    algorithm: str | None
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class ReproducibleCost:
    """What ``reproducible=True`` costs a call, step by step, against the plain call.

    Attributes:
        route: how the call runs, in one line.
        steps: its steps in order (none for integers, whose plain call is exact).
        plain: the plain call's predicted seconds (its choice's).
        note: what the prediction leaves out, in one line; ``None`` for nothing.
    """

    route: str
    steps: tuple[ReproducibleStep, ...]
    plain: float
    note: str | None = None

    @property
    def time(self) -> float:
        """Predicted seconds of the reproducible call (the plain call's for integers)."""
        return sum(step.seconds for step in self.steps) if self.steps else self.plain

    @property
    def ratio(self) -> float:
        """Its predicted time over the plain call's."""
        return self.time / self.plain if self.plain > 0 else 1.0

    def lines(self) -> list[str]:
        """The section ``str(Explanation)`` ends with."""
        lines = ["", f"reproducible=True: {self.route}"]
        if self.steps:
            titles = ("step", "work", "algorithm", "bytes", "predicted(us)")
            rows: list[tuple[str, ...]] = [
                (f"{i}. {s.name}", s.work, s.algorithm or "-", str(s.nbytes), f"{s.seconds * 1e6:.2f}")
                for i, s in enumerate(self.steps, 1)
            ]
            lines += _table(titles, rows, left=3)
        if self.note is not None:
            lines.append(f"note: {self.note}")
        lines.append(
            f"predicted: {self.time * 1e6:.2f} us reproducible against {self.plain * 1e6:.2f} us for the "
            f"plain call ({self.ratio:.2f}x)"
        )
        return lines


@dataclass(frozen=True)
class Explanation:
    """What the selector predicted for every algorithm, and what it chose.

    Attributes:
        collective: the collective's name.
        count: elements of the full buffer (allreduce's buffer, reduce_scatter's
            input, allgather's output).
        dtype: the element type's name.
        world_size: the number of ranks.
        op: the reduction's name; ``None`` for a collective that does not reduce.
        model: the cost model's constants.
        candidates: the algorithms that apply, fastest first.
        rejected: the algorithms that do not, with their reasons.
        choice: the fastest candidate; ``None`` when every algorithm was rejected.
        topology: the machine the transfers were predicted on, with link
            contention, instead of the model's alpha and beta; ``None`` for none.
        device: how device buffers travel, in one line (see :func:`collectives.explain`);
            ``None`` where not asked.
        nodes: ``(nodes, ranks per node)`` where the ranks span several nodes (the
            communicator's node split), so that two classes of link are weighed; ``None`` on one node.
        measured: where the online tuner timed the best candidates (see
            :mod:`collectives.tuner`): each one's seconds, the slowest rank's, fastest
            first; the choice is then the fastest measured. Empty where nothing was measured.
        note: what the explanation could not know, in one line; ``None`` for nothing.
        reproducible: what the call costs with ``reproducible=True`` (``explain(...,
            reproducible=True)``); ``None`` where not asked.
    """

    collective: str
    count: int
    dtype: str
    world_size: int
    op: str | None
    model: CostModel
    candidates: tuple[Candidate, ...]
    rejected: tuple[Rejected, ...]
    choice: str | None
    topology: Topology | None = None
    device: str | None = None
    nodes: tuple[int, int] | None = None
    measured: tuple[tuple[str, float], ...] = ()
    note: str | None = None
    reproducible: ReproducibleCost | None = None

    def __repr__(self) -> str:
        # one short line, as a REPL shows it; str() (print) gives the whole table
        size = _bytes(self.count * itemsize(self.dtype))
        chosen = next((c for c in self.candidates if c.algorithm == self.choice), None)
        choice = "none applies" if chosen is None else f"{chosen.algorithm} ({chosen.time * 1e6:.2f} us)"
        cost = self.reproducible
        reproducible = "" if cost is None else f"; reproducible {cost.time * 1e6:.2f} us ({cost.ratio:.2f}x)"
        return (
            f"<Explanation {self.collective} of {size} {self.dtype} over {self.world_size} ranks: {choice}"
            f"{reproducible}; {len(self.candidates)} candidates, {len(self.rejected)} rejected; print() it "
            "for the table>"
        )

    def __str__(self) -> str:
        size = self.count * itemsize(self.dtype)
        op = "" if self.op is None else f", op {self.op}"
        lines = [
            f"{self.collective} of {self.count} {self.dtype} ({_bytes(size)}) over {self.world_size} "
            f"ranks{op}",
            f"cost model: {self.model.describe()}",
            *(
                []
                if self.topology is None
                else [f"transfers: on the links of {self.topology.name}, with contention, not alpha and beta"]
            ),
            *([] if self.device is None else [f"device buffers: {self.device}"]),
            *([] if self.note is None else [f"note: {self.note}"]),
            *(
                []
                if self.nodes is None
                else [f"nodes: {self.nodes[0]} x {self.nodes[1]} ranks; links weighed by class:"]
                + [f"  {line}" for line in self.model.link_classes(self.nodes[0])]
            ),
            "",
        ]
        titles = ("", "algorithm", "schedule", "steps", "messages", "barriers", "bytes moved",
                  "bytes copied", "bytes reduced", "latency(us)", "transfer(us)", "reduce(us)",
                  "total(us)")  # fmt: skip
        rows: list[tuple[str, ...]] = [
            ("*" if c.algorithm == self.choice else "", c.algorithm, c.schedule,
             str(c.traffic.steps), str(c.traffic.messages), str(c.traffic.barriers),
             str(c.traffic.elements * c.itemsize), str(c.traffic.copied * c.itemsize),
             str(c.traffic.reduced * c.itemsize),
             f"{c.latency * 1e6:.2f}", f"{c.transfer * 1e6:.2f}", f"{c.reduction * 1e6:.2f}",
             f"{c.time * 1e6:.2f}")
            for c in self.candidates
        ]  # fmt: skip
        lines += _table(titles, rows, left=3) if rows else ["no candidates"]
        lines.append(
            "(messages and bytes: per step, the most any one rank sends, receives, copies through "
            "shared memory or reduces)"
        )
        corrected = [c for c in self.candidates if c.correction != 1.0]
        if corrected:
            factors = ", ".join(f"{c.algorithm} x{c.correction:.2f}" for c in corrected)
            lines.append(f"times include the calibration's measured corrections at this size: {factors}")
        if self.rejected:
            lines.append("rejected:")
            width = max(len(r.algorithm) for r in self.rejected)
            lines += [f"  {r.algorithm.ljust(width)}  {'; '.join(r.reasons)}" for r in self.rejected]
        if self.measured:
            timed = ", ".join(f"{name} {seconds * 1e6:.2f} us" for name, seconds in self.measured)
            lines.append(f"measured by the tuner (slowest rank, median): {timed}")
        if self.choice is None:
            lines.append("choice: none")
        else:
            chosen = next((c for c in self.candidates if c.algorithm == self.choice), self.candidates[0])
            how = "measured fastest; " if self.measured else ""
            lines.append(f"choice: {self.choice} ({how}predicted {chosen.time * 1e6:.2f} us)")
        if self.reproducible is not None:
            lines += self.reproducible.lines()
        return "\n".join(lines)


def _bytes(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} B"


def _table(titles: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> list[str]:
    """Aligned lines: the first ``left`` columns flush left, the rest flush right."""
    widths = [max(len(row[i]) for row in (titles, *rows)) for i in range(len(titles))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(titles), *(line(row) for row in rows)]
