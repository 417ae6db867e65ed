"""A torch launcher (torchrun) where MPI should have launched: said at once, with the mpiexec line to use."""

__all__ = ["launcher_mismatch", "mpiexec_command"]

import os
import shlex
import sys


def mpiexec_command(processes: int, per_node: int | None = None) -> str:
    """The ``mpiexec`` line that starts this script with its arguments as ``processes`` MPI ranks."""
    placement = ""
    if per_node and 0 < per_node < processes:
        placement = f" -ppn {per_node} -hosts <host1>,<host2>,..."
    script = shlex.join([sys.executable, *sys.argv])
    return f"mpiexec -n {processes}{placement} {script}"


def launcher_mismatch(mpi_size: int) -> str | None:
    """Why this launch gives torch more processes than MPI sees, with the command to use; ``None`` if none.

    Under torchrun every process is an MPI job of its own (a singleton): left
    alone, each would train by itself while torch believes they work together.
    """
    try:
        torch_size = int(os.environ.get("WORLD_SIZE", ""))
    except ValueError:
        return None
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    if torch_size == mpi_size or not (torchrun or mpi_size == 1):
        return None
    try:
        per_node: int | None = int(os.environ.get("LOCAL_WORLD_SIZE", ""))
    except ValueError:
        per_node = None
    launcher = "torchrun" if torchrun else "the launcher"
    return (
        f"{launcher} started {torch_size} processes (WORLD_SIZE), but MPI sees {mpi_size} in this job: "
        "each process is an MPI job of its own. collectives runs over MPI, so let MPI start them, "
        f"with init_method='mpi://': {mpiexec_command(torch_size, per_node)}"
    )
