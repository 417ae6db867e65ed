"""torch's own distributed_test cases, run against the collectives backend under mpiexec."""
