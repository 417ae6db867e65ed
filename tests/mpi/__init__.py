"""Tests run under mpiexec with pytest --with-mpi; launched by tests/test_mpi_launch.py."""
