"""The benchmarks of resident memory, of segment sizes and of the small-message path."""

import re

import pytest

from collectives import engine
from collectives.shared_sizes import small_bytes
from tests.mpirun import BENCH, mpiexec, run_mpi

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec: install the mpich extra")


@needs_mpiexec
def test_resident_memory_stays_flat_over_repeated_allreduces() -> None:
    args = [*BENCH, "memory", "-n", "2000", "--sizes", "8,64K", "--max-growth-kib", "1024"]
    result = run_mpi(2, args, timeout=120)
    assert result.returncode == 0, result.stdout
    rows = re.findall(r"growth after warm-up ([+-]\d+) KiB", result.stdout)
    assert len(rows) == 2, result.stdout
    # a leak of even half a KiB per call would show as about 900 KiB here
    assert all(int(kib) <= 1024 for kib in rows), result.stdout


@needs_mpiexec
def test_memory_bench_fails_when_growth_exceeds_the_bound() -> None:
    # a bound below zero cannot be met: the check itself must be able to fail
    args = [*BENCH, "memory", "-n", "20", "--sizes", "8", "--max-growth-kib", "-1"]
    result = run_mpi(1, args, timeout=60)
    assert result.returncode == 1, result.stdout
    assert "more than -1 KiB" in result.stdout


@needs_mpiexec
def test_segment_bench_times_every_segment_size_against_the_default() -> None:
    args = [*BENCH, "segments", "--segments", "64K,4M,whole", "--sizes", "64K", "-n", "2"]
    result = run_mpi(2, args, timeout=120)
    assert result.returncode == 0, result.stdout
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("65536 B"))
    # the default (4 MiB) is among the segments, so it is its own unit
    assert "4096K" in row and "(1.00)" in row and "whole" in row, result.stdout


@needs_mpiexec
def test_small_path_bench_times_every_layer() -> None:
    result = run_mpi(2, [*BENCH, "small_path", "-n", "20", "-r", "2"], timeout=120)
    assert result.returncode == 0, result.stdout
    layers = re.findall(r"^(\w+) +(\d+\.\d+) us +(\d+\.\d+)x mpi$", result.stdout, re.MULTILINE)
    compiled = ["compiled"] if engine.compiled() else []  # the compiled engine's floor, where it runs
    names = ["floor", *compiled, "watchdog", "executor", "prepared", "allreduce", "persistent", "mpi"]
    assert [name for name, _, _ in layers] == names, result.stdout
    assert all(float(us) > 0 for _, us, _ in layers), result.stdout
    assert layers[-1][2] == "1.00", result.stdout  # each row's time over MPI's


@needs_mpiexec
def test_small_path_bench_refuses_sizes_off_the_one_barrier_path() -> None:
    result = run_mpi(2, [*BENCH, "small_path", "--size", "4M"], timeout=60)
    assert result.returncode == 2, result.stdout
    limit = small_bytes(2, engine.compiled())
    assert f"a size of at most {limit} bytes at 2 ranks" in result.stdout


@needs_mpiexec
def test_device_allreduce_bench_checks_and_times_each_size() -> None:
    # on host arrays: the GPU run (bench/README.md) takes the same loops with CuPy arrays
    args = [
        "-m",
        "collectives",
        "bench",
        "device_allreduce",
        "--array",
        "numpy",
        "-b",
        "4K",
        "-e",
        "64K",
        "-f",
        "4",
        "-n",
        "3",
        "-r",
        "2",
    ]
    result = run_mpi(2, args, timeout=120)
    assert result.returncode == 0, result.stdout
    rows = re.findall(r"^ +(\d+)" + r" +(\d+\.\d+)" * 5 + "$", result.stdout, re.MULTILINE)
    assert [int(size) for size, *_ in rows] == [4096, 16384, 65536], result.stdout
    assert all(float(ours) > 0 and float(ring) > 0 and float(mpi) > 0 for _, ours, ring, mpi, _, _ in rows)
