"""``python -m collectives info`` (the job), ``check`` (a self-test), ``bench`` (benchmarks), ``trace``."""

import sys

_USAGE = """usage: python -m collectives {info,check,bench,trace} [options]

  info   what this machine and job offer: versions, MPI and its thread level, nodes,
         shared memory, calibration, torch/CuPy/GPU, fault tolerance (--json for bug reports)
  check  run every collective with every algorithm on this job (under mpiexec -n N),
         checked against exact results and the MPI library's own; exit 1 on any failure
  bench  the benchmark suite: every collective nccl-tests style under mpiexec, calibrate,
         compare, simulate, kvstore and more (python -m collectives bench --help)
  trace  merge DIR -o job.json [--predict]: the ranks' traces ($COLLECTIVES_TRACE=DIR) on one
         timeline, with the cost model's times beside them; why DIR: why a job hung, in words
"""


def main(argv: list[str]) -> int:
    """Run the sub-command named first in ``argv``."""
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "info":
        from .doctor import main as info

        return info(rest)
    if command == "check":
        from .selfcheck import main as check

        return check(rest)
    if command == "bench":
        from .bench.__main__ import main as bench

        return bench(rest)
    if command == "trace":
        from .tracing.cli import main as trace

        return trace(rest)
    print(f"unknown command {command!r}\n{_USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
