"""What ``reproducible=True`` costs (``mpiexec -n 2 python -m collectives bench reproducible``); the add rate.

Per size, float32 sums timed side by side, interleaved round by round (a barrier
before each sample, up to 200 calls per sample for small sizes): the default
``allreduce`` (``auto``) and the reproducible one, each into an ``out`` array. A
sample's time is its slowest rank's; the table gives medians and the ratio
reproducible/default. ``--in-place`` times both in place (``out=x``, as the torch
hooks call them), with ``op="avg"``: a sum in place would pass float32's range
within a sample.

``python -m collectives bench reproducible --add`` (no MPI) times ``ReproducibleSum.add``
of float32 and float64 arrays (``--dtype`` names others) of 64 KiB, 1 MiB and 16 MiB, in
GB/s of input on one core; ``--error`` (no MPI) measures the reproducible sum's error
against float64 pairwise summation (numpy's ``sum``) on sums that cancel, both against
the exact sum.
"""

__all__ = ["add_rate", "errors", "main"]

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from .config import parse_size


def add_rate(nbytes: int, dtype: str = "float32", repeats: int = 20) -> float:
    """``ReproducibleSum.add``'s rate on arrays of ``nbytes``: GB/s of input, the best of ``repeats``."""
    import ml_dtypes  # numpy's bfloat16

    import collectives

    kind = np.dtype(getattr(ml_dtypes, dtype)) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(0)
    x = rng.normal(size=nbytes // kind.itemsize).astype(kind)
    total = collectives.ReproducibleSum(like=x)
    total.add(x)  # the first add sets the codes; later ones find them
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        total.add(x)
        best = min(best, time.perf_counter() - start)
    return x.nbytes / best / 1e9


def _cancelling(rng: np.random.Generator, terms: int, count: int, spread: int) -> np.ndarray:
    """``terms`` contributions of ``count`` elements whose sums cancel: pairs x, -x over a range of
    2**spread magnitudes, and one small remainder, shuffled."""
    half = terms // 2
    values = rng.uniform(1, 2, (half, count)) * np.exp2(rng.integers(-spread, spread, (half, count)))
    rest = rng.normal(size=(terms - 2 * half or 1, count))[: terms - 2 * half]
    parts = np.concatenate([values, -values * (1 + rng.normal(size=values.shape) * 1e-9), rest])
    return parts[rng.permutation(len(parts))]


def errors(
    terms: int = 1000, count: int = 2000, spread: int = 30
) -> list[tuple[str, float, float, float, float]]:
    """Per dtype, over ``count`` sums of ``terms`` cancelling contributions: the largest error of the
    reproducible sum and of float64 pairwise summation (numpy's ``sum``, rounded to the dtype), each
    relative to the sum of the magnitudes; and the share of sums each rounds correctly."""
    from fractions import Fraction

    import collectives

    rng = np.random.default_rng(1)
    found = []
    for dtype in ("float32", "float64"):
        parts = _cancelling(rng, terms, count, spread).astype(dtype)
        total = collectives.ReproducibleSum(like=parts[0])
        for part in parts:
            total.add(part)
        wide = parts.astype(np.float64)
        results = (total.value().astype(np.float64), wide.sum(axis=0).astype(dtype).astype(np.float64))
        exact = [sum(map(Fraction, column.tolist()), Fraction(0)) for column in wide.T]
        rounded = np.array([float(e) for e in exact]).astype(dtype).astype(np.float64)  # one rounding of each
        magnitudes = np.abs(wide).sum(axis=0)
        row: list[float] = []
        for got in results:
            error = [abs(Fraction(float(v)) - e) for v, e in zip(got, exact, strict=True)]
            row.append(float(max(float(err) / m for err, m in zip(error, magnitudes, strict=True))))
        row += [float((got == rounded).mean()) for got in results]
        found.append((dtype, row[0], row[1], row[2], row[3]))
    return found


def _timed(comm: object, calls: int, body: Callable[[], object]) -> float:
    """Seconds a call of ``body``, the slowest rank's, over ``calls`` calls after a barrier."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    world.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        body()
    took = (time.perf_counter() - start) / calls
    return float(world.allreduce(took, op=MPI.MAX))


def main(argv: list[str] | None = None) -> None:
    """Print the table (under mpiexec) or, with ``--add``, the accumulator's rate."""
    parser = argparse.ArgumentParser(prog="python -m collectives bench reproducible", description=__doc__)
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("8"))
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("1M"))
    parser.add_argument("-f", "--stepfactor", type=int, default=8)
    parser.add_argument("-n", "--rounds", type=int, default=15, help="samples per size (default 15)")
    parser.add_argument("--add", action="store_true", help="time ReproducibleSum.add instead (no MPI)")
    parser.add_argument(
        "--dtype", nargs="+", default=["float32", "float64"], help="--add's dtypes (default float32 float64)",
        choices=["float16", "bfloat16", "float32", "float64"],
    )  # fmt: skip
    parser.add_argument("--error", action="store_true", help="measure the error instead (no MPI)")
    parser.add_argument("--in-place", action="store_true", help="both calls in place, op avg")
    options = parser.parse_args(argv)
    if options.error:
        print("dtype    largest |error| / sum |x|: reproducible  float64 pairwise", end="")
        print("   correctly rounded: ours  pairwise")
        for dtype, ours, pairwise, ours_right, pairwise_right in errors():
            print(f"{dtype:<8} {ours:>35.3g} {pairwise:>17.3g} {ours_right:>24.1%} {pairwise_right:>9.1%}")
        return
    if options.add:
        for dtype in options.dtype:
            for nbytes in (64 << 10, 1 << 20, 16 << 20):
                print(f"add {nbytes:>9} B {dtype}: {add_rate(nbytes, dtype):5.2f} GB/s")
        return
    from mpi4py import MPI

    import collectives

    world = MPI.COMM_WORLD
    comm = collectives.Communicator()
    if world.rank == 0:
        how = "avg in place" if options.in_place else "sum"
        print(f"# {world.size} ranks, float32 {how}, median of {options.rounds} samples; times in us")
        print(f"{'size':>8} {'default':>9} {'reproducible':>13} {'ratio':>6}")
    size = options.minbytes
    while size <= options.maxbytes:
        x = np.random.default_rng(world.rank).normal(size=max(size // 4, 1)).astype(np.float32)
        out = x if options.in_place else np.empty_like(x)
        op = "avg" if options.in_place else "sum"
        calls = max(1, min(200, (1 << 20) // max(size, 1)))
        contenders = {
            "default": functools.partial(collectives.allreduce, x, op, out=out, comm=comm),
            "reproducible": functools.partial(
                collectives.allreduce, x, op, out=out, comm=comm, reproducible=True
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for body in contenders.values():  # warm: the first calls decide and prepare
            _timed(comm, 3, body)
        for round_ in range(options.rounds):
            order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
            for name in order:
                times[name].append(_timed(comm, calls, contenders[name]))
        if world.rank == 0:
            plain, repro = (statistics.median(times[n]) * 1e6 for n in ("default", "reproducible"))
            print(f"{x.nbytes:>8} {plain:>9.1f} {repro:>13.1f} {repro / plain:>6.2f}", flush=True)
        size *= options.stepfactor
    comm.free()


if __name__ == "__main__":
    main(sys.argv[1:])
