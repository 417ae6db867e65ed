"""Scripts of the project's own that make the calls Horovod's PyTorch examples make, run under mpiexec."""
