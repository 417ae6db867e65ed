"""``mpiexec -n N python -m collectives check``: every collective and algorithm on this job, checked.

Every registered algorithm of every collective (and ``auto``) runs on this
job's ranks for a few element counts (0, 1, fewer than the ranks, not divisible
by them, a few thousand), dtypes and ops; each result is compared with the exact
one, which every rank computes from the known inputs of all ranks, and with the
MPI library's own collective on the same inputs. One table, a few seconds; the
exit status is 1 on any wrong element or error. As nccl-tests' ``#wrong``
column, but over every algorithm the selector may pick on this machine.
"""

__all__ = ["CHECKED", "CollectiveCheck", "check", "main"]

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import api
from .algorithms import ALGORITHMS
from .algorithms.base import implements
from .communicator import Communicator
from .selector import AUTO

CHECKED = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter", "alltoall")
"""The collectives checked, in the table's order (the barrier moves no data)."""

_DTYPES = ("float32", "float64", "int32")
_ROOT = 0


@dataclass
class CollectiveCheck:
    """One collective and algorithm: cases run, elements wrong, disagreements with MPI, the first error."""

    collective: str
    algorithm: str
    cases: int = 0
    wrong: int = 0
    against_mpi: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not (self.wrong or self.against_mpi or self.error)


