"""What the MPI library at hand is and grants, and its own collectives as the reference of a self-check."""

__all__ = ["MPI_OPS", "launcher", "library", "reference"]

import os
from typing import Any

import numpy as np
from mpi4py import MPI

_THREAD_LEVELS = {
    MPI.THREAD_SINGLE: "single",
    MPI.THREAD_FUNNELED: "funneled",
    MPI.THREAD_SERIALIZED: "serialized",
    MPI.THREAD_MULTIPLE: "multiple",
}

MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}
"""The ops whose MPI counterpart :func:`reference` uses."""

# the variables each launcher sets in every rank's environment (the first found names it)
_LAUNCHERS = (
    ("SLURM_STEP_ID", "Slurm (srun)"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec (prterun)"),
    ("PMIX_RANK", "a PMIx launcher"),
    ("PMI_RANK", "MPICH's or Intel MPI's mpiexec (Hydra, PMI)"),
    ("MPI_LOCALNRANKS", "MPICH's mpiexec (Hydra)"),
)


def launcher() -> str:
    """The launcher that started this process, from its environment; ``"none (a singleton)"`` if none."""
    for variable, name in _LAUNCHERS:
        if variable in os.environ:
            return name
    return "none (a singleton)"


def library(comm: "MPI.Intracomm | None" = None) -> dict[str, Any]:
    """The MPI library and what it grants, and how ``comm``'s ranks (the world's) lie on nodes; collective."""
    comm = MPI.COMM_WORLD if comm is None else comm
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        node_size, node_rank = node.Get_size(), node.Get_rank()
    finally:
        node.Free()
    nodes = comm.allreduce(1 if node_rank == 0 else 0)
    major, minor = MPI.Get_version()
    first_line = (MPI.Get_library_version().strip().splitlines() or [""])[0]
    import mpi4py  # its version: the module above has none

    return {
        # the first line, its runs of spaces (and Open MPI's trailing NUL) made one space
        "library": " ".join("".join(c if c.isprintable() else " " for c in first_line).split()),
        "standard": f"{major}.{minor}",
        "mpi4py": mpi4py.__version__,
        "thread_level": _THREAD_LEVELS.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "rank": comm.Get_rank(),
        "world_size": comm.Get_size(),
        "nodes": nodes,
        "ranks_on_this_node": node_size,
        "processor": MPI.Get_processor_name(),
        "launcher": launcher(),
    }


def reference(
    collective: str, x: np.ndarray, op: str, root: int, comm: "MPI.Intracomm | None" = None
) -> np.ndarray | None:
    """The MPI library's own result of ``collective`` on ``x`` (the result's shape as ours); collective.

    ``None`` off the root of a reduce or gather, and where MPI has no datatype for
    ``x``'s dtype (float16, bfloat16) or no counterpart of ``op``: the caller checks
    against the exact result alone then (every rank must ask alike).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    size, rank = comm.Get_size(), comm.Get_rank()
    if x.dtype.kind == "V" or x.dtype.name in ("float16", "bfloat16") or op not in MPI_OPS:
        return None
    mpi_op = MPI_OPS[op]
    x = np.ascontiguousarray(x)
    if collective == "allreduce":
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=mpi_op)
        return out
    if collective == "reduce_scatter":
        out = np.empty(x.size // size, x.dtype)
        comm.Reduce_scatter_block(x, out, op=mpi_op)
        return out
    if collective == "reduce":
        out = np.empty_like(x)
        comm.Reduce(x, out, op=mpi_op, root=root)
        return out if rank == root else None
    if collective == "allgather":
        out = np.empty(x.size * size, x.dtype)
        comm.Allgather(x, out)
        return out
    if collective == "gather":
        out = np.empty(x.size * size, x.dtype)
        comm.Gather(x, out if rank == root else None, root=root)
        return out if rank == root else None
    if collective == "broadcast":
        out = x.copy()
        comm.Bcast(out, root=root)
        return out
    if collective == "scatter":
        out = np.empty(x.size // size, x.dtype)
        comm.Scatter(x if rank == root else None, out, root=root)
        return out
    if collective == "alltoall":
        out = np.empty_like(x)
        comm.Alltoall(x, out)
        return out
    raise ValueError(f"no MPI reference for {collective!r}")
