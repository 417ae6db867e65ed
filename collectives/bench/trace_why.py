"""How long ``trace why`` takes on dumps of 64 ranks x 10,000 calls: ``collectives bench trace_why``.

Writes synthetic dumps (``rank<R>.hang.json``, as a rank writes on a timeout with
``$COLLECTIVES_FLIGHT_RECORDER`` at the number of calls) of a job where one rank
skipped call ``--skipped`` (its later calls pair with the others' next ones, and
the others hang in their last), times reading them and the verdict, and checks
that the verdict names that rank and call.
"""

__all__ = ["main", "right", "write_dumps"]

import argparse
import json
import os
import sys
import tempfile
import time

from collectives.tracing.events import FORMAT
from collectives.tracing.why import Verdict, diagnose, read_ranks, verdict_text

_FRAME = '  File "/job/train.py", line {line}, in {function}\n    {code}\n'


def write_dumps(folder: str, ranks: int, calls: int, late: int, skipped: int) -> None:
    """Dumps of ``ranks`` ranks that made ``calls`` allreduces each; rank ``late`` skipped call ``skipped``.

    The calls' sizes cycle (a model's layers), so the rank that skipped one makes
    every later call with the next one's size; the others time out in their last.
    """
    for rank in range(ranks):
        numbers = [s for s in range(calls) if not (rank == late and s == skipped)]
        entries = [
            [i, i, "allreduce", 1024 + s % 7, "float32", "sum", -1, "ring", "ok"]
            for i, s in enumerate(numbers)
        ]
        if rank != late:
            entries[-1][-1] = "timed out"
        stack = (
            [_FRAME.format(line=88, function="load_batch", code="batch = next(loader)")]
            if rank == late
            else [_FRAME.format(line=52, function="step", code="collectives.allreduce(grads, out=grads)")]
        )
        data = {
            "format": FORMAT,
            "rank": rank,
            "why": f"allreduce #{calls - 1} timed out" if rank != late else f"rank 0: allreduce #{calls - 1}",
            "communicators": [{"number": 1, "rank": rank, "size": ranks, "calls": entries}],
            "stacks": {"MainThread": stack},
        }
        with open(os.path.join(folder, f"rank{rank}.hang.json"), "w") as out:
            json.dump(data, out)


def right(verdict: Verdict, late: int, skipped: int) -> bool:
    """Whether the verdict names the rank that skipped the call, and the call."""
    found = verdict.disagreements.get(1)
    return found is not None and found[0] == skipped and [late] in found[1].values()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench trace_why", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--ranks", type=int, default=64, help="ranks (default 64)")
    parser.add_argument("--calls", type=int, default=10_000, help="calls per rank (default 10,000)")
    parser.add_argument("--late", type=int, default=17, help="the rank that skipped a call (default 17)")
    parser.add_argument("--skipped", type=int, default=7321, help="the call it skipped (default 7,321)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        write_dumps(folder, args.ranks, args.calls, args.late, args.skipped)
        start = time.perf_counter()
        verdict = diagnose(read_ranks(folder))
        text = verdict_text(verdict)
        took = time.perf_counter() - start
    print(text)
    found = right(verdict, args.late, args.skipped)
    print(
        f"# {args.ranks} ranks x {args.calls} calls: verdict in {took:.2f} s "
        f"({'right' if found else 'WRONG'})"
    )
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
