"""Benchmarks of the collectives under mpiexec, in the style of nccl-tests."""