def _input(collective: str, rank: int, count: int, size: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input: small integers (exact in every dtype and sum), different on every rank."""
    n = count * size if collective in ("reduce_scatter", "scatter", "alltoall") else count
    return ((np.arange(n) * 7 + rank * 13) % 17 + rank).astype(dtype)


def _expected(collective: str, op: str, inputs: list[np.ndarray], rank: int) -> np.ndarray | None:
    """The exact result at ``rank`` (``None`` where it gets none), from every rank's input."""
    size = len(inputs)
    stacked = np.stack(inputs)
    reduced = stacked.sum(axis=0) if op == "sum" else stacked.max(axis=0)
    combined: np.ndarray = reduced.astype(inputs[0].dtype)
    if collective == "allreduce":
        return combined
    if collective == "reduce":
        return combined if rank == _ROOT else None
    if collective == "reduce_scatter":
        return np.asarray(np.split(combined, size)[rank])
    if collective in ("allgather", "gather"):
        return np.concatenate(inputs) if collective == "allgather" or rank == _ROOT else None
    if collective == "broadcast":
        return inputs[_ROOT]
    if collective == "scatter":
        return np.split(inputs[_ROOT], size)[rank]
    if collective == "alltoall":
        return np.concatenate([np.split(x, size)[rank] for x in inputs])
    raise ValueError(collective)


def _call(collective: str, x: np.ndarray, op: str, algorithm: str, comm: Communicator) -> Any:
    if collective in ("allreduce", "reduce_scatter"):
        return getattr(api, collective)(x, op, algorithm=algorithm, comm=comm)
    if collective == "reduce":
        return api.reduce(x, op, _ROOT, algorithm=algorithm, comm=comm)
    if collective in ("broadcast", "gather", "scatter"):
        return getattr(api, collective)(x, _ROOT, algorithm=algorithm, comm=comm)
    return getattr(api, collective)(x, algorithm=algorithm, comm=comm)


def _differs(result: Any, expected: np.ndarray | None) -> int:
    """Elements of ``result`` unlike ``expected`` (all of them where the shapes differ)."""
    if expected is None:
        return 0 if result is None else 1
    got = np.asarray(result).reshape(-1)
    if got.shape != expected.shape:
        return max(expected.size, 1)
    return int(np.count_nonzero(got != expected))


def _cases(collective: str, size: int) -> list[tuple[str, str, int]]:
    """(dtype, op, count) to run: every dtype at a few counts; max once where the collective reduces."""
    counts = sorted({0, 1, max(size - 1, 1), size + 1, 2053})
    cases = [(dtype, "sum", count) for dtype in _DTYPES for count in counts]
    if collective in ("allreduce", "reduce_scatter", "reduce"):
        cases.append(("float32", "max", 1031))
    return cases


def check(
    world: Communicator,
    collectives: Sequence[str] = CHECKED,
    reference: Callable[[str, np.ndarray, str, int], np.ndarray | None] | None = None,
    timeout: float = 60.0,
) -> list[CollectiveCheck]:
    """Run every case of every algorithm of ``collectives`` on ``world``'s ranks; one row each; collective.

    Each algorithm runs on a communicator of its own (a sibling of ``world``) with
    ``timeout``, so one that fails or hangs leaves the next rows unharmed.
    ``reference(collective, x, op, root)`` gives the MPI library's result.
    """
    size, rank = world.size, world.rank
    rows = []
    for collective in collectives:
        cases = _cases(collective, size)
        # MPI's results first, every rank alike, whatever our algorithms do below
        theirs = [
            None
            if reference is None
            else reference(collective, _input(collective, rank, n, size, t), op, _ROOT)
            for t, op, n in cases
        ]
        names = [AUTO] + [name for name, module in ALGORITHMS.items() if implements(module, collective)]
        for algorithm in names:
            row = CollectiveCheck(collective, algorithm)
            rows.append(row)
            comm = Communicator(world.transport.duplicate(), timeout=timeout)
            try:
                for (dtype, op, count), mpi_result in zip(cases, theirs, strict=True):
                    inputs = [_input(collective, r, count, size, dtype) for r in range(size)]
                    x = inputs[rank].copy()
                    # a named algorithm runs its schedule where its transport feature is missing; one
                    # that refuses a case refuses it on every rank alike, and the row says so
                    result = _call(collective, x, op, algorithm, comm)
                    row.cases += 1
                    expected = _expected(collective, op, inputs, rank)
                    row.wrong += _differs(result, expected)
                    if mpi_result is not None and expected is not None:
                        row.against_mpi += _differs(result, mpi_result)
            except Exception as error:
                row.error = f"{type(error).__name__}: {error}".splitlines()[0][:160]
            finally:
                comm.free()
    return rows


def _agreed(world: Communicator, rows: list[CollectiveCheck]) -> list[CollectiveCheck]:
    """The rows summed over the ranks (wrong elements and disagreements), with the first rank's error."""
    counts = np.array([[r.wrong, r.against_mpi, int(bool(r.error))] for r in rows], np.int64)
    total = api.allreduce(counts, comm=world)
    for row, (wrong, against, errors) in zip(rows, total, strict=True):
        row.wrong, row.against_mpi = int(wrong), int(against)
        if errors and not row.error:
            row.error = f"failed on {int(errors)} other rank(s)"
    return rows


def table(rows: list[CollectiveCheck], size: int) -> list[str]:
    """The rows as an aligned table, and a summary line."""
    titles = ("collective", "algorithm", "cases", "#wrong", "#unlike MPI", "status")
    cells = [
        (r.collective, r.algorithm, str(r.cases), str(r.wrong), str(r.against_mpi),
         "ok" if r.ok else (r.error or "WRONG"))
        for r in rows
    ]  # fmt: skip
    widths = [max(len(line[i]) for line in (titles, *cells)) for i in range(len(titles) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)) + "  " + line[-1]
             for line in (titles, *cells)]  # fmt: skip
    bad = [r for r in rows if not r.ok]
    lines.append(f"# {size} ranks, {len(rows)} algorithms x collectives, {sum(r.cases for r in rows)} cases: "
                 + ("all OK" if not bad else f"{len(bad)} FAILED"))  # fmt: skip
    return lines


def main(argv: list[str]) -> int:
    """Check every collective and algorithm on this job; rank 0 prints the table. 1 on any failure."""
    parser = argparse.ArgumentParser(
        prog="python -m collectives check",
        description="Run every collective with every algorithm on this job, checked against exact results "
        "and the MPI library's own.",
    )
    parser.add_argument(
        "-c",
        "--collectives",
        default=",".join(CHECKED),
        help=f"comma-separated (default {','.join(CHECKED)})",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a call may take (default 60)")
    args = parser.parse_args(argv)
    chosen = [c.strip() for c in args.collectives.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CHECKED]
    if unknown:
        parser.error(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(CHECKED)}")
    from .transport.mpi.about import reference

    world = Communicator()
    try:
        rows = _agreed(world, check(world, chosen, reference, args.timeout))
        if world.rank == 0:
            print("\n".join(table(rows, world.size)), flush=True)
    finally:
        world.free()
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
